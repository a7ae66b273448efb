"""What a guard knows per thread: the configs of the guards it is in, whether it is inside a
checked call, and the deferred verdicts it has not read yet.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from .ops import OpCheck
from .report import _Where
from .requirements import Requirement, Summary


@dataclass(frozen=True)
class GuardConfig:
    only: frozenset[str] | None = None  # op names or families; None: all
    skip: frozenset[str] = frozenset()
    deferred: bool = False

    def selects(self, check: OpCheck) -> bool:
        only, skip = self.only, self.skip
        if only is not None and check.name not in only and check.family not in only:
            return False
        return check.name not in skip and check.family not in skip


class _ThreadState(threading.local):
    """Per thread: the wrappers are process-wide, the guard is not (a thread outside any guard
    calls the bare op)."""

    def __init__(self) -> None:
        self.configs: list[GuardConfig] = []
        # inside a checked call (its check or the op itself): torch's own inner calls (the
        # nll_loss inside cross_entropy, indexing inside a check) pass through unchecked
        self.busy = False
        self.pending: list[_Pending] = []
        # per stream: the event each deferred call records after its summaries, while marking
        self.events: dict[tuple[int, int, int], tuple[Any, Any]] = {}
        self.side_streams: dict[torch.device, Any] = {}  # per device: where reads go behind
        self.marking = False  # deferral.WAITED_S


_STATE = _ThreadState()
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state


def _skips() -> bool:
    """While ``torch.jit.trace`` records or ``torch.compile`` captures a graph, the op runs bare:
    the graph holds the user's ops only, never the checks' (their aminmax, resolve_conj...).
    The guard says so once, as it ends (``_note_unchecked``)."""
    if _tracing_state() is not None:
        _TRACED.append(True)
        return True
    return _is_compiling()


_TRACED: list[bool] = []  # checked calls a trace recorded unchecked, until a guard says so


@dataclass
class _Pending:
    """One deferred call: its summaries (on the device) and what the message needs later."""

    check: OpCheck
    func: Any
    requirements: list[Requirement]
    summaries: list[Summary]
    versions: list[int | None]
    where: _Where
    ready: Any = None  # its stream's event, recorded after the summaries (deferral._marked)
