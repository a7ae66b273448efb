"""Parse the device-side assert lines the CUDA runtime prints to fd 2.

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

Pasted lines lose parts: the path (``nll_loss_...: block: ...`` with no file: ``file`` is then
""), the quotes (re-quoted ``'cond'`` or none), the block/thread numbers (``[...]``). A line of a
known kernel file that says "Assertion" but whose condition cannot be read (cut off, two
threads' lines interleaved) still counts, with an empty condition. A line cut short (an issue
title's length limit) keeps what was left: the condition's start, marked abridged (" ..."), or
only its kernel function and file, from which the rules read the op.

The shapes are the CUDA runtime's device ``assert`` output (PyTorch's ``CUDA_KERNEL_ASSERT``,
c10/macros/Macros.h) and HIP's device ``__assert_fail`` (its format string: "%s:%u: %s:
Device-side assertion `%s' failed.").
"""

from __future__ import annotations

import re

from .classify import normalize
from .model import AssertLine
from .rules import rule_for

# Pastes drop the colon after the line number ("TensorCompare.cu:109 _assert_async_cuda_kernel").
_FILE = r"(?P<file>[^\\/\s:`'\"]+\.(?:cu|cuh|hip|h|hpp|cpp|cc|c|py)|unknown):(?P<line>\d+):? "
_BLOCK = r"block: ?\[[^\]\n]*\],?\s*thread: ?\[[^\]\n]*\]\s*(?:\.\.\.\s*)?"
# The condition may contain backticks of its own (`inf`, `nan`): stop at the closing "` failed.";
# pastes re-quote it ('cond', "cond") or drop the quotes.
_ASSERTION = r"Assertion\s*[`'\"]?(?P<cond>[^\n]*?)[`'\"]?\s*failed\.?"

_CUDA = re.compile(
    _FILE
    # The function may itself contain ": " (C++ scopes, pretty signatures); Windows prints none.
    + r"(?:(?P<func>[^\n]*?): )?"
    + _BLOCK
    + _ASSERTION
)

# HIP prints "Device-side assertion `cond' failed." (backtick, apostrophe) and no block/thread.
_HIP = re.compile(
    _FILE
    + r"(?:(?P<func>[^\n]*?): )?Device-side assertion [`'\"]?(?P<cond>[^\n]*?)[`'\"]? failed\.?"
)

# CUDA_KERNEL_ASSERT_PRINTF (and _VERBOSE in verbose builds) first prints its own line (c10
# Macros.h): "[CUDA_KERNEL_ASSERT] <path>:<line>: <func>: block: [..], thread: [..]: Assertion
# failed: `<cond>`: <message>", then the runtime's usual line for the same site.
_PRINTF = re.compile(
    r"\[CUDA_KERNEL_ASSERT\] [^\n]*?"
    + _FILE
    + r"(?:(?P<func>[^\n]*?): )?"
    + r"block: ?\[[^\]\n]*\],?\s*thread: ?\[[^\]\n]*\]:?\s*"
    r"Assertion failed: `(?P<cond>[^\n]*?)`(?::|$)"
)

_DSA = re.compile(
    r"GPU assertion failure message = (?P<cond>[^\n]*)\n"
    r"\s*File containing assertion = [^\n]*?(?P<file>[^\\/\s:]+):(?P<line>\d+)\s*\n"
    r"(?:\s*Device function containing assertion = (?P<func>[^\n]*))?"
)

# A line pasted without its path: "nll_loss_forward_..._kernel_2d: block: [...] Assertion ...".
_NO_FILE = re.compile(r"(?:(?P<func>[A-Za-z_~][\w:<>~]*(?:\(\))?): )?" + _BLOCK + _ASSERTION)

