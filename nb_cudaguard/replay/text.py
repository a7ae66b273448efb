"""A plan in words: the cells that run again, in order, and why; what is kept; what is not."""

from __future__ import annotations

from collections.abc import Sequence

from .history import Cell
from .planner import Plan

FIRST_LINE_CHARS = 60


def cell_label(cell: Cell) -> str:
    return f"[{cell.count}]" if cell.count is not None else "[?]"


def first_line(source: str) -> str:
    """The first line that says something (not blank, not a comment)."""
    lines = [line.strip() for line in source.splitlines()]
    line = next((x for x in lines if x and not x.startswith("#")), lines[0] if lines else "")
    more = " ..." if len([x for x in lines if x]) > 1 else ""
    if len(line) > FIRST_LINE_CHARS:
        return line[: FIRST_LINE_CHARS - 3] + "..."
    return line + more


def plan_lines(plan: Plan, cells: Sequence[Cell]) -> list[str]:
    """One line per cell to run: its number, its first line, why."""
    return [
        f"{cell_label(cells[s.index])} {first_line(cells[s.index].source)}   <- "
        + "; ".join(s.reasons)
        for s in plan.steps
    ]


def plan_summary(plan: Plan, cells: Sequence[Cell]) -> str:
    failing = cells[plan.steps[-1].index]
    before = len(plan.steps) - 1
    total = plan.steps[-1].index  # cells before the failing one
    head = (
        f"Replay to cell {cell_label(failing)} of the previous kernel: "
        f"{before} of its {total} earlier cells run again, then that cell"
        if before
        else f"Replay cell {cell_label(failing)} of the previous kernel: nothing else is needed"
    )
    notes = []
    if plan.kept:
        notes.append("already here (kept): " + ", ".join(plan.kept[:12]))
    if plan.unresolved:
        notes.append(
            "not rebuilt, no earlier cell defines them: " + ", ".join(plan.unresolved[:12])
        )
    return head + (" (" + "; ".join(notes) + ")" if notes else "") + "."
