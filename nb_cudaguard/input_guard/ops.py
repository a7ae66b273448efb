"""Which calls the guard checks, and what each one's GPU kernel asserts about its arguments.

One entry per op: its entry points, which the guard wraps while it is active (functional form,
tensor method, in-place method), and how to turn a call's arguments into requirements (pure
host work: shapes and arguments, no tensor values). The conditions follow PyTorch's own CPU
checks, which the tests compare against call by call; where CUDA checks nothing at all
(ctc_loss targets) the condition is the one the kernel silently relies on.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .requirements import (
    FloatRange,
    IntRange,
    Offsets,
    ProbabilityRows,
    Repeats,
    Requirement,
    Slot,
)

Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Extract = Callable[[Args, Kwargs], list[Requirement]]

_BIG = 1 << 62  # an upper bound no real size reaches


def _arg(args: Args, kwargs: Kwargs, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


PLAIN = (torch.Tensor, torch.nn.Parameter)
_INDEX_DTYPES = frozenset(
    d
    for d in vars(torch).values()
    if isinstance(d, torch.dtype) and not (d.is_floating_point or d.is_complex or d == torch.bool)
)


def _is_plain(value: Any) -> bool:
    """A tensor whose values can be read: not a FakeTensor, DTensor or other subclass, not meta."""
    return type(value) in PLAIN and not value.is_meta


def _is_index(value: Any) -> bool:
    return type(value) in PLAIN and value.dtype in _INDEX_DTYPES and not value.is_meta


def _size(t: torch.Tensor, dim: Any) -> tuple[int, int] | None:
    """(normalised dim, size) as the gather/scatter family sees it; a 0-d tensor has size 1."""
    if not isinstance(dim, int):
        if isinstance(dim, torch.Tensor):
            return None  # (reading a GPU tensor's value would wait for the device)
        try:
            dim = operator.index(dim)  # a numpy integer, which PyTorch takes as a dim too
        except TypeError:
            return None  # a dimension's name: PyTorch reports what it does not take itself
    ndim = max(t.dim(), 1)
    if not -ndim <= dim < ndim:
        return None  # PyTorch reports a bad dim itself
    dim %= ndim
    return dim, (t.shape[dim] if t.dim() else 1)


# --- losses -----------------------------------------------------------------------------------
def _class_targets(args: Args, kwargs: Kwargs) -> list[Requirement]:
    """cross_entropy's and nll_loss's class indices. A floating target (cross_entropy's class
    probabilities) is no index: any values are valid."""
    n = len(args)  # _arg inlined: this runs for every checked loss
    logits: Any = args[0] if n > 0 else kwargs.get("input")
    target: Any = args[1] if n > 1 else kwargs.get("target")
    if not (_is_plain(logits) and _is_index(target)):
        return []
    dims = logits.dim()
    if dims == 0:
        return []
    ignore = args[4] if n > 4 else kwargs.get("ignore_index", -100)
    class_dim = 0 if dims == 1 else 1
    classes = logits.shape[class_dim]
    return [
        IntRange(
            "target",
            target,
            0,
            classes,
            f"input.shape[{class_dim}] = {classes}, the number of classes",
            problem="class index out of range",
            ignore=int(ignore),
            slot=(1, "target", None),
        )
    ]


_cross_entropy = _nll_loss = _class_targets


def _multi_margin(args: Args, kwargs: Kwargs) -> list[Requirement]:
    logits, target = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "target")
    if not (_is_plain(logits) and _is_index(target)):
        return []
    classes = logits.shape[-1] if logits.dim() else 1  # a 0-d input is one class
    source = f"input.shape[-1] = {classes}, the number of classes"
    problem = "class index out of range"
    return [IntRange("target", target, 0, classes, source, problem, slot=(1, "target", None))]


def _binary_cross_entropy(args: Args, kwargs: Kwargs) -> list[Requirement]:
    found: list[Requirement] = []
    for index, name in ((0, "input"), (1, "target")):
        value = _arg(args, kwargs, index, name)
        if _is_plain(value):
            problem = "probability outside [0, 1]"
            found.append(FloatRange(name, value, 0.0, 1.0, "", problem, (index, name, None)))
    return found


def _ctc_loss(args: Args, kwargs: Kwargs) -> list[Requirement]:
    log_probs, targets = _arg(args, kwargs, 0, "log_probs"), _arg(args, kwargs, 1, "targets")
    lengths = _arg(args, kwargs, 3, "target_lengths")
    if not (_is_plain(log_probs) and _is_index(targets)) or log_probs.dim() == 0:
        return []
    classes = log_probs.shape[-1]
    used = _ctc_used_targets(targets, lengths)
    if used is None:
        return []
    source = f"log_probs.shape[-1] = {classes}, the number of classes (blank included)"
    problem = "class index out of range"
    return [IntRange("targets", used, 0, classes, source, problem, slot=(1, "targets", None))]


def _ctc_used_targets(targets: torch.Tensor, lengths: Any) -> torch.Tensor | None:
    """Only the first target_lengths[i] entries of each row are read: padding may be anything."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.to(targets.device)
    elif isinstance(lengths, Sequence):
        lengths = torch.as_tensor(list(lengths), device=targets.device)
    else:
        return None
    if targets.dim() == 2 and lengths.dim() == 1 and lengths.numel() == targets.shape[0]:
        used = torch.arange(targets.shape[1], device=targets.device) < lengths[:, None]
        # unread padding becomes 0, a valid class, so one min/max still decides
        return targets.masked_fill(~used, 0)
    if targets.dim() == 1 and lengths.device.type == "cpu":
        return targets[: int(lengths.sum())]
    return targets if targets.dim() == 1 else None