# The kernel function and the condition, without path or block/thread ("_assert_async_cuda_kernel:
# ... Assertion 'probability tensor ...' failed." in an issue). glibc's own asserts have this
# shape too ("__pthread_mutex_lock: Assertion ..."): not after a C/C++ path, not a "__" name;
# nor an exception's class ("RuntimeError: Assertion ...", PyTorch <= 0.4's CPU checks).
_NO_BLOCK = re.compile(
    r"(?<![\w./:])(?P<func>(?!__)(?!\w*(?:Error|Exception):)[A-Za-z_][\w:<>~]*(?:\(\))?):"
    r"(?:\s*\.\.\.)?\s*" + _ASSERTION
)
# A line cut before its end (an issue title, a truncated log viewer): the kernel function and
# the block/thread part, maybe the start of the condition, and no "failed". Only a CUDA/HIP
# source's or header's line, a Triton kernel's ("<file>.py:31: unknown: block: ["), or one whose
# function names a PyTorch kernel: "foo: block: [" alone is any text.
_CUT_SHORT = re.compile(
    r"(?:(?P<file>[^\\/\s:`'\"]+\.(?:cu|cuh|hip|h|hpp|py)):(?P<line>\d+):? )?"
    r"(?:(?P<func>[A-Za-z_~][^\n\\/]*?): )?block: ?\[[^\n]*?"
    r"(?:Assertion\s*[`'\"]?(?P<cond>[^\n]*?))?\s*$"
)
_HOST_SOURCE = re.compile(r"\.(?:c|cc|cpp|cxx|h|hpp):\d+:")

# An assert condition quoted alone ("Assertion `t >= 0 && t < n_classes` failed." pasted by
# itself): no file, no function, no block/thread part. Any C program prints this shape, so it
# counts only where the condition is one of PyTorch's kernel checks of the user's data.
_BARE = re.compile(
    r"(?<![\w:])(?:Device-side assertion|Assertion)\s*[`'\"](?P<cond>[^\n]*?)[`'\"]\s*failed"
)


# Where the bare shape is a CPU check: an exception's own message (PyTorch <= 0.4's THNN raised
# "RuntimeError: Assertion `cur_target >= 0 && cur_target < n_classes' failed. at
# .../THNN/generic/ClassNLLCriterion.c:87"; a GPU's line never becomes one), or a line naming a
# host or Lua source (Lua torch's "THNN.lua:110: Assertion ... at .../ClassNLLCriterion.c:48").
_CPU_ASSERT = re.compile(
    r"\b\w*(?:Error|Exception):\s*(?:Device-side assertion|Assertion)\b"
    r"|[\w-]\.(?:c|cc|cpp|cxx|lua):\d+"
)


def _a_kernel_check_on_data(condition: str) -> bool:
    rule = rule_for(AssertLine(file="", condition=condition.strip()))
    return rule is not None and rule.cause != "pytorch-internal"


# A kernel source file's line that says "Assertion ... failed" (or prints a block) but whose
# condition cannot be read. Only CUDA/HIP sources: glibc's own assert prints "file.c:81: ...:
# Assertion `...' failed." too.
_LOOSE = re.compile(
    r"(?P<file>[^\\/\s:`'\"]+\.(?:cu|cuh|hip))(?::\d+:?(?:[^\n]*?\bAssertion\b[^\n]*?\bfailed"
    # an issue title cut after the word: "IndexKernel.cu:91: Assertion"
    r"|[^\n]*?\bblock: ?\[|[^\n]*?\bAssertion\b\W*$)"
    # without its line number: "Assertion failed in Loss.cu" needs both words on the line
    r"|\b[^\n]*?\bAssertion\b[^\n]*?\bfailed)"
    r"|\bAssertion\b[^\n]*?\bfailed\b[^\n]*?\b(?P<file2>[^\\/\s:`'\"]+\.(?:cu|cuh|hip))\b"
)


def _key(match: re.Match[str], file: str) -> tuple[str, str | None, str]:
    groups = match.groupdict()
    function = (groups.get("func") or "").strip() or None
    return file, function, (groups.get("cond") or "").strip()


_Site = tuple[str, "str | None", str]
_WRAPPED_AFTER_FUNCTION = re.compile(r"(?<=\w):[ \t]*\n[ \t]*(?=Assertion\s*[`'\"])")
_OPENING_QUOTE = re.compile(r"Assertion\s*[`'\"]")


def _condition_left_open(line: str) -> bool:
    """The line's last "Assertion `..." has no "failed" after it: the paste broke the line."""
    at = line.rfind("Assertion")
    if at < 0:
        return False
    tail = line[at:]
    return "failed" not in tail and _OPENING_QUOTE.match(tail) is not None


