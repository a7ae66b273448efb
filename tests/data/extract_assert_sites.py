"""Extract the device-side assert sites of PyTorch CUDA sources: the text each site prints.

    python tests/data/extract_assert_sites.py <source root> <commit> <file>... > sites.json

``CUDA_KERNEL_ASSERT(cond)`` and ``CUDA_KERNEL_ASSERT_VERBOSE(cond, ...)`` (without
C10_ENABLE_VERBOSE_ASSERT, as in the wheels) print ``#cond``; ``CUDA_KERNEL_ASSERT_MSG(cond,
msg)`` prints ``msg``; ``CUDA_KERNEL_ASSERT_PRINTF(cond, msg, ...)`` prints ``#cond`` (after a
``[CUDA_KERNEL_ASSERT]`` line with the message). See c10's Macros.h. The preprocessor's
stringification turns each run of white space into one space.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_CALL = re.compile(r"\b(CUDA_KERNEL_ASSERT(?:_MSG|_PRINTF|_VERBOSE)?)\s*\(")


def _arguments(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose "(" is at ``start - 1``."""
    depth, quote, args, current = 1, "", [], []
    for char in text[start:]:
        if quote:
            current.append(char)
            if char == quote and current[-2:-1] != ["\\"]:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current))
                return [a.strip() for a in args]
        elif char == "," and depth == 1:
            args.append("".join(current))
            current = []
            continue
        current.append(char)
    return []


def _stringify(code: str) -> str:
    out, quote = [], ""
    for token in re.split(r'("(?:[^"\\]|\\.)*")', code):
        out.append(token if token.startswith('"') else re.sub(r"\s+", " ", token))
    del quote
    return "".join(out).strip()


def _literal(code: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', code)).encode().decode("unicode_escape")


def sites(path: Path, name: str) -> list[dict[str, object]]:
    text = path.read_text()
    found = []
    for match in _CALL.finditer(text):
        if text[max(0, match.start() - 8) : match.start()].strip().endswith("define"):
            continue
        args = _arguments(text, match.end())
        if not args:
            continue
        macro = match.group(1)
        printed = _literal(args[1]) if macro == "CUDA_KERNEL_ASSERT_MSG" else _stringify(args[0])
        found.append(
            {
                "file": name,
                "line": text.count("\n", 0, match.start()) + 1,
                "macro": macro,
                "printed": printed,
            }
        )
    return found


if __name__ == "__main__":
    root, commit, *names = sys.argv[1:]
    entries = []
    for name in names:
        for site in sites(Path(root) / name, name.rsplit("/", 1)[-1]):
            entries.append({**site, "path": name, "commit": commit})
    json.dump(entries, sys.stdout, indent=1)
