"""A job launched from this process (a notebook's cell): its ranks' records, and their verdict here.

``notebook_launcher``, ``start_processes`` and ``mp.spawn`` raise a launcher's exception in the
kernel (``ChildFailedError``, ``ProcessRaisedException``, ``ProcessExitedException``) whose text
holds no CUDA error, or names a victim; the children's own lines reach the kernel on fd 2, late
or not at all. So the launching process sets ``NB_CUDAGUARD_RANK_DIR`` to a private folder of its
own, which every child inherits, and each rank writes its record there *before* its error leaves
it (ranks/record.py). When the cell fails, the records are on disk already: no race.

The verdict: the culprit is the rank whose record is a CUDA error or a guard refusal, the earliest
by its own clock, never one stopped by a peer. The CUDA contexts it poisoned lived in the
children; a process that never initialised CUDA itself needs no restart, and is told so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..diagnosis.model import ContextState, Diagnosis
from ..files.private import private_dir
from . import record as rank_record


class RankDir:
    """The private folder this process's launched ranks write their records to, named to the
    children through ``NB_CUDAGUARD_RANK_DIR``; ``close()`` removes both."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._previous: str | None = None

    def open(self) -> Path:
        if self.path is None:
            path = Path(tempfile.mkdtemp(prefix="nb_cudaguard-ranks-"))
            private_dir(path)
            self._previous = os.environ.get(rank_record.RANK_DIR_ENV)
            os.environ[rank_record.RANK_DIR_ENV] = str(path)
            self.path = path
        return self.path

    def close(self) -> None:
        path, self.path = self.path, None
        if path is None:
            return
        if os.environ.get(rank_record.RANK_DIR_ENV) == str(path):
            if self._previous is None:
                del os.environ[rank_record.RANK_DIR_ENV]
            else:
                os.environ[rank_record.RANK_DIR_ENV] = self._previous
        shutil.rmtree(path, ignore_errors=True)

    def take(self, since: float) -> list[dict[str, Any]]:
        """The records ranks wrote since ``since`` (a ``time.time()``); every record is removed
        as it is read, so a later failure never reads an earlier job's."""
        if self.path is None:
            return []
        records = [r for r in rank_record.read_dir(self.path) if float(r["time"]) >= since]
        for entry in self.path.glob("*.json"):
            with contextlib.suppress(OSError):
                entry.unlink()
        return records


def verdict(records: list[dict[str, Any]], kernel_cuda: bool) -> Diagnosis | None:
    """The diagnosis to show in the launching process, from its children's ``records``; None
    where none of them failed of a CUDA error or a guard refusal. ``kernel_cuda``: the launching
    process initialised CUDA itself (then only a probe of its own context can tell its state)."""
    culprit = rank_record.culprit(records)
    if culprit is None:
        return None
    rank = culprit["rank"]
    stopped = sorted(int(r["rank"]) for r in records if r.get("kind") == "stopped-by-peer")
    others = (
        f" {_ranks(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped because of it."
        if stopped
        else ""
    )
    where = f"rank {rank} (host {culprit.get('host')}, pid {culprit.get('pid')})"
    base = rank_record.diagnosis_of(culprit)
    if base is None:  # a guard refusal: the bad input never reached the GPU
        base = Diagnosis(
            cause="not-sticky",
            sticky=False,
            title="The guard refused a bad input",
            explanation="",
            fixes=(str(culprit.get("exception", "")).splitlines()[0],),
        )
        happened = f"In {where}, nb_cudaguard's guard refused a batch before its kernel ran."
    else:
        happened = f"{where} hit this in its own process: {base.explanation}"
    if kernel_cuda:
        kernel = (
            "The poisoned CUDA contexts were the child processes', which have ended; this "
            "kernel's own CUDA context is a separate one."
        )
    else:
        kernel = (
            "The poisoned CUDA contexts were the child processes', which have ended; this "
            "kernel never initialised CUDA, so it needs no restart: fix the cause and run the "
            "cell again."
        )
    return replace(
        base,
        sticky=False,  # in this process: nothing of it is broken
        title=f"Rank {rank} failed: {base.title}",
        explanation=f"{happened}{others} {kernel}",
        context=ContextState.NO_CUDA if not kernel_cuda else ContextState.UNKNOWN,
        device=None,
    )


def _ranks(ranks: list[int]) -> str:
    words = [str(r) for r in ranks]
    if len(words) == 1:
        return f"rank {words[0]}"
    return f"ranks {', '.join(words[:-1])} and {words[-1]}"
