"""A plan in words: the cells that run again, in order, and why; what is kept; what is not."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from .history import Cell
from .planner import Plan, Step

FIRST_LINE_CHARS = 60


def cell_label(cell: Cell) -> str:
    label = f"[{cell.count}]" if cell.count is not None else "[?]"
    if cell.ran_before > 2:
        return f"{label} lines 1-{cell.ran_before - 1}"
    return f"{label} line 1" if cell.ran_before else label


def _not_again(cells: Sequence[Cell], index: int, steps: Collection[int], what: str) -> str:
    """How much of failed cell ``index`` the replay runs again, and what ``what`` (``"that
    name"``, ``"those names"``, ``"this process"``) lacks."""
    before = cells[index - 1] if index else None
    if before is not None and before.ran_before and index - 1 in steps:
        return (
            f"its lines before line {before.ran_before} run again, not the statement that "
            f"raised, so {what} may lack what that statement did"
        )
    lacks = "lack" if what == "those names" else "lacks"
    return f"it is not run again, so {what} {lacks} what it did"


def first_line(source: str) -> str:
    """The first line that says something (not blank, not a comment)."""
    lines = [line.strip() for line in source.splitlines()]
    line = next((x for x in lines if x and not x.startswith("#")), lines[0] if lines else "")
    more = " ..." if len([x for x in lines if x]) > 1 else ""
    if len(line) > FIRST_LINE_CHARS:
        return line[: FIRST_LINE_CHARS - 3] + "..."
    return line + more


def step_reasons(step: Step) -> str:
    """Why a cell runs, and which names the namespace has that it binds anew (put back)."""
    reasons = list(step.reasons)
    others = [n for n in step.keeps if n not in step.defs]
    if others:
        names = ", ".join(others[:12])
        reasons.append(f"the {names} here {'is' if len(others) == 1 else 'are'} put back after it")
    if step.defs:
        names = ", ".join(step.defs[:12])
        one = len(step.defs) == 1
        reasons.append(
            f"the {names} here {'stays' if one else 'stay'} from the cell's class/def on, "
            f"so what it makes uses {'it' if one else 'them'}"
        )
    return "; ".join(reasons)


def plan_lines(plan: Plan, cells: Sequence[Cell]) -> list[str]:
    """One line per cell to run: its number, its first line, why."""
    return [
        f"{cell_label(cells[s.index])} {first_line(cells[s.index].source)}   <- {step_reasons(s)}"
        for s in plan.steps
    ]


CODE_PREFIX = "      | "
FLAG_PREFIX = "      ! "


def plan_details(
    plan: Plan, cells: Sequence[Cell], flags: Mapping[int, Sequence[str]]
) -> list[str]:
    """``plan_lines``, each followed by what the cell does beyond the namespace (``flags``, by
    index: shell commands, installs, file and network writes, a long run) and its whole code:
    what the user consents to."""
    lines = []
    for step, line in zip(plan.steps, plan_lines(plan, cells), strict=True):
        lines.append(line)
        lines += [FLAG_PREFIX + flag for flag in flags.get(step.index, ())]
        lines += [CODE_PREFIX + code for code in cells[step.index].source.splitlines()]
    return lines


def plan_summary(plan: Plan, cells: Sequence[Cell]) -> str:
    failing = cells[plan.steps[-1].index]
    earlier = [cells[step.index] for step in plan.steps[:-1]]
    before = sum(not cell.ran_before for cell in earlier)
    # cells before the failing one (what a failed one ran before it raised is part of it)
    total = sum(not cell.ran_before for cell in cells[: plan.steps[-1].index])
    parts = [cell_label(cell) for cell in earlier if cell.ran_before]
    head = (
        f"Replay to cell {cell_label(failing)} of the previous kernel: "
        f"{before} of its {total} earlier cells run again"
        + (f" (and {', '.join(parts)}, what a failed cell ran before it raised)" if parts else "")
        + ", then that cell"
        if earlier
        else f"Replay cell {cell_label(failing)} of the previous kernel: nothing else is needed"
    )
    ran = {step.index for step in plan.steps}
    notes = []
    kept = [n for n in plan.kept if n not in plan.bound_here]
    if kept:
        notes.append("already here (kept): " + ", ".join(kept[:12]))
    if plan.unresolved:
        notes.append(
            "not rebuilt, no earlier cell defines them: " + ", ".join(plan.unresolved[:12])
        )
    if plan.twice:
        notes.append(
            "as restored, though the cells below change them again (no earlier cell builds them "
            "anew, and the restored ones have those changes already): " + ", ".join(plan.twice)
        )
    changed = [(n, why) for n, why in plan.yours if n not in plan.bound_here]
    if changed:
        notes.append(
            "kept as you changed them after the restore: "
            + ", ".join(f"{name} (though {why})" if why else name for name, why in changed[:12])
        )
    if plan.bound_here:
        notes.append(
            "kept as your cells bound them after the restart, not as they were before the "
            "failure: " + ", ".join(plan.bound_here[:12])
        )
    if plan.from_yours:
        notes.append(
            f"built from what you {'bound or ' if plan.bound_here else ''}changed after the "
            f"{'restart' if plan.bound_here else 'restore'}, so they follow your change: "
            + ", ".join(plan.from_yours[:12])
        )
    if plan.failed_changes:
        notes.append(
            "; ".join(
                f"{cell_label(cells[i])} failed when it ran, after it bound or changed "
                f"{', '.join(names[:12])}: "
                + _not_again(cells, i, ran, "that name" if len(names) == 1 else "those names")
                + (f", and so do {', '.join(built[:12])}, built from it later" if built else "")
                for i, names, built in plan.failed_changes
            )
        )
    if plan.failed_setup:
        notes.append(
            "; ".join(
                f"{cell_label(cells[i])} failed when it ran, after it set process state "
                f"({setup}): "
                + _not_again(cells, i, ran, "this process")
                + (f", and these may differ with it: {', '.join(made[:12])}" if made else "")
                for i, setup, made in plan.failed_setup
            )
        )
    if plan.set_again:
        notes.append(
            "; ".join(
                f"{cell_label(cells[i])} failed when it ran, after it set {what}: it is not run "
                "again, and the replay sets these as they were when it ran"
                for i, what in plan.set_again
            )
        )
    if plan.overwritten:
        notes.append(
            "built again though you changed them after the restore (your change is lost): "
            + "; ".join(f"{name}: {why}" for name, why in plan.overwritten[:12])
        )
    if plan.unseeded:
        labels = ", ".join(cell_label(cells[i]) for i in plan.unseeded)
        notes.append(
            f"{labels} draw random numbers with no seed set before: what they draw differs "
            "from the previous kernel's"
        )
    if plan.unrepeatable_names:
        what = "; ".join(f"{cell_label(cells[i])} {why}" for i, why in plan.unrepeatable[:12])
        if " in order" in what or "string hashing" in what:
            what += " (a set's order and a string's hash follow each process's string hashing, "
            what += "PYTHONHASHSEED)"
        notes.append(
            f"{what}: run again in this process, these may differ: "
            + ", ".join(plan.unrepeatable_names[:12])
        )
    if plan.kept_foreign:
        notes.append(
            "kept as the previous kernel left them, though made from what held in its process "
            "only, so they may not match what is here: "
            + ", ".join(
                f"{name} ({cell_label(cells[i])} read {what})"
                for name, i, what in plan.kept_foreign
            )
        )
    if plan.kept_running:
        notes.append(
            "changed in the previous kernel by a thread or task that a cell not run again "
            "started, while the cells ran (maybe after the failure too): kept or rebuilt here, "
            "they may differ: "
            + ", ".join(f"{name} ({cell_label(cells[i])})" for name, i in plan.kept_running)
        )
    graphless = (
        "restored without their autograd graph (leaves now: a backward() through them would "
        "reach nothing)"
    )
    if plan.graphless:
        notes.append(f"{graphless}, so built again: " + ", ".join(plan.graphless[:12]))
    if plan.graph_lost:
        notes.append(
            f"{graphless}, and not built again: "
            + ", ".join(f"{name} ({why})" for name, why in plan.graph_lost[:12])
        )
    if plan.files_changed:
        notes.append(
            "files the replay leaves otherwise than the previous kernel did: "
            + "; ".join(f"{path}, {how}" for path, how in plan.files_changed)
        )
    if plan.unrecorded:
        labels = ", ".join(cell_label(cells[i]) for i in plan.unrecorded[:12])
        notes.append(
            f"{labels} ran before nb_cudaguard was loaded: planned from their text alone, so a "
            "change they made through a call may be missed"
        )
    if plan.unseen:
        notes.append(
            "not compared whole when the cells ran (too large, or holding state Python cannot "
            "read), a change inside them may be missed: " + ", ".join(plan.unseen[:12])
        )
    return head + (" (" + "; ".join(notes) + ")" if notes else "") + "."
