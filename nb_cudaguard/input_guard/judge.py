"""Judging a checked call: its requirements read (one host transfer for all of them), and on host
memory whether the CPU op may run first and what PyTorch's own error would be.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Iterable
from types import FunctionType
from typing import Any

import torch

from .errors import Finding
from .ops import PLAIN, OpCheck
from .requirements import Requirement, Summary, transforms_active, unwrapped

# How often the guard read verdicts back to the host (on a GPU each is a synchronisation: the cost
# the deferred mode removes; on CPU a read of host memory, counted alike).
STATS: Counter[str] = Counter()


# A call whose tensors are all in host memory runs first and is checked only when the op raises,
# where PyTorch's CPU op rejects every value the CUDA kernel asserts on, for each requirement of
# the op (``ops.CPU_CHECKS``): a valid call costs one wrapper, and a bad one still ends in the
# guard's message. Not for in-place calls (an ``out=``, ``x.scatter_``, ``max_norm``): those may
# write before they raise; not for random ops (they would draw first); not past ``HOST_FIRST_LINE``
# elements in one tensor, where the op would compute for long before it raises (an 8192 x 32000
# cross_entropy: 4.8 s) and the rules cost nothing beside it. Tests turn this off to run every
# check itself on CPU, as a GPU's calls do.
TRUST_HOST_OPS = True
HOST_FIRST_LINE = 1 << 20  # elements; benchmarks/bench_host_line.py measures where it sits


def _runs_on_host(check: OpCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if kwargs and ("out" in kwargs or not _on_host(kwargs.values())):
        return False
    # first the tensors: a GPU tensor's call, which is most of them, stops at the first one
    return _on_host(args) and not (check.writes is not None and check.writes(args, kwargs))


def _on_host(values: Iterable[Any]) -> bool:
    """Every tensor in host memory, none of them past HOST_FIRST_LINE elements."""
    for value in values:
        if isinstance(value, torch.Tensor):
            if not _small_on_host(value):
                return False
        elif type(value) is tuple or type(value) is list:  # x[idx, mask], index_put's indices
            for item in value:
                if isinstance(item, torch.Tensor) and not _small_on_host(item):
                    return False
    return True


def _small_on_host(tensor: torch.Tensor) -> bool:
    # A subclass's attributes are read through its __torch_function__, which may refuse or
    # count them: not read here (the rules do not read such a tensor's values either).
    return type(tensor) in PLAIN and tensor.is_cpu and tensor.numel() <= HOST_FIRST_LINE


def _host_error(
    check: OpCheck, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> BaseException | None:
    """On the failing path: PyTorch's own error for these values in host memory, run on copies
    of the tensors (so nothing is written), where that is quick and draws no random number. Its
    words go into the guard's message, so code that matches PyTorch's text still matches."""
    if check.random or not (_on_host(args) and _on_host(kwargs.values())):
        return None
    try:
        func(*_copies(args), **{key: _copies(value) for key, value in kwargs.items()})
    except Exception as error:
        return error
    return None


def _copies(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(_copies(v) for v in value)
    return value


def _accepts(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """On the failing path only: would torch take these arguments at all? The wrapper runs
    before torch parses them, and a bare call with a wrong argument raises a TypeError first
    (``x.bernoulli(out=y)``), so the guard must not answer for it."""
    if isinstance(func, FunctionType):  # torch.nn.functional's Python functions
        try:
            inspect.signature(func).bind(*args, **kwargs)
        except TypeError:
            return False
        except ValueError:  # no signature to bind against
            return True
        return True
    try:  # a builtin: let torch's parser judge the call, run on shapes alone
        func(*_on_meta(args), **{k: _on_meta(v) for k, v in kwargs.items()})
    except TypeError:
        return False
    except Exception:
        pass  # the parser took the arguments; what failed later is not our business here
    return True


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if type(value) in (list, tuple):
        return type(value)(_on_meta(v) for v in value)
    return value


def _inspect(check: OpCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Finding | None:
    try:
        requirements = check.extract(args, kwargs)
        if transforms_active():  # inside torch.func.vmap / grad: read the plain tensors
            requirements = unwrapped(requirements)
        return first_violation(requirements)
    except Exception:  # a check must never break a call PyTorch itself would accept
        STATS["check_failed"] += 1
        return None


def first_violation(requirements: list[Requirement]) -> Finding | None:
    """One fused reduction per requirement, one host read for all of them (a GPU's summaries
    travel together; a CPU tensor's values are read where they are)."""
    if not requirements:
        return None
    STATS["calls"] += 1
    if len(requirements) == 1:  # the usual call, one index tensor: judged with no lists built
        only = requirements[0]
        if only.trivially_holds():
            STATS["skipped"] += 1
            return None
        if only.tensor.is_cpu:
            STATS["transfers"] += 1
            return None if only.holds_now() else only.explain()
        live, on_host = requirements, False  # (what _live says of it, without asking again)
    else:
        live, on_host = _live(requirements)
    if not live:
        STATS["skipped"] += 1
        return None
    if on_host:
        STATS["transfers"] += 1
        return _judged_on_host(live)
    for requirement, values in zip(live, _read([r.summary() for r in live]), strict=True):
        if not requirement.holds(values):
            return requirement.explain()
    return None


def _live(requirements: list[Requirement]) -> tuple[list[Requirement], bool]:
    """The requirements whose values must be read, and whether all of them are in host memory."""
    if len(requirements) == 1:  # the usual call: no loop, and the list itself returned
        only = requirements[0]
        if only.trivially_holds():
            return [], True
        return requirements, only.tensor.is_cpu
    live = []
    on_host = True
    for requirement in requirements:
        if not requirement.trivially_holds():
            live.append(requirement)
            on_host = on_host and requirement.tensor.is_cpu
    return live, on_host


def _judged_on_host(live: list[Requirement]) -> Finding | None:
    for requirement in live:
        if not requirement.holds_now():
            return requirement.explain()
    return None


def _read(summaries: list[Summary]) -> list[list[Any]]:
    """Every summary's values, with one stack and one host transfer per dtype (each read in its
    own dtype, so a float64 bound is compared exactly). ``summaries`` is not empty."""
    parts = [part for summary in summaries for part in summary]
    dtype = parts[0].dtype
    if all(part.dtype == dtype for part in parts):  # the usual case: one dtype, one transfer
        STATS["transfers"] += 1
        flat: list[Any] = torch.stack(parts).tolist()
    else:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, part in enumerate(parts):
            by_dtype.setdefault(part.dtype, []).append(i)
        flat = [None] * len(parts)
        for places in by_dtype.values():
            STATS["transfers"] += 1
            values = torch.stack([parts[i] for i in places]).tolist()
            for i, value in zip(places, values, strict=True):
                flat[i] = value
    out = []
    start = 0
    for summary in summaries:
        out.append(flat[start : start + len(summary)])
        start += len(summary)
    return out
