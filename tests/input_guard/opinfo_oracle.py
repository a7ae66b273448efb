"""PyTorch's own test inputs for every checked op, and boundary values derived from them, with the
bare CPU op as the oracle: the guard must raise exactly when the CPU op raises, and an exception
of the CPU op's class.

The inputs come from ``torch.testing._internal`` (``op_db``'s sample, reference and error inputs;
``module_db``'s forward inputs). Each input is then varied one element at a time: integer tensors
get the edges of every size in the call (``-s-1 .. s``) and of their dtype, floating tensors get
the edges of ``[0, 1]`` and of ``[0, inf)`` exact in their own dtype (the next value after 1, the
smallest subnormal, -0.0, NaN, +-inf, the dtype's max). Nothing here knows the guard's rules.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

# op_db names of the checked ops (ctc_loss is left out: the CPU op does not check its targets,
# the guard does on purpose, tests/input_guard/test_guard_ops.py covers it).
OP_NAMES = (
    "nn.functional.cross_entropy",
    "nn.functional.nll_loss",
    "nn.functional.multi_margin_loss",
    "nn.functional.binary_cross_entropy",
    "nn.functional.embedding",
    "nn.functional.embedding_bag",
    "multinomial",
    "bernoulli",
    "gather",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_select",
    "index_add",
    "index_copy",
    "index_fill",
    "index_put",
    "__getitem__",
    "take",
    "put",
    "nn.functional.one_hot",
    "repeat_interleave",
    "nn.functional.max_unpool1d",
    "nn.functional.max_unpool2d",
    "nn.functional.max_unpool3d",
)
MODULE_NAMES = ("Embedding", "NLLLoss", "CrossEntropyLoss", "MultiMarginLoss", "BCELoss")

# Within CI's minutes: every dtype's edges are exercised, but past the first two dtypes only a few
# samples each and the functional form only; the value checks depend on the dtype of the checked
# argument (varied below), much less on that of the data around it.
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8)
SAMPLES_PER_DTYPE = {torch.float32: 24, torch.float64: 8}
SAMPLES_OTHER_DTYPES = 3
MODULE_INPUTS = 12
MAX_ELEMENTS = 2048


@dataclass
class Case:
    name: str
    call: Callable[[], Any]


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _sizes(values: list[Any]) -> set[int]:
    found: set[int] = set()
    for v in values:
        if isinstance(v, torch.Tensor):
            found.update(v.shape)
            found.add(v.numel())
        elif isinstance(v, (list, tuple)):
            found |= _sizes(list(v))
        elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 20:
            found.add(v)  # output_size, num_classes
    return found


def _int_candidates(dtype: torch.dtype, sizes: set[int]) -> list[int]:
    info = torch.iinfo(dtype)
    wanted = {0, -1, -100, info.min, info.max}
    for s in sizes:
        wanted |= {s - 1, s, s + 1, -s, -s - 1}
    return sorted(v for v in wanted if info.min <= v <= info.max)


def _float_candidates(dtype: torch.dtype) -> list[torch.Tensor]:
    one = torch.ones((), dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    info = torch.finfo(dtype)
    tiny = torch.nextafter(zero, one)  # the smallest subnormal of this dtype
    values = [
        zero,
        -zero,
        one,
        torch.nextafter(one, 2 * one),
        torch.nextafter(one, zero),
        tiny,
        -tiny,
        -one,
        torch.full((), float("nan"), dtype=dtype),
        torch.full((), float("inf"), dtype=dtype),
        torch.full((), float("-inf"), dtype=dtype),
        torch.full((), info.max, dtype=dtype),
    ]
    return values


def _slots(sample: Any) -> list[tuple[str, Any, Callable[[Any, Any], Any]]]:
    """(label, tensor, put) for each tensor of a sample, put(sample, new) giving a new sample."""
    found: list[tuple[str, Any, Callable[[Any, Any], Any]]] = []

    def add(label: str, value: Any, put: Callable[[Any, Any], Any]) -> None:
        if isinstance(value, torch.Tensor) and value.numel() > 0 and value.dtype != torch.bool:
            found.append((label, value, put))

    add("input", sample.input, lambda s, new: (new, s.args, s.kwargs))
    for i, arg in enumerate(sample.args):
        add(f"args[{i}]", arg, lambda s, new, i=i: (s.input, _put(s.args, i, new), s.kwargs))
        if isinstance(arg, (list, tuple)):
            for j, item in enumerate(arg):
                add(
                    f"args[{i}][{j}]",
                    item,
                    lambda s, new, i=i, j=j: (
                        s.input,
                        _put(s.args, i, type(s.args[i])(_put(s.args[i], j, new))),
                        s.kwargs,
                    ),
                )
    for key, arg in sample.kwargs.items():
        add(key, arg, lambda s, new, key=key: (s.input, s.args, {**s.kwargs, key: new}))
    return found


def _put(seq: Any, index: int, new: Any) -> tuple[Any, ...]:
    items = list(seq)
    items[index] = new
    return tuple(items)


@dataclass
class Sample:
    input: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def variants(sample: Sample) -> Iterator[tuple[str, Sample]]:
    """The sample itself, then one element of one tensor at a time set to each boundary value."""
    yield "as given", sample
    sizes = _sizes([sample.input, *sample.args, *sample.kwargs.values()])
    for label, tensor, put in _slots(sample):
        flat_positions = sorted({0, tensor.numel() - 1})
        if tensor.dtype.is_floating_point:
            flat_positions = [tensor.numel() - 1]
            candidates: list[Any] = _float_candidates(tensor.dtype)
        elif tensor.dtype.is_complex:
            continue
        else:
            candidates = _int_candidates(tensor.dtype, sizes)
        for position in flat_positions:
            for value in candidates:
                new = tensor.detach().clone(memory_format=torch.contiguous_format)
                new.view(-1)[position] = value
                new.requires_grad_(tensor.requires_grad)
                shown = value.item() if isinstance(value, torch.Tensor) else value
                yield f"{label}[{position}]={shown!r}", Sample(*put(sample, new))


def cuda_asserts(name: str, sample: Sample) -> bool:
    """Values the CPU op takes but the CUDA kernel asserts on, as that kernel states it.

    ``embedding_bag``'s offsets: EmbeddingBag.cu takes bag ``b`` from ``begin = offsets[b]``
    (0 for the first bag, whatever ``offsets[0]`` says) to ``end = offsets[b + 1]`` (the number
    of indices after the last offset, unless ``include_last_offset``) and asserts
    ``end >= begin``. Depending on mode and ``include_last_offset`` the CPU op raises, returns,
    or reports a value it read from outside the input ("Index -1 of input takes value
    7232166166", torch 2.13); the guard must reject them all (GuardIndexError, both classes).
    """
    if "embedding_bag" not in name and "EmbeddingBag" not in name:
        return False
    offsets = sample.kwargs.get("offsets", sample.args[1] if len(sample.args) > 1 else None)
    # op_db's samples put the weight first: the indices are the integer tensor beside it
    indices = next(
        (
            t
            for t in (sample.input, *sample.args)
            if isinstance(t, torch.Tensor) and t is not offsets and not t.is_floating_point()
        ),
        None,
    )
    if not isinstance(offsets, torch.Tensor) or offsets.numel() == 0:
        return False
    if indices is None or indices.dim() != 1:
        return False
    flat = [int(v) for v in offsets.reshape(-1).tolist()]
    include_last = bool(sample.kwargs.get("include_last_offset", False))
    ends = flat[1:] if include_last else [*flat[1:], indices.numel()]
    begins = [0, *flat[1:]][: len(ends)]
    return any(end < begin for begin, end in zip(begins, ends, strict=True))


def _outcome(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as error:  # the op's own exception is the answer
        return error
    return None


def compare(
    function: Callable[..., Any], sample: Sample, guard_factory: Any, device_asserts: bool = False
) -> str | None:
    """None when the guarded call raises exactly as the bare one (same class), else why not;
    ``device_asserts``: the CUDA kernel asserts on these values, so the guard must raise even
    where the CPU op does not."""

    def bare() -> Any:
        return function(_clone(sample.input), *_clone(sample.args), **_clone(sample.kwargs))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _outcome(bare)

        def guarded() -> None:
            with guard_factory():
                bare()  # a deferred verdict is raised as the block ends

        got = _outcome(guarded)
    if expected is None and device_asserts:
        if got is None:
            return "missed: the CPU op takes these values, the CUDA kernel asserts on them"
        return None
    if expected is None and got is None:
        return None
    if expected is None:
        return f"false alarm: {type(got).__name__}: {str(got).splitlines()[0]}"
    if got is None:
        return f"missed: CPU raises {type(expected).__name__}: {str(expected).splitlines()[0]}"
    if not isinstance(got, type(expected)):
        return (
            f"class: CPU raises {type(expected).__name__}, guarded {type(got).__name__}: "
            f"{str(got).splitlines()[0]}"
        )
    return None


def op_infos() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    # scatter_reduce's five reductions share one check (two are enough here); max_unpool's
    # "grad" entries call the same function as the plain ones
    skip = {"prod", "mean", "amin", "grad"}
    return [op for op in op_db if op.name in OP_NAMES and op.variant_test_name not in skip]


def late_bound(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function as user code reaches it: looked up by name at each call.

    op_db holds the function objects it found at import (``torch.gather``, the
    ``TensorBase.gather`` descriptor); a call through such a reference bypasses whatever torch
    exposes under that name at call time, as ``x.gather(...)`` or ``torch.gather(...)`` in user
    code does not. Lambdas already look their op up when called.
    """
    name = getattr(function, "__name__", "")
    for owner in (torch.nn.functional, torch, torch.Tensor):
        if name and getattr(owner, name, None) is function:

            def call(*args: Any, owner: Any = owner, **kwargs: Any) -> Any:
                return getattr(owner, name)(*args, **kwargs)

            return call
    return function


def op_samples(op: Any) -> Iterator[tuple[str, Callable[..., Any], Sample]]:
    """(label, function, sample) for the op's functional, method and in-place forms."""
    supported = op.supported_dtypes("cpu")
    functions = [("op", late_bound(op.op))]
    if op.method_variant is not None:
        functions.append(("method", late_bound(op.method_variant)))
    if op.inplace_variant is not None:
        functions.append(("inplace", late_bound(op.inplace_variant)))
    for dtype in DTYPES:
        if dtype not in supported:
            continue
        sources = [op.sample_inputs("cpu", dtype, requires_grad=False)]
        if op.reference_inputs_func is not None:
            sources.append(op.reference_inputs("cpu", dtype, requires_grad=False))
        limit = SAMPLES_PER_DTYPE.get(dtype, SAMPLES_OTHER_DTYPES)
        if "max_unpool" in op.name:  # each call allocates its output plane: fewer, same edges
            limit = max(1, limit // 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = [s for source in sources for s in _safe_iter(source) if _small(s)][:limit]
        if op.error_inputs_func is not None and dtype == DTYPES[0]:
            errors = [e.sample_input for e in _safe_iter(op.error_inputs("cpu"))]
            found += [e for e in errors if _small(e)]
        forms = functions if dtype == DTYPES[0] else functions[:1]
        for index, s in enumerate(found):
            sample = Sample(s.input, tuple(s.args), dict(s.kwargs))
            for form, function in forms:
                yield f"{op.name}.{op.variant_test_name} {form} {dtype} #{index}", function, sample


def _small(sample: Any) -> bool:
    """Large inputs add no edge the small ones lack, only time."""
    values = [sample.input, *sample.args, *sample.kwargs.values()]
    return _sizes_total(values) <= MAX_ELEMENTS


def _sizes_total(values: list[Any]) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel()
        elif isinstance(v, (list, tuple)):
            total += _sizes_total(list(v))
    return total


def _safe_iter(source: Any) -> list[Any]:
    out = []
    try:
        for item in source:
            out.append(item)
    except Exception:  # a generator that needs something this build lacks
        pass
    return out


def module_samples(name: str) -> Iterator[tuple[str, Callable[..., Any], Sample]]:
    from torch.testing._internal.common_modules import module_db

    for info in module_db:
        if info.module_cls.__name__ != name:
            continue
        for dtype in (torch.float32, torch.float64):
            for training in (False,):  # no checked module behaves differently in training
                inputs = info.module_inputs_func(
                    info, device="cpu", dtype=dtype, requires_grad=False, training=training
                )
                for index, mi in enumerate(inputs):
                    if index >= MODULE_INPUTS:
                        break
                    if mi.forward_input is None:
                        continue
                    c = mi.constructor_input
                    torch.manual_seed(0)
                    module = info.module_cls(*c.args, **c.kwargs).to(dtype)
                    args = mi.forward_input.args
                    if not args or _sizes_total(list(args)) > MAX_ELEMENTS:
                        continue
                    sample = Sample(args[0], tuple(args[1:]), dict(mi.forward_input.kwargs))

                    def function(*a: Any, module: Any = module, **k: Any) -> Any:
                        return copy.deepcopy(module)(*a, **k)

                    yield f"{name} {dtype} train={training} #{index}", function, sample
