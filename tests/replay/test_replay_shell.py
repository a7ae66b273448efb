"""The replay glue in a real IPython shell: the plan as the user sees it, the run, the magic."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from nb_cudaguard.notebook import replay_glue
from nb_cudaguard.notebook.replay_glue import (
    COMMAND,
    PlanView,
    ReplayState,
    make_plan,
    run_plan,
)
from nb_cudaguard.replay.history import Cell, SavedCells

CELLS = (
    Cell("import math\nprint('RAN:math')", 1, False),
    Cell("print('RAN:a'); a = 2", 2, False),
    Cell("%load_ext nb_cudaguard\nprint('RAN:b'); b = 3", 3, False),
    Cell("print('RAN:unused'); unused = 1", 4, False),
    Cell("print('RAN:fail')\nc = [a, b]\nc[math.floor(a * b)]", 5, True),
)
NAMES = ("a", "b", "c", "unused", "math")


@pytest.fixture
def saved():
    return SavedCells(CELLS, 4, time.time(), 1)


@pytest.fixture
def fresh(shell):
    for name in NAMES:
        shell.user_ns.pop(name, None)
    yield shell
    for name in (*NAMES, "_go", "after"):
        shell.user_ns.pop(name, None)


def test_the_plan_lists_each_cell_with_its_number_first_line_and_reason(fresh, saved):
    view = PlanView(make_plan(fresh, saved), saved.cells, blocking_on=True)
    bundle = view._repr_mimebundle_()
    text = bundle["text/plain"]
    assert "Replay to cell [5] of the previous kernel: 3 of its 4 earlier cells" in text
    assert "[1] import math ...   <- imports math" in text
    assert "[3] %load_ext nb_cudaguard ...   <- defines b" in text
    assert "[4]" not in text
    assert f"`{COMMAND}`" in text
    assert "<code>%cudaguard replay --yes</code>" in bundle["text/html"]
    assert "Blocking mode is off" not in text


def test_without_blocking_mode_the_plan_says_the_line_may_be_wrong(fresh, saved):
    text = PlanView(make_plan(fresh, saved), saved.cells, blocking_on=False).text()
    assert "Blocking mode is off in this kernel" in text
    assert "`%cudaguard restart`" in text


def test_the_run_stops_at_the_failing_cell_and_leaves_the_history_alone(fresh, saved):
    count = fresh.execution_count
    with capture_output() as out:
        said = run_plan(fresh, saved, make_plan(fresh, saved), blocking_on=True)
    assert re.findall(r"^RAN:(\w+)$", out.stdout, re.M) == ["math", "a", "b", "fail"]
    assert "Replay stopped at cell [5] of the previous kernel, the failing cell" in said
    assert "IndexError" in out.stdout + out.stderr
    assert fresh.execution_count == count
    assert "nb_cudaguard" not in fresh.extension_manager.loaded  # the %load_ext line was skipped


def test_an_earlier_cell_that_fails_stops_the_run_before_the_failing_cell(fresh):
    cells = (Cell("zero_div = 1 / 0", 1, False), Cell("print(zero_div)", 2, True))
    saved = SavedCells(cells, 1, time.time(), 1)
    with capture_output():
        said = run_plan(fresh, saved, make_plan(fresh, saved), blocking_on=True)
    assert "stopped at cell [1] of the previous kernel (before the failing cell)" in said


def test_the_replayed_cells_are_kept_for_the_next_restart(fresh, saved):
    replay = ReplayState()  # the extension's, in a kernel
    fresh.user_ns["_go"] = lambda: run_plan(fresh, saved, make_plan(fresh, saved), True, replay)
    with capture_output():
        fresh.run_cell("_go()", store_history=True)  # as %cudaguard replay --yes runs, in a cell
    fresh.run_cell("after = 1", store_history=True)
    cells, failing = replay_glue.cells_to_save(fresh, {}, after_cell=None, replay=replay)
    # In their place: after the cell that ran them, before the next one.
    assert [c.source for c in cells[-6:]] == [
        "_go()",
        *(CELLS[i].source for i in (0, 1, 2, 4)),
        "after = 1",
    ]
    assert [c.count for c in cells[-5:-1]] == [1, 2, 3, 5]  # as the notebook numbered them
    assert failing is not None and cells[failing].source == CELLS[4].source
    assert (cells[failing].count, cells[failing].failed) == (5, True)
    assert all(c.seconds is not None for c in cells[-5:-1])  # timed as they ran


def test_the_magic_says_there_is_nothing_to_replay_outside_a_kernel(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match="nothing to replay: this is not a Jupyter kernel"):
        shell.run_line_magic("cudaguard", "replay")


def test_yes_goes_with_replay_only(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match="takes no --yes"):
        shell.run_line_magic("cudaguard", "status --yes")


def test_before_any_replay_the_previous_kernels_failing_cell_stays_the_target(fresh, saved):
    # A plain restart, then a NameError here (the variables are gone), then the blocking restart.
    replay = ReplayState(previous=saved, loaded=True)
    fresh.run_cell("print(a_name_that_is_gone)", store_history=True)
    count = fresh.execution_count - 1
    cells, failing = replay_glue.cells_to_save(
        fresh, {count: False}, after_cell=None, replay=replay
    )
    assert list(cells[: len(CELLS)]) == list(CELLS)
    assert failing == 4 and cells[failing] == CELLS[4]
    assert cells[-1] == Cell("print(a_name_that_is_gone)", count, True)


LINKED = (
    Cell("import torch\ntorch.manual_seed(0)\nprint('RAN:seed')", 1, False),
    Cell("model = torch.nn.Linear(2, 1)\nprint('RAN:model')", 2, False),
    Cell("opt = torch.optim.SGD(model.parameters(), lr=1.0)\nprint('RAN:opt')", 3, False),
    Cell("loss = model(torch.ones(1, 2)).sum()\nloss.backward()\nprint('RAN:backward')", 4, False),
    Cell("layer = model\nprint('RAN:alias')", 5, False),
    Cell("unused = 5\nprint('RAN:unused')", 6, False),
    Cell("opt.step()\nprint('RAN:step')", 7, False),
    Cell("with torch.no_grad():\n    layer.bias.fill_(3.0)\nprint('RAN:bias')", 8, False),
    Cell("print('RAN:fail')\nafter = model.weight.detach().clone(), model.bias.item()", 9, True),
)
LINKED_NAMES = ("torch", "model", "opt", "loss", "layer", "unused", "after")


@contextlib.contextmanager
def _without(shell, names: tuple[str, ...]) -> Iterator[None]:
    """The names gone from the namespace before and after: a fresh kernel's view."""
    for name in names:
        shell.user_ns.pop(name, None)
    try:
        yield
    finally:
        for name in names:
            shell.user_ns.pop(name, None)