# --- embeddings -------------------------------------------------------------------------------
def _ids(ids: Any, weight: Any, slot: Slot) -> list[Requirement]:
    if not (_is_index(ids) and _is_plain(weight)) or weight.dim() == 0:
        return []
    rows = weight.shape[0]
    source = f"weight.shape[0] = {rows}, the number of embeddings"
    return [IntRange("input", ids, 0, rows, source, "token id out of range", slot=slot)]


_INPUT_SLOT: Slot = (0, "input", None)
_INDICES_SLOT: Slot = (1, "indices", None)


def _embedding(args: Args, kwargs: Kwargs) -> list[Requirement]:
    n = len(args)  # _arg inlined: this runs for every embedding call
    ids: Any = args[0] if n > 0 else kwargs.get("input")
    weight: Any = args[1] if n > 1 else kwargs.get("weight")
    return _ids(ids, weight, _INPUT_SLOT)


def _torch_embedding(args: Args, kwargs: Kwargs) -> list[Requirement]:
    # torch.embedding(weight, indices, ...) takes its arguments the other way round
    weight, ids = _arg(args, kwargs, 0, "weight"), _arg(args, kwargs, 1, "indices")
    return _ids(ids, weight, _INDICES_SLOT)


def _embedding_bag(args: Args, kwargs: Kwargs, inner: bool = False) -> list[Requirement]:
    if inner:  # torch.embedding_bag(weight, indices, offsets, ...), what F.embedding_bag calls
        weight, ids = _arg(args, kwargs, 0, "weight"), _arg(args, kwargs, 1, "indices")
        id_slot: Slot = (1, "indices", None)
    else:
        ids, weight = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
        id_slot = (0, "input", None)
        if _is_plain(ids) and ids.is_floating_point() and _is_index(weight):
            # the old order, F.embedding_bag(weight, input, offsets), which PyTorch still takes
            # (with a warning: torch/nn/functional.py, embedding_bag) and swaps
            ids, weight, id_slot = weight, ids, (1, "weight", None)
    offsets = _arg(args, kwargs, 2, "offsets")
    found = _ids(ids, weight, id_slot)
    if found and ids.dim() == 1 and _is_index(offsets) and offsets.dim() == 1:
        found.append(Offsets("offsets", offsets, ids.numel(), slot=(2, "offsets", None)))
    return found


def _renorms(args: Args, kwargs: Kwargs) -> bool:
    """F.embedding(_bag) with max_norm rescales rows of the weight in place, ids unchecked."""
    return _arg(args, kwargs, 3, "max_norm") is not None


# --- sampling ---------------------------------------------------------------------------------
def _multinomial(args: Args, kwargs: Kwargs) -> list[Requirement]:
    probs = _arg(args, kwargs, 0, "input")
    if not _is_plain(probs) or probs.dim() not in (1, 2):
        return []
    return [ProbabilityRows("input", probs, slot=(0, "input", None))]


