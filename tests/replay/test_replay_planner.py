"""The replay planner, table-driven: which earlier cells rebuild what the failing cell needs.

Cells are written as a user types them; IPython's own input transformer turns them into Python
first, as the glue does with ``shell.transform_cell``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from nb_cudaguard.replay.analysis import SKIPPED, analyse, runnable_source
from nb_cudaguard.replay.planner import plan_replay

_transform = TransformerManager().transform_cell


def facts_of(cells: list[str]):
    return [analyse(_transform(runnable_source(c)), _transform) for c in cells]


@dataclass(frozen=True)
class Case:
    id: str
    cells: list[str]  # the last one is the failing cell
    runs: list[int]  # indices of the cells replayed (the failing one included)
    present: tuple[str, ...] = ()
    failed: tuple[int, ...] = ()


CASES = [
    Case(
        "only-the-definers-and-the-mutation",
        ["data = [1, 2, 3]", "unused = 5", "data", "data.append(4)", "print(data[3])"],
        [0, 3, 4],
    ),
    Case(
        "a-kept-name-needs-nothing",
        ["data = [1, 2, 3]", "data.append(4)", "print(data[3])"],
        [2],
        present=("data",),
    ),
    Case(
        "the-value-read-is-the-one-before-the-reader",
        ["x = 1", "y = x * 2", "x = 10", "print(y)"],
        [0, 1, 3],
    ),
    Case(
        "the-latest-definition-before-the-failing-cell-wins",
        ["x = 1", "x = 10", "print(x)"],
        [1, 2],
    ),
    Case(
        "a-function-brings-the-globals-its-body-reads",
        ["def f():\n    return w * 2", "w = 3", "unrelated = 1", "f()"],
        [0, 1, 3],
    ),
    Case(
        "a-kept-function-still-needs-its-missing-globals",
        ["def f():\n    return w * 2", "w = 3", "f()"],
        [1, 2],
        present=("f",),
    ),
    Case(
        "a-method-reads-globals-when-called",
        [
            "import torch",
            "scale = 2.0",
            "class Net:\n    def forward(self, x):\n        return x * scale",
            "net = Net()",
            "net.forward(torch.ones(1))",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-loop-accumulating-needs-its-start",
        ["total = 0", "for i in range(3):\n    total += i", "other = 1", "assert total == 99"],
        [0, 1, 3],
    ),
    Case(
        "imports-are-included-when-missing",
        ["import numpy as np", "import os", "a = np.ones(3)", "a.sum() / 0"],
        [0, 2, 3],
    ),
    Case(
        "a-call-on-a-module-changes-no-object",
        ["import numpy as np", "np.set_printoptions(precision=3)", "b = np.zeros(2)", "b[5]"],
        [0, 2, 3],
    ),
    Case(
        "mutations-of-a-rebuilt-object-are-replayed",
        [
            "import torch",
            "model = torch.nn.Linear(2, 2)",
            "model.eval()",
            "model.weight.data[0] = 1",
            "model.bias = None",
            "model(torch.ones(2))",
        ],
        [0, 1, 2, 3, 4, 5],
    ),
    Case(
        "display-only-cells-are-skipped",
        [
            "import pandas as pd",
            "df = pd.DataFrame({'a': [1]})",
            "df.head()",
            "print(df)",
            "df",
            "df.describe()",
            "df['b'] = 2",
            "df['c']",
        ],
        [0, 1, 6, 7],
    ),
    Case(
        "a-cell-that-failed-before-is-not-the-definer",
        ["x = [1]", "x = broken()", "x[3]"],
        [0, 2],
        failed=(1,),
    ),
    Case(
        "a-cell-that-failed-is-used-when-nothing-else-defines-the-name",
        ["x = [1]; y = broken()", "x[3]"],
        [0, 1],
        failed=(0,),
    ),
    Case(
        "a-deleted-name-is-not-rebuilt",
        ["x = 1", "del x", "x"],
        [2],
    ),
    Case(
        "cell-magics-that-run-python-define-names",
        ["%%time\nmodel = [1]\nbatch = 7", "%time y = model[0]", "%%bash\necho hi", "y + batch"],
        [0, 1, 3],
    ),
    Case(
        "capture-defines-its-name",
        ["%%capture out\nprint('hi')", "out.stdout"],
        [0, 1],
    ),
    Case(
        "a-shell-command-output-is-a-definition",
        ["files = !ls", "!echo hello", "len(files)"],
        [0, 2],
    ),
    Case(
        "run-may-define-anything",
        ["%run setup.py", "x = 1", "print(x, from_setup)"],
        [0, 1, 2],
    ),
    Case(
        "exec-may-define-anything",
        ["exec('z = 1')", "z + 1"],
        [0, 1],
    ),
    Case(
        "a-star-import-may-define-anything",
        ["from math import *", "pi * r"],
        [0, 1],
    ),
    Case(
        "an-opaque-cell-after-the-definer-is-not-needed",
        ["exec('q = 1')", "z = 5", "z + 1"],
        [1, 2],
    ),
    Case(
        "a-seed-is-set-again",
        ["import torch", "torch.manual_seed(0)", "x = torch.rand(3)", "x[7]"],
        [0, 1, 2, 3],
    ),
    Case(
        "our-own-commands-never-run-again",
        ["%load_ext nb_cudaguard\nx = 3", "%cudaguard restart", "x + 1"],
        [0, 2],
    ),
    Case(
        "comprehension-variables-are-local",
        ["v = 1", "k = 2", "ys = [v * k for v in range(3)]", "ys[9]"],
        [1, 2, 3],
    ),
    Case(
        "a-walrus-defines",
        ["if (n := 10) > 5:\n    pass", "n + 1"],
        [0, 1],
    ),
    Case(
        "a-name-bound-in-the-failing-cell-itself-is-not-needed",
        ["t = 1", "t = 2\nprint(t)\n1 / 0"],
        [1],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_runs_exactly_the_cells_needed(case: Case):
    facts = facts_of(case.cells)
    plan = plan_replay(facts, len(facts) - 1, set(case.present), set(case.failed))
    assert list(plan.indices) == case.runs
    assert plan.steps[-1].failing


def test_each_chosen_cell_says_which_names_it_rebuilds():
    cells = ["import torch", "data = [1]", "data.append(2)", "torch.tensor(data)[5]"]
    plan = plan_replay(facts_of(cells), 3, set())
    reasons = {s.index: s.reasons for s in plan.steps}
    assert reasons[0] == ("imports torch",)
    assert reasons[1] == ("defines data",)
    assert reasons[2] == ("changes data",)
    assert reasons[3] == ("the failing cell",)


def test_an_opaque_cell_says_why_it_is_included():
    cells = ["from math import *", "exec('w = 2')", "pi * w"]
    plan = plan_replay(facts_of(cells), 2, set())
    reasons = {s.index: " ".join(s.reasons) for s in plan.steps}
    assert "star import from math" in reasons[0]
    assert "calls exec()" in reasons[1]


def test_names_nothing_defines_are_reported_and_kept_names_listed():
    plan = plan_replay(facts_of(["a = 1", "a + b + c"]), 1, {"c"})
    assert plan.unresolved == ("b",)
    assert plan.kept == ("c",)
    assert list(plan.indices) == [0, 1]


def test_builtins_are_never_looked_for_unless_a_cell_shadowed_them():
    plan = plan_replay(facts_of(["x = 1", "print(len([x]))"]), 1, set())
    assert plan.unresolved == ()
    shadowed = plan_replay(facts_of(["list = [3]", "len(list)"]), 1, set())
    assert list(shadowed.indices) == [0, 1]


def test_control_lines_are_commented_out_and_keep_their_line_numbers():
    raw = "%load_ext nb_cudaguard\nx = 1\n%cudaguard restart\n%pip install foo\ny = 2"
    out = runnable_source(raw)
    assert out.splitlines() == [
        SKIPPED + "%load_ext nb_cudaguard",
        "x = 1",
        SKIPPED + "%cudaguard restart",
        SKIPPED + "%pip install foo",
        "y = 2",
    ]
    assert runnable_source("%cudacheck on") == "%cudacheck on"  # the guard is the user's setup


def test_a_failing_index_outside_the_cells_is_refused():
    with pytest.raises(ValueError):
        plan_replay(facts_of(["x = 1"]), 3, set())
