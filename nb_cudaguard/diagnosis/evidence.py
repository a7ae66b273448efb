"""Evidence from what a poisoned process can still read: Python objects and CPU tensors.

After a sticky error every CUDA call re-raises (NVIDIA's error types,
https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html), so this module
reads only attributes of modules and configs (plain ints), ``len(tokenizer)``, tensor *metadata*
(dtype, device, shape) and the values of tensors whose device is the CPU. It never reads a CUDA
tensor's values, and it touches torch only through ``sys.modules`` (it never imports it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bounds import MAX_MODULES, find_classifier, marks_void

_LABEL_NAMES = ("labels", "label", "targets", "target", "y", "y_true", "yb", "masks", "mask", "gt")
_ID_NAMES = ("input_ids", "ids", "tokens", "token_ids", "x", "xb", "inputs", "input")
_PROB_NAMES = ("probs", "preds", "pred", "outputs", "output", "out", "y_pred", "scores", "p")
# Names that say what a tensor holds. Evidence never blames a tensor for a generic name alone
# (`x`, `out`, `p` hold anything): only these, and only for values that prove the point.
_BLAME_ID_NAMES = ("input_ids", "ids", "tokens", "token_ids")
_DECODER_ID_NAMES = ("decoder_input_ids",)
_BLAME_PROB_NAMES = ("probs", "probabilities", "preds", "pred", "predictions", "y_pred", "y_hat")
_MAX_NUMEL = 50_000_000


@dataclass(frozen=True)
class Evidence:
    sentences: tuple[str, ...] = ()
    ranked_causes: tuple[str, ...] = ()  # the rule's likely causes, reordered by what was found


def frames_of(error: BaseException) -> list[Mapping[str, Any]]:
    """The local variables of the failing traceback's frames, innermost first."""
    frames: list[Mapping[str, Any]] = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_locals)
        tb = tb.tb_next
    return frames[::-1]


@dataclass
class _Found:
    """Objects found in the frames and the namespace, by kind."""

    embeddings: list[tuple[str, int, int | None]] = field(default_factory=list)
    modules: list[tuple[str, Any]] = field(default_factory=list)  # (name, model), as found
    ignore_index: int | None = None
    bce_loss: bool = False
    ends_in_sigmoid: bool = False
    half_model: bool = False
    configs: list[Any] = field(default_factory=list)
    tokenizers: list[Any] = field(default_factory=list)
    tensors: dict[str, Any] = field(default_factory=dict)  # name -> CPU tensor


def _torch() -> Any:
    return sys.modules.get("torch")


def _is_cpu_tensor(torch: Any, value: Any) -> bool:
    if torch is None or not isinstance(value, torch.Tensor):
        return False
    try:
        return bool(value.device.type == "cpu") and value.numel() <= _MAX_NUMEL
    except Exception:
        return False


def _candidates(
    frames: Sequence[Mapping[str, Any]], namespace: Mapping[str, Any] | None
) -> Iterator[tuple[str, Any]]:
    for scope in frames:
        yield from list(scope.items())
    if namespace is not None:
        for name, value in list(namespace.items()):
            if not name.startswith("_") and name not in (
                "In",
                "Out",
                "get_ipython",
                "exit",
                "quit",
            ):
                yield name, value


def _scan_module(torch: Any, found: _Found, name: str, module: Any) -> None:
    nn = torch.nn
    last: Any = None
    for count, (sub_name, sub) in enumerate(module.named_modules()):
        if count > MAX_MODULES:
            break
        qualified = f"{name}.{sub_name}" if sub_name else name
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)):
            entry = (qualified, int(sub.num_embeddings), getattr(sub, "padding_idx", None))
            if entry not in found.embeddings:
                found.embeddings.append(entry)
        elif isinstance(sub, (nn.CrossEntropyLoss, nn.NLLLoss)):
            found.ignore_index = int(sub.ignore_index)
        elif isinstance(sub, nn.BCELoss):
            found.bce_loss = True
        if not list(sub.children()):
            last = sub
    if last is not None and isinstance(last, nn.Sigmoid):
        found.ends_in_sigmoid = True
    config = getattr(module, "config", None)
    if config is not None and _is_config(config) and config not in found.configs:
        found.configs.append(config)
    try:
        first = next(module.parameters(), None)
        if first is not None and first.dtype == torch.float16:  # metadata only
            found.half_model = True
    except Exception:
        pass


def _is_config(value: Any) -> bool:
    return type(value).__name__.endswith("Config") and any(
        hasattr(value, attr) for attr in ("vocab_size", "num_labels", "max_position_embeddings")
    )