def _replay(shell, cells: tuple[Cell, ...]) -> tuple[dict[int, list[str]], list[str]]:
    """Plan and run the replay of ``cells`` (the last one failed): each planned cell's reasons
    by its count, and the RAN: markers the replayed cells printed."""
    saved = SavedCells(cells, len(cells) - 1, time.time(), 1)
    plan = make_plan(shell, saved)
    reasons = {saved.cells[s.index].count: s.reasons for s in plan.steps}
    with capture_output() as out:
        run_plan(shell, saved, plan, blocking_on=True)
    return reasons, re.findall(r"^RAN:(\w+)$", out.stdout, re.M)


def _run_then_replay(
    shell, cells: tuple[Cell, ...], names: tuple[str, ...]
) -> tuple[Any, Any, dict[int, list[str]], list[str]]:
    """Run ``cells`` as the previous kernel did, then replay them in a namespace without
    ``names``: ``after`` from each run, the plan's reasons and the RAN: markers."""
    with _without(shell, names):
        with capture_output():  # the previous kernel, cell by cell
            for cell in cells:
                shell.run_cell(cell.source)
        original = shell.user_ns["after"]
    with _without(shell, names):  # the restart: nothing kept
        reasons, ran = _replay(shell, cells)
        return original, shell.user_ns["after"], reasons, ran


