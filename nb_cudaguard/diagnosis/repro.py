"""A small script that replays the failing operation on CPU, with the inputs found in the notebook.

After a sticky error nothing more can run on this kernel's GPU, but the batch usually still sits in
CPU tensors (before ``.to(device)``), and the module sizes in plain attributes. Replayed on CPU,
the same bad input gives PyTorch's readable error (its CPU kernels check on the host:
aten/src/ATen/native/LossNLL.cpp "Target 3 is out of bounds."); with ``REPRO_DEVICE=cuda`` the
same script runs on a GPU, under ``CUDA_LAUNCH_BLOCKING=1`` or ``compute-sanitizer``.

Pure: reads objects handed in (never CUDA memory), returns text; the caller writes the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .bounds import find_classifier
from .evidence import (
    _ID_NAMES,
    _LABEL_NAMES,
    _PROB_NAMES,
    _config_attr,
    _Found,
    _named,
    collect,
)
from .model import Diagnosis
from .rules import match_rules

_INLINE_LIMIT = 100_000  # elements written into the script; beyond, only the bad values


@dataclass(frozen=True)
class Replay:
    op: str  # the operation replayed, in words
    script: str
    expected: str  # the CPU error it should raise


def _literal(tensor: Any, bad: Any | None = None) -> str:
    """``torch.tensor(...)`` source for a CPU tensor (or, for a huge one, its bad values)."""
    values = tensor if tensor.numel() <= _INLINE_LIMIT or bad is None else bad
    dtype = str(values.dtype).replace("torch.", "")
    return f"torch.tensor({values.tolist()!r}, dtype=torch.{dtype})"


_HEADER = '''"""Replay of the CUDA error diagnosed by nb_cudaguard ({cause}): {op}.

Written by `%cudaguard repro` from the notebook's CPU tensors and module sizes.

    python {{name}}                                           # on CPU: {expected}
    REPRO_DEVICE=cuda CUDA_LAUNCH_BLOCKING=1 python {{name}}   # on a GPU, blocking launches
    REPRO_DEVICE=cuda compute-sanitizer python {{name}}        # memory errors, with their kernel
"""

import os

import torch
import torch.nn.functional as F

device = torch.device(os.environ.get("REPRO_DEVICE", "cpu"))
'''


def _labels(found: _Found) -> Replay | None:
    head = find_classifier(found.modules)
    classes = head.outputs if head else _config_attr(found, "num_labels")
    if classes is None:
        return None
    ignore = found.ignore_index if found.ignore_index is not None else -100
    for name, labels in _named(found, _LABEL_NAMES, integer=True):
        bad_mask = ((labels < 0) | (labels >= classes)) & (labels != ignore)
        if not bool(bad_mask.any()):
            continue
        source = f"the classifier `{head.path}`" if head else "config.num_labels"
        if labels.numel() > _INLINE_LIMIT:
            labels = labels[bad_mask]  # too big to write out: the bad values fail the same way
        labels_src = _literal(labels)
        dims = [int(labels.shape[0]), classes, *labels.shape[1:]] if labels.dim() else [classes]
        shape = ", ".join(str(d) for d in dims)
        body = (
            f"# `{name}` as the notebook held it on CPU\n"
            f"labels = {labels_src}.to(device)\n"
            f"num_classes = {classes}  # from {source}\n"
            f"logits = torch.randn({shape}, device=device)  # only the shape matters\n"
            f"loss = F.cross_entropy(logits, labels, ignore_index={ignore})\n"
            "print('no error: the labels are in range', loss.item())\n"
        )
        return Replay(
            "cross_entropy with the notebook's labels",
            body,
            "IndexError: Target N is out of bounds.",
        )
    return None


def _token_ids(found: _Found) -> Replay | None:
    if not found.embeddings:
        return None
    module, rows, padding = max(found.embeddings, key=lambda e: e[1])
    for name, ids in _named(found, _ID_NAMES, integer=True):
        bad_mask = (ids < 0) | (ids >= rows)
        if not bool(bad_mask.any()):
            continue
        body = (
            f"# `{name}` as the notebook held it on CPU\n"
            f"input_ids = {_literal(ids, ids[bad_mask])}.to(device)\n"
            f"# the sizes of `{module}`\n"
            f"embedding = torch.nn.Embedding({rows}, 8, padding_idx={padding!r}).to(device)\n"
            "out = embedding(input_ids)\n"
            "print('no error: every id is in range', tuple(out.shape))\n"
        )
        return Replay(
            f"nn.Embedding({rows}, ...) with the notebook's ids",
            body,
            "IndexError: index out of range in self",
        )
    return None


def _probabilities(found: _Found) -> Replay | None:
    for name, probs in _named(found, _PROB_NAMES, integer=False):
        outside = (probs < 0) | (probs > 1) | probs.isnan()
        if not bool(outside.any()):
            continue
        body = (
            f"# `{name}` as the notebook held it on CPU\n"
            f"probs = {_literal(probs, probs[outside])}.to(device)\n"
            "target = torch.zeros_like(probs)  # only the shape matters\n"
            "loss = F.binary_cross_entropy(probs, target)\n"
            "print('no error: every probability is in [0, 1]', loss.item())\n"
        )
        return Replay(
            "binary_cross_entropy with the notebook's probabilities",
            body,
            "RuntimeError: all elements of input should be between 0 and 1",
        )
    return None


def _sampling(found: _Found) -> Replay | None:
    for name, probs in _named(found, ("logits", "weights", *_PROB_NAMES), integer=False):
        if bool(probs.isfinite().all()) and not bool((probs < 0).any()):
            continue
        body = (
            f"# `{name}` as the notebook held it on CPU\n"
            f"probs = {_literal(probs)}.to(device)\n"
            "sample = torch.multinomial(probs, 1)\n"
            "print('no error: the probabilities are valid', sample.tolist())\n"
        )
        return Replay(
            "multinomial with the notebook's probabilities",
            body,
            "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
        )
    return None


_BUILDERS: dict[str, Callable[[_Found], Replay | None]] = {
    "class-target": _labels,
    "embedding": _token_ids,
    "index": _token_ids,
    "inductor-index": _token_ids,
    "bce-input": _probabilities,
    "multinomial": _sampling,
}


def replay_script(
    diagnosis: Diagnosis,
    *,
    frames: Sequence[Mapping[str, Any]] = (),
    namespace: Mapping[str, Any] | None = None,
    name: str = "repro.py",
) -> Replay | None:
    """The replay for ``diagnosis``, or None when no known operation's bad input was found.
    ``name`` is the script's file name, for its usage lines.

    With the device lines, only the family they name is tried; without them (``unknown-assert``),
    each family in turn, and the first with a bad value in the inputs wins.
    """
    matched = match_rules(diagnosis.assert_lines)
    if matched is not None:
        builder = _BUILDERS.get(matched[0].op)
        builders = [builder] if builder is not None else []
    elif diagnosis.cause == "unknown-assert":
        builders = [_labels, _token_ids, _probabilities, _sampling]
    else:
        builders = []
    if not builders:
        return None
    found = collect(frames, namespace)
    for build in builders:
        try:
            replay = build(found)
        except Exception:  # an odd object must not cost the other families
            continue
        if replay is not None:
            header = _HEADER.format(
                cause=diagnosis.cause, op=replay.op, expected=replay.expected
            ).replace("{name}", name)
            return Replay(replay.op, header + "\n" + replay.script, replay.expected)
    return None