def _bernoulli(args: Args, kwargs: Kwargs) -> list[Requirement]:
    # bernoulli(input) draws with probabilities input; bernoulli(input, p=0.5) ignores its values
    probs, p = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "p")
    if p is not None or not _is_plain(probs):
        return []
    problem = "probability outside [0, 1]"
    return [FloatRange("input", probs, 0.0, 1.0, "", problem, (0, "input", None))]


def _bernoulli_(args: Args, kwargs: Kwargs) -> list[Requirement]:
    # self.bernoulli_(p): p (a float is checked by PyTorch on the host) holds the probabilities
    p = _arg(args, kwargs, 1, "p")
    if not _is_plain(p):
        return []
    return [FloatRange("p", p, 0.0, 1.0, "", "probability outside [0, 1]", (1, "p", None))]


def _poisson(args: Args, kwargs: Kwargs) -> list[Requirement]:
    rates = _arg(args, kwargs, 0, "input")
    if not _is_plain(rates):
        return []
    problem = "negative or NaN Poisson rate"
    return [FloatRange("input", rates, 0.0, float("inf"), "", problem, (0, "input", None))]


# --- gather / scatter / index_* ---------------------------------------------------------------
def _dim_index(negative_ok: bool, index_pos: int = 2) -> Extract:
    """(self, dim, index, ...): index values address self.size(dim)."""

    def extract(args: Args, kwargs: Kwargs) -> list[Requirement]:
        x, dim = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "dim")
        index = _arg(args, kwargs, index_pos, "index")
        if not (_is_plain(x) and _is_index(index)):
            return []
        found = _size(x, dim)
        if found is None:
            return []
        dim, size = found
        lo = -size if negative_ok else 0
        source = f"self.shape[{dim}] = {size}"
        return [IntRange("index", index, lo, size, source, slot=(index_pos, "index", None))]

    return extract


def _take(args: Args, kwargs: Kwargs) -> list[Requirement]:
    x, index = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "index")
    if not (_is_plain(x) and _is_index(index)):
        return []
    n = x.numel()
    source = f"self.numel() = {n}, indexing the flattened tensor"
    return [IntRange("index", index, -n, n, source, slot=(1, "index", None))]


# --- x[idx], x[idx] = v, index_put ------------------------------------------------------------
def _as_index_tensor(item: Any) -> torch.Tensor | None:
    if isinstance(item, torch.Tensor):
        return item if _is_plain(item) else None
    try:
        converted = torch.as_tensor(item)
    except (TypeError, ValueError, RuntimeError):
        return None
    return converted


def _index_items(idx: Any) -> tuple[Any, ...] | None:
    """The items of an indexing expression, or None where no tensor values are involved."""
    if isinstance(idx, (int, slice)) or idx is None or idx is Ellipsis:
        return None  # the fast path: PyTorch checks plain ints on the host
    if isinstance(idx, tuple):
        items = idx
    elif _sequence_as_tuple(idx):
        items = tuple(idx)  # NumPy's legacy rule: such a list is a tuple of indices
    else:
        items = (idx,)
    if not any(
        not isinstance(i, (int, slice)) and i is not None and i is not Ellipsis for i in items
    ):
        return None
    return items


_is_sequence = ctypes.pythonapi.PySequence_Check
_is_sequence.argtypes = [ctypes.py_object]
_is_sequence.restype = ctypes.c_int


def _sequence_as_tuple(idx: Any) -> bool:
    """PyTorch's ``treatSequenceAsTuple`` (``python_variable_indexing.h``), NumPy's legacy rule
    for an index that is neither a tuple, a tensor nor an ndarray: a sequence of fewer than 32
    items is a tuple of indices when one of them is a tensor, a slice, ``None``, ``...`` or itself
    a sequence (a list, a NumPy array, 0-d included); otherwise it is one index, made a tensor
    whole (so a list of 32 or more lists indexes dimension 0 only)."""
    kind = type(idx)
    if isinstance(idx, torch.Tensor) or (kind.__name__ == "ndarray" and kind.__module__ == "numpy"):
        return False  # PyArray_CheckExact: an ndarray is one index
    if not _is_sequence(idx):
        return False
    try:
        if len(idx) >= 32:
            return False
        items = list(idx)
    except Exception:
        return False
    for item in items:
        if isinstance(item, (torch.Tensor, slice, list, tuple)) or item is None:
            return True
        if item is Ellipsis or (not isinstance(item, (int, float)) and _is_sequence(item)):
            return True
    return False


