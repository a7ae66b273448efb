"""Which device assert lines repeat a site another GPU thread printed: what the fd 2 tee folds.

The GPU prints a failed ``CUDA_KERNEL_ASSERT`` once per failing thread (hundreds of lines for one
bad batch); a reader that takes the first characters of a cell's output (an agent, a log) would
see nothing else. The tee's child (runtime/capture.py) imports this module by name, on the first
line that may be an assert: it forwards the verdict line and the first line of each site, and one
line with the count for the rest. Its kept copy, which the diagnosis reads, stays complete.
"""

from __future__ import annotations

from .assert_lines import parse_assert_lines
from .rules import rule_for
from .schema import verdict_text

Site = tuple[str, "str | None", str]


def site(line: str) -> tuple[Site, str] | None:
    """(the assert site of ``line``, its cause id), or None if it is no device assert line."""
    parsed = parse_assert_lines(line)
    if not parsed:
        return None
    first = parsed[0]
    rule = rule_for(first)
    return (first.file, first.function, first.condition), (
        rule.cause if rule is not None else "unknown-assert"
    )


def verdict(cause: str, command: str) -> str:
    """The verdict line for a device assert: it always leaves the context poisoned."""
    return verdict_text("required", cause, command)


def folded(count: int) -> str:
    return (
        f"nb_cudaguard: {count} more line{'s' if count != 1 else ''} of the same assert from "
        "other GPU threads folded here; every line is in the panel's details."
    )