def _is_tokenizer(value: Any) -> bool:
    return "Tokenizer" in type(value).__name__ and hasattr(value, "__len__")


def collect(frames: Sequence[Mapping[str, Any]], namespace: Mapping[str, Any] | None) -> _Found:
    torch = _torch()
    found = _Found()
    seen: set[int] = set()
    for name, value in _candidates(frames, namespace):
        if id(value) in seen:
            continue
        seen.add(id(value))
        try:
            if torch is not None and isinstance(value, torch.nn.Module):
                found.modules.append((name, value))
                _scan_module(torch, found, name, value)
            elif _is_config(value):
                found.configs.append(value)
            elif _is_tokenizer(value):
                found.tokenizers.append(value)
            elif _is_cpu_tensor(torch, value):
                # detached (a view, no copy): torch warns when a tensor that requires grad
                # becomes a Python number, under the user's cell
                found.tensors.setdefault(name, value.detach())
            elif isinstance(value, Mapping) and len(value) < 64:
                for key, item in list(value.items()):
                    if isinstance(key, str) and _is_cpu_tensor(torch, item):
                        found.tensors.setdefault(f"{name}[{key!r}]", item.detach())
        except Exception:  # a strange object must not cost the diagnosis
            continue
    return found


def _key(name: str) -> str:
    """`batch['labels']` -> labels; `labels` -> labels."""
    if name.endswith("']"):
        return name.rsplit("['", 1)[-1][:-2]
    return name


def _named(found: _Found, names: Iterable[str], *, integer: bool) -> list[tuple[str, Any]]:
    torch = _torch()
    wanted = tuple(names)
    out = []
    for name, tensor in found.tensors.items():
        if _key(name) not in wanted or tensor.numel() == 0:
            continue
        is_float = tensor.is_floating_point()
        if integer and (is_float or tensor.dtype == torch.bool):
            continue
        if not integer and not is_float:
            continue
        out.append((name, tensor))
    out.sort(key=lambda item: wanted.index(_key(item[0])))
    return out


def _config_attr(found: _Found, attr: str) -> int | None:
    for config in found.configs:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _rank(likely: Sequence[str], first: Iterable[str]) -> tuple[str, ...]:
    """Move the likely causes that start with any of ``first`` (in that order) to the front."""
    ordered: list[str] = []
    for prefix in first:
        ordered.extend(c for c in likely if prefix in c and c not in ordered)
    ordered.extend(c for c in likely if c not in ordered)
    return tuple(ordered)


def _values(tensor: Any, limit: int = 5) -> list[int]:
    return [int(v) for v in tensor.flatten().unique()[:limit].tolist()]


# --- per family ----------------------------------------------------------------------------------
def _encoder_decoder(found: _Found) -> bool:
    return any(getattr(config, "is_encoder_decoder", False) is True for config in found.configs)


def _labels(found: _Found, likely: Sequence[str]) -> Evidence:
    num_labels = _config_attr(found, "num_labels")
    head = find_classifier(found.modules)
    classes = head.outputs if head else num_labels
    source = f"the classifier `{head.path}` has" if head else "the config has"
    if classes is None:
        return Evidence((), tuple(likely))
    ignore = found.ignore_index if found.ignore_index is not None else -100
    sentences: list[str] = []
    hints: list[str] = []
    # A seq2seq model's labels are the decoder's token ids: _token_ids reads them.
    names = [n for n in _LABEL_NAMES if not (_encoder_decoder(found) and n == "labels")]
    for name, labels in _named(found, names, integer=True):
        bad = labels[((labels < 0) | (labels >= classes)) & (labels != ignore)]
        if bad.numel() == 0:
            continue
        values = _values(bad)
        shown = ", ".join(str(v) for v in values)
        sentences.append(
            f"`{name}` contains {shown} but {source} {classes} outputs "
            f"(valid: 0..{classes - 1} or {ignore})."
        )
        kept = labels[labels != ignore]
        lo, hi = int(kept.min()), int(kept.max())
        if marks_void(values):  # ignore_index=255 is the fix
            hints.insert(0, "255")
        if lo >= 1 and hi == classes:
            hints.append("1..C")
        if -1 in values or any(v == _config_attr(found, "pad_token_id") for v in values):
            hints.append("-1 or the tokenizer")
        if hi >= classes:
            hints.append("fewer outputs")
    if num_labels is not None and head and num_labels != classes:
        sentences.append(
            f"config.num_labels is {num_labels} but the classifier has {classes} outputs."
        )
    return Evidence(tuple(sentences), _rank(likely, hints))


