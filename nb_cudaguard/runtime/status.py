"""``%cudaguard status``: torch, CUDA and debug-switch state of this kernel, read side-effect free.

torch is never imported here (its installed version is read from package metadata) and CUDA is
never initialised; whether blocking mode is effective comes from ``blocking``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..diagnosis.model import ContextState
from .blocking import VARIABLE, Blocking, blocking_state, marker, watch_cuda_init
from .probe import Probe, probe_devices


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


# Plain words, not the internal ids (`no-cuda`) that the JSON payload uses.
_WORDS = {
    ContextState.POISONED: "poisoned: only a kernel restart helps",
    ContextState.HEALTHY: "healthy",
    ContextState.NO_CUDA: "none yet (this kernel has not used CUDA)",
    ContextState.UNKNOWN: "could not be checked",
}


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
    devices: tuple[tuple[int, ContextState], ...] = ()  # each device with a context

    def lines(self) -> list[str]:
        torch = self.torch_version or "not installed"
        if self.torch_version and not self.torch_imported:
            torch += " (not imported yet)"
        out = [f"torch: {torch}"]
        if self.torch_imported:
            out.append(f"CUDA (torch built with): {self.cuda_version or 'none (CPU build)'}")
            out.append(f"CUDA initialised: {'yes' if self.cuda_initialised else 'no'}")
        if len(self.devices) > 1:
            each = ", ".join(f"cuda:{i} {_WORDS[state]}" for i, state in self.devices)
            out.append(f"CUDA context: {_WORDS[self.context]} ({each})")
        elif self.devices:
            out.append(f"CUDA context: {_WORDS[self.context]} (cuda:{self.devices[0][0]})")
        else:
            out.append(f"CUDA context: {_WORDS[self.context]}")
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
    probe: Probe = probe_devices(torch)
    return Status(
        str(getattr(torch, "__version__", "unknown")),
        True,
        # Never torch.cuda.is_available(): it may start the driver before the user sets variables.
        getattr(torch.version, "cuda", None),
        initialised,
        probe.state,
        blocking_state(initialised),
        _dsa(torch),
        marker() is not None,
        probe.devices,
    )
