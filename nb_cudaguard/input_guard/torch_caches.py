"""Torch's lazily built tables of its own functions, kept free of the guard's wrappers.

Some parts of torch list its functions once, on first use, by reading its namespaces
(``dir(torch.Tensor)``, ``torch.gather`` in a set literal) and cache the objects they found.
Built while a guard's wrappers stand in for torch's functions, such a table would hold the
wrappers, and after the guard torch's own functions would be missing from it for the rest of
the process: ``torch.compile`` would break the graph at ``torch._C._nn.cross_entropy_loss``
("Dynamo does not know how to trace the builtin"), ``torch.fx`` would record ``x.gather(...)`` as
a call of a function instead of a method. So the guard notes which of these tables exist when it
starts, and empties those that were built while it was active as it ends: torch builds them
again from its own objects on their next use, as it would have without the guard.

TorchScript's table of builtins is the exception: it is built at once, before the wrappers go in
(the guard also lists its wrappers there as the ops they wrap, ``entries._Entries``).
"""

from __future__ import annotations

import sys
from typing import Any

# (module, attribute path): functools caches whose result holds torch functions
CACHES = (
    ("torch.overrides", "get_ignored_functions"),
    ("torch.overrides", "get_default_nowrap_functions"),
    ("torch.overrides", "get_testing_overrides"),
    ("torch.overrides", "_get_overridable_functions"),
    ("torch.overrides", "_get_tensor_methods"),
    ("torch._dynamo.trace_rules", "get_torch_obj_rule_map"),
    ("torch._dynamo.trace_rules", "get_tensor_method"),
    ("torch._dynamo.variables.torch", "get_overridable_functions"),
    ("torch._dynamo.variables.torch", "TorchInGraphFunctionVariable._get_handlers"),
)


_FOUND: dict[tuple[str, str], Any] = {}  # the cached functions, once their module is imported
# sys.modules's size and last key at the last look for the others (a module imported since
# is its last key, a ``del`` in between notwithstanding)
_LOOKED: list[tuple[int, str | None]] = [(-1, None)]


def _caches() -> dict[tuple[str, str], Any]:
    """The caches that exist now; those found once are kept (asked twice per guard), and the
    others looked for again only once more modules are loaded (torch._dynamo's, on first use)."""
    if len(_FOUND) < len(CACHES):
        loaded = (len(sys.modules), next(reversed(sys.modules), None))
        if loaded == _LOOKED[0]:
            return _FOUND
        _LOOKED[0] = loaded
        for module, path in CACHES:
            if (module, path) not in _FOUND and module in sys.modules:
                found = _cache(module, path)
                if found is not None:
                    _FOUND[(module, path)] = found
    return _FOUND


def _cache(module: str, path: str) -> Any:
    found = sys.modules.get(module)
    for name in path.split("."):
        found = getattr(found, name, None)
    if not (hasattr(found, "cache_clear") and hasattr(found, "cache_info")):
        return None
    return found


def _filled(cache: Any) -> bool:
    try:
        return bool(cache.cache_info().currsize)
    except Exception:
        return True  # unknown: never emptied


def built() -> frozenset[tuple[str, str]]:
    """The tables that exist now."""
    return frozenset([key for key, cache in _caches().items() if _filled(cache)])


def forget_built_since(before: frozenset[tuple[str, str]]) -> None:
    """Empty the tables built since ``before`` was taken (while the wrappers were in place)."""
    for key, cache in _caches().items():
        if key not in before and _filled(cache):
            cache.cache_clear()


def build_builtin_table() -> None:
    """TorchScript's table of builtins (``id(torch.gather) -> "aten::gather"``), built now from
    torch's own functions where a torch version builds it on first use only."""
    jit = sys.modules.get("torch.jit._builtins")
    if jit is not None and getattr(jit, "_builtin_table", 0) is None:
        build = getattr(jit, "_get_builtin_table", None)
        if build is not None:
            build()