def _vocabulary(found: _Found) -> int | None:
    """Rows of the word embedding (the largest), else the config's vocab_size."""
    words = [e for e in found.embeddings if "position" not in e[0] and "type" not in e[0]]
    if words:
        return max(words, key=lambda e: e[1])[1]
    return _config_attr(found, "vocab_size")


def _usable_positions(found: _Found) -> tuple[int, int] | None:
    """(positions a sequence may use, max_position_embeddings). RoBERTa-style models number
    positions from ``padding_idx + 1``, so they have ``padding_idx + 1`` fewer than the table."""
    table = [e for e in found.embeddings if e[0].endswith("position_embeddings")]
    if table:
        _name, rows, padding_idx = table[0]
        offset = padding_idx + 1 if padding_idx is not None and padding_idx >= 0 else 0
        return rows - offset, rows
    max_pos = _config_attr(found, "max_position_embeddings")
    if max_pos is None:
        return None
    model_type = str(getattr(found.configs[0], "model_type", "")) if found.configs else ""
    if model_type in _OFFSET_POSITION_MODELS:
        pad = _config_attr(found, "pad_token_id")
        return max_pos - ((pad if pad is not None else 1) + 1), max_pos
    return max_pos, max_pos


# Hugging Face models whose position ids start after the padding index (create_position_ids_
# from_input_ids): RoBERTa and its descendants.
_OFFSET_POSITION_MODELS = (
    "roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text", "xmod", "ibert",
    "roberta-prelayernorm", "xlm-roberta-xl", "luke", "mpnet", "esm", "markuplm", "layoutlmv3",
)  # fmt: skip


def _tokenizer_length(found: _Found) -> int | None:
    for tokenizer in found.tokenizers:
        try:
            return len(tokenizer)
        except Exception:
            continue
    return None


def _object_mismatches(found: _Found) -> tuple[list[str], list[str]]:
    """Mismatches between the user's objects, true whatever kernel fired: a tokenizer larger
    than the embedding, sequences longer than the positions, token types past the table."""
    sentences: list[str] = []
    hints: list[str] = []
    size = _vocabulary(found)
    tokenizer_len = _tokenizer_length(found)
    if tokenizer_len is not None and size is not None and tokenizer_len > size:
        sentences.append(
            f"len(tokenizer) is {tokenizer_len} but the embedding has {size} rows: tokens were "
            "added without model.resize_token_embeddings(len(tokenizer))."
        )
        hints.append("token id >=")
    positions = _usable_positions(found)
    if positions is not None:
        usable, table = positions
        for name, ids in _named(found, ("input_ids",), integer=True):
            length = int(ids.shape[-1]) if ids.dim() >= 1 else 0
            if length > usable:
                sentences.append(
                    f"`{name}` has sequence length {length} but max_position_embeddings is "
                    f"{table}" + (f" ({usable} usable positions)" if usable != table else "") + "."
                )
                hints.append("longer than")
    types = _config_attr(found, "type_vocab_size")
    for name, tti in _named(found, ("token_type_ids",), integer=True):
        top = int(tti.max())
        if types is not None and (top >= types or int(tti.min()) < 0):
            advice = (
                "this model has one token type; drop token_type_ids."
                if types == 1
                else f"valid token types are 0..{types - 1}."
            )
            sentences.append(f"`{name}` contains {top} but type_vocab_size is {types}: {advice}")
            hints.append("token_type_ids")
    return sentences, hints


def _token_ids(found: _Found, likely: Sequence[str]) -> Evidence:
    sentences, hints = _object_mismatches(found)
    size = _vocabulary(found)
    tokenizer_len = _tokenizer_length(found)
    added = tokenizer_len is not None and size is not None and tokenizer_len > size
    names: tuple[str, ...] = (*_BLAME_ID_NAMES, *_DECODER_ID_NAMES)
    if _encoder_decoder(found):
        names = (*names, "labels")  # the decoder's targets are token ids of the shared embedding
    ignore = found.ignore_index if found.ignore_index is not None else -100
    for name, ids in _named(found, names, integer=True):
        if size is None:
            break
        if _key(name) == "labels":
            ids = ids[ids != ignore]
            if ids.numel() == 0:
                continue
        top, low = int(ids.max()), int(ids.min())
        if top >= size:
            # Blame a tokenizer only where one was found: most notebooks index by hand.
            if added and tokenizer_len is not None:  # the len(tokenizer) sentence says why
                reason = f": one of the {tokenizer_len - size} added token(s)"
            elif tokenizer_len is not None:
                reason = f": the tokenizer (len {tokenizer_len}) does not match the model"
            else:
                reason = ""
            shared = (
                " (the decoder's shared embedding)"
                if _key(name) != "input_ids" and (_encoder_decoder(found))
                else ""
            )
            sentences.append(f"token id {top} in `{name}` >= vocab size {size}{shared}{reason}.")
            hints.append("token id >=")
        if low < 0:
            sentences.append(f"`{name}` contains the negative id {low}.")
            hints.append("negative index")
    return Evidence(tuple(sentences), _rank(likely, hints))


