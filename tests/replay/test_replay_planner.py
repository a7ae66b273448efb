"""The replay planner, table-driven: which earlier cells rebuild what the failing cell needs.

Cells are written as a user types them; IPython's own input transformer turns them into Python
first, as the glue does with ``shell.transform_cell``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from nb_cudaguard.replay.analysis import SKIPPED, analyse, runnable_source
from nb_cudaguard.replay.planner import joined, plan_replay
from nb_cudaguard.replay.record import CellRecord

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
        ["import numpy as np", "np.testing.assert_equal(1, 1)", "b = np.zeros(2)", "b[5]"],
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
    # --- objects changed under another name (issue 13, item 4) -----------------------------------
    Case(
        "an-optimizer-step-changes-the-model-it-was-built-from",
        [
            "import torch",
            "model = torch.nn.Linear(2, 2)",
            "opt = torch.optim.AdamW(model.parameters())",
            "loss = model(torch.ones(2)).sum()\nloss.backward()",
            "opt.step()",
            "unrelated = 1",
            "model(torch.ones(2))",
        ],
        [0, 1, 2, 3, 4, 6],
    ),
    Case(
        "a-scheduler-built-from-the-optimizer-links-to-the-model-too",
        [
            "model = Net()",
            "opt = SGD(model.parameters(), lr=0.1)",
            "sched = StepLR(opt, 1)",
            "sched.step()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-data-set-changed-after-its-loader-was-built",
        [
            "ds = make_ds()",
            "loader = DataLoader(ds)",
            "ds.transform = aug",
            "batch = next(iter(loader))",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "a-layer-set-as-an-attribute-changes-the-model",
        [
            "import torch.nn as nn",
            "model = nn.Sequential(nn.Linear(2, 2))",
            "model.fc = nn.Linear(2, 3)",
            "model(x)",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "an-attribute-alias-changed-in-a-later-cell",
        ["model = Net()", "x = model.layer1", "x.weight.data.fill_(0)", "model(inp)"],
        [0, 1, 2, 3],
    ),
    Case(
        "an-attribute-alias-changed-in-the-same-cell",
        ["model = Net()", "x = model.layer1\nx.weight.data.fill_(0)", "model(inp)"],
        [0, 1, 2],
    ),
    Case(
        "an-alias-through-a-loop-variable",
        [
            "model = Net()",
            "for p in model.parameters():\n    p.requires_grad_(False)",
            "model(inp)",
        ],
        [0, 1, 2],
    ),
    Case(
        "an-alias-bound-anew-to-another-object-no-longer-links",
        [
            "model = Net()",
            "opt = SGD(model.parameters())",
            "opt = SGD(other.parameters())",
            "opt.step()",
            "model(inp)",
        ],
        [0, 4],
    ),
    Case(
        "a-copy-shares-nothing",
        ["df = load()", "df2 = df.copy()", "df2['a'] = 1", "df['b']"],
        [0, 3],
    ),
    Case(
        "a-notebook-function-that-steps-the-optimizer-changes-the-model",
        [
            "model = Net()",
            "opt = SGD(model.parameters())",
            "def train():\n    opt.step()",
            "train()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-function-handed-the-model-may-change-it",
        ["from lib import fit", "model = Net()", "history = fit(model, data)", "model(inp)"],
        [0, 1, 2, 3],
    ),
    Case(
        "an-in-place-function-changes-its-argument",
        ["import torch.nn as nn", "model = Net()", "nn.init.zeros_(model.fc.weight)", "model(inp)"],
        [0, 1, 2, 3],
    ),
    Case(
        "builtins-that-only-read-and-classes-being-built-change-nothing",
        [
            "model = Net()",
            "print(model)\nn = len(model)",
            "opt = SGD(model.parameters())",
            "model(inp)",
        ],
        [0, 3],
    ),
    Case(
        "the-model-rebuilt-by-a-later-cell-is-a-new-object",
        [
            "model = Net()",
            "opt = SGD(model.parameters())",
            "model = Net()",
            "opt.step()",
            "model(inp)",
        ],
        [2, 4],
    ),
    # --- objects stored in containers, changed through them (issue 13, item 4) -----------------
    Case(
        "a-model-changed-through-the-list-it-was-appended-to",
        [
            "model = Net()",
            "models = []",
            "models.append(model)",
            "unrelated = 1",
            "models[0].fc.reset_parameters()",
            "model(inp)",
        ],
        [0, 1, 2, 4, 5],
    ),
    Case(
        "a-model-changed-through-a-loop-over-its-list",
        [
            "model = Net()",
            "models = []\nmodels.append(model)",
            "for m in models:\n    m.half()",
            "model(inp)",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "a-loop-variable-kept-from-an-earlier-cell-still-holds-the-element",
        [
            "model = Net()",
            "models = [model]",
            "for m in models:\n    pass",
            "m.half()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-function-handed-the-container-changes-what-it-holds",
        ["model = Net()", "d = {}", "d['m'] = model", "fit(d)", "model(inp)"],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "only-the-container-missing-needs-the-stored-object-s-cells-as-before",
        [
            "model = Net()",
            "models = []",
            "models.append(model)",
            "models[0].train()",
            "models[0](inp)",
        ],
        [1, 2, 3, 4],
        present=("model",),
    ),
    Case(
        "a-missing-container-brings-the-stored-object-and-its-changes",
        ["model = Net()", "models = []", "models.append(model)", "model.half()", "models[0](inp)"],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-notebook-function-that-changes-the-container-s-elements",
        [
            "model = Net()",
            "models = []",
            "models.append(model)",
            "def train_all():\n    for m in models:\n        m.train()",
            "train_all()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4, 5],
    ),
    Case(
        "a-notebook-function-that-changes-what-its-cell-just-stored",
        [
            "model = Net()",
            "models = []",
            "def train_all():\n    for m in models:\n        m.train()",
            "models.append(model)\ntrain_all()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-kept-container-holding-the-old-model-is-built-again-before-it-changes-it",
        ["model = Net()", "models = []", "models.append(model)", "models[0].train()", "model(inp)"],
        [0, 1, 2, 3, 4],
        present=("models",),
    ),
    Case(
        "storing-more-into-the-container-leaves-the-stored-model-alone",
        [
            "model = Net()",
            "models = []",
            "models.append(model)",
            "models.append(Net())",
            "models[1] = other\nmodels += [third]",
            "model(inp)",
        ],
        [0, 5],
    ),
    Case(
        "a-read-through-the-container-changes-nothing",
        [
            "model = Net()",
            "models = []",
            "models.append(model)",
            "print(models[0].eval, len(models))\nmodels[0].state_dict()",
            "model(inp)",
        ],
        [0, 4],
    ),
    Case(
        "storing-an-int-or-a-clone-links-nothing",
        [
            "model = Net()",
            "n = 3",
            "snaps = []",
            "snaps.append(model.fc.weight.clone())\nsnaps.append(n)\nsnaps.append(3)",
            "snaps[0].zero_()",
            "model(inp)",
        ],
        [0, 5],
    ),
    # --- objects handed to the methods of others (issue 13, item 4) -----------------------------
    Case(
        "a-lightning-trainer-changes-the-model-it-fits",
        [
            "import lightning as pl",
            "model = Net()",
            "dm = DataModule()",
            "trainer = pl.Trainer(max_epochs=3); trainer.fit(model, dm)",
            "unrelated = 1",
            "model(inp)",
        ],
        [0, 1, 2, 3, 5],
    ),
    Case(
        "an-amp-loop-changes-the-model-through-the-optimizer-and-the-loss",
        [
            "import torch",
            "model = Net()",
            "opt = torch.optim.AdamW(model.parameters())",
            "scaler = torch.cuda.amp.GradScaler()",
            "loss = model(x).sum()",
            "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4, 5, 6],
    ),
    Case(
        "an-optimizer-stepped-by-the-scaler-alone-changes-the-model",
        [
            "model = Net()",
            "opt = SGD(model.parameters())",
            "scaler = make()",
            "scaler.step(opt)",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
    ),
    Case(
        "a-method-of-a-function-s-result-changes-what-it-is-handed",
        [
            "def get_trainer():\n    return T()",
            "model = Net()",
            "get_trainer().fit(model)",
            "model(inp)",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "learners-accelerators-engines-and-swa-change-what-they-are-handed",
        [
            "model = Net()",
            "learner = L()\naccelerator = A()\nengine = E()\nswa_model = S()",
            "learner.fit(model)",
            "loss = model(x).sum()",
            "accelerator.backward(loss)",
            "engine.run(model, loader)",
            "swa_model.update_parameters(model)",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4, 5, 6, 7],
        present=("x", "loader"),
    ),
    Case(
        "a-module-s-functions-only-read-what-they-are-handed",
        [
            "import numpy as np\nimport torch\nimport torch.nn.functional as F\nimport json",
            "x = np.ones(3)\na = 1\nb = 2\nout = 3\ny = 4\ncfg = {}\nnames = ['n']\ndf = mk()",
            "np.mean(x)\ntorch.cat([a, b])\nF.cross_entropy(out, y)\njson.dumps(cfg)",
            "print(x)\n'-'.join(names)\ndf.head()\ntorch.nn.functional.relu(x)",
            "from torch import nn\nnn.functional.softmax(out)",
            "nn.functional.relu(x)\nnp.concatenate(x)\nstr.join('-', names)",
            "print(x, a, b, out, y, cfg, names, df)",
        ],
        [0, 1, 6],
    ),
    Case(
        "a-notebook-function-whose-scaler-steps-the-optimizer-changes-the-model",
        [
            "import torch\nimport torch.nn.functional as F",
            "model = Net()\nopt = SGD(model.parameters())",
            "def train():\n    loss = F.mse_loss(model(x), y)\n    scaler.scale(loss).backward()\n"
            "    scaler.step(opt)",
            "train()",
            "model(inp)",
        ],
        [0, 1, 2, 3, 4],
        present=("x", "y", "scaler"),
    ),
    Case(
        "a-notebook-function-that-hands-globals-to-a-module-changes-nothing",
        [
            "import numpy as np",
            "w = np.ones(3)",
            "def report():\n    return np.mean(w)",
            "report()",
            "w[5]",
        ],
        [0, 1, 4],
    ),
    Case(
        "a-name-imported-and-also-assigned-is-not-a-module",
        ["import runner", "runner = make()", "model = Net()", "runner.run(model)", "model(inp)"],
        [1, 2, 3, 4],
    ),
    # --- scopes and syntax ---------------------------------------------------------------------
    Case(
        "a-function-that-assigns-a-global-defines-it-where-it-is-called",
        ["def setup():\n    global cfg\n    cfg = {'lr': 1}", "other = 2", "setup()", "cfg['lr']"],
        [0, 2, 3],
    ),
    Case(
        "a-function-that-bumps-a-global-needs-its-start",
        ["count = 0", "def bump():\n    global count\n    count += 1", "bump()", "print(count)"],
        [0, 1, 2, 3],
    ),
    Case(
        "a-function-called-by-another-passes-its-effects-on",
        [
            "def inner():\n    global flag\n    flag = 1",
            "def outer():\n    inner()",
            "outer()",
            "flag",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "nonlocal-binds-no-global",
        [
            "def outer():\n    n = 0\n    def inner():\n        nonlocal n\n        n += 1\n"
            "    inner()\n    return n",
            "n = 5",
            "outer()",
            "print(n)",
        ],
        [1, 3],
    ),
    Case(
        "match-captures-define-names",
        [
            "cmd = {'lr': 1, 'x': 2}",
            "match cmd:\n    case {'lr': lr, **rest}:\n        pass\n    case [first, *others]:\n"
            "        pass\n    case Point(x=px) as pt:\n        pass",
            "print(lr, rest, first, others, px, pt)",
        ],
        [0, 1, 2],
    ),
    Case(
        "a-match-class-pattern-reads-the-class",
        [
            "class Point:\n    pass",
            "p = Point()",
            "match p:\n    case Point():\n        hit = 1",
            "hit",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "top-level-await-defines",
        ["import asyncio", "result = await asyncio.sleep(0, 5)", "result + 1"],
        [0, 1, 2],
    ),
    Case(
        "an-async-comprehension-variable-is-local",
        ["ys = [a async for a in agen()]", "a = 1", "print(a, ys)"],
        [0, 1, 2],
    ),
    Case(
        "a-walrus-in-a-comprehension-binds-outside-it",
        ["vals = [y := v * 2 for v in range(3)]", "print(y)"],
        [0, 1],
    ),
    Case(
        "for-and-with-targets-define",
        [
            "rows = [1, 2]",
            "for row in rows:\n    pass",
            "with open('f') as fh:\n    pass",
            "print(row, fh)",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "augmented-assignment-of-a-name-changes-it-in-place",
        ["t = make()", "view = t[0]", "view += 1", "t.sum()"],
        [0, 1, 2, 3],
    ),
    Case(
        "a-decorator-that-registers-changes-the-registry",
        [
            "registry = {}",
            "def register(fn):\n    registry[fn.__name__] = fn\n    return fn",
            "@register\ndef g():\n    return 1",
            "registry['g']()",
        ],
        [0, 1, 2, 3],
    ),
    Case(
        "a-class-body-reads-now-its-methods-when-called",
        [
            "base = 2",
            "other = 3",
            "unused = 4",
            "class C:\n    k = base * 2\n    def m(self):\n        return other",
            "C().m()",
        ],
        [0, 1, 3, 4],
    ),
    Case(
        "class-body-names-stay-in-the-class",
        ["k = 1", "class C:\n    k = 2", "print(k)"],
        [0, 2],
    ),
    Case(
        "import-a-dot-b-defines-a",
        ["import os.path", "os.getcwd()"],
        [0, 1],
    ),
    Case(
        "a-line-magic-assigned-defines",
        ["import math", "x = %time math.sqrt(4)", "print(x)"],
        [0, 1, 2],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_runs_exactly_the_cells_needed(case: Case):
    facts = facts_of(case.cells)
    plan = plan_replay(facts, len(facts) - 1, set(case.present), set(case.failed))
    assert list(plan.indices) == case.runs
    assert plan.steps[-1].failing


STORED = [
    ("models = []", "models.append(model)", "models[0]"),
    ("models = []", "models.insert(0, model)", "models[0]"),
    ("models = []", "models.extend([model, other])", "models[0]"),
    ("d = {}", "d['m'] = model", "d['m']"),
    ("d = {}", "d.update(m=model)", "d['m']"),
    ("d = {}", "d.setdefault('m', model)", "d['m']"),
    ("s = set()", "s.add(model)", "next(iter(s))"),
    ("holder = Holder()", "holder.net = model", "holder.net"),
    ("cfg = {'lr': 1}", "cfg['model'] = model", "cfg['model']"),
    ("q = Queue()", "q.put(model)", "q.get()"),
    ("lst = []", "lst += [model]", "lst[-1]"),
    ("holder = Holder()", "setattr(holder, 'net', model)", "holder.net"),
]
CHANGES = [
    "{}.train()",
    "{}.fc.reset_parameters()",
    "{}.to(dev)",
    "{}.load_state_dict(sd)",
    "with torch.no_grad():\n    {}.fc.weight.fill_(0)",
]


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize(("start", "store", "element"), STORED, ids=[s[1] for s in STORED])
def test_a_change_through_a_container_is_replayed_for_the_object_stored(
    start: str, store: str, element: str, change: str
):
    cells = ["model = Net()", start, store, "unused = 1", change.format(element), "model(inp)"]
    plan = plan_replay(facts_of(cells), 5, set())
    assert list(plan.indices) == [0, 1, 2, 4, 5]
    reasons = {s.index: s.reasons for s in plan.steps}
    container = start.split(" =")[0]
    assert f"changes model through {container}" in reasons[4]


def test_each_chosen_cell_says_which_names_it_rebuilds():
    cells = ["import torch", "data = [1]", "data.append(2)", "torch.tensor(data)[5]"]
    plan = plan_replay(facts_of(cells), 3, set())
    reasons = {s.index: s.reasons for s in plan.steps}
    assert reasons[0] == ("imports torch",)
    assert reasons[1] == ("defines data",)
    assert reasons[2] == ("changes data",)
    assert reasons[3] == ("the failing cell",)


def test_a_cell_that_builds_and_trains_a_model_defines_it():
    cells = [
        "def train():\n    opt.step()",
        "model = Net()\nopt = SGD(model.parameters())\ntrain()",
        "model(inp)",
    ]
    plan = plan_replay(facts_of(cells), 2, set())
    reasons = {s.index: s.reasons for s in plan.steps}
    assert "defines model" in reasons[1]
    assert plan.unresolved == ("Net", "SGD", "inp")


def test_a_kept_optimizer_of_a_rebuilt_model_is_built_again_before_it_steps():
    cells = ["model = Net()", "opt = SGD(model.parameters())", "opt.step()", "model(inp)"]
    plan = plan_replay(facts_of(cells), 3, {"opt", "Net", "SGD", "inp"})
    reasons = {s.index: s.reasons for s in plan.steps}
    assert list(plan.indices) == [0, 1, 2, 3]
    assert "defines opt again (the one here was built from the model replaced)" in reasons[1]
    assert "changes model through opt" in reasons[2]
    assert "opt" not in plan.kept


def test_a_kept_object_only_read_is_left_alone():
    cells = [
        "tok = Tokenizer()",
        "ds = Dataset(texts, tok)",
        "tok.add_tokens(['x'])",
        "print(ds[0], tok.vocab)",
    ]
    plan = plan_replay(facts_of(cells), 3, {"ds", "Tokenizer", "Dataset", "texts"})
    # tok is rebuilt and changed again; ds is here, and only read: not built again.
    assert list(plan.indices) == [0, 2, 3]
    assert "ds" in plan.kept


def test_a_change_through_another_name_says_which():
    cells = [
        "model = Net()",
        "opt = AdamW(model.parameters())",
        "opt.step()",
        "x = model.layer1",
        "x.weight.data.fill_(0)",
        "model(inp)",
    ]
    plan = plan_replay(facts_of(cells), 5, set())
    reasons = {s.index: s.reasons for s in plan.steps}
    assert "changes model through opt" in reasons[2]
    assert "changes model through x" in reasons[4]
    assert list(plan.indices) == [0, 1, 2, 3, 4, 5]


def test_a_model_and_its_optimizer_built_in_one_cell_are_linked():
    cells = [
        "model = Net()\nopt = SGD(model.parameters())",
        "def step(x):\n    opt.zero_grad()\n    model(x).backward()\n    opt.step()",
        "for batch in batches:\n    step(batch)",
        "model(inp)",
    ]
    plan = plan_replay(facts_of(cells), 3, set())
    reasons = {s.index: s.reasons for s in plan.steps}
    assert "changes model through opt" in reasons[2]
    assert list(plan.indices) == [0, 1, 2, 3]


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


# --- issue 22: what was restored stays as it was before the failure ---


def _plan(
    cells: list[str], present=(), restored=(), after_failure=(), own_modules=(), changed_here=()
):
    return plan_replay(
        facts_of(cells),
        len(cells) - 1,
        present,
        restored=restored,
        after_failure=after_failure,
        own_modules=own_modules,
        changed_here=changed_here,
    )


def test_a_restored_value_with_the_failing_cells_change_is_built_again():
    cells = ["history = []", "history.append(0)", "unused = 1", "history.append(1)\nh = history[0]"]
    plan = _plan(cells, present={"history"}, restored={"history"}, after_failure={"history"})
    assert plan.indices == (0, 1, 3)
    assert "defines history again (the one restored has the failing cell's change already)" in (
        plan.steps[0].reasons
    )
    assert "history" not in plan.kept


def test_a_restored_value_the_user_changed_since_is_kept_and_named():
    cells = ["history = []", "history.append(0)", "unused = 1", "history.append(1)\nh = history[0]"]
    plan = _plan(
        cells,
        present={"history"},
        restored={"history"},
        after_failure={"history"},
        changed_here={"history", "unused"},  # unused: not restored, not the plan's to name
    )
    assert plan.indices == (3,)
    assert plan.yours == (("history", "the one restored has the failing cell's change already"),)
    assert "history" in plan.kept and plan.overwritten == ()


def test_a_restored_value_the_user_changed_that_a_replayed_cell_changes_again_stays():
    cells = ["labels = [3]", "x = 1\nlabels *= 2", "print(x, labels)"]
    plan = _plan(cells, present={"labels"}, restored={"labels"}, changed_here={"labels"})
    assert plan.indices == (1, 2)
    assert plan.yours == (("labels", "the one restored has this cell's change already"),)


def test_a_restored_value_the_user_changed_that_must_give_way_is_named_as_lost():
    cells = ["labels = [3]\nds = list(labels)", "print(ds)"]
    plan = _plan(cells, present={"labels"}, restored={"labels"}, changed_here={"labels"})
    assert plan.overwritten and plan.overwritten[0][0] == "labels"


# A restored tensor autograd computed is a leaf (keep/pickling.py marks its name).
MODEL = "import torch\nmodel = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(model.parameters())"
HERE = {"torch", "model", "opt", "x", "out", "loss"}


def _graph_plan(cells: list[str], changed_here=()):
    # What the record saw each cell do (the text alone takes ``model(x)`` for a change of x).
    changes = {"opt.step()": {"model", "opt"}, "loss.backward()": {"model"}}
    records = [
        CellRecord(
            bound=frozenset({"out", "loss"} & set(facts.defines)),
            changed=frozenset(n for part, names in changes.items() if part in cell for n in names),
        )
        for cell, facts in zip(cells, facts_of(cells), strict=True)
    ]
    return plan_replay(
        [joined(f, r) for f, r in zip(facts_of(cells), records, strict=True)],
        len(cells) - 1,
        HERE,
        restored=HERE - {"torch"},
        changed_here=changed_here,
        graphless={"out", "loss"},
    )


def test_a_loss_restored_without_its_graph_is_built_again_by_its_forward_cell():
    cells = [MODEL, "x = torch.ones(4, 3)", "out = model(x)\nloss = out.sum()", "loss.backward()"]
    plan = _graph_plan(cells)
    assert plan.indices == (2, 3)
    assert "defines loss again (restored without its autograd graph)" in plan.steps[0].reasons
    assert plan.graphless == ("loss",)
    assert plan.graph_lost == (("out", "the failing cell does not read it"),)


@pytest.mark.parametrize(
    ("forward", "between", "why"),
    [
        # a training step: built again, it would step the restored model once more
        (
            "out = model(x)\nloss = out.sum()\nloss.backward()\nopt.step()",
            "pass",
            "the cell that made it also changes model, opt",
        ),
        # the model it was computed from was stepped after: built again, another loss
        ("out = model(x)\nloss = out.sum()", "opt.step()", "what it was made from changed later"),
    ],
)
def test_a_loss_whose_cell_cannot_be_run_again_the_same_stays_a_leaf_and_is_named(
    forward: str, between: str, why: str
):
    cells = [MODEL, "x = torch.ones(4, 3)", forward, between, "loss.backward()"]
    plan = _graph_plan(cells)
    assert plan.graphless == () and 2 not in plan.indices
    assert dict(plan.graph_lost)["loss"].startswith(why), plan.graph_lost
    assert "loss" in plan.kept


def test_a_loss_the_user_computed_again_after_the_restore_is_theirs():
    cells = [MODEL, "x = torch.ones(4, 3)", "out = model(x)\nloss = out.sum()", "loss.backward()"]
    plan = _graph_plan(cells, changed_here={"loss"})
    assert plan.indices == (3,) and plan.graphless == ()
    assert plan.yours == (("loss", "restored without its autograd graph"),)


def test_a_snapshot_taken_before_the_failing_cell_is_left_as_restored():
    cells = ["history = []", "history.append(0)", "history.append(1)\nh = history[0]"]
    plan = _plan(cells, present={"history"}, restored={"history"})  # not after the failure
    assert plan.indices == (2,)


def test_a_restored_value_that_no_cell_builds_anew_is_said_to_change_twice():
    cells = ["unused = 1", "labels -= 1\nprint(labels)"]
    plan = _plan(cells, present={"labels"}, restored={"labels"}, after_failure={"labels"})
    assert plan.twice == ("labels",)
    assert plan.unresolved == ()


def test_a_restored_value_a_replayed_cell_changes_again_is_built_again():
    # x is missing; the cell that rebuilds it also scales the restored labels in place.
    cells = ["labels = [3]", "x = 1\nlabels *= 2", "print(x, labels)"]
    plan = _plan(cells, present={"labels"}, restored={"labels"})
    assert plan.indices == (0, 1, 2)
    assert "defines labels again (the one restored has this cell's change already)" in (
        plan.steps[0].reasons
    )


@pytest.mark.parametrize(
    ("cells", "runs"),
    [
        # ``cfg`` rebound after ``old`` read it: the one restored is the later dict
        (["cfg = {'lr': 1}", "old = cfg['lr']", "cfg = {'lr': 2}", "print(cfg, old)"], (0, 1, 2)),
        # read and bound anew by one cell: the one restored is that cell's result
        (["steps = 0", "steps = steps + 1\nlast = steps", "print(last, steps)"], (0, 1)),
        # changed in place after a cell read it
        (["log = [1]", "n = len(log)", "log.append(2)", "print(n, log)"], (0, 1, 2)),
    ],
    ids=["rebound later", "read and rebound", "changed in place later"],
)
def test_a_restored_value_a_replayed_cell_read_before_a_later_change_is_built_again(cells, runs):
    name = cells[0].split()[0]
    plan = _plan(cells, present={name}, restored={name})
    assert plan.indices == (*runs, len(cells) - 1)
    assert name not in plan.kept and not plan.steps[0].keeps
    assert any(f"defines {name} again (the one restored has" in r for r in plan.steps[0].reasons)
    # not restored (bound here by the user): not a value the cells left, so not this rule
    here = _plan(cells, present={name})
    assert not any("the one restored has" in r for s in here.steps for r in s.reasons)


def test_a_restored_value_bound_anew_is_not_put_back_before_a_later_change_a_cell_reads():
    # ``steps = 0`` put back after its cell would give ``step()`` the later value (3, not 0)
    cells = [
        "steps = 0\nlog = []\ndef step():\n    global steps\n    steps += 1\n    log.append(steps)",
        "for _ in range(3):\n    step()",
        "print(log, steps)",
    ]
    records = [None, CellRecord(bound=frozenset({"steps"}), changed=frozenset({"log"})), None]
    facts = [joined(f, r) for f, r in zip(facts_of(cells), records, strict=True)]
    plan = plan_replay(facts, 2, {"steps"}, restored={"steps"})
    assert plan.indices == (0, 1, 2)
    assert plan.steps[0].keeps == () and plan.steps[1].keeps == ()
    # nothing reads it before the change (``print`` and ``len`` are no function of the
    # notebook's): put back after the cell that binds it, as before
    cells = ["steps = 0\nlog = []", "n = len(log)", "steps = 3", "print(log, steps, n)"]
    plan = _plan(cells, present={"steps"}, restored={"steps"})
    assert plan.indices == (0, 1, 3) and plan.steps[0].keeps == ("steps",)


def test_a_restored_value_a_function_reads_when_called_is_not_built_again_for_its_definition():
    # The setup cell runs again (a seed); the hook it defines reads ``calls`` when a later
    # cell calls it, not when it is defined: the restored ``calls`` is kept, put back after it.
    cells = [
        "import torch\ntorch.manual_seed(0)\ncalls = []\nhook = lambda: calls.append(1)",
        "hook()",
        "print(calls)",
    ]
    records = [None, CellRecord(changed=frozenset({"calls"})), None]
    facts = [joined(f, r) for f, r in zip(facts_of(cells), records, strict=True)]
    restored = {"torch", "calls", "hook"}
    plan = plan_replay(facts, 2, restored, restored=restored)
    assert plan.indices == (0, 2)
    assert "calls" in plan.steps[0].keeps and "calls" not in plan.rebuilt


def test_a_name_the_namespace_has_is_put_back_after_a_cell_that_binds_it_anew():
    plan = _plan(["labels = [3]\nx = 1", "print(x, labels)"], present={"labels"})
    assert plan.steps[0].keeps == ("labels",)


def test_a_name_gives_way_where_the_rebuilt_one_is_built_from_it_in_that_cell():
    plan = _plan(["labels = [3]\nds = list(labels)", "print(ds)"], present={"labels"})
    assert plan.steps[0].keeps == ()
    assert any("defines labels again (ds built from it here" in r for r in plan.steps[0].reasons)


def test_a_module_of_the_notebooks_own_may_change_what_it_is_handed():
    cells = ["import helpers", "model = []", "helpers.fit(model)", "print(model)"]
    assert _plan(cells).indices == (1, 3)  # a library's function only reads
    assert _plan(cells, own_modules={"helpers"}).indices == (0, 1, 2, 3)
    cells[0] = "from helpers import trainer"
    cells[2] = "trainer.fit(model)"
    assert _plan(cells, own_modules={"helpers"}).indices == (0, 1, 2, 3)


# --- held-out round 5 ---


def test_a_cell_that_patches_a_librarys_module_runs_again():
    # np.float = float lives in numpy's module: a new process (or a restore) imports it afresh.
    cells = [
        "import numpy as np\nimport sys",
        "np.float = float",
        "sys.argv = ['train.py', '--lr', '0.1']",
        "model.fc = None",  # an object of ours: its change is its own, kept or rebuilt
        "x = 1",
        "print(x)",
    ]
    plan = _plan(cells, present={"np", "sys", "model"}, restored={"np", "sys", "model"})
    assert 1 in plan.indices and 2 in plan.indices and 3 not in plan.indices
    step = next(s for s in plan.steps if s.index == 1)
    assert any(r.startswith("patches np") for r in step.reasons)


def test_a_restored_iterator_the_failing_cell_reads_is_built_again():
    cells = ["pairs = zip(xs, ys)", "first = next(pairs)", "print(list(pairs))"]
    kept = {"pairs", "xs", "ys", "first"}
    plan = plan_replay(
        facts_of(cells), 2, kept, restored=kept, after_failure=kept, iterators={"pairs"}
    )
    assert plan.indices == (0, 1, 2)
    assert "pairs" not in plan.kept
    plain = plan_replay(facts_of(cells), 2, kept, restored=kept, after_failure=kept)
    assert plain.indices == (2,)


@pytest.mark.parametrize(
    ("code", "patches"),
    [
        ("np.float = float", {"np"}),
        ("plt.rcParams['figure.figsize'] = (10, 6)", {"plt"}),
        ("sys.modules['wandb'] = stub", {"sys"}),
        ("setattr(torch.Tensor, 'as_list', torch.Tensor.tolist)", {"torch"}),
        ("del np.float", {"np"}),
        ("x[0] = 1", set()),
        ("model.fc = head", {"model"}),  # an object of ours: the planner's modules leave it out
    ],
)
def test_the_names_a_cell_sets_attributes_of(code, patches):
    (facts,) = facts_of([code])
    assert facts.patches == patches


def test_a_failed_cells_change_is_followed_through_a_copy():
    # The failed cell is not run again; ``n = len(log)`` is, from the list without its change:
    # n differs with log though it shares no object with it.
    facts = facts_of(["log = [1]", "log.append(2)\nraise ValueError", "n = len(log)", "print(n)"])
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("log",), ("n",)),)


def test_what_is_computed_from_a_users_fix_follows_it():
    # The user fixed the restored losses; n is built again from them (through a copy), and
    # rate from n in turn: both follow the fix.
    facts = facts_of(
        ["losses = [0.9, -1.0]", "n = len(losses)", "rate = 1 / n", "print(losses, rate)"]
    )
    plan = plan_replay(facts, 3, {"losses"}, restored={"losses"}, changed_here={"losses"})
    assert plan.from_yours == ("n", "rate")


def test_a_failed_cells_change_is_followed_into_what_a_call_computes():
    # A notebook function that reads the history as a global, and a method handed its last
    # value: what they set follows the history, which lacks the failed cell's append.
    facts = facts_of(
        [
            "hist = [0.5]\ndef summarize():\n    global mean\n    mean = sum(hist) / len(hist)\n"
            "class S:\n    def step(self, v):\n        self.v = v\nstopper = S()",
            "hist.append(0.6)\nraise RuntimeError",
            "summarize()\nstopper.step(hist[-1])",
            "print(mean, stopper.v)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("hist",), ("mean", "stopper")),)


def test_what_a_notebook_function_returns_follows_the_globals_it_reads():
    facts = facts_of(
        [
            "hist = [1]\ndef score():\n    return sum(hist)\n"
            "class Report:\n    def __init__(self):\n        self.n = len(hist)",
            "hist.append(2)\nraise RuntimeError",
            "s = score() + 1\nr = Report()",
            "print(s, r.n)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("hist",), ("r", "s")),)


def test_a_module_put_in_sys_modules_is_the_object_a_later_import_binds():
    # A stand-in for a missing package: ``import stub15 as s`` and ``from stub15 import x``
    # bind the failed cell's changed ``stub`` (or what it holds), not a module imported afresh.
    facts = facts_of(
        [
            "import sys, types\nstub = types.ModuleType('stub15')\nstub.x = 1\n"
            "sys.modules['stub15'] = stub",
            "stub.x = 2\nraise RuntimeError",
            "import stub15 as s\nfrom stub15 import x\nv = s.x",
            "print(v, x)",
        ]
    )
    assert "stub" in facts[0].registers["stub15"]
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("stub",), ("s", "v", "x")),)


def test_a_lambda_bound_to_a_name_is_called_as_a_function():
    # What it returns follows the globals it reads; what it changes is changed where it is
    # called.
    facts = facts_of(
        [
            "xs = [1]\nsize = lambda: len(xs)\nlog = lambda v: seen.append(v)\nseen = []",
            "xs.append(2)\nraise RuntimeError",
            "n = size()\nlog(n)",
            "print(n, seen)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("xs",), ("n", "seen")),)
    assert "seen" in facts[2].mutates or 2 in plan.indices


def test_a_class_body_and_calls_in_a_comprehension_follow_what_they_read():
    # ``class CFG: n = len(classes)`` computes its attribute now; ``[bump() for _ in xs]``
    # calls bump once per item.
    facts = facts_of(
        [
            "classes = ['a']\nn = 0\ndef bump():\n    global n\n    n += 1",
            "classes.append('b')\nraise RuntimeError",
            "class CFG:\n    num_classes = len(classes)\n[bump() for _ in classes]",
            "print(CFG.num_classes, n)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("classes",), ("CFG", "n")),)


def test_what_a_method_changes_in_what_it_is_handed_follows_its_object():
    # ``r.shuffle(order)`` puts ``order`` in an order drawn from ``r``'s state, which lacks the
    # failed cell's draw; ``val = order[:2]`` in turn.
    facts = facts_of(
        [
            "import random\nr = random.Random(0)\nfiles = ['a', 'b', 'c']",
            "r.random()\nraise RuntimeError",
            "order = files[:]\nr.shuffle(order)\nval = order[:2]",
            "print(order, val)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("r",), ("order", "val")),)


def test_what_an_objects_method_changes_in_what_it_is_handed_follows_the_object():
    # ``sh.inject(xs)`` appends the object's ``k`` to ``xs``: a failed cell changed ``k``.
    facts = facts_of(
        [
            "class Sh:\n    k = 1\n    def inject(self, xs):\n        xs.append(self.k)\n"
            "sh = Sh()\nxs = []",
            "sh.k = 2\nraise RuntimeError",
            "sh.inject(xs)",
            "print(xs)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("sh",), ("xs",)),)


def test_what_a_cell_builds_from_what_it_changes_follows_the_change():
    # ``rng.shuffle(perm)`` orders ``perm`` by ``rng``; ``fold``, from ``perm`` in the same
    # cell, follows it in turn.
    facts = facts_of(
        [
            "import numpy as np\nrng = np.random.default_rng(0)\nperm = np.arange(4)",
            "rng.random()\nraise RuntimeError",
            "rng.shuffle(perm)\nfold = perm[:2].tolist()",
            "print(perm, fold)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("rng",), ("fold", "perm")),)


def test_process_state_a_failed_cell_set_is_named_with_what_later_cells_make():
    # The new process lacks the variable and the dtype the failed cell set before it raised.
    facts = facts_of(
        [
            "import os, torch",
            "os.environ['MODE'] = 'offline'\ntorch.set_default_dtype(torch.float64)\n"
            "raise RuntimeError",
            "mode = os.environ.get('MODE')\nx = torch.zeros(2)",
            "print(mode, x)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    ((index, setup, made),) = plan.failed_setup
    assert (index, made) == (1, ("mode", "x"))
    assert "os.environ" in setup and "set_default_dtype" in setup


def test_settings_a_failed_cell_set_through_a_method_are_named_as_the_notebook_spells_them():
    # ``cfg.apply()`` set numpy's print options: the record reads ``numpy.set_printoptions``,
    # which the notebook knows as ``np`` (``from torch.backends import cudnn``: ``cudnn``).
    cells = [
        "import numpy as np\nfrom torch.backends import cudnn\nfrom torch import nn\n"
        "class Cfg:\n    def apply(self):\n        np.set_printoptions(precision=3)\ncfg = Cfg()",
        "cfg.apply()\nraise RuntimeError",
        "print(1)",
    ]
    record = CellRecord(
        settings=("numpy.set_printoptions", "torch.backends.cudnn.benchmark", "torch.foo")
    )
    facts = facts_of(cells)
    facts[1] = joined(facts[1], record)
    ((_, setup, _),) = plan_replay(facts, 2, set(), {1}).failed_setup
    assert "numpy is np here" in setup and "torch.backends.cudnn is cudnn here" in setup
    assert "torch is" not in setup  # ``from torch import nn``: ``torch.nn``, not ``torch``


def test_a_seed_set_by_a_failed_cell_is_not_named():
    # Each replayed cell that drew starts from the random state it had.
    facts = facts_of(["import torch", "torch.manual_seed(0)\nraise RuntimeError", "print(1)"])
    assert plan_replay(facts, 2, set(), {1}).failed_setup == ()


def test_a_failed_cell_changing_a_view_in_place_changes_the_name_it_shares_memory_with():
    # ``a = t.numpy()``: ``a += 1`` in a failed cell is ``t``'s change too (no version counter of
    # ``t`` moves, so the record would not see it); what is built from ``t`` later follows.
    facts = facts_of(
        [
            "import torch\nt = torch.zeros(3)\na = t.numpy()",
            "a += 1\nraise RuntimeError",
            "s = t.sum().item()",
            "print(s)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("a", "t"), ("s",)),)


def test_a_failed_cell_binding_a_view_anew_leaves_the_name_it_shared_memory_with():
    # ``a = a + 1`` binds a new array: ``t`` keeps its values, and is not named for it.
    facts = facts_of(
        [
            "import torch\nt = torch.zeros(3)\na = t.numpy()",
            "a = a + 1\nraise RuntimeError",
            "s = t.sum().item()",
            "print(s)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert all("t" not in names for _, names, _ in plan.failed_changes)


def test_a_failed_cell_setting_an_imported_class_attribute_is_named():
    # The new process imports ``tqdm`` afresh, without the failed cell's setting.
    facts = facts_of(
        [
            "from tqdm import tqdm",
            "tqdm.monitor_interval = 0\nraise RuntimeError",
            "interval = tqdm.monitor_interval",
            "print(interval)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("tqdm",), ("interval",)),)


def test_a_failed_cell_setting_a_class_put_back_by_the_restore_is_named():
    # A class put back is imported afresh (pickled by reference), without the failed cell's
    # setting: the plan names it though it is here.
    facts = facts_of(
        [
            "from tqdm import tqdm",
            "tqdm.monitor_interval = 0\nraise RuntimeError",
            "interval = tqdm.monitor_interval",
            "print(interval)",
        ]
    )
    plan = plan_replay(facts, 3, {"tqdm", "interval"}, {1})
    assert plan.failed_changes == ((1, ("tqdm",), ()),)


def test_a_kept_function_or_class_the_cell_sets_attributes_on_is_put_back_after_it():
    # ``log_step.n = 0`` after the def would reset the kept one's count, were it put back at
    # the def: it is put back after the cell, as it was (``Tok`` alone stays from its class on).
    cells = [
        "def log_step(loss):\n    log_step.n += 1\nlog_step.n = 0\nclass CFG:\n    lr = 1\n"
        "CFG.lr = 2\nclass Tok:\n    pass\nbuilt = 1",
        "print(built, log_step, CFG, Tok)",
    ]
    plan = plan_replay(facts_of(cells), 1, {"log_step", "CFG", "Tok"})
    step = plan.steps[0]
    assert set(step.keeps) == {"log_step", "CFG", "Tok"}
    assert step.defs == ("Tok",)


def test_a_class_patched_through_an_instance_here_is_patched_again_or_named():
    # ``type(model).forward = f``: the kept model's class is imported afresh, without it.
    cells = [
        "import torch\nmodel = torch.nn.Linear(2, 2)",
        "def fwd(self, t):\n    return t\ntype(model).forward = fwd",
        "print(model)",
    ]
    plan = plan_replay(facts_of(cells), 2, {"torch", "model", "fwd"})
    assert [s.index for s in plan.steps] == [1, 2]
    assert "patches model" in " ".join(plan.steps[0].reasons)
    # by a cell that failed: not run again, so named
    plan = plan_replay(facts_of(cells), 2, {"torch", "model", "fwd"}, {1})
    assert [s.index for s in plan.steps] == [2]
    assert [(i, names) for i, names, _ in plan.failed_changes] == [(1, ("model",))]


@pytest.mark.parametrize("present", [(), ("torch", "act", "x", "y")], ids=["rebuilt", "kept"])
def test_a_library_class_a_failed_cell_patched_names_what_was_made_from_its_module(present):
    # ``torch.nn.GELU.forward = f``: the record sees ``torch`` by identity alone (unchanged),
    # and ``act``, a ``GELU``, comes back (or is made again) with the class imported afresh.
    cells = [
        "import torch\nact = torch.nn.GELU()\nx = torch.linspace(-2, 2, 5)",
        "torch.nn.GELU.forward = lambda self, t: torch.relu(t)\nraise RuntimeError('oom')",
        "y = act(x).tolist()",
        "print(act, x, y)",
    ]
    records = [None, CellRecord(), None, None]
    facts = [joined(f, r) for f, r in zip(facts_of(cells), records, strict=True)]
    plan = plan_replay(facts, 3, set(present), {1})
    ((index, names, _),) = plan.failed_changes
    assert index == 1 and {"torch", "act"} <= set(names)


@pytest.mark.parametrize(
    "setter",
    [
        "torch.hub.set_dir('/data/hub')",
        "sns.set_theme(style='dark')",
        "plt.style.use('ggplot')",
        "transformers.logging.set_verbosity_error()",
        "datasets.disable_progress_bar()",
    ],
)
def test_a_librarys_setter_sets_up_where_it_is_called_on_a_module(setter):
    # The state it sets lives in the library, which the new process imports afresh; a setter
    # of an object of the notebook's (``df.set_index``) is no setup.
    imports = (
        "import torch, seaborn as sns, transformers, datasets\nimport matplotlib.pyplot as plt"
    )
    plan = _plan([imports, setter, "x = 1", "y = x"])
    assert any(s.index == 1 and "sets up: calls" in " ".join(s.reasons) for s in plan.steps)
    plan = _plan([imports, "df = load()", "df.set_index('a')", "y = 1"])
    assert [s.index for s in plan.steps] == [3]


def test_a_librarys_setter_called_by_a_notebook_function_or_method_sets_up():
    cells = [
        "import torch",
        "def configure():\n    torch.hub.set_dir('/data/hub')",
        "class Env:\n    def apply(self):\n        torch.hub.set_dir('/data/hub')",
        "configure()",
        "env = Env()",
        "env.apply()",
        "y = 1",
    ]
    steps = {s.index: s.reasons for s in _plan(cells).steps}
    assert "sets up: calls torch.hub.set_dir()" in steps[3]
    assert "sets up: calls torch.hub.set_dir()" in steps[5]


def test_sys_path_changed_by_a_failed_cell_is_named_with_what_later_cells_make():
    # ``sys.path.insert(0, repo)`` at the top of a cell that then raised: the new process's
    # path lacks it, as it lacks a directory the cell changed to.
    facts = facts_of(
        [
            "import os, sys",
            "sys.path.insert(0, os.getcwd())\nraise RuntimeError",
            "first = sys.path[0]",
            "print(first)",
        ]
    )
    plan = plan_replay(facts, 3, set(), {1})
    ((index, setup, made),) = plan.failed_setup
    assert (index, made) == (1, ("first",))
    assert "sys.path" in setup


def test_a_file_read_further_by_a_failed_cell_is_named_with_what_later_reads_give():
    # ``first = f.readline()`` moved the file's position (an open file is not seen whole, so the
    # text's guess stands): the replay's ``f`` is a line behind, and so is ``second``.
    facts = facts_of(
        [
            "f = open('labels.csv')\nheader = f.readline()",
            "first = f.readline()\nraise RuntimeError",
            "second = f.readline()",
            "print(second)",
        ]
    )
    records = [None, CellRecord(bound=frozenset({"first"}), unseen=frozenset({"f"})), None, None]
    facts = [joined(f, r) for f, r in zip(facts, records, strict=True)]
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("f",), ("second",)),)


def test_names_a_failed_cell_bound_through_globals_are_named_where_a_cell_reads_globals():
    # The failed sweep bound ``lr_a`` through ``globals()``, which no cell's text names: the
    # cell listing ``globals()`` and the failing cell reading it find it missing.
    facts = facts_of(
        [
            "base = 1",
            "for k in 'ab':\n    globals()['lr_' + k] = base\n    raise RuntimeError",
            "found = sorted(n for n in globals() if n.startswith('lr_'))",
            "print(found, globals().get('lr_a'))",
        ]
    )
    record = CellRecord(bound=frozenset({"k", "lr_a"}))
    facts[1] = joined(facts[1], record)
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("k", "lr_a"), ("found",)),)
    # Here (restored), they are as the failed cell left them: nothing to name.
    assert plan_replay(facts, 3, {"k", "lr_a", "base", "found"}, {1}).failed_changes == ()


def test_a_stream_a_library_call_wrote_into_is_changed_and_a_path_is_not():
    # ``torch.save(sd, buf)`` writes into an ``io.BytesIO`` (not seen whole: a C object), where
    # ``torch.save(sd, path)`` leaves the string alone (seen whole, unchanged).
    facts = facts_of(["torch.save(sd, buf)"])[0]
    assert "buf" in joined(facts, CellRecord(unseen=frozenset({"buf"}))).mutates
    assert "buf" not in joined(facts, CellRecord()).mutates


def test_a_checkpoint_a_failed_cell_saved_into_a_buffer_is_named_with_what_later_cells_read():
    facts = facts_of(
        [
            "import io, torch\nnet = torch.nn.Linear(2, 1)\nbuf = io.BytesIO()",
            "torch.save(net.state_dict(), buf)\nraise RuntimeError",
            "size = buf.tell()",
            "print(size)",
        ]
    )
    facts[1] = joined(facts[1], CellRecord(unseen=frozenset({"buf"})))
    plan = plan_replay(facts, 3, set(), {1})
    assert plan.failed_changes == ((1, ("buf",), ("size",)),)


def test_a_helper_defined_anew_after_a_replayed_cell_called_it_is_named():
    # ``step`` was edited after ``step(model)`` ran: the one here is the new one, so the
    # replayed call does what it does now, and ``model`` may differ.
    cells = [
        "import torch\nmodel = torch.nn.Linear(2, 1)",
        "def step(m):\n    m.weight.data.mul_(2)",
        "step(model)",
        "def step(m):\n    pass",
        "print(model)",
    ]
    plan = _plan(cells, present={"step"}, restored={"step"})
    reasons = {s.index: s.reasons for s in plan.steps}
    assert any(
        "calls step as a later cell defined it anew" in r and "model" in r for r in reasons[2]
    )
    # Not where the plan runs the old definition before the call (nothing here to stand in).
    plan = _plan(cells)
    assert not any("defined it anew" in r for s in plan.steps for r in s.reasons)


_SHRINK = (
    "import torch, functools\nmodel = torch.nn.Linear(2, 1)\nx = 1\n"
    "def shrink(m, f):\n    for p in m.parameters():\n        p.data.mul_(f)\n"
    "class Shrink:\n    def on_end(self, m):\n        shrink(m, 0.5)\n"
)


@pytest.mark.parametrize(
    ("build", "call"),
    [
        ("half = functools.partial(shrink, f=0.5)", "half(model)"),
        ("callbacks = [Shrink()]", "for cb in callbacks:\n    cb.on_end(model)"),
        ("ops = {'s': shrink}", "ops['s'](model, 0.5)"),
    ],
    ids=["a partial", "a method that calls it, of instances in a list", "a dict of functions"],
)
def test_a_data_write_reached_through_what_holds_a_notebook_function_runs_again(build, call):
    # ``shrink`` changes what it is handed through ``.data``, which no version counter counts:
    # reached through a partial, a callback's method or a dict, the record saw ``model``
    # unchanged, and the cell was skipped.
    from nb_cudaguard.replay.planner import with_unseen_handed

    cells = [_SHRINK + build, call, "print(model, x)"]
    records = [
        CellRecord(bound=frozenset({"torch", "functools", "model", "x", "shrink", "Shrink"})),
        CellRecord(),
        None,
    ]
    texts = with_unseen_handed(facts_of(cells))
    facts = [joined(f, r) for f, r in zip(texts, records, strict=True)]
    assert plan_replay(facts, 2, {"x"}).indices == (0, 1, 2)


def test_a_library_patched_through_a_partial_of_a_notebook_function_runs_again():
    # ``use_tanh = partial(set_act, "tanh")``: the cell calls ``use_tanh``, which the text does
    # not know for ``set_act``; the patch lives in the library, gone with the old process.
    cells = [
        "import functools\nimport torch.nn.functional as F\n"
        "def set_act(kind):\n    F.gelu = lambda x: x\nuse_tanh = functools.partial(set_act, 1)",
        "use_tanh()",
        "print(F.gelu)",
    ]
    records = [CellRecord(bound=frozenset({"functools", "F", "set_act", "use_tanh"})), CellRecord()]
    texts = facts_of(cells)
    facts = [*(joined(f, r) for f, r in zip(texts[:2], records, strict=True)), texts[2]]
    assert plan_replay(facts, 2, set()).indices == (0, 1, 2)