def _consumed(item: Any) -> int:
    """How many dimensions of the indexed tensor one index item addresses."""
    if item is None or isinstance(item, bool):
        return 0
    if isinstance(item, torch.Tensor) and item.dtype in (torch.bool, torch.uint8):
        return item.dim()
    return 1


def _indexing(
    x: Any,
    items: Sequence[Any],
    none_is_slice: bool,
    whole: bool = False,
    keyword: str | None = None,
) -> list[Requirement]:
    """``whole``: the index is one item, not a tuple or list of them (``x[idx]``)."""
    if not _is_plain(x):
        return []
    if none_is_slice:  # index_put's None stands for a whole dimension
        items = [slice(None) if i is None else i for i in items]
    # lists and arrays become tensors first, so a boolean one counts as a mask
    converted: list[Any] = []
    for item in items:
        if isinstance(item, (int, slice, torch.Tensor)) or item is None or item is Ellipsis:
            converted.append(item)
        else:
            tensor = _as_index_tensor(item)
            if tensor is None:
                return []  # PyTorch will say what is wrong with it
            converted.append(tensor)
    items = converted
    if sum(1 for i in items if i is Ellipsis) > 1:
        return []
    used = sum(_consumed(i) for i in items if i is not Ellipsis)
    found: list[Requirement] = []
    dim = 0
    for position, item in enumerate(items):
        if item is Ellipsis:
            dim += max(x.dim() - used, 0)
            continue
        width = _consumed(item)
        if width == 1 and not isinstance(item, (int, slice)) and dim < x.dim():
            tensor = _as_index_tensor(item)
            if tensor is not None and _is_index(tensor) and tensor.dtype != torch.uint8:
                name = f"index {position}" if len(items) > 1 else "index"
                slot = (1, keyword, None if whole else position)
                found.append(_index_range(name, tensor, x.shape[dim], dim, slot))
        dim += width
    return found


def _index_range(name: str, tensor: torch.Tensor, size: int, dim: int, slot: Slot) -> IntRange:
    """One index tensor into dimension ``dim``: negative Python indices count from the end."""
    return IntRange(name, tensor, -size, size, f"self.shape[{dim}] = {size}", slot=slot)


_PLAIN_ITEMS = (int, slice, type(None), type(Ellipsis))


def plain_index(args: Args) -> bool:
    """``x[0]``, ``x[:, 1:]``, ``x[..., None]``: no tensor values, PyTorch checks them on the
    host. Decided before anything else, since model code slices tensors all the time."""
    if len(args) < 2:
        return False
    idx = args[1]
    if type(idx) is tuple:
        return all(type(i) in _PLAIN_ITEMS for i in idx)
    return type(idx) in _PLAIN_ITEMS


def _getitem(args: Args, kwargs: Kwargs) -> list[Requirement]:
    if len(args) > 1 and type(args[1]) in PLAIN:
        # x[idx] with one tensor: the common case, decided without the general walk below
        x, idx = args[0], args[1]
        if _is_plain(x) and x.dim() and _is_index(idx) and idx.dtype != torch.uint8:
            return [_index_range("index", idx, x.shape[0], 0, (1, None, None))]
    items = _index_items(args[1]) if len(args) > 1 else None
    if items is None:
        return []
    whole = len(items) == 1 and items[0] is args[1]  # one index, not a tuple of them
    return _indexing(args[0], items, none_is_slice=False, whole=whole)


def _index_put(args: Args, kwargs: Kwargs) -> list[Requirement]:
    x, indices = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "indices")
    if not isinstance(indices, (tuple, list)):
        return []
    return _indexing(x, indices, none_is_slice=True, keyword="indices")


# --- the rest ---------------------------------------------------------------------------------
def _one_hot(args: Args, kwargs: Kwargs) -> list[Requirement]:
    labels, classes = _arg(args, kwargs, 0, "tensor"), _arg(args, kwargs, 1, "num_classes", -1)
    if not _is_index(labels) or labels.dtype != torch.int64:
        return []
    slot: Slot = (0, "tensor", None)
    if classes == -1:  # inferred from the largest label: only negatives are wrong
        return [IntRange("tensor", labels, 0, _BIG, "", "negative class index", slot=slot)]
    source = f"num_classes = {classes}"
    problem = "class index out of range"
    return [IntRange("tensor", labels, 0, int(classes), source, problem, slot=slot)]