def _bce(found: _Found, likely: Sequence[str], *, target: bool) -> Evidence:
    sentences: list[str] = []
    hints: list[str] = []
    names = _LABEL_NAMES if target else _BLAME_PROB_NAMES
    if not target and found.bce_loss:
        # With an nn.BCELoss in scope, a model's outputs are what it is fed (still never `out`
        # or `p` alone: too many things are called that).
        names = (*names, "outputs", "output", "scores", "logits")
    for name, tensor in _named(found, names, integer=False):
        nan = bool(tensor.isnan().any())
        values = tensor[~tensor.isnan()]
        outside = values[(values < 0) | (values > 1)]
        if not nan and not outside.numel():
            continue
        # The range of the real values: NaN would hide in nan_to_num's 0.
        span = (
            f"min {float(values.min()):.4g}, max {float(values.max()):.4g}"
            if outside.numel()
            else ""
        )
        if nan:
            sentences.append(
                f"`{name}` has values outside [0, 1]: it contains NaN"
                + (f"; {span}" if span else "")
                + "."
            )
        else:
            sentences.append(f"`{name}` has values outside [0, 1] ({span}).")
        hints.append("NaN" if nan else "logits")
    if not target and found.bce_loss and not found.ends_in_sigmoid:
        sentences.append("nn.BCELoss is in use, and the model's last layer is not a Sigmoid.")
        hints.insert(0, "logits")
    return Evidence(tuple(sentences), _rank(likely, hints))


def _sampling(found: _Found, likely: Sequence[str]) -> Evidence:
    sentences: list[str] = []
    hints: list[str] = []
    if found.half_model:
        sentences.append("The model's parameters are float16: logits can overflow to inf/NaN.")
        hints.append("fp16")
    for name, tensor in _named(found, ("logits", *_BLAME_PROB_NAMES), integer=False):
        if bool((~tensor.isfinite()).any()):
            sentences.append(f"`{name}` contains NaN or inf.")
            hints.append("NaN")
        elif bool((tensor < 0).any()):
            sentences.append(f"`{name}` contains negative values.")
            hints.append("negative")
    return Evidence(tuple(sentences), _rank(likely, hints))


_TOKEN_OPS = ("embedding", "inductor-index", "index", "gather")


def gather_evidence(
    op: str,
    likely: Sequence[str],
    *,
    frames: Sequence[Mapping[str, Any]] = (),
    namespace: Mapping[str, Any] | None = None,
) -> Evidence:
    """Sentences and a ranking of ``likely`` for the assert family ``op`` (see Rule.op).

    The family's own checks rank its causes; mismatches between the user's objects (tokenizer
    vs embedding, sequence vs positions, token types, labels vs the classifier) are reported
    whatever kernel fired: RoBERTa's positions overflow in a gather, a label in a loss.
    """
    if not frames and namespace is None:
        return Evidence((), tuple(likely))
    try:
        found = collect(frames, namespace)
        own = Evidence((), tuple(likely))
        if op == "class-target":
            own = _labels(found, likely)
        elif op in _TOKEN_OPS:
            own = _token_ids(found, likely)
        elif op in ("bce-input", "bce-target"):
            own = _bce(found, likely, target=op == "bce-target")
        elif op in ("multinomial", "bernoulli"):
            own = _sampling(found, likely)
        if op == "internal":
            return own
        sentences = list(own.sentences)
        extra = (
            _object_mismatches(found)[0],
            [] if op == "class-target" else list(_labels(found, ()).sentences),
        )
        for group in extra:
            sentences.extend(s for s in group if s not in sentences)
        return Evidence(tuple(sentences), own.ranked_causes)
    except Exception:  # evidence is a bonus: never let it cost the diagnosis
        pass
    return Evidence((), tuple(likely))
