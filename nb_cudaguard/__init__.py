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

    from .diagnosis.engine import diagnose
    from .diagnosis.model import CAUSES, AssertLine, ContextState, CudaError, Diagnosis
    from .input_guard.errors import GuardError, GuardIndexError
    from .notebook.kernel import restart_kernel
    from .ranks.in_rank import guard
    from .restart.methods import RestartError
    from .runtime.probe import probe_context

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY: dict[str, str] = {
    "CAUSES": ".diagnosis.model",
    "AssertLine": ".diagnosis.model",
    "ContextState": ".diagnosis.model",
    "CudaError": ".diagnosis.model",
    "Diagnosis": ".diagnosis.model",
    "diagnose": ".diagnosis.engine",
    "probe_context": ".runtime.probe",
    "GuardError": ".input_guard.errors",
    "GuardIndexError": ".input_guard.errors",
    "guard": ".ranks.in_rank",  # the guard (imports torch, on first use only), rank-aware
    "restart_kernel": ".notebook.kernel",  # imports IPython, on first use only
    "RestartError": ".restart.methods",
}

__all__ = [
    "CAUSES",
    "AssertLine",
    "ContextState",
    "CudaError",
    "Diagnosis",
    "GuardError",
    "GuardIndexError",
    "RestartError",
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
    from .notebook.extension import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: InteractiveShell) -> None:
    from .notebook.extension import unload_ipython_extension as unload

    unload(shell)
