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
    "GuardError",
    "__version__",
    "diagnose",
    "guard",
    "load_ipython_extension",
    "probe_context",
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


def __getattr__(name: str) -> Any:
    # The guard needs torch: import it only when someone asks for it.
    if name == "guard":
        from ._guard import guard

        return guard
    if name in ("GuardError", "GuardIndexError"):
        from . import _guard_error

        return getattr(_guard_error, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
