"""``guard()`` in a rank of a multi-process job: the guard, plus the record and the peers' stop.

The switch is the environment, so the training script changes by no line: a process is a rank
where a launcher set ``RANK`` (or that joined a process group) and one of these is set:
``TORCHELASTIC_ERROR_FILE`` (torchrun sets it in every worker), ``NB_CUDAGUARD_RANK_DIR`` (the
notebook extension sets it; a launcher started from a cell passes it down) or
``NB_CUDAGUARD_RANKS=1`` (anyone else); ``NB_CUDAGUARD_RANKS=0`` turns it off. There ``with
nb_cudaguard.guard():`` starts the peer watch as it is entered (once the process group exists),
and when a CUDA error or a guard refusal leaves the block it writes this rank's record at once
and tells the peers, then lets the error go on as before. Elsewhere guard() is the plain guard.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from ..input_guard import scope
from ..runtime.capture import FdTee
from . import peers
from . import record as rank_record

SWITCH_ENV = "NB_CUDAGUARD_RANKS"


def enabled() -> bool:
    """Whether this process is a rank whose failures we record."""
    if rank_record.rank() is None or os.environ.get(SWITCH_ENV) == "0":
        return False
    return bool(
        os.environ.get(rank_record.ERROR_FILE_ENV)
        or os.environ.get(rank_record.RANK_DIR_ENV)
        or os.environ.get(SWITCH_ENV, "") not in ("", "0")
    )


_reported: set[int] = set()


def report(error: BaseException, device_output: str = "") -> dict[str, Any] | None:
    """Record ``error`` for this rank and tell the peers, if it is a CUDA error or a guard
    refusal and the first such failure of this process; the record, else None.
    ``device_output``: what the rank wrote to fd 2 meanwhile (the GPU's assert lines)."""
    if _reported:
        return None
    try:
        found = rank_record.failure_record(error, device_output=device_output)
    except Exception:  # our failure must never hide the user's
        return None
    if found is None:
        return None
    _reported.add(id(error))
    rank_record.write(found, error)
    with contextlib.suppress(Exception):
        peers.announce(found)
    return found


_tee: list[FdTee | None] = []  # this process's fd 2 tee once started (None: it could not be)


def _fd2() -> FdTee | None:
    """This process's fd 2 tee, started at the first guarded block and left on for the rest of
    the process: the CUDA runtime prints a device assert's lines to fd 2, never to an
    exception, so the record reads them there. Left on, a block costs no fd swap (two ``dup2``
    and an ``fstat`` each way: 40 us a training step); what a block that ends well captured is
    cleared, so a failing block's text is its own. None where it cannot run (no child could be
    started, Windows): the record then has no device lines."""
    if _tee:
        return _tee[0]
    tee = FdTee()
    try:
        tee.start()
    except OSError:
        _tee.append(None)
        return None
    _tee.append(tee)
    return tee


class RankGuard:
    """The guard of one ``with`` block in a rank: ``scope.Guard``'s behaviour, unchanged, and
    the record and the peers' stop around it. fd 2 is teed, as in a notebook's cell."""

    def __init__(self, inner: scope.Guard) -> None:
        self.inner = inner

    def __enter__(self) -> RankGuard:
        with contextlib.suppress(Exception):
            peers.watch()
        _fd2()
        self.inner.__enter__()
        return self

    @staticmethod
    def _device_output() -> str:
        tee = _fd2()
        return tee.text() if tee is not None else ""

    @staticmethod
    def _ended_well() -> None:
        tee = _fd2()
        if tee is not None:
            with contextlib.suppress(Exception):
                tee.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        __tracebackhide__ = True
        try:
            self.inner.__exit__(exc_type, exc, tb)
        except Exception as raised:  # a deferred verdict, read as the block ends
            report(raised, self._device_output())
            raise
        if isinstance(exc, Exception):
            report(exc, self._device_output())
        elif exc is None:
            self._ended_well()


def guard(
    only: Iterable[str] | str | None = None,
    skip: Iterable[str] | str | None = None,
    sync: bool = False,
    mode: str = "strict",
    namespace: dict[str, Any] | None = None,
) -> scope.Guard | RankGuard:
    """:func:`nb_cudaguard.input_guard.scope.guard`; in a rank (see the module docstring), with
    the rank's record and the peers' stop."""
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    inner = scope.guard(only=only, skip=skip, sync=sync, mode=mode, namespace=namespace)
    return RankGuard(inner) if enabled() else inner


guard.__doc__ = scope.guard.__doc__
