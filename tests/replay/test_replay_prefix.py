"""What a failed cell ran before the statement that raised runs again in a replay: the line is
read from the traceback as the cell ends (a real IPython shell with the extension loaded), the
statements before it become a cell of their own, and the state the later cells ran from is the
one they had."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.utils.capture import capture_output

from nb_cudaguard.notebook import replay_glue
from nb_cudaguard.notebook.extension import current_state
from nb_cudaguard.notebook.replay_glue import make_plan, replayable, run_plan
from nb_cudaguard.replay.history import Cell, SavedCells
from nb_cudaguard.replay.prefix import ran_before, with_prefixes
from nb_cudaguard.replay.record import CellRecord
from nb_cudaguard.replay.text import plan_lines, plan_summary

OOM = "raise RuntimeError('CUDA out of memory')"


@pytest.fixture
def recorded(shell: Any) -> Iterator[Any]:
    before = set(shell.user_ns)
    shell.run_line_magic("load_ext", "nb_cudaguard")
    yield shell
    for name in set(shell.user_ns) - before:
        shell.user_ns.pop(name, None)


def _run(shell: Any, cells: Sequence[str]) -> SavedCells:
    """Run ``cells`` (the last must fail); what our restart keeps of them, these cells only."""
    for source in cells:
        result = shell.run_cell(source, store_history=True)
    assert not result.success, "the last cell must fail"
    state = current_state(shell)
    assert state is not None and state.recorder is not None
    kept, failing = replay_glue.cells_to_save(
        shell,
        state.outcomes,
        shell.execution_count - 1,
        state.seconds,
        state.recorder.settle(),
        state.replay,
    )
    assert failing is not None
    mine = kept[failing - len(cells) + 1 : failing + 1]
    return SavedCells(tuple(mine), len(mine) - 1, time.time(), 1)


def _replay(shell: Any, saved: SavedCells) -> tuple[str, list[str]]:
    saved = replayable(shell, saved)
    plan = make_plan(shell, saved)
    with capture_output():
        run_plan(shell, saved, plan, blocking_on=True)
    return plan_summary(plan, saved.cells), plan_lines(plan, saved.cells)


def test_the_record_keeps_the_line_of_the_statement_a_failed_cell_raised_in(recorded, tmp_path):
    (tmp_path / "nbpre_raises.py").write_text("x = 1\nraise ValueError('at import')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        saved = _run(
            recorded,
            [
                "def deep():\n    raise ValueError('inside')",
                f"a = 1\n\nb = [a]\n{OOM}\nc = 2",  # line 4, the cell's own raise
                "for i in range(3):\n    if i == 2:\n        deep()",  # in a loop: its first line
                "y = 0\nimport nbpre_raises",  # in a module it imports: the import
                "exec('z = 1\\nraise KeyError(2)')",  # in code it executes: the exec
            ],
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nbpre_raises", None)
    stopped = [c.record.stopped if c.record else None for c in saved.cells]
    assert stopped == [0, 4, 3, 2, 1]
    again = CellRecord.from_json(saved.cells[1].record.to_json())  # type: ignore[union-attr]
    assert again.stopped == 4


def test_the_lines_before_the_statement_that_raised_are_whole_statements():
    source = (
        "import torch\n@torch.no_grad()\ndef f(x):\n    return x\n\nfor i in range(3):\n    f(i)\n"
    )
    assert ran_before(source, 1) == ("", 0)
    assert ran_before(source, 2) == ("import torch\n", 2)
    assert ran_before(source, 4) == ("import torch\n", 2)  # inside the decorated def
    defined = "import torch\n@torch.no_grad()\ndef f(x):\n    return x\n\n"
    assert ran_before(source, 7) == (defined, 6)  # in the loop's body: from the loop on
    assert ran_before("x = (\n1)\ny", 3) == ("x = (\n1)\n", 3)
    assert ran_before("x = 1\nif x:\n", 2) == ("", 0)  # a text that does not parse
    assert ran_before("x = 1", 9) == ("", 0)  # a line past the text


def test_a_failed_cell_is_preceded_by_what_it_ran_before_the_failing_index_moving_on():
    record = CellRecord(bound=frozenset({"a"}), rng="state", stopped=3)
    cells = (
        Cell("import os", 1, False),
        Cell("a = 1\nb = 2\nraise ValueError", 2, True, 0.1, record),
        Cell("c = 1\nraise ValueError", 3, True, 0.1, CellRecord(stopped=1)),  # nothing before
        Cell("d = a", 4, True, None, CellRecord(stopped=1)),
    )
    saved = with_prefixes(SavedCells(cells, 3, time.time(), 1), str)
    assert saved.failing == 4 and saved.cells[4] is cells[3]
    prefix = saved.cells[1]
    assert (prefix.source, prefix.count, prefix.failed, prefix.ran_before) == (
        "a = 1\nb = 2\n",
        2,
        False,
        3,
    )
    assert prefix.record == CellRecord(rng="state")  # its random state, none of its effects
    assert saved.cells[2] is cells[1] and saved.cells[3] is cells[2]
    unchanged = SavedCells(cells[:1] + cells[2:], 2, time.time(), 1)
    assert with_prefixes(unchanged, str) is unchanged


def test_what_a_failed_cell_appended_to_a_module_and_drew_before_it_raised_is_replayed(
    recorded, tmp_path: Path
):
    (tmp_path / "nbpre_registry.py").write_text("entries = []\n")
    sys.path.insert(0, str(tmp_path))
    cells = [
        "import torch, nbpre_registry\ntorch.manual_seed(0)",
        f"nbpre_registry.entries.append('kernel')\nw = torch.randn(2)\n{OOM}",
        "n = len(nbpre_registry.entries)",
        "seen = (n, w.tolist())\n[][0]",
    ]
    try:
        saved = _run(recorded, cells)
        before = recorded.user_ns["n"], recorded.user_ns["w"].tolist()
        for name in ("torch", "nbpre_registry", "w", "n", "seen"):  # a new process
            recorded.user_ns.pop(name, None)
        sys.modules.pop("nbpre_registry", None)
        summary, lines = _replay(recorded, saved)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("nbpre_registry", None)
    assert recorded.user_ns["seen"] == before == (1, before[1])
    assert "(and [" in summary and "lines 1-2, what a failed cell ran before it raised)" in summary
    assert any(line.lstrip().startswith(f"[{saved.cells[1].count}] lines 1-2") for line in lines)


def test_a_prefix_that_binds_what_the_failing_cell_reads_is_used_not_the_failed_cell(recorded):
    # Before: the only cell binding ``w`` had failed, so it ran again whole and the replay stopped
    # there, at its raise, before the failing cell.
    cells = ["import torch\ntorch.manual_seed(1)", f"w = torch.rand(3)\n{OOM}", "seen = w\n[][0]"]
    saved = _run(recorded, cells)
    original = recorded.user_ns["w"].clone()
    for name in ("torch", "w", "seen"):
        recorded.user_ns.pop(name, None)
    torch.manual_seed(123)  # a new process's generator is elsewhere
    _replay(recorded, saved)
    assert torch.equal(recorded.user_ns["seen"], original)


def test_a_cell_that_ran_a_magic_counts_its_lines_in_the_text_ipython_ran(recorded):
    cells = ["\n\n%env NBPRE_FLAG=1\nflag = 7\n" + OOM, "seen = flag\n[][0]"]
    saved = _run(recorded, cells)
    assert saved.cells[0].record is not None and saved.cells[0].record.stopped == 3
    recorded.user_ns.pop("flag", None)
    expanded = replayable(recorded, saved)
    assert expanded.cells[0].source.endswith("flag = 7\n")
    assert "run_line_magic('env', 'NBPRE_FLAG=1')" in expanded.cells[0].source
    _replay(recorded, saved)
    assert recorded.user_ns["seen"] == 7


def test_a_cell_that_failed_inside_a_loop_runs_again_up_to_the_loop(recorded):
    cells = [
        "hist = []\nfor i in range(5):\n    hist.append(i)\n    if i == 3:\n        " + OOM,
        "seen = len(hist)\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert saved.cells[0].record is not None and saved.cells[0].record.stopped == 5
    recorded.user_ns.pop("hist", None)
    summary, lines = _replay(recorded, saved)
    count = saved.cells[0].count
    assert any(line.lstrip().startswith(f"[{count}] line 1 ") for line in lines), lines
    # the loop's appends are not run again, and the plan says so
    assert recorded.user_ns["seen"] == 0
    assert "its lines before line 2 run again, not the statement that raised, so" in summary
    assert "may lack what that statement did" in summary
    assert "hist" in summary.split("then that cell", 1)[1]


def test_a_part_replayed_in_an_earlier_kernel_is_planned_from_its_text(recorded):
    # Saved again after that replay, it stands alone: its record holds a random state only,
    # which is no record of what it did (a change its text shows is still planned for).
    cells = (
        Cell("log = []", 1, False),
        Cell("log.append(1)\n", 2, False, None, CellRecord(rng=""), ran_before=2),
        Cell("seen = list(log)\n[][0]", 3, True),
    )
    for name in ("log", "seen"):
        recorded.user_ns.pop(name, None)
    saved = SavedCells(cells, 2, time.time(), 1)
    plan = make_plan(recorded, saved)
    assert [step.index for step in plan.steps] == [0, 1, 2]


def test_the_part_takes_of_the_cells_record_what_its_lines_may_have_done():
    from nb_cudaguard.replay.analysis import analyse_cell
    from nb_cudaguard.replay.prefix import before_it_raised

    facts = analyse_cell("scale.register_kernel('cpu')(f)\n", str)
    record = CellRecord(
        changed=frozenset({"scale", "other"}),
        settings=("os.environ", "torch.set_printoptions"),
        environ=(("K", "v"),),
    )
    part = before_it_raised(facts, record)
    assert "scale" in part.mutates and "other" not in part.mutates  # named by its lines only
    assert "torch.set_printoptions" in part.setup  # a setting: the lines run as setup does
    assert "os.environ" not in part.setup  # set again from the record itself
    assert before_it_raised(
        facts, CellRecord(settings=("os.environ",), environ=(("K", None),))
    ) == (before_it_raised(facts, None))
