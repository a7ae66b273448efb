"""Device-side assert rules: which PyTorch kernel condition means which cause. Rules are data.

Each rule names the kernel source files it comes from and the condition (or CUDA_KERNEL_ASSERT_MSG
message) texts it matches; it never matches on a path prefix or a line number, which differ per
build and release.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ._diagnosis import AssertLine


@dataclass(frozen=True)
class Rule:
    cause: str  # a stable cause id (see _diagnosis.CAUSES)
    files: tuple[str, ...]  # kernel source file names; empty matches any file
    condition: str  # regular expression searched in the condition or message text
    source: str  # where in PyTorch the assert lives, for the reader
    title: str
    explanation: str
    likely_causes: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()

    def matches(self, line: AssertLine) -> bool:
        if self.files and line.file not in self.files:
            return False
        return re.search(self.condition, line.condition) is not None


RULES: tuple[Rule, ...] = (
    Rule(
        cause="label-out-of-range",
        files=("Loss.cu", "NLLLoss2d.cu", "ClassNLLCriterion.cu", "SpatialClassNLLCriterion.cu"),
        condition=r"t >= 0 && t < n_classes|cur_target >= 0 && cur_target < n_classes",
        source="aten/src/ATen/native/cuda/Loss.cu (nll_loss, used by cross_entropy)",
        title="A class label is outside 0..num_classes-1",
        explanation=(
            "cross_entropy / nll_loss got a target class that is negative or not smaller than "
            "the number of classes the model outputs (and is not ignore_index)."
        ),
        likely_causes=(
            "labels are numbered 1..C instead of 0..C-1",
            "the model's output layer has fewer classes than the data (num_labels left at 2)",
            "padding or 'void' labels (-1, 255, the pad token id) without ignore_index=-100",
        ),
        fixes=(
            "Check on CPU: `assert labels.min() >= 0 and labels.max() < logits.shape[-1]`.",
            "Shift 1-based labels with `labels - 1`, or size the output layer for every class.",
            "Mark labels to skip with -100 (the default ignore_index), or pass ignore_index=255.",
        ),
    ),
)


def match_rules(lines: Sequence[AssertLine]) -> tuple[Rule, AssertLine] | None:
    """The first rule matching any of the assert lines, in the order the lines were printed."""
    for line in lines:
        for rule in RULES:
            if rule.matches(line):
                return rule, line
    return None
