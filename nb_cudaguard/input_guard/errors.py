"""GuardError: what ``%%cudacheck`` raises instead of letting a bad input reach a GPU kernel.

The message follows the diagnosis panel's order (what happened, where, how to fix it) in plain
text, because an exception has nothing else. Knows neither torch nor IPython.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SAFE = (
    "nb_cudaguard stopped this call before it ran: the CUDA context is healthy and every "
    "variable is intact; fix the input and run the cell again."
)
SAFE_DEFERRED = (
    "nb_cudaguard (deferred mode) ran this call with the offending values replaced by valid "
    "ones, so no kernel could fault: the CUDA context is healthy, but what the call returned, and "
    "everything computed from it since, is garbage. No optimizer step has run since the call. "
    "Fix the input and run the cell again."
)


@dataclass(frozen=True)
class Finding:
    """One argument's values that break an op's precondition (computed on the failing path only)."""

    argument: str  # "target", "input (indices)", "index 0 of x[...]"
    problem: str  # "class index out of range"
    valid: str  # "0 <= target < 10, or == ignore_index (-100)"
    source: str  # where the bound comes from: "input.shape[1] = 10 (the number of classes)"
    count: int  # offending elements
    total: int  # elements checked
    samples: tuple[tuple[str, str], ...]  # (position, value), the first few
    limit: int | None = None  # an integer range's exclusive upper bound (the class count)
    # an integer range's smallest distinct offending values (a few), for hints: 255 in a mask
    distinct: tuple[int, ...] = ()


@dataclass(frozen=True)
class Violation:
    """A finding placed in the user's program: which op, where, and what to do about it."""

    op: str  # "F.cross_entropy"
    finding: Finding
    fix: str
    owner: str | None = None  # "nn.Embedding(30522, 768) at model.bert.embeddings.word_embeddings"
    line: str | None = None  # the innermost frame of the user's code: "Cell In[5], line 3: ..."
    entry_line: str | None = None  # the outermost one, where it differs (the cell's own line)
    library_line: str | None = None  # the innermost non-torch frame, where it is not the user's
    rank: int | None = None
    deferred: bool = False  # found when the deferred verdicts were read, after the call ran
    cpu_error: str | None = None  # PyTorch's own error for these values on CPU, where it has one


class GuardError(RuntimeError):
    """A bad input caught by nb_cudaguard before its GPU kernel ran.

    A ``RuntimeError``, like the CUDA error it replaces (``torch.AcceleratorError`` is one), so
    existing ``except RuntimeError`` handlers keep working. Where PyTorch's own CPU check raises
    ``IndexError`` (nn.Embedding, cross_entropy targets, ``x[idx]``), the guard raises
    :class:`GuardIndexError`, which is both, so code that relies on ``IndexError`` (the sequence
    protocol, ``except IndexError``) behaves as it does on CPU.
    """

    def __init__(self, violation: Violation) -> None:
        super().__init__(format_violation(violation))
        self.violation = violation
        # set by the raiser: (filename, line) -> "Cell In[5], line 3: source", and which
        # files are torch's or ours (their frames are noise to the user)
        self.describe: Callable[[tuple[str, int]], str] | None = None
        self.is_internal: Callable[[str], bool] | None = None

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: the user's own frames and the message, without torch's and the
        guard's frames in between (the message already names the bad call's line)."""
        frames: list[str] = []
        tb = self.__traceback__
        while tb is not None:
            filename = tb.tb_frame.f_code.co_filename
            if self.is_internal is None or not self.is_internal(filename):
                place = (filename, tb.tb_lineno)
                frames.append(self.describe(place) if self.describe else f"{filename}, {place[1]}")
            tb = tb.tb_next
        name = type(self).__name__
        head = [f"{name}: raised at", *(f"  {f}" for f in frames)] if frames else []
        return [*head, f"{name}: {self}"]


class GuardIndexError(GuardError, IndexError):
    """A GuardError where PyTorch's own CPU check raises IndexError."""


def _headline(v: Violation) -> str:
    f = v.finding
    rank = f" [rank {v.rank}]" if v.rank is not None else ""
    first = f"{f.samples[0][1]} at {f.samples[0][0]}" if f.samples else ""
    what = f"{f.count} bad values, first" if f.count > 1 else "bad value"
    return f"{v.op}{rank}: {f.problem} in {f.argument}: {what} {first} (valid: {f.valid})"


def format_violation(v: Violation) -> str:
    f = v.finding
    shown = ", ".join(f"{value} at {pos}" for pos, value in f.samples)
    more = f" and {f.count - len(f.samples)} more" if f.count > len(f.samples) else ""
    checked = "1 element" if f.total == 1 else f"{f.total} elements"
    lines = [
        _headline(v),
        "",
        "What happened",
        f"  {f.argument}: {shown}{more} ({checked} checked).",
        f"  Valid: {f.valid}.",
    ]
    if v.owner or f.source:
        origin = v.owner + (f" ({f.source})" if f.source else "") if v.owner else f.source
        lines.append(f"  The bound comes from {origin}.")
    if v.cpu_error:
        lines.append(f"  PyTorch's own error on CPU: {v.cpu_error}")
    lines += ["", "Where"]
    if v.line:
        lines.append(f"  your line: {v.line}")
    if v.entry_line:
        lines.append(f"  reached from: {v.entry_line}")
    if v.library_line:
        lines.append(f"  called from: {v.library_line}")
    if not v.line and not v.library_line:
        lines.append("  (no frame outside torch found)")
    lines += ["", "How to fix it", f"  {v.fix}", "", SAFE_DEFERRED if v.deferred else SAFE]
    return "\n".join(lines)