def test_a_replay_changes_the_rebuilt_model_through_the_names_built_from_it(shell):
    torch = pytest.importorskip("torch")
    with _without(shell, LINKED_NAMES):
        reasons, ran = _replay(shell, LINKED)
        assert "changes model through opt" in reasons[7]
        assert "changes model through layer" in reasons[8]
        assert ran == ["seed", "model", "opt", "backward", "alias", "step", "bias", "fail"]
        torch.manual_seed(0)
        initial = torch.nn.Linear(2, 1).weight.detach()
        weight, bias = shell.user_ns["after"]
        assert torch.equal(weight, initial - 1.0)  # one SGD step, lr 1, gradient 1: replayed
        assert bias == 3.0


STORED = (
    Cell("import torch\ntorch.manual_seed(0)\nprint('RAN:seed')", 1, False),
    Cell("model = torch.nn.Linear(2, 1)\nprint('RAN:model')", 2, False),
    Cell("models = []\nprint('RAN:list')", 3, False),
    Cell("models.append(model)\nprint('RAN:append')", 4, False),
    Cell("unused = 5\nprint('RAN:unused')", 5, False),
    Cell("with torch.no_grad():\n    models[0].weight.mul_(2.0)\nprint('RAN:scale')", 6, False),
    Cell("for m in models:\n    m.bias.data.fill_(3.0)\nprint('RAN:loop')", 7, False),
    Cell("print(len(models), models[0].training)\nprint('RAN:read')", 8, False),
    Cell("print('RAN:fail')\nafter = model.weight.detach().clone(), model.bias.item()", 9, True),
)
STORED_NAMES = ("torch", "model", "models", "unused", "m", "after")


def test_a_replay_changes_the_rebuilt_model_through_the_list_it_was_stored_in(shell):
    torch = pytest.importorskip("torch")
    (weight, bias), (replayed_weight, replayed_bias), reasons, ran = _run_then_replay(
        shell, STORED, STORED_NAMES
    )
    assert "changes model through models" in reasons[6]
    assert "changes model through models" in reasons[7]
    assert ran == ["seed", "model", "list", "append", "scale", "loop", "fail"]
    assert torch.equal(replayed_weight, weight)  # doubled through models[0]
    assert replayed_bias == bias == 3.0  # set through the loop variable


HANDED = (
    Cell("import torch\ntorch.manual_seed(0)\nprint('RAN:seed')", 1, False),
    Cell("model = torch.nn.Linear(2, 1)\nprint('RAN:model')", 2, False),
    Cell(
        "class Trainer:\n    def __init__(self, lr):\n        self.lr = lr\n"
        "    def fit(self, net):\n        opt = torch.optim.SGD(net.parameters(), lr=self.lr)\n"
        "        net(torch.ones(1, 2)).sum().backward()\n        opt.step()\n"
        "print('RAN:class')",
        3,
        False,
    ),
    Cell("trainer = Trainer(lr=1.0)\nprint('RAN:trainer')", 4, False),
    Cell("unused = 5\nprint('RAN:unused')", 5, False),
    Cell("trainer.fit(model)\nprint('RAN:fit')", 6, False),
    Cell("print('RAN:fail')\nafter = model.weight.detach().clone(), model.bias.item()", 7, True),
)
HANDED_NAMES = ("torch", "model", "Trainer", "trainer", "unused", "after")


def test_a_replay_runs_again_the_trainer_that_fitted_the_rebuilt_model(shell):
    torch = pytest.importorskip("torch")
    (weight, bias), (replayed_weight, replayed_bias), reasons, ran = _run_then_replay(
        shell, HANDED, HANDED_NAMES
    )
    assert "changes model" in reasons[6]
    assert ran == ["seed", "model", "class", "trainer", "fit", "fail"]
    assert torch.equal(replayed_weight, weight)  # one SGD step inside trainer.fit: replayed
    assert replayed_bias == bias


# --- issue 22: draws after a seed, the notebook's own modules, consent ---

DRAWS = (
    Cell("import torch\ntorch.manual_seed(0)\nprint('RAN:seed')", 1, False),
    Cell("x = torch.randn(3)\nprint('RAN:x')", 2, False),
    Cell("x = torch.randn(3)\nprint('RAN:x')", 3, False),  # the same cell, run twice
    Cell(
        "loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, shuffle=True)\n"
        "print('RAN:loader')",
        4,
        False,
    ),
    Cell("peek = next(iter(loader))\nprint('RAN:peek')", 5, False),
    Cell("w = torch.randn(3)\nprint('RAN:w')", 6, False),
    Cell("print('RAN:fail')\nafter = w.clone()", 7, True),
)
DRAWS_NAMES = ("torch", "x", "loader", "peek", "w", "after")