def _repeat_interleave(args: Args, kwargs: Kwargs) -> list[Requirement]:
    x, repeats = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "repeats")
    output_size = kwargs.get("output_size", args[3] if len(args) > 3 else None)
    slot: Slot = (1, "repeats", None)
    if repeats is None:  # torch.repeat_interleave(repeats)
        repeats, x, slot = x, None, (0, "input", None)
    if not _is_index(repeats):
        return []
    if x is not None and repeats.numel() == 1:
        output_size = None  # one count for every element: the total is not a plain sum
    return [Repeats("repeats", repeats, output_size, slot=slot)]


def _max_unpool(n: int) -> Extract:
    def extract(args: Args, kwargs: Kwargs) -> list[Requirement]:
        x, indices = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "indices")
        kernel = _arg(args, kwargs, 2, "kernel_size")
        stride = _arg(args, kwargs, 3, "stride")
        padding = _arg(args, kwargs, 4, "padding", 0)
        output_size = _arg(args, kwargs, 5, "output_size")
        if not (_is_plain(x) and _is_index(indices)) or x.dim() < n:
            return []
        spatial = _unpool_size(tuple(x.shape[-n:]), n, kernel, stride, padding, output_size)
        if spatial is None:
            return []
        plane = 1
        for size in spatial:
            plane *= size
        shape = "x".join(str(s) for s in spatial)
        source = f"the output plane of {shape} = {plane} elements"
        problem = "max index out of range"
        slot: Slot = (1, "indices", None)
        return [IntRange("indices", indices, 0, plane, source, problem, slot=slot)]

    return extract


