"""Which names of a notebook's namespace are kept, and in plain words why the others are not.

Most reasons come from trying (the pickler says what failed); these are decided before trying,
because pickle's own message would not tell the user what to do.
"""

from __future__ import annotations

import io
import re
import socket
import sys
import threading
import types
from typing import Any

# IPython's own names: In, Out, the output cache (_, __, ___, _12), the input cache (_i, _ii,
# _iii, _i12), its history lists, and the shell's helpers. IPython recreates them.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh"})
_IPYTHON_PATTERN = re.compile(r"^(_{1,3}|_i{1,3}|_i?\d+)$")

_LOCKS = (
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Semaphore,
    threading.Event,
)


def is_ipython_name(name: str, hidden: frozenset[str] = frozenset()) -> bool:
    """IPython's bookkeeping (never kept, never listed one by one)."""
    return (
        name in _IPYTHON_NAMES
        or name in hidden
        or (name.startswith("__") and name.endswith("__"))
        or bool(_IPYTHON_PATTERN.match(name))
    )


def importable_module(value: types.ModuleType) -> str | None:
    """The name to import ``value`` again by, or None (``__main__``, a module made in a cell)."""
    name = getattr(value, "__name__", None)
    if not isinstance(name, str) or name == "__main__" or sys.modules.get(name) is not value:
        return None
    return name if getattr(value, "__spec__", None) is not None else None


def reason_not_to_try(value: Any) -> str | None:
    """Why ``value`` cannot be kept, where pickle's own message would not say what to do."""
    if isinstance(value, io.IOBase) or (
        hasattr(value, "fileno") and hasattr(value, "read") and hasattr(value, "closed")
    ):
        return "an open file or stream: open it again after the restore"
    if isinstance(value, socket.socket):
        return "a network socket: connect again after the restore"
    if isinstance(value, types.GeneratorType | types.CoroutineType | types.AsyncGeneratorType):
        return "a generator: where it stopped cannot be saved; create it again"
    if isinstance(value, _LOCKS):
        return "a lock or another threading primitive: create it again"
    if isinstance(value, threading.Thread):
        return "a thread: start it again"
    if isinstance(value, types.ModuleType):
        return "a module made in the notebook: run the cell that made it again"
    return None


def describe(value: Any) -> str:
    """A short type description: ``numpy.ndarray float32 (1000, 1000)``, ``dict, 3 items``."""
    kind = type(value)
    module = str(getattr(kind, "__module__", "") or "")
    parts = module.split(".")
    if module in ("builtins", "__main__"):
        name = kind.__qualname__
    else:  # torch.nn.Linear, torch.optim.Adam, numpy.ndarray, pandas.DataFrame
        prefix = ".".join(parts[:2]) if parts[0] == "torch" and len(parts) > 2 else parts[0]
        name = f"{prefix}.{kind.__qualname__}"
    try:
        if module.split(".")[0] == "numpy" and hasattr(value, "dtype") and hasattr(value, "shape"):
            return f"{name} {value.dtype} {tuple(value.shape)}"
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            dtype = str(value.dtype).replace("torch.", "")
            where = "" if value.device.type == "cpu" else f" on {value.device}"
            return f"{name} {dtype} {list(value.shape)}{where}"
        if isinstance(value, dict | list | set | tuple | frozenset):
            return f"{name}, {len(value)} item{'' if len(value) == 1 else 's'}"
        if isinstance(value, types.ModuleType):
            return "module"
        if isinstance(value, type):
            return "class"
        if isinstance(value, types.FunctionType):
            return "function"
    except Exception:
        pass
    return name


def human_size(size: int) -> str:
    amount = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if amount < 1000 or unit == "GB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1000
    return f"{amount:.1f} GB"  # pragma: no cover - the loop always returns