def test_a_replay_draws_what_the_skipped_cells_drew_after_the_seed(shell):
    torch = pytest.importorskip("torch")
    original, replayed, reasons, ran = _run_then_replay(shell, DRAWS, DRAWS_NAMES)
    assert ran == ["seed", "x", "x", "loader", "peek", "w", "fail"]
    assert "draws random numbers (calls randn()) after the seed" in " ".join(reasons[2])
    assert torch.equal(replayed, original)


def test_a_plan_says_which_cells_draw_with_no_seed_set(shell):
    cells = (
        Cell("import random\nprint('RAN:import')", 1, False),
        Cell("w = random.random()\nprint('RAN:w')", 2, False),
        Cell("print('RAN:fail')\nafter = w", 3, True),
    )
    with _without(shell, ("random", "w", "after")):
        saved = SavedCells(cells, 2, time.time(), 1)
        text = PlanView(make_plan(shell, saved), saved.cells, blocking_on=True).text()
    assert "[2] draw random numbers with no seed set before" in text


OWN_MODULE = """\
def train(net):
    net.append('trained')
"""


def test_a_replay_follows_a_function_of_a_module_beside_the_notebook(shell, tmp_path, monkeypatch):
    (tmp_path / "nbcg_own_steps.py").write_text(OWN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cells = (
        Cell("import nbcg_own_steps as steps\nprint('RAN:import')", 1, False),
        Cell("model = []\nprint('RAN:model')", 2, False),
        Cell("steps.train(model)\nprint('RAN:train')", 3, False),
        Cell("print('RAN:fail')\nafter = list(model)", 4, True),
    )
    original, replayed, reasons, ran = _run_then_replay(shell, cells, ("steps", "model", "after"))
    assert ran == ["import", "model", "train", "fail"]
    assert "changes model" in reasons[3]
    assert replayed == original == ["trained"]


def test_a_library_function_still_only_reads_what_it_is_handed(shell):
    pytest.importorskip("numpy")
    cells = (
        Cell("import numpy as np\nprint('RAN:import')", 1, False),
        Cell("model = [1.0, 2.0]\nprint('RAN:model')", 2, False),
        Cell("m = np.mean(model)\nprint('RAN:mean')", 3, False),
        Cell("print('RAN:fail')\nafter = list(model)", 4, True),
    )
    _, _, _, ran = _run_then_replay(shell, cells, ("np", "model", "m", "after"))
    assert ran == ["model", "fail"]


def test_a_cell_that_binds_anew_what_the_namespace_has_leaves_it_as_it_is(shell):
    cells = (
        Cell("print('RAN:setup')\nlabels = [0, 1, 3]\nx = 2", 1, False),
        Cell("print('RAN:fail')\nafter = (list(labels), x)", 2, True),
    )
    with _without(shell, ("labels", "x", "after")):
        fixed = shell.user_ns["labels"] = [0, 1, 2]
        saved = SavedCells(cells, 1, time.time(), 1)
        plan = make_plan(shell, saved)
        assert plan.steps[0].keeps == ("labels",)
        with capture_output():
            run_plan(shell, saved, plan, blocking_on=True)
        assert shell.user_ns["labels"] is fixed
        assert shell.user_ns["after"] == ([0, 1, 2], 2)


def test_a_cell_that_ran_long_before_is_flagged_in_the_plan(shell):
    cells = (
        Cell("import time\nprint('RAN:a')\na = 1", 1, False, 754.0),
        Cell("print('RAN:fail')\nafter = a", 2, True, 0.1),
    )
    with _without(shell, ("time", "a", "after")):
        saved = SavedCells(cells, 1, time.time(), 1)
        text = replay_glue.plan_view(shell, make_plan(shell, saved), saved, True).text()
    assert "      ! ran 12 min 34 s before" in text
    assert "They took 12 min 34 s before." in text