# Where a device line starts: a kernel source position, or the block/thread part. A line that
# holds one but not the "failed" that ends it was wrapped by the paste (a console copy, an editor's
# hard wrap at 80-120 columns). Host sources (.py, .cpp) are left alone: their warnings are lines
# of their own.
# Headers hold device code too (c10/util/safe_conv.h, DistributionTemplates.h, DynamicCast.h).
_DEVICE_START = re.compile(r"[\w-]\.(?:cu|cuh|hip|h|hpp):\d+:|\bblock: ?\[")
_NEXT_RECORD = re.compile(
    r"^\s*(?:Traceback|File \"|\w*(?:Error|Exception)\b|\[CUDA_KERNEL_ASSERT\])"
    r"|[\w-]\.(?:cu|cuh|hip|h|hpp):\d+:"
)


def _device_line_left_open(line: str) -> bool:
    starts = list(_DEVICE_START.finditer(line))
    return bool(starts) and "failed" not in line[starts[-1].start() :]


def _unwrap(text: str) -> str:
    """Device lines a paste wrapped ("..._kernel:\nAssertion `...` failed.", a condition broken
    over two lines, a line hard-wrapped at a console's width) joined back into one."""
    text = _WRAPPED_AFTER_FUNCTION.sub(": ", text)
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        joined = 0
        while joined < 6 and index + 1 < len(lines):
            if _condition_left_open(line):
                pass
            elif not _device_line_left_open(line) or _NEXT_RECORD.search(lines[index + 1]):
                break
            index += 1
            joined += 1
            line = f"{line.rstrip()} {lines[index].strip()}"
        out.append(line)
        index += 1
    return "\n".join(out)


# Thread and block numbers: the only difference between the lines of one site's threads.
_NUMBERS = re.compile(r"\[[\d,\s]*\]")


def _sites_in_line(line: str) -> list[tuple[_Site, str]]:
    """The assert sites one printed line holds (two when threads' lines ran together)."""
    found: list[tuple[int, _Site, str]] = []
    taken: list[tuple[int, int]] = []

    def free(match: re.Match[str]) -> bool:
        return all(match.end() <= start or match.start() >= end for start, end in taken)

    for pattern in (_PRINTF, _CUDA, _HIP):
        for match in pattern.finditer(line):
            if not free(match):
                continue
            found.append((match.start(), _key(match, match.group("file")), match.group(0)))
            taken.append(match.span())
    if "block" in line:
        for match in _NO_FILE.finditer(line):
            if free(match):
                found.append((match.start(), _key(match, ""), match.group(0)))
                taken.append(match.span())
    if not found and not _HOST_SOURCE.search(line):
        for match in _NO_BLOCK.finditer(line):
            found.append((match.start(), _key(match, ""), match.group(0)))
            taken.append(match.span())
    if not found and not _HOST_SOURCE.search(line) and not _CPU_ASSERT.search(line):
        for match in _BARE.finditer(line):
            if _a_kernel_check_on_data(match.group("cond")):
                found.append((match.start(), _key(match, ""), match.group(0)))
                taken.append(match.span())
    if not found and "failed" not in line:
        cut = _cut_short(line)
        if cut is not None:
            start, site = cut
            found.append((start, site, line[start:].strip()))
            taken.append((start, len(line)))
    for match in _LOOSE.finditer(line):
        if free(match):
            file = match.group("file") or match.group("file2")
            found.append((match.start(), (file, None, ""), match.group(0)))
    found.sort(key=lambda item: item[0])
    return [(site, _as_printed(line, start, raw)) for start, site, raw in found]


def _cut_short(line: str) -> tuple[int, _Site] | None:
    """Where a device line cut short starts, and its site: the condition's start marked
    abridged, or empty; None where neither a kernel source nor a known kernel function says it
    is a device line."""
    match = _CUT_SHORT.search(line)
    if match is None:
        return None
    file, function = match.group("file") or "", (match.group("func") or "").strip() or None
    condition = (match.group("cond") or "").strip().strip("`'\"")
    if condition:
        condition = f"{condition} ..."
    if file.endswith(".py") and function != "unknown":
        return None
    if not file and rule_for(AssertLine(file="", condition="", function=function)) is None:
        return None
    return match.start(), (file, function, condition)


