"""nb_cudaguard: explain CUDA device-side asserts in notebooks, and catch bad inputs before the GPU.

``%load_ext nb_cudaguard`` in a notebook. Importing this package imports neither torch, ipywidgets
nor IPython and changes nothing: public names are loaded on first use (PEP 562), and the extension
entry points import the IPython glue only when IPython calls them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ._diagnose import diagnose
    from ._diagnosis import CAUSES, AssertLine, ContextState, CudaError, Diagnosis
    from ._guard import guard
    from ._guard_error import GuardError, GuardIndexError
    from ._probe import probe_context
    from ._restart import restart_kernel

__version__ = "0.1.0"

# public name -> the private module that defines it
_LAZY: dict[str, str] = {
    "CAUSES": "._diagnosis",
    "AssertLine": "._diagnosis",
    "ContextState": "._diagnosis",
    "CudaError": "._diagnosis",
    "Diagnosis": "._diagnosis",
    "diagnose": "._diagnose",
    "probe_context": "._probe",
    "GuardError": "._guard_error",
    "GuardIndexError": "._guard_error",
    "guard": "._guard",  # imports torch, on first use only
    "restart_kernel": "._restart",
}

__all__ = [
    "CAUSES",
    "AssertLine",
    "ContextState",
    "CudaError",
    "Diagnosis",
    "GuardError",
    "GuardIndexError",
    "__version__",
    "diagnose",
    "guard",
    "load_ipython_extension",
    "probe_context",
    "restart_kernel",
    "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nb_cudaguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_ipython_extension(shell: InteractiveShell) -> None:
    from ._extension import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    from ._extension import unload_ipython_extension as unload

    unload(shell)
