"""The kinds of precondition a GPU kernel asserts, each as one fused device reduction.

Every requirement splits its work in two, so that a guarded call costs at most one host transfer
and a later non-blocking mode can keep the first half on the device:
- ``summary()``: 0-d tensors on the input's device (min/max, a zero-row count), no sync;
- ``holds(values)``: the decision on the host, from that summary's values;
- ``holds_now()``: both at once, for tensors in host memory, where reading costs no
  synchronisation and fewer ops are cheaper than one stacked summary;
- ``explain()``: only on the failing path, the positions and values for the message.
``trivially_holds()`` answers without touching the values where the answer is known (empty
tensors, dtypes whose whole range is valid). Summaries keep the checked tensor's own dtype, so a
float64 ``1 + 2**-52`` or ``5e-324`` is compared exactly as the op compares it.

For the deferred mode each requirement also says where its tensor sits in the call (``slot``)
and builds ``safe()``: the same tensor with every offending value replaced by a valid one, so the
launch cannot fault whatever the values are; for valid values it is the identity.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch

from .errors import Finding

SAMPLES = 5  # offending values shown in a message
# Up to this many values in host memory, reading them as Python numbers and sorting them
# (~0.5 us for 16 values, ~1.6 us for 64) costs about what one reduction and the reads of its
# results do (~1.3 us), and an ignore_index among them (-100) costs nothing more, where a
# reduction needs three more kernels to step over it.
_LISTED = 64

# aminmax has no kernel for the unsigned types beyond uint8 (torch 2.13, CPU)
_WIDEN = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}


# A requirement's verdict on the device: 0-d tensors, read together with the others (one
# stack and one transfer per dtype), never one by one on a GPU.
Summary = tuple[torch.Tensor, ...]

# Where a checked tensor sits in a call: (position, keyword, item of an index tuple or None).
Slot = tuple[int, str | None, int | None]


def _listed(t: torch.Tensor) -> list[Any]:
    """A small tensor's values as one flat list: rows of its ``tolist()`` joined, with no
    ``reshape`` (a dispatched op, ~0.6 us: half of what reading 32 values costs)."""
    dims = t.dim()
    if dims == 0:
        return [_item(t)]
    values: list[Any] = _tolist(t)
    for _ in range(dims - 1):
        values = list(chain.from_iterable(values))
    return values


def _dtype_bounds(dtype: torch.dtype) -> tuple[int, int] | None:
    try:
        return _BOUNDS[dtype]
    except KeyError:
        pass
    bounds: tuple[int, int] | None
    if dtype == torch.bool:
        bounds = 0, 1
    elif dtype.is_floating_point or dtype.is_complex:
        bounds = None
    else:
        info = torch.iinfo(dtype)
        bounds = int(info.min), int(info.max)
    _BOUNDS[dtype] = bounds
    return bounds


_BOUNDS: dict[torch.dtype, tuple[int, int] | None] = {}
# torch's own, not torch.Tensor.item: the guard wraps that one while it is active
_item = torch._C.TensorBase.item
_tolist = torch._C.TensorBase.tolist


class _Scratch(threading.local):
    """Per thread: for each dtype, a two-element host tensor and its two 0-d views, which
    ``aminmax(out=...)`` fills, so both extremes come back in one read (~0.4 us less than
    reading two fresh 0-d results, per checked call on host memory)."""

    def __init__(self) -> None:
        self.pairs: dict[torch.dtype, tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}


_SCRATCH = _Scratch()


def _extremes(t: torch.Tensor) -> list[Any]:
    """[min, max] of a tensor in host memory, in its own dtype."""
    pairs = _SCRATCH.pairs
    found = pairs.get(t.dtype)
    if found is None:
        # a normal tensor even when first made in inference mode (an inference tensor could not
        # be written outside it), on the host whatever device a ``with torch.device`` names
        with torch.inference_mode(False):
            both = torch.empty(2, dtype=t.dtype, device="cpu")
        if type(both) is not torch.Tensor:  # made under a mode (fake tensors): no scratch
            low, high = torch.aminmax(t)
            return [_item(low), _item(high)]
        found = pairs[t.dtype] = (both, (both[0], both[1]))
    try:
        torch.aminmax(t, out=found[1])
    except RuntimeError:  # a wrapped tensor (functorch) that refuses a plain out=: as before
        low, high = torch.aminmax(t)
        return [_item(low), _item(high)]
    return _tolist(found[0])


def _position(flat: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return f"[{flat}]"
    coords = []
    for size in reversed(shape):
        coords.append(flat % size)
        flat //= size
    return "[" + ", ".join(str(c) for c in reversed(coords)) + "]"


def _samples(values: torch.Tensor, bad: torch.Tensor) -> tuple[int, tuple[tuple[str, str], ...]]:
    flat_bad = bad.reshape(-1)
    count = int(flat_bad.sum().item())
    where = flat_bad.nonzero().reshape(-1)[:SAMPLES].tolist()
    flat_values = values.reshape(-1)
    shape = tuple(values.shape)
    return count, tuple((_position(i, shape), _show(flat_values[i].item())) for i in where)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


@dataclass(slots=True)  # not frozen: a frozen one costs ~1.7 us more to build, per call
class IntRange:
    """Every value v satisfies lo <= v < hi, or v == ignore (cross_entropy's ignore_index)."""

    argument: str
    tensor: torch.Tensor
    lo: int
    hi: int
    source: str
    problem: str = "index out of range"
    ignore: int | None = None
    slot: Slot | None = None
    _memo: tuple[torch.Tensor, torch.Tensor | None] | None = field(
        default=None, repr=False, compare=False
    )

    def _outside_ignore(self) -> int | None:
        """ignore_index where it matters: outside [lo, hi), where it cannot pass as valid."""
        if self.ignore is None or self.lo <= self.ignore < self.hi:
            return None
        return self.ignore

    def trivially_holds(self) -> bool:
        t = self.tensor
        if t.numel() == 0:
            return True
        bounds = _BOUNDS.get(t.dtype) or _dtype_bounds(t.dtype)
        return bounds is not None and self.lo <= bounds[0] and bounds[1] < self.hi

    def _mapped(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The values with an ignore_index outside the range (-100) mapped into it, so one
        min/max decides, and where it was; computed once for summary() and safe()."""
        if self._memo is None:
            t = self.tensor.detach()
            if t.dtype in _WIDEN or t.dtype == torch.bool:
                t = t.to(torch.int64)
            ignore = self._outside_ignore()
            if ignore is None:
                self._memo = t, None
            else:
                is_ignore = torch.eq(t, ignore)
                self._memo = t.masked_fill(is_ignore, self.lo), is_ignore
        return self._memo

    def summary(self) -> Summary:
        low, high = torch.aminmax(self._mapped()[0])
        return low, high

    def holds(self, values: list[Any]) -> bool:
        low, high = values
        return bool(self.lo <= low and high < self.hi)

    def holds_now(self) -> bool:
        """The verdict read at once (host memory). A few values are read as Python ints and
        sorted (faster than starting a kernel); more take one reduction. The ignore_index is
        looked at only where an extreme value breaks the range: it lies outside the range, so
        it is the smallest or the largest value there, and the next one decides."""
        t = self.tensor
        if t.numel() <= _LISTED:
            values: list[int] = _listed(t)
            values.sort()
            if not values or (self.lo <= values[0] and values[-1] < self.hi):
                return True
            ignore = self._outside_ignore()
            if ignore is None:
                return False
            low, high = values[0], values[-1]
            if low == ignore:  # -100: step over it
                after = bisect_right(values, ignore)
                if after == len(values):
                    return True
                low = values[after]
            elif high == ignore:  # 255 above the classes: step back over it
                high = values[bisect_left(values, ignore) - 1]
            return self.lo <= low and high < self.hi
        if t.dtype in _WIDEN or t.dtype == torch.bool:
            return self.holds([_item(v) for v in self.summary()])
        smallest, largest = _extremes(t)
        if self.lo <= smallest and largest < self.hi:
            return True
        ignore = self._outside_ignore()
        if ignore is None or (smallest != ignore and largest != ignore):
            return False
        return self.holds([_item(v) for v in self.summary()])  # with the ignore_index mapped

    def safe(self, value: Any) -> torch.Tensor | None:
        t = value if isinstance(value, torch.Tensor) else self.tensor
        bounds = _dtype_bounds(t.dtype)
        if bounds is None:
            return None
        lo, hi = max(self.lo, bounds[0]), min(self.hi - 1, bounds[1])
        if lo > hi:
            return None  # no valid value to put there: the caller checks at once instead
        if t.dtype == torch.bool:
            return t
        ignore = self._outside_ignore()
        keep_ignore = ignore is not None and bounds[0] <= ignore <= bounds[1]
        mapped, is_ignore = self._mapped()
        if t is self.tensor and mapped.dtype == t.dtype:
            clamped = mapped.clamp(lo, hi)  # reuses the summary's work (one kernel fewer)
        else:
            clamped = t.clamp(lo, hi)
            is_ignore = torch.eq(t, ignore) if keep_ignore and ignore is not None else None
        if keep_ignore and is_ignore is not None:
            clamped = torch.where(is_ignore, t, clamped)
        return clamped

    @property
    def valid(self) -> str:
        text = f"{self.lo} <= value < {self.hi}"
        if self._outside_ignore() is not None:
            text += f", or == ignore_index ({self.ignore})"
        return text

    def explain(self) -> Finding:
        t = self.tensor.detach()
        if t.dtype in _WIDEN:
            t = t.to(torch.int64)
        bad = (t < self.lo) | (t >= self.hi)
        ignore = self._outside_ignore()
        if ignore is not None:
            bad &= torch.ne(t, ignore)
        count, samples = _samples(t, bad)
        return Finding(
            self.argument,
            self.problem,
            self.valid,
            self.source,
            count,
            t.numel(),
            samples,
            limit=self.hi,
            distinct=tuple(int(v) for v in t[bad].unique()[:SAMPLES].tolist()),
        )


@dataclass(slots=True)  # not frozen: a frozen one costs ~1.7 us more to build, per call
class FloatRange:
    """Every value v is a number with lo <= v <= hi (NaN fails, as in the kernels' checks)."""

    argument: str
    tensor: torch.Tensor
    lo: float
    hi: float
    source: str
    problem: str
    slot: Slot | None = None

    def trivially_holds(self) -> bool:
        return self.tensor.numel() == 0 or not self.tensor.dtype.is_floating_point

    def summary(self) -> Summary:
        low, high = torch.aminmax(self.tensor.detach())  # NaN propagates into both
        return low, high

    def holds_now(self) -> bool:
        low, high = torch.aminmax(self.tensor.detach())
        return bool(self.lo <= _item(low) and _item(high) <= self.hi)  # NaN compares False

    def safe(self, value: Any) -> torch.Tensor | None:
        t = value if isinstance(value, torch.Tensor) else self.tensor
        clamped = t.clamp(self.lo, self.hi)  # the identity (and its gradient) inside the range
        # (where, not masked_fill: the result keeps the input's layout, as the op's output does)
        return torch.where(torch.isnan(clamped), self.lo, clamped)

    def holds(self, values: list[Any]) -> bool:
        low, high = values
        return bool(self.lo <= low and high <= self.hi)

    @property
    def valid(self) -> str:
        if math.isinf(self.hi):
            return f"[{_show(self.lo)}, inf]"
        return f"[{_show(self.lo)}, {_show(self.hi)}]"

    def explain(self) -> Finding:
        t = self.tensor.detach()
        bad = ~((t >= self.lo) & (t <= self.hi))
        count, samples = _samples(t, bad)
        return Finding(
            self.argument, self.problem, self.valid, self.source, count, t.numel(), samples
        )


@dataclass(slots=True)  # not frozen: a frozen one costs ~1.7 us more to build, per call
class ProbabilityRows:
    """multinomial's input: no NaN, inf or negative entry, and every row sums to more than 0."""

    argument: str
    tensor: torch.Tensor
    slot: Slot | None = None

    def trivially_holds(self) -> bool:
        return self.tensor.numel() == 0 or not self.tensor.dtype.is_floating_point

    def summary(self) -> Summary:
        t = self.tensor.detach()
        low, high = torch.aminmax(t)
        # multinomial's own test: a row whose sum, in the input's dtype, equals 0
        zero_rows = torch.eq(t.sum(-1), 0).sum().to(t.dtype)
        return low, high, zero_rows

    def holds(self, values: list[Any]) -> bool:
        low, high, zero_rows = values
        return bool(low >= 0 and high < math.inf and zero_rows == 0)

    def holds_now(self) -> bool:
        return self.holds([_item(v) for v in self.summary()])

    def safe(self, value: Any) -> torch.Tensor | None:
        t = value if isinstance(value, torch.Tensor) else self.tensor
        finite = torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0).clamp(min=0)
        return finite + torch.eq(finite.sum(-1, keepdim=True), 0).to(finite.dtype)

    def explain(self) -> Finding:
        t = self.tensor.detach()
        bad = ~((t >= 0) & (t < math.inf))
        count, samples = _samples(t, bad)
        problem = "probabilities contain NaN, inf or a negative value"
        if count == 0:  # all entries fine: some row sums to zero
            rows = t.reshape(-1, t.shape[-1]) if t.dim() > 0 else t.reshape(1, 1)
            zero = torch.eq(rows.sum(-1), 0)
            count, samples = _samples(rows.sum(-1), zero)
            samples = tuple((f"row {pos}", f"sum {value}") for pos, value in samples)
            problem = "a row of probabilities sums to 0"
        return Finding(
            self.argument,
            problem,
            "finite values >= 0 with every row summing to more than 0",
            "the definition of a probability distribution",
            count,
            t.numel(),
            samples,
        )


@dataclass(slots=True)  # not frozen: a frozen one costs ~1.7 us more to build, per call
class Offsets:
    """embedding_bag offsets: start at 0, never decrease, and end within the indices."""

    argument: str
    tensor: torch.Tensor
    n_indices: int
    slot: Slot | None = None

    def trivially_holds(self) -> bool:
        return self.tensor.numel() == 0

    def summary(self) -> Summary:
        t = self.tensor.detach().reshape(-1).to(torch.int64)
        # compared, not subtracted: a difference overflows for offsets near the int64 limits
        decreases = torch.lt(t[1:], t[:-1]).sum()
        return t[0], decreases, t[-1]

    def holds(self, values: list[Any]) -> bool:
        first, decreases, last = values
        return bool(first == 0 and decreases == 0 and last <= self.n_indices)

    def holds_now(self) -> bool:
        return self.holds([_item(v) for v in self.summary()])

    def safe(self, value: Any) -> torch.Tensor | None:
        t = value if isinstance(value, torch.Tensor) else self.tensor
        ordered = torch.cummax(t.clamp(0, self.n_indices), 0).values
        return ordered - ordered[:1]

    def explain(self) -> Finding:
        t = self.tensor.detach().reshape(-1).to(torch.int64)
        bad = t > self.n_indices
        bad[1:] |= t[1:] < t[:-1]
        bad[0] |= t[0] != 0
        count, samples = _samples(t, bad)
        return Finding(
            self.argument,
            "offsets out of order",
            f"offsets[0] == 0, non-decreasing, and <= {self.n_indices}",
            f"the {self.n_indices} indices in input",
            count,
            t.numel(),
            samples,
        )


@dataclass(slots=True)  # not frozen: a frozen one costs ~1.7 us more to build, per call
class Repeats:
    """repeat_interleave's repeats: none negative, and summing to output_size where given."""

    argument: str
    tensor: torch.Tensor
    output_size: int | None
    slot: Slot | None = None

    def trivially_holds(self) -> bool:
        return self.tensor.numel() == 0 or self.tensor.dtype.is_floating_point

    def summary(self) -> Summary:
        t = self.tensor.detach().reshape(-1).to(torch.int64)
        return t.min(), t.sum()

    def holds(self, values: list[Any]) -> bool:
        low, total = values
        return bool(low >= 0 and (self.output_size is None or total == self.output_size))

    def holds_now(self) -> bool:
        return self.holds([_item(v) for v in self.summary()])

    def safe(self, value: Any) -> torch.Tensor | None:
        t = value if isinstance(value, torch.Tensor) else self.tensor
        if self.output_size is None:
            return t.clamp(min=0)
        # counts that add up to output_size exactly, used only where the given ones do not
        n = t.numel()
        share, rest = divmod(self.output_size, n)
        even = torch.full((n,), share, dtype=t.dtype, device=t.device)
        even[:rest] += 1
        even = even.reshape(t.shape)
        ok = (t >= 0).all() & torch.eq(t.sum(), self.output_size)
        return torch.where(ok, t, even)

    def explain(self) -> Finding:
        t = self.tensor.detach().reshape(-1).to(torch.int64)
        count, samples = _samples(t, t < 0)
        if count:
            return Finding(
                self.argument, "negative repeat count", "values >= 0", "", count, t.numel(), samples
            )
        total = int(t.sum().item())
        return Finding(
            self.argument,
            "repeats do not add up to output_size",
            f"values summing to output_size = {self.output_size}",
            "the output_size argument",
            1,
            t.numel(),
            (("sum", str(total)),),
        )


Requirement = IntRange | FloatRange | ProbabilityRows | Offsets | Repeats

# (torch.func's C parts: in torch 2.0 and later; before, no call runs inside a transform)
_functorch: Any = getattr(torch._C, "_functorch", None)
transforms_active: Any = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def unwrapped(requirements: list[Requirement]) -> list[Requirement]:
    """The requirements of a call made inside ``torch.func`` transforms (``vmap``, ``grad``,
    ``jacrev``, ``functionalize``; per-sample gradients), on the plain tensors that hold their
    values.

    Inside ``vmap`` a checked tensor is a wrapper whose values cannot be read (``tolist()``
    raises), and a summary built from it must not outlive the transform: the deferred mode read
    one at the end of the block and failed with an internal assert of functorch on valid code.
    The values of a vmapped tensor are those of its physical tensor, one slice per batch entry,
    the batch dimensions moved to the front so that a row is still the last dimension. Offsets
    and repeats are judged as a whole sequence, which a batch of them is not: those are left to
    PyTorch there. A wrapper of another kind is left unchecked too. (Under ``functionalize`` a
    summary of a functional tensor could not be read after it either: "tolist() shouldn't be
    called on a tensor with unallocated storage".)"""
    kept: list[Requirement] = []
    for requirement in requirements:
        t: torch.Tensor | None = requirement.tensor
        batched = False
        while t is not None and _functorch.is_functorch_wrapped_tensor(t):
            if _functorch.is_batchedtensor(t):
                batched = True
                t = _functorch.get_unwrapped(t).movedim(_functorch.maybe_get_bdim(t), 0)
            elif _functorch.is_gradtrackingtensor(t):
                t = _functorch.get_unwrapped(t)
            elif _functorch.is_functionaltensor(t):  # functionalize: its pending writes applied
                t = _functorch._unwrap_functional_tensor(t, False)
            else:
                t = None
        if t is None or (batched and isinstance(requirement, (Offsets, Repeats))):
            continue
        requirement.tensor = t
        kept.append(requirement)
    return kept
