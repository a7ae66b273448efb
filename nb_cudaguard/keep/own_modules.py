"""Which values are the globals of the notebook's own modules, and binding them back there.

``from helpers import registry`` binds the notebook's ``registry`` to the very object
``helpers.registry`` is. A restore that put back only the notebook's name would split them:
the new process imports ``helpers`` afresh, and ``registry is helpers.registry`` would be
False, the module's functions updating one list and the notebook reading the other. So the
keep notes which module global a kept value was, and the restore binds the restored value (the
state before the failure, mutations included) back to that module attribute, importing the
module where it can (it sits next to the notebook, so the new process finds it as the old did).

A notebook's own module is any imported module with a file outside the standard library and
the installed packages (site-packages, the user site), other than ``__main__``: the installed
packages' state is not the notebook's to write.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import site
import sys
import sysconfig
import types
from collections.abc import Mapping
from typing import Any

# Values whose identity nothing can depend on: kept by value, never bound back.
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def _installed_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(Exception):
        roots.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        roots.add(site.getusersitepackages())
    roots.add(sys.prefix)
    roots.add(sys.base_prefix)
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def own_modules() -> list[types.ModuleType]:
    """The imported modules that are the notebook's own (see above)."""
    installed = _installed_roots()
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or not isinstance(path, str) or name.startswith("nb_cudaguard"):
            continue
        real = os.path.realpath(path)
        if not real.startswith(installed):
            found.append(module)
    return found


def module_globals(values: Mapping[str, Any]) -> dict[str, str]:
    """For each of ``values`` that is a global of one of the notebook's own modules (not a
    module, function or class: those are found again by import): ``module:attribute``."""
    wanted = {
        id(v): n
        for n, v in values.items()
        if not isinstance(v, (*_ATOMS, types.ModuleType, types.FunctionType, type))
    }
    if not wanted:
        return {}
    found: dict[str, str] = {}
    for module in own_modules():
        with contextlib.suppress(Exception):
            for attribute, value in vars(module).items():
                name = wanted.get(id(value))
                if name is not None and name not in found and not attribute.startswith("__"):
                    found[name] = f"{module.__name__}:{attribute}"
    return found


def bind_back(place: str, value: Any) -> str | None:
    """Make ``value`` the module attribute ``place`` (``module:attribute``) names, importing
    the module if needed; None, or why it could not."""
    module_name, _, attribute = place.partition(":")
    try:
        module = importlib.import_module(module_name)
        setattr(module, attribute, value)
    except Exception as error:
        why = f"{type(error).__name__}: {error}"
        return f"{module_name}.{attribute} is not the restored one ({why})"
    return None