_PATH_TAIL = re.compile(r"\S*$")


def _as_printed(line: str, start: int, matched: str) -> str:
    """The site's text as the GPU printed it: the match with its path prefix, which the file
    pattern leaves out (``/pytorch/aten/src/ATen/native/cuda/`` before ``Loss.cu``); a log's
    prefix before the path is not the GPU's."""
    prefix = _PATH_TAIL.search(line, 0, start)
    begin = prefix.start() if prefix else start
    return (line[begin:start] + matched).strip()


# Machine-translated pastes translate the words around the condition; mapped back before parsing
# (longest first). The condition itself is code and stays as printed.
TRANSLATED_WORDS: tuple[tuple[str, str], ...] = (
    ("が失敗しました", " failed"),
    ("に失敗しました", " failed"),
    ("失敗しました", "failed"),
    ("실패했습니다", "failed"),
    ("не выполнено", "failed"),
    ("fehlgeschlagen", "failed"),
    ("a échoué", "failed"),
    ("échouée", "failed"),
    ("échoué", "failed"),
    ("fallida", "failed"),
    ("falló", "failed"),
    ("falhou", "failed"),
    ("失败", "failed"),
    ("失敗", "failed"),
    ("실패", "failed"),
    ("アサーション", "Assertion"),
    ("Behauptung", "Assertion"),
    ("Zusicherung", "Assertion"),
    ("L'assertion", "Assertion"),
    ("Aserción", "Assertion"),
    ("aserción", "Assertion"),
    ("Asserção", "Assertion"),
    ("Утверждение", "Assertion"),
    ("утверждение", "Assertion"),
    ("어설션", "Assertion"),
    ("断言", "Assertion"),
    ("ブロック", "block"),
    ("블록", "block"),
    ("блок", "block"),
    ("块", "block"),
    ("スレッド", "thread"),
    ("스레드", "thread"),
    ("поток", "thread"),
    ("线程", "thread"),
    ("執行緒", "thread"),
    ("Block:", "block:"),
    ("Thread:", "thread:"),
)
_ASCII_WORDS = tuple((word, english) for word, english in TRANSLATED_WORDS if word.isascii())


def _untranslate(text: str, words: tuple[tuple[str, str], ...] = TRANSLATED_WORDS) -> str:
    for word, english in words:
        if word in text:
            text = text.replace(word, english)
    return text


def parse_assert_lines(text: str) -> tuple[AssertLine, ...]:
    """Every distinct assert site in ``text``, in order of first appearance, folded by thread."""
    text = normalize(text)
    if not text.isascii():
        text = _untranslate(text)
    elif "ssert" not in text:
        text = _untranslate(text, _ASCII_WORDS)
    if "ssert" not in text and "block: [" not in text:  # a long log's common case: nothing
        return ()
    if "Assertion" in text:
        text = _unwrap(text)
    counts: dict[_Site, int] = {}
    first_raw: dict[_Site, str] = {}
    # Thousands of threads print the same site: each distinct line shape is parsed once.
    seen: dict[str, list[tuple[_Site, str]]] = {}
    for line in text.splitlines():
        if "ssert" not in line and "block: [" not in line:
            continue
        shape = _NUMBERS.sub("[]", line)
        sites = seen.get(shape)
        if sites is None:
            sites = seen[shape] = _sites_in_line(line)
        for site, raw in sites:
            counts[site] = counts.get(site, 0) + 1
            first_raw.setdefault(site, raw)
    if "GPU assertion failure message" in text:
        for match in _DSA.finditer(text):
            site = _key(match, match.group("file"))
            counts[site] = counts.get(site, 0) + 1
            first_raw.setdefault(site, match.group(0).strip())
    return tuple(
        AssertLine(
            file=file, function=function, condition=condition, count=count, raw=first_raw[key]
        )
        for key, count in counts.items()
        for file, function, condition in (key,)
    )
