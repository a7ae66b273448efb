"""Parse the device-side assert lines the CUDA runtime prints to fd 2 (FIELD_NOTES §1).

One line per failing GPU thread, in several shapes (wrapped here; one line each when printed):

    Linux:    <path>/Loss.cu:250: nll_loss_forward_..._kernel: block: [0,0,0], thread: [5,0,0]
              Assertion `t >= 0 && t < n_classes` failed.
    Windows:  C:\\...\\Loss.cu:250: block: [0,0,0], thread: [5,0,0]
              Assertion `t >= 0 && t < n_classes` failed.
    old THC:  /pytorch/.../ClassNLLCriterion.cu:106: void cunn_...(Dtype *, ...)
              [with Dtype = float]: block: ...
    Inductor: /tmp/torchinductor_x/ab/cab....py:18: unknown: block: [0,0,0], thread: [0,0,0]
              Assertion `index out of bounds: 0 <= tmp4 < 50257` failed.
    ROCm:     <path>/Loss.hip:250: nll_loss_...: Device-side assertion `t >= 0 && t < n_classes'
              failed.
    DSA:      (builds with TORCH_USE_CUDA_DSA, inside the exception text)
              Assertion failure 0
                GPU assertion failure message = t >= 0 && t < n_classes
                File containing assertion = <path>/Loss.cu:250
                Device function containing assertion = nll_loss_forward_...

A ``CUDA_KERNEL_ASSERT_MSG(cond, msg)`` site prints its *message* where the others print the
condition; both land in ``AssertLine.condition``. A ``CUDA_KERNEL_ASSERT_PRINTF`` site prints its
formatted detail without a newline, so the detail is glued in front of the next line's path: the
file name is therefore read as the last path component before ``:<line>:``, never from the start
of a line. Path prefixes and line numbers differ per build and release, so only the file name,
the function and the condition are kept. Lines of many threads interleave; identical sites fold
into one.
"""

from __future__ import annotations

import re

from .model import AssertLine

_FILE = r"(?P<file>[^\\/\s:`'\"]+\.(?:cu|cuh|hip|h|hpp|cpp|cc|c|py)):(?P<line>\d+): "

_CUDA = re.compile(
    _FILE
    # The function may itself contain ": " (C++ scopes, pretty signatures); Windows prints none.
    + r"(?:(?P<func>[^\n]*?): )?"
    r"block: \[[\d,\s]*\],\s*thread: \[[\d,\s]*\]\s*"
    # The condition may contain backticks of its own (`inf`, `nan`): stop at the closing "` failed."
    r"Assertion `(?P<cond>[^\n]*?)` failed\.?"
)

# HIP prints "Device-side assertion `cond' failed." (backtick, apostrophe) and no block/thread.
_HIP = re.compile(
    _FILE + r"(?:(?P<func>[^\n]*?): )?Device-side assertion `(?P<cond>[^\n]*?)' failed\.?"
)

_DSA = re.compile(
    r"GPU assertion failure message = (?P<cond>[^\n]*)\n"
    r"\s*File containing assertion = [^\n]*?(?P<file>[^\\/\s:]+):(?P<line>\d+)\s*\n"
    r"(?:\s*Device function containing assertion = (?P<func>[^\n]*))?"
)

_PATTERNS = (_CUDA, _HIP, _DSA)


def parse_assert_lines(text: str) -> tuple[AssertLine, ...]:
    """Every distinct assert site in ``text``, in order of first appearance, folded by thread."""
    found: list[tuple[int, re.Match[str]]] = []
    for pattern in _PATTERNS:
        found.extend((match.start(), match) for match in pattern.finditer(text))
    found.sort(key=lambda item: item[0])
    counts: dict[tuple[str, str | None, str], int] = {}
    first_raw: dict[tuple[str, str | None, str], str] = {}
    for _start, match in found:
        function = (match.group("func") or "").strip() or None
        key = (match.group("file"), function, match.group("cond").strip())
        counts[key] = counts.get(key, 0) + 1
        first_raw.setdefault(key, match.group(0).strip())
    return tuple(
        AssertLine(
            file=file, function=function, condition=condition, count=count, raw=first_raw[key]
        )
        for key, count in counts.items()
        for file, function, condition in (key,)
    )