def _tuple(value: Any, n: int) -> tuple[int, ...] | None:
    if isinstance(value, int):
        return (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n:
        return tuple(int(v) for v in value)
    return None


def _unpool_size(
    spatial: tuple[int, ...], n: int, kernel: Any, stride: Any, padding: Any, output_size: Any
) -> tuple[int, ...] | None:
    if output_size is not None:
        given = list(output_size)
        return tuple(int(s) for s in given[-n:]) if len(given) >= n else None
    k, p = _tuple(kernel, n), _tuple(padding, n)
    s = k if stride is None else _tuple(stride, n)
    if k is None or s is None or p is None:
        return None
    return tuple((spatial[i] - 1) * s[i] - 2 * p[i] + k[i] for i in range(n))


# --- the table --------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCheck:
    name: str  # what --only/--skip accept, and the message's op name
    family: str
    funcs: tuple[str, ...]  # "F.x", "torch.x", "Tensor.x", "_nn.x": wrapped while guarded
    extract: Extract
    fix: str
    index_error: bool = False  # PyTorch's CPU check raises IndexError here
    nothing_to_check: Callable[[Args], bool] | None = None  # a quick test of the arguments
    # Every argument a requirement of this op can name ("index 1" counts as "index"), and those
    # whose values PyTorch's CPU kernel rejects wherever the CUDA kernel asserts (CPU_CHECKS).
    states: frozenset[str] = frozenset()
    writes: Callable[[Args, Kwargs], bool] | None = None  # changes an argument before checking
    random: bool = False  # draws random numbers: judged before it runs, never after

    @property
    def cpu_checks(self) -> frozenset[str]:
        return CPU_CHECKS.get(self.name, frozenset())

    @property
    def cpu_rejects(self) -> bool:
        """May the CPU op run first, its check only when it raises? Only where it rejects
        everything the CUDA kernel asserts on, for every requirement, and draws nothing."""
        return bool(self.states) and self.states <= self.cpu_checks and not self.random


# The requirements (op -> argument) whose values the CPU kernel rejects wherever the CUDA kernel
# asserts, read from PyTorch's aten/src/ATen/native/*.cpp against cuda/*.cu (torch 2.13):
# - class targets: LossNLL.cpp TORCH_CHECK_INDEX(t >= 0 && t < n_classes) vs cuda/Loss.cu and
#   NLLLoss2d.cu CUDA_KERNEL_ASSERT, ignore_index skipped by both; LossMultiMargin.cpp
#   "target out of range" vs MultiMarginLoss.cu; Loss.cpp checks input and target of
#   binary_cross_entropy in [0, 1] as cuda/Loss.cu asserts;
# - ids: embedding and embedding_bag go through index_select / EmbeddingBag.cpp's
#   "Expected idx >= 0 && idx < num_embeddings" vs Indexing.cu / EmbeddingBag.cu asserts;
# - indices: ScatterGatherKernel.cpp "index .. is out of bounds for dimension" vs
#   ScatterGatherKernel.cu; IndexKernel.cpp (x[idx], index_put, take, put, index_fill) and
#   TensorAdvancedIndexing.cpp (index_select, index_add, index_copy) TORCH_CHECK_INDEX vs
#   IndexKernel.cu / Indexing.cu asserts;
# - one_hot: Onehot.cpp compares min and max on the host for CPU tensors, CUDA asserts in scatter;
# - repeat_interleave: Repeat.cpp checks negative counts and the sum against output_size
#   (compute_cpu) as Repeat.cu asserts them;
# - max_unpool: MaxUnpooling.cpp "Found an invalid max index" for any index outside the plane,
#   MaxUnpooling.cu asserts the same after truncating it to int (fewer, never more).
# Left out: embedding_bag offsets (the CPU op accepts decreasing offsets with mode="max" and a
# negative last offset with include_last_offset; EmbeddingBag.cu asserts end >= begin), ctc_loss
# targets (LossCTC.cpp reads them unchecked, as does LossCTC.cu), and the random ops (they would
# draw before the check; bernoulli, multinomial, poisson are judged first).
CPU_CHECKS: dict[str, frozenset[str]] = {
    "cross_entropy": frozenset({"target"}),
    "nll_loss": frozenset({"target"}),
    "multi_margin_loss": frozenset({"target"}),
    "binary_cross_entropy": frozenset({"input", "target"}),
    "embedding": frozenset({"input"}),
    "embedding_bag": frozenset({"input"}),
    **dict.fromkeys(
        (
            "gather",
            "scatter",
            "index_select",
            "index_add",
            "index_copy",
            "index_fill",
            "index_put",
            "getitem",
            "setitem",
            "take",
            "put",
        ),
        frozenset({"index"}),
    ),
    "one_hot": frozenset({"tensor"}),
    "repeat_interleave": frozenset({"repeats"}),
    **dict.fromkeys(("max_unpool1d", "max_unpool2d", "max_unpool3d"), frozenset({"indices"})),
}


FIX_CLASSES = (
    "Class ids must run from 0 to C-1: check the label encoding (labels 1..C need `y - 1`), "
    "that the last layer has one output per class, and that padding labels equal ignore_index."
)
FIX_EMBEDDING = (
    "Token ids must be smaller than num_embeddings: the tokenizer may have more tokens than the "
    "embedding (added special tokens: `model.resize_token_embeddings(len(tokenizer))`), or ids "
    "were not remapped to a smaller vocabulary."
)
FIX_POSITIONS = (
    "Position ids must be smaller than the position table (max_position_embeddings, "
    "n_positions): the sequences are longer than the model takes. Truncate them "
    "(`tokenizer(..., truncation=True, max_length=model.config.max_position_embeddings)`), or "
    "build position ids from the real length, not a padded one."
)
FIX_TOKEN_TYPES = (
    "Token type (segment) ids must be smaller than type_vocab_size (2 for BERT): use the "
    "token_type_ids of the model's own tokenizer, or pass none; another tokenizer's, or a third "
    "segment, are out of range."
)
FIX_BCE = (
    "binary_cross_entropy takes probabilities. If the model outputs raw scores (logits), use "
    "nn.BCEWithLogitsLoss (or F.binary_cross_entropy_with_logits) instead, which also avoids "
    "sigmoid's precision loss; targets must lie in [0, 1] too."
)
FIX_PROBS = (
    "Probabilities must be finite and non-negative, each row with a positive sum: a NaN usually "
    "comes from the logits (check for overflow; `torch.softmax(logits.float(), -1)`), a zero row "
    "from masking every option."
)
FIX_INDEX = (
    "Every index must address an existing element along that dimension: compare the index "
    "tensor's range (`idx.min()`, `idx.max()`) with the tensor's shape."
)
FIX_CTC = (
    "CTC targets must be class ids smaller than log_probs.shape[-1] (the blank included); CUDA "
    "does not check this at all and reads out of bounds."
)

# The "_nn." entries (torch._C._nn) and torch.ctc_loss / torch.embedding / torch.embedding_bag
# are what the functional forms call inside, with the same leading arguments: checked there
# only when the outer function was not (a reference to it taken before the guard started).
_INDEX = frozenset({"index"})
CHECKS: tuple[OpCheck, ...] = (
    OpCheck(
        "cross_entropy",
        "loss",
        ("F.cross_entropy", "_nn.cross_entropy_loss"),
        _cross_entropy,
        FIX_CLASSES,
        True,
        states=frozenset({"target"}),
    ),
    OpCheck(
        "nll_loss",
        "loss",
        ("F.nll_loss", "_nn.nll_loss_nd"),
        _nll_loss,
        FIX_CLASSES,
        True,
        states=frozenset({"target"}),
    ),
    OpCheck(
        "multi_margin_loss",
        "loss",
        ("F.multi_margin_loss", "_nn.multi_margin_loss"),
        _multi_margin,
        FIX_CLASSES,
        states=frozenset({"target"}),
    ),
    OpCheck(
        "binary_cross_entropy",
        "loss",
        ("F.binary_cross_entropy", "_nn.binary_cross_entropy"),
        _binary_cross_entropy,
        FIX_BCE,
        states=frozenset({"input", "target"}),
    ),
    OpCheck(
        "ctc_loss",
        "loss",
        ("F.ctc_loss", "torch.ctc_loss"),
        _ctc_loss,
        FIX_CTC,
        states=frozenset({"targets"}),
    ),
    OpCheck(
        "embedding",
        "embedding",
        ("F.embedding",),
        _embedding,
        FIX_EMBEDDING,
        True,
        states=frozenset({"input"}),
        writes=_renorms,
    ),
    OpCheck(
        "embedding",
        "embedding",
        ("torch.embedding",),
        _torch_embedding,
        FIX_EMBEDDING,
        True,
        states=frozenset({"input"}),
    ),
    # IndexError for ids, as on CPU; the CPU's offsets errors are RuntimeErrors or IndexErrors
    # depending on mode, and GuardIndexError is both
    OpCheck(
        "embedding_bag",
        "embedding",
        ("F.embedding_bag",),
        _embedding_bag,
        FIX_EMBEDDING,
        True,
        states=frozenset({"input", "offsets"}),
        writes=_renorms,
    ),
    OpCheck(
        "embedding_bag",
        "embedding",
        ("torch.embedding_bag",),
        lambda args, kwargs: _embedding_bag(args, kwargs, inner=True),
        FIX_EMBEDDING,
        True,
        states=frozenset({"input", "offsets"}),
    ),
    OpCheck(
        "multinomial",
        "sampling",
        ("torch.multinomial", "Tensor.multinomial"),
        _multinomial,
        FIX_PROBS,
        states=frozenset({"input"}),
        random=True,
    ),
    OpCheck(
        "bernoulli",
        "sampling",
        ("torch.bernoulli", "Tensor.bernoulli"),
        _bernoulli,
        FIX_PROBS,
        states=frozenset({"input"}),
        random=True,
    ),
    OpCheck(
        "bernoulli",
        "sampling",
        ("Tensor.bernoulli_",),
        _bernoulli_,
        FIX_PROBS,
        states=frozenset({"p"}),
        random=True,
    ),
    OpCheck(
        "poisson",
        "sampling",
        ("torch.poisson",),
        _poisson,
        "Poisson rates must be >= 0 and not NaN.",
        states=frozenset({"input"}),
        random=True,
    ),
    OpCheck(
        "gather",
        "gather_scatter",
        ("torch.gather", "Tensor.gather"),
        _dim_index(negative_ok=False),
        FIX_INDEX + " gather does not accept negative indices.",
        states=_INDEX,
    ),
    OpCheck(
        "scatter",
        "gather_scatter",
        (
            "torch.scatter",
            "Tensor.scatter",
            "Tensor.scatter_",
            "torch.scatter_add",
            "Tensor.scatter_add",
            "Tensor.scatter_add_",
            "torch.scatter_reduce",
            "Tensor.scatter_reduce",
            "Tensor.scatter_reduce_",
        ),
        _dim_index(negative_ok=False),
        FIX_INDEX + " scatter does not accept negative indices.",
        states=_INDEX,
    ),
    OpCheck(
        "index_select",
        "index",
        ("torch.index_select", "Tensor.index_select"),
        _dim_index(negative_ok=False),
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    OpCheck(
        "index_add",
        "index",
        ("torch.index_add", "Tensor.index_add", "Tensor.index_add_"),
        _dim_index(negative_ok=False),
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    OpCheck(
        "index_copy",
        "index",
        ("torch.index_copy", "Tensor.index_copy", "Tensor.index_copy_"),
        _dim_index(negative_ok=False),
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    OpCheck(
        "index_fill",
        "index",
        ("torch.index_fill", "Tensor.index_fill", "Tensor.index_fill_"),
        _dim_index(negative_ok=True),
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    OpCheck(
        "index_put",
        "index",
        ("torch.index_put", "torch.index_put_", "Tensor.index_put", "Tensor.index_put_"),
        _index_put,
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    *(
        OpCheck(
            name, "index", (f"Tensor.__{name}__",), _getitem, FIX_INDEX, True, plain_index, _INDEX
        )
        for name in ("getitem", "setitem")
    ),
    OpCheck("take", "index", ("torch.take", "Tensor.take"), _take, FIX_INDEX, True, states=_INDEX),
    OpCheck(
        "put",
        "index",
        ("torch.put", "Tensor.put", "Tensor.put_"),
        _take,
        FIX_INDEX,
        True,
        states=_INDEX,
    ),
    OpCheck(
        "one_hot",
        "one_hot",
        ("F.one_hot",),
        _one_hot,
        "Labels must be 0 .. num_classes-1 (or pass num_classes=-1 to infer it).",
        states=frozenset({"tensor"}),
    ),
    OpCheck(
        "repeat_interleave",
        "repeat_interleave",
        ("torch.repeat_interleave", "Tensor.repeat_interleave"),
        _repeat_interleave,
        "Repeat counts must be >= 0 and, with output_size, add up to it exactly.",
        states=frozenset({"repeats"}),
    ),
    *(
        OpCheck(
            f"max_unpool{n}d",
            "unpool",
            (f"F.max_unpool{n}d",),
            _max_unpool(n),
            "Pass the indices returned by the matching max_pool call (return_indices=True) "
            "with the same kernel_size, stride and padding.",
            states=frozenset({"indices"}),
        )
        for n in (1, 2, 3)
    ),
)

FAMILIES = frozenset(c.family for c in CHECKS)
NAMES = frozenset(c.name for c in CHECKS) | FAMILIES


def _owner(namespace: str) -> Any:
    return {
        "F": torch.nn.functional,
        "torch": torch,
        "Tensor": torch.Tensor,
        "_nn": torch._C._nn,
    }[namespace]


def entry_points() -> list[tuple[Any, str, OpCheck]]:
    """(owner, attribute, check) for every entry point the guard wraps: ``torch.nn.functional``
    and ``torch`` functions, and ``torch.Tensor`` methods (``x[idx]`` is ``__getitem__``); ops
    a torch version lacks are left out."""
    found: list[tuple[Any, str, OpCheck]] = []
    for check in CHECKS:
        for path in check.funcs:
            namespace, _, attr = path.partition(".")
            owner = _owner(namespace)
            if getattr(owner, attr, None) is not None:
                found.append((owner, attr, check))
    return found


def display_name(check: OpCheck, func: Any) -> str:
    name = getattr(func, "__name__", check.name)
    qualname = getattr(func, "__qualname__", name)
    module = getattr(func, "__module__", "") or ""
    if module == "torch._C._nn":  # F.one_hot, and what the functional losses call inside
        return f"F.{check.name}"
    if module == "torch.nn.functional":
        return f"F.{name}"
    if "TensorBase" in qualname or "Tensor." in qualname:
        if name == "__getitem__":
            return "x[index]"
        if name == "__setitem__":
            return "x[index] = value"
        return f"Tensor.{name}"
    return f"torch.{name}"
