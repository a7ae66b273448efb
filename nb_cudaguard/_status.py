"""``%cudaguard status``: torch, CUDA and debug-switch state of this kernel, read side-effect free.

torch is never imported here (its installed version is read from package metadata) and CUDA is
never initialised. Whether ``CUDA_LAUNCH_BLOCKING`` is *effective* depends on when it was set: the
driver reads it when the context is created (FIELD_NOTES §3). We know it was in time when it was in
the process's start environment (``/proc/self/environ``), when our startup injection put it there,
or when a hook queued on torch's lazy CUDA init saw it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._diagnosis import ContextState
from ._inject import marker
from ._probe import probe_context

VARIABLE = "CUDA_LAUNCH_BLOCKING"

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


def _dsa(torch: Any) -> str:
    try:
        config = torch.__config__.show()
    except Exception:
        return "unknown"
    if "TORCH_USE_CUDA_DSA" in config:
        return "yes (built with TORCH_USE_CUDA_DSA)"
    if "USE_CUDA=0" in config or not getattr(torch.version, "cuda", None):
        return "no (a CPU build)"
    return (
        "no: stock wheels are built without TORCH_USE_CUDA_DSA; setting it (or "
        "PYTORCH_USE_CUDA_DSA) at run time does nothing"
    )


@dataclass(frozen=True)
class Status:
    torch_version: str | None
    torch_imported: bool
    cuda_version: str | None
    cuda_initialised: bool | None
    context: ContextState
    blocking: Blocking
    dsa: str
    blocking_from_us: bool

    def lines(self) -> list[str]:
        torch = self.torch_version or "not installed"
        if self.torch_version and not self.torch_imported:
            torch += " (not imported yet)"
        out = [f"torch: {torch}"]
        if self.torch_imported:
            out.append(f"CUDA (torch built with): {self.cuda_version or 'none (CPU build)'}")
            out.append(f"CUDA initialised: {'yes' if self.cuda_initialised else 'no'}")
        out.append(f"CUDA context: {self.context.value}")
        value = "unset" if self.blocking.value is None else repr(self.blocking.value)
        verdict = {True: "effective", False: "not effective", None: "effect unknown"}
        if self.blocking.value is None and self.blocking.effective is False:
            out.append(f"{VARIABLE}: unset ({self.blocking.reason})")
        else:
            verdict_text = verdict[self.blocking.effective]
            out.append(f"{VARIABLE}: {value}, {verdict_text} ({self.blocking.reason})")
        if self.blocking.too_late:
            out.append(
                f"WARNING: {VARIABLE} was set too late. Run `%cudaguard restart`: the next kernel "
                "gets it before CUDA starts."
            )
        if self.blocking_from_us:
            out.append(
                "Blocking mode was switched on by nb_cudaguard; it ends at the next restart."
            )
        if self.torch_imported:
            out.append(f"device-side assertions (TORCH_USE_CUDA_DSA): {self.dsa}")
        return out

    def text(self) -> str:
        return "\n".join(self.lines())


def _installed_torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def gather(torch: Any = None) -> Status:
    torch = sys.modules.get("torch") if torch is None else torch
    if torch is None:
        return Status(
            _installed_torch_version(),
            False,
            None,
            False,
            ContextState.NO_CUDA,
            blocking_state(False),
            "unknown",
            marker() is not None,
        )
    watch_cuda_init(torch)
    initialised: bool | None
    try:
        initialised = bool(torch.cuda.is_initialized())
    except Exception:
        initialised = None
    return Status(
        str(getattr(torch, "__version__", "unknown")),
        True,
        # Never torch.cuda.is_available(): it may start the driver before the user sets variables.
        getattr(torch.version, "cuda", None),
        initialised,
        probe_context(torch),
        blocking_state(initialised),
        _dsa(torch),
        marker() is not None,
    )
