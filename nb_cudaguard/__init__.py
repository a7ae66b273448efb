"""nb_cudaguard: explain CUDA device-side asserts in notebooks, and catch bad inputs before the GPU.

``%load_ext nb_cudaguard`` in a notebook. Importing this package imports neither torch, ipywidgets
nor IPython and changes nothing: the extension entry points import the IPython glue lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._diagnose import diagnose
from ._diagnosis import CAUSES, AssertLine, ContextState, CudaError, Diagnosis

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__version__ = "0.1.0"

__all__ = [
    "CAUSES",
    "AssertLine",
    "ContextState",
    "CudaError",
    "Diagnosis",
    "__version__",
    "diagnose",
    "load_ipython_extension",
    "probe_context",
    "restart_kernel",
    "unload_ipython_extension",
]


def load_ipython_extension(shell: InteractiveShell) -> None:
    from ._extension import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    from ._extension import unload_ipython_extension as unload

    unload(shell)


def probe_context(torch: Any = None) -> ContextState:
    """Whether this process's CUDA context is poisoned, healthy, absent (no CUDA) or unknown."""
    from ._probe import probe_context as probe

    return probe(torch)


def restart_kernel(blocking: bool = True) -> Any:
    """Restart this kernel; with ``blocking``, only its next process gets CUDA_LAUNCH_BLOCKING=1.

    Returns the plan at once; the kernel goes away a moment later. Re-run from the top afterwards.
    """
    from ._restart import restart_kernel as restart

    return restart(blocking=blocking)
