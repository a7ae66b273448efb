"""Blocking mode in this process: ``CUDA_LAUNCH_BLOCKING``, whether nb_cudaguard set it, and
whether it can have taken effect.

The driver reads the variable when the CUDA context is created (the CUDA Programming Guide's
"CUDA Environment Variables": https://docs.nvidia.com/cuda/cuda-c-programming-guide/), so it is
*effective* only if it was set before that: it was in the process's start environment
(``/proc/self/environ``), our restart injection put it there before the first cell (``MARKER``), or
a hook queued on torch's lazy CUDA init saw it. torch is never imported here and CUDA is never
initialised.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIABLE = "CUDA_LAUNCH_BLOCKING"
BLOCKING = {VARIABLE: "1"}
# Set in a process that got blocking mode from nb_cudaguard's restart; its value is the cell that
# crashed in the previous process ("" when unknown).
MARKER = "NB_CUDAGUARD_BLOCKING_AFTER_CELL"


@dataclass(frozen=True)
class Marker:
    """This process got blocking mode from nb_cudaguard."""

    after_cell: int | None


def marker(environ: Mapping[str, str] | None = None) -> Marker | None:
    environ = os.environ if environ is None else environ
    value = environ.get(MARKER)
    if value is None:
        return None
    return Marker(int(value) if value.isdigit() else None)


# The value of CUDA_LAUNCH_BLOCKING when torch initialised CUDA, recorded by watch_cuda_init().
_seen_at_cuda_init: list[str | None] = []
_watching: list[bool] = []


def watch_cuda_init(torch: Any = None) -> None:
    """Record CUDA_LAUNCH_BLOCKING at CUDA initialisation (torch imported, CUDA not yet started)."""
    torch = sys.modules.get("torch") if torch is None else torch
    if torch is None or _watching:
        return
    lazy_call = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
    with contextlib.suppress(Exception):
        if lazy_call is None or torch.cuda.is_initialized():
            return
        # Queued calls run right after torch creates the CUDA state, on first CUDA use.
        lazy_call(lambda: _seen_at_cuda_init.append(os.environ.get(VARIABLE)))
        _watching.append(True)


def _start_environment() -> dict[str, str] | None:
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


@dataclass(frozen=True)
class Blocking:
    value: str | None  # CUDA_LAUNCH_BLOCKING now
    effective: bool | None  # None: cannot tell
    reason: str
    too_late: bool = False


def blocking_state(cuda_initialised: bool | None) -> Blocking:
    value = os.environ.get(VARIABLE)
    on = value not in (None, "", "0")
    if not on:
        if _seen_at_cuda_init and _seen_at_cuda_init[0] not in (None, "", "0"):
            return Blocking(value, True, "it was set when CUDA started and stays in force")
        return Blocking(value, False, "CUDA launches are asynchronous")
    if not cuda_initialised:
        return Blocking(value, True, "set, and CUDA has not started yet: it will apply")
    if _seen_at_cuda_init:
        if _seen_at_cuda_init[0] not in (None, "", "0"):
            return Blocking(value, True, "it was set when CUDA started")
        return Blocking(
            value, False, "set after CUDA started in this kernel: it has no effect", too_late=True
        )
    if marker() is not None:
        return Blocking(value, True, "nb_cudaguard set it before the first cell of this kernel")
    start = _start_environment()
    if start is not None and start.get(VARIABLE) == value:
        return Blocking(value, True, "it was set when this kernel process started")
    if start is not None:
        return Blocking(
            value,
            False,
            "set during this session, and CUDA has started: it has no effect unless it was set "
            "before the first CUDA call",
            too_late=True,
        )
    return Blocking(value, None, "set during this session; cannot tell whether before CUDA started")
