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
from nb_cudaguard.notebook.replay_glue import COMMAND, PlanView, make_plan, run_plan
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


def test_the_replayed_cells_are_kept_for_the_next_restart(fresh, saved, monkeypatch):
    monkeypatch.setattr(replay_glue, "_PROCESS", replay_glue._Process())
    fresh.user_ns["_go"] = lambda: run_plan(fresh, saved, make_plan(fresh, saved), True)
    with capture_output():
        fresh.run_cell("_go()", store_history=True)  # as %cudaguard replay --yes runs, in a cell
    fresh.run_cell("after = 1", store_history=True)
    cells, failing = replay_glue.cells_to_save(fresh, {}, after_cell=None)
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


def test_the_magic_says_there_is_nothing_to_replay_outside_a_kernel(shell, monkeypatch):
    monkeypatch.setattr(replay_glue, "_PROCESS", replay_glue._Process())
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match="nothing to replay: this is not a Jupyter kernel"):
        shell.run_line_magic("cudaguard", "replay")


def test_yes_goes_with_replay_only(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match="takes no --yes"):
        shell.run_line_magic("cudaguard", "status --yes")


def test_before_any_replay_the_previous_kernels_failing_cell_stays_the_target(
    fresh, saved, monkeypatch
):
    # A plain restart, then a NameError here (the variables are gone), then the blocking restart.
    monkeypatch.setattr(replay_glue, "_PROCESS", replay_glue._Process(previous=saved, loaded=True))
    fresh.run_cell("print(a_name_that_is_gone)", store_history=True)
    count = fresh.execution_count - 1
    cells, failing = replay_glue.cells_to_save(fresh, {count: False}, after_cell=None)
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
