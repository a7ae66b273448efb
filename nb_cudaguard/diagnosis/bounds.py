"""Where a bound comes from, in the user's own modules: the one place that finds them.

The panel's evidence ("the classifier `model.classifier` has 21 outputs") and the guard's message
("the classifier nn.Conv2d(64, 21, ...) at model.classifier") both find the classifier here, so
the two never disagree about which layer's outputs are the classes: a ``Linear``, or a 1x1
convolution named like a head (a segmentation model's per-pixel classifier). The guard also
finds here the module that owns a parameter (the ``nn.Embedding`` whose rows bound the ids).

Pure: reads the objects handed in (module attributes, never tensor values), and torch only
through ``sys.modules`` (it never imports it).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# A layer or a model rarely has more; past this many a walk stops (a pathological object).
MAX_MODULES = 5000
# Names of output layers: BERT's classifier, GPT's lm_head, ResNet's fc, a U-Net's outc,
# torchvision's DeepLabHead (classifier.4).
_HEAD = re.compile(r"classifier|score|head|fc|out|logits|cls", re.IGNORECASE)
# Segmentation masks mark pixels that belong to no class ("void": borders, unlabelled) with 255
# (Pascal VOC, Cityscapes' trainId, ADE20K's reduced labels); the loss must be told to skip them.
VOID_LABEL = 255
VOID_FIX = (
    "255 is the label segmentation masks give 'void' pixels (object borders, unlabelled "
    "areas): pass `ignore_index=255` (`nn.CrossEntropyLoss(ignore_index=255)` or "
    "`F.cross_entropy(..., ignore_index=255)`) so the loss skips them."
)


@dataclass(frozen=True)
class Head:
    """An output layer of the user's model."""

    path: str  # "model.classifier.4", from the name the user's namespace gives its model
    outputs: int  # out_features, or out_channels of a 1x1 convolution
    module: Any
    num_labels: int | None  # the owning model's config.num_labels, where it has one
    named: bool  # named like an output layer


def find_classifier(owners: Iterable[tuple[str, Any]], classes: int | None = None) -> Head | None:
    """The layer whose outputs are a loss's classes, among the modules in ``owners``.

    ``owners``: (name, object) pairs, the better-named first (the notebook's ``model`` before a
    frame's ``self``): a layer reached from two is called by the first. ``classes``: where the
    caller knows the number (the guard, from the logits' shape), only layers with that many
    outputs. Of the rest: a model with a ``config.num_labels`` before a stray layer, a layer
    named like a head before others, and then the last found (a model's output layer comes
    after its hidden ones; a notebook's model after the backbone it was built from).
    """
    heads = [h for h in _heads(owners) if classes is None or h.outputs == classes]
    if not heads:
        return None
    return max(enumerate(heads), key=lambda e: (e[1].num_labels is not None, e[1].named, e[0]))[1]


def _heads(owners: Iterable[tuple[str, Any]]) -> list[Head]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    nn = torch.nn
    found: list[Head] = []
    seen: set[int] = set()  # owners
    layers: set[int] = set()
    for name, owner in owners:
        if not isinstance(owner, nn.Module) or id(owner) in seen:
            continue
        seen.add(id(owner))
        labels = _num_labels(owner)
        for count, (path, module) in enumerate(owner.named_modules()):
            if count > MAX_MODULES:
                break
            outputs = _outputs(nn, module, path or name)
            if outputs is None or id(module) in layers:
                continue
            layers.add(id(module))
            where = ".".join(filter(None, (name, path)))
            found.append(Head(where, outputs, module, labels, _named_like_a_head(where)))
    return found


def _outputs(nn: Any, module: Any, path: str) -> int | None:
    """A Linear's outputs; a 1x1 convolution's where its path names it a head (torchvision's
    ``classifier.4``, a U-Net's ``outc``): other 1x1 convolutions (ResNet bottlenecks) say
    nothing about the number of classes."""
    if isinstance(module, nn.Linear):
        return int(module.out_features)
    if (
        isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
        and all(k == 1 for k in module.kernel_size)
        and _HEAD.search(path) is not None
    ):
        return int(module.out_channels)
    return None


def _named_like_a_head(path: str) -> bool:
    """By the last name that is not an index: ``classifier.4`` is the classifier's."""
    names = [part for part in path.split(".") if not part.isdigit()]
    return bool(names) and _HEAD.search(names[-1]) is not None


def _num_labels(model: Any) -> int | None:
    labels = getattr(getattr(model, "config", None), "num_labels", None)
    return labels if isinstance(labels, int) and not isinstance(labels, bool) else None


def parameter_owner(params: set[int], owners: Iterable[tuple[str, Any]]) -> str | None:
    """'nn.Embedding(30522, 768) at model.bert.embeddings.word_embeddings': the module among
    ``owners`` (the better-named first) that holds one of the parameters whose ids are given."""
    torch = sys.modules.get("torch")
    if torch is None or not params:
        return None
    seen: set[int] = set()
    for name, owner in owners:
        if not isinstance(owner, torch.nn.Module) or id(owner) in seen:
            continue
        seen.add(id(owner))
        for path, module in owner.named_modules():
            if any(id(p) in params for p in module._parameters.values()):
                return f"{describe_module(module)} at {'.'.join(filter(None, (name, path)))}"
    return None


def describe_module(module: Any) -> str:
    """'nn.Linear(in_features=8, out_features=3, bias=True)', as the user would build it."""
    cls = type(module)
    prefix = "nn." if cls.__module__.startswith("torch.nn") else ""
    return f"{prefix}{cls.__name__}({module.extra_repr()})"


def marks_void(bad_values: Iterable[int]) -> bool:
    """Whether the offending labels include 255, segmentation's "void" label."""
    return VOID_LABEL in bad_values
