"""What a failed cell did before it failed: its top-level statements before the one that raised.

A cell that failed is not run again whole (it would raise again, and the replay stops at the
first error), yet what it did before the statement that raised is part of the state every later
cell ran from: a process group it started (``dist.init_process_group``), a kernel it registered
(``op.register_kernel("cpu")``), a list it appended to. The record keeps the line of the
statement the error escaped from (``stopped_line``, read from the traceback as the cell ends);
the replay runs the statements before it again, as a cell of their own just before the failed
one (``with_prefixes``), from the random state the cell began with. What the statement that
raised did before raising is not run again: the plan still names what the failed cell changed.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

from .analysis import CellFacts
from .history import Cell, SavedCells
from .record import CellRecord


def stopped_line(error: BaseException | None, namespace: Mapping[str, Any]) -> int:
    """The line of the cell's top-level statement that ``error`` escaped from, 0 where unknown:
    the outermost traceback entry of code run with ``namespace`` as its globals, where that code
    is no function's (the cell's own: ``<module>``, or ``<cell line: 0>`` as IPython 7 names it;
    a module the cell imports has globals of its own, and ``exec`` of another text inside the
    cell comes later in the traceback)."""
    entry: TracebackType | None = error.__traceback__ if error is not None else None
    while entry is not None:
        frame = entry.tb_frame
        if frame.f_globals is namespace:
            return 0 if frame.f_code.co_flags & inspect.CO_NEWLOCALS else entry.tb_lineno or 0
        entry = entry.tb_next
    return 0


def ran_before(source: str, line: int) -> tuple[str, int]:
    """The lines of ``source`` before its top-level statement that holds ``line`` (its
    decorators included), where they hold a statement, and that statement's first line; else
    ("", 0)."""
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError):
        return "", 0
    for statement in body:
        decorators = getattr(statement, "decorator_list", [])
        first = min([statement.lineno, *(d.lineno for d in decorators)])
        if first <= line <= (statement.end_lineno or statement.lineno):
            break
    else:
        return "", 0
    prefix = "".join(source.splitlines(keepends=True)[: first - 1])
    try:
        return (prefix, first) if ast.parse(prefix).body else ("", 0)
    except (SyntaxError, ValueError):  # (a statement cannot end inside another)
        return "", 0


def with_prefixes(saved: SavedCells, transform: Callable[[str], str]) -> SavedCells:
    """``saved`` with, before each cell that failed (not the failing one) whose record says where
    it raised, a cell of what ran before that statement (``Cell.ran_before``: that statement's
    first line; its record: the failed cell's random state only, not what the cell did).
    ``transform``: IPython's ``transform_cell``, whose output is the text the line numbers count
    in (magics become calls, leading blank lines go)."""
    if saved.failing is None:
        return saved
    cells: list[Cell] = []
    failing = saved.failing
    for index, cell in enumerate(saved.cells):
        record = cell.record
        if cell.failed and index != saved.failing and record is not None and record.stopped > 1:
            try:
                text = transform(cell.source)
            except Exception:  # a cell IPython can no longer transform: nothing before
                text = ""
            prefix, first = ran_before(text, record.stopped) if text else ("", 0)
            if prefix:
                cells.append(
                    Cell(
                        prefix,
                        cell.count,
                        False,
                        None,
                        CellRecord(rng=record.rng) if record.rng else None,
                        ran_before=first,
                    )
                )
                failing += index < saved.failing
        cells.append(cell)
    if len(cells) == len(saved.cells):
        return saved
    return replace(saved, cells=tuple(cells), failing=failing)


def before_it_raised(facts: CellFacts, failed: CellRecord | None) -> CellFacts:
    """The facts of what a failed cell ran before the statement that raised: its text's, and of
    the cell's record (which covers that statement too) what these lines may have done: the
    objects it changed in place that they name (``scale.register_kernel("cpu")(f)``: a call
    whose change the text alone does not see), and the process settings it changed, which they
    need not name (``dist.init_process_group``): then they run again as a setup cell does."""
    if failed is None:
        return facts
    named = failed.changed & (facts.uses | facts.defines | facts.mutates)
    if named:
        facts = replace(
            facts,
            defines=facts.defines | named,
            uses=facts.uses | named,
            mutates=facts.mutates | named,
        )
    # (not the environment and directory the replay sets again from the record itself)
    settings = [name for name in failed.settings if name not in failed.set_again]
    if settings:
        part = "ran before its failed statement, in the cell that changes " + ", ".join(settings)
        facts = replace(facts, setup="; ".join(filter(None, [facts.setup, part])))
    return facts


def unless_restored(
    facts: CellFacts, restored: Collection[str], failed: CellRecord | None
) -> CellFacts:
    """A part's facts, or none (it never runs) where it, or the failed cell by its record, changed
    a restored name in place: the restore brought that object back as the failed cell left it,
    the part's change included, and running the part again would change it twice (a counter on a
    class the restore keeps; a list appended to by a cell the part runs through ``run_cell``,
    which its text does not show)."""
    changed = facts.mutates | (failed.changed if failed is not None else frozenset())
    if changed.isdisjoint(restored):
        return facts
    return CellFacts()


def part_facts(facts: CellFacts, failed: CellRecord | None, restored: Collection[str]) -> CellFacts:
    """A part's facts from its text's ``facts``: ``before_it_raised``, where
    ``unless_restored`` lets it run."""
    return unless_restored(before_it_raised(facts, failed), restored, failed)
