"""Parse the device-side assert lines the CUDA runtime prints to fd 2 (FIELD_NOTES §1).

One line per failing GPU thread, in several shapes:

    Linux:    <path>/Loss.cu:250: nll_loss_forward_..._kernel: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.
    Windows:  C:\\...\\Loss.cu:250: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.
    old THC:  /pytorch/.../ClassNLLCriterion.cu:106: void cunn_...(Dtype *, ...) [with Dtype = float]: block: ...
    Inductor: /tmp/torchinductor_x/ab/cab....py:18: unknown: block: [0,0,0], thread: [0,0,0] Assertion `index out of bounds: 0 <= tmp4 < 50257` failed.

Path prefixes and line numbers differ per build and release, so only the file name, the function
and the condition are kept. Lines of many threads interleave; identical sites fold into one.
"""

from __future__ import annotations

import re

from ._diagnosis import AssertLine

_ASSERT = re.compile(
    # The file name is the last path component before ":<line>: ".
    r"(?P<file>[^\\/\s:`]+\.(?:cu|cuh|h|hpp|cpp|cc|c|py)):(?P<line>\d+): "
    # The function may itself contain ": " (C++ scopes, pretty signatures); Windows prints none.
    r"(?:(?P<func>.*?): )?"
    r"block: \[[\d,\s]*\], thread: \[[\d,\s]*\] "
    r"Assertion `(?P<cond>.*?)` failed\."
)


def parse_assert_lines(text: str) -> tuple[AssertLine, ...]:
    """Every distinct assert site in ``text``, in order of first appearance, folded by thread."""
    counts: dict[tuple[str, str | None, str], int] = {}
    first_raw: dict[tuple[str, str | None, str], str] = {}
    for match in _ASSERT.finditer(text):
        function = match.group("func") or None
        key = (match.group("file"), function, match.group("cond").strip())
        counts[key] = counts.get(key, 0) + 1
        first_raw.setdefault(key, match.group(0))
    return tuple(
        AssertLine(file=file, function=function, condition=condition, count=count, raw=first_raw[key])
        for key, count in counts.items()
        for file, function, condition in (key,)
    )
