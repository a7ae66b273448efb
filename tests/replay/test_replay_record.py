"""Replay plans from what each cell did when it ran, in a real IPython shell with the extension
loaded: the cells run, one fails, a new process is stood in for by emptying the namespace (and
forgetting the notebook's own modules), then the plan runs; the failing cell must start from the
state it had before the failure."""

from __future__ import annotations

import abc
import array
import collections
import dataclasses
import functools
import importlib
import os
import random
import re
import sys
import textwrap
import time
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from IPython.utils.capture import capture_output

from nb_cudaguard.notebook import replay_glue
from nb_cudaguard.notebook.extension import current_state
from nb_cudaguard.notebook.replay_glue import make_plan, run_plan
from nb_cudaguard.replay.history import SavedCells, load_cells, save_cells
from nb_cudaguard.replay.record import CellRecord, Recorder, _see, _see_global, fingerprint
from nb_cudaguard.replay.rng import encode_rng, restore_rng, rng_states
from nb_cudaguard.replay.settings import process_settings, settings_changed
from nb_cudaguard.replay.text import plan_summary


@pytest.fixture
def recorded(shell: Any) -> Iterator[Any]:
    """A shell with the extension loaded (with replay state of its own), an empty user
    namespace."""
    before = set(shell.user_ns)
    grad = torch.is_grad_enabled()
    shell.run_line_magic("load_ext", "nb_cudaguard")
    yield shell
    for name in set(shell.user_ns) - before:
        shell.user_ns.pop(name, None)
    torch.set_grad_enabled(grad)


def _run(shell: Any, cells: Sequence[str], earlier: int = 0) -> SavedCells:
    """Run ``cells`` as a notebook does; the last must fail. Returns what our restart keeps of
    them and of the ``earlier`` cells before them."""
    for source in cells:
        result = shell.run_cell(source, store_history=True)
    assert not result.success, "the last cell must fail"
    state = current_state(shell)
    assert state is not None and state.recorder is not None
    failing_count = shell.execution_count - 1
    kept, failing = replay_glue.cells_to_save(
        shell, state.outcomes, failing_count, state.seconds, state.recorder.settle(), state.replay
    )
    assert failing is not None
    # These cells only: the shell is shared, and its history holds other tests' cells, which
    # ran with no record (the extension loaded again since) and would be planned from text.
    mine = kept[failing - len(cells) - earlier + 1 : failing + 1]
    return SavedCells(tuple(mine), len(mine) - 1, time.time(), 1)


def _new_process(shell: Any, names: Sequence[str], modules: Sequence[str] = ()) -> None:
    for name in names:
        shell.user_ns.pop(name, None)
    for module in modules:
        sys.modules.pop(module, None)


def _replay(shell: Any, saved: SavedCells) -> str:
    plan = make_plan(shell, saved)
    with capture_output():
        run_plan(shell, saved, plan, blocking_on=True)
    return plan_summary(plan, saved.cells)


TRAINING = [
    "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.5)",
    textwrap.dedent(
        """\
        class Trainer:
            def __init__(self, model, opt):
                self.model, self.opt = model, opt

            def train(self):
                for _ in range(3):
                    self.opt.zero_grad()
                    self.model(torch.ones(8, 4)).pow(2).sum().backward()
                    self.opt.step()
                return "trained"

        trainer = Trainer(model, opt)"""
    ),
    "train_result = trainer.train()",  # a method's result bound: its change is in `model`
    "noise = torch.randn(5)",  # a draw the failing cell does not need
    "weights = model.weight.detach().clone()\ndraw = torch.rand(3)\n[][0]",
]


def test_a_training_call_bound_to_a_name_runs_again_and_the_draws_match(recorded):
    saved = _run(recorded, TRAINING)
    weights, draw = recorded.user_ns["weights"], recorded.user_ns["draw"]
    _new_process(
        recorded,
        ["torch", "model", "opt", "Trainer", "trainer", "train_result", "noise", "weights", "draw"],
    )
    _replay(recorded, saved)
    # Trained as before the failure (the cell binding `train_result` ran again), and the failing
    # cell drew what it drew then (its random state restored; the skipped `noise` draw is moot).
    assert torch.equal(recorded.user_ns["weights"], weights)
    assert torch.equal(recorded.user_ns["draw"], draw)
    assert "noise" not in recorded.user_ns


def test_an_early_stopper_called_by_a_loop_runs_again(recorded):
    # The common early stopper is an object called once per epoch (``__call__`` in Python):
    # its counter moves with no method named in the cell's text.
    cells = [
        textwrap.dedent(
            """\
            class EarlyStopping:
                def __init__(self, patience):
                    self.patience, self.counter, self.best = patience, 0, None

                def __call__(self, loss):
                    if self.best is not None and loss >= self.best:
                        self.counter += 1
                    self.best = loss if self.best is None else min(self.best, loss)
                    return self.counter >= self.patience"""
        ),
        "stopper = EarlyStopping(patience=3)",
        "for loss in [0.5, 0.6, 0.7]:\n    stop = stopper(loss)",
        "counter = stopper.counter\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert recorded.user_ns["counter"] == 2
    _new_process(recorded, ["EarlyStopping", "stopper", "loss", "stop", "counter"])
    _replay(recorded, saved)
    assert recorded.user_ns["counter"] == 2


def test_a_global_torch_setting_changed_by_a_cell_is_set_again(recorded):
    cells = [
        "import torch\nx = torch.ones(2, requires_grad=True)",
        "torch.set_grad_enabled(False)",
        "grad_on = torch.is_grad_enabled()\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert recorded.user_ns["grad_on"] is False
    torch.set_grad_enabled(True)  # a new process starts with grad mode on
    _new_process(recorded, ["torch", "x", "grad_on"])
    _replay(recorded, saved)
    assert recorded.user_ns["grad_on"] is False


def test_a_name_deleted_before_the_failure_stays_deleted(recorded):
    cells = [
        "raw = list(range(10))",
        "total = sum(raw)",
        "del raw",
        "result = total * 2\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert "raw" not in recorded.user_ns
    _new_process(recorded, ["total", "result"])
    _replay(recorded, saved)
    assert recorded.user_ns["result"] == 90
    assert "raw" not in recorded.user_ns


def test_a_call_into_the_notebooks_own_module_that_changes_its_state_runs_again(
    recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "nbcg_helpers.py").write_text("STATE = []\n\ndef log(v):\n    STATE.append(v)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cells = [
        "from nbcg_helpers import log, STATE",
        "log(1)",
        "seen = list(STATE)\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert recorded.user_ns["seen"] == [1]
    _new_process(recorded, ["log", "STATE", "seen"], modules=["nbcg_helpers"])
    _replay(recorded, saved)
    assert recorded.user_ns["seen"] == [1]
    sys.modules.pop("nbcg_helpers", None)


def test_a_call_that_fills_a_class_of_the_notebooks_own_module_runs_again(
    recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A registry kept on a class (``Registry.items``), filled through a classmethod: no global
    # of the module is re-bound, the class itself holds the state.
    (tmp_path / "nbcg_registry.py").write_text(
        "class Registry:\n    items = []\n\n    @classmethod\n"
        "    def add(cls, x):\n        cls.items.append(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cells = [
        "from nbcg_registry import Registry",
        "Registry.add(3)",
        "seen = list(Registry.items)\n[][0]",
    ]
    saved = _run(recorded, cells)
    assert recorded.user_ns["seen"] == [3]
    _new_process(recorded, ["Registry", "seen"], modules=["nbcg_registry"])
    _replay(recorded, saved)
    assert recorded.user_ns["seen"] == [3]
    sys.modules.pop("nbcg_registry", None)


def test_the_record_goes_to_the_next_process_with_the_cells(recorded, tmp_path: Path):
    saved = _run(recorded, TRAINING)
    connection = tmp_path / "kernel-1.json"
    connection.write_text("{}")
    save_cells(tmp_path, str(connection), saved.cells, saved.failing)
    loaded, why = load_cells(
        tmp_path, str(connection), started=time.time(), image_started=time.time() + 10
    )
    assert loaded is not None, why
    assert [c.record for c in loaded.cells] == [c.record for c in saved.cells]
    trained = loaded.cells[saved.failing - 2].record
    assert trained is not None and "model" in trained.changed and "train_result" in trained.bound
    assert loaded.cells[saved.failing].record.rng  # the failing cell's random state


def test_what_a_cell_did_is_seen_from_its_effects_not_its_text():
    namespace: dict[str, Any] = {}
    recorder = Recorder()
    recorder.prime(namespace)

    def cell(count: int, code: str) -> CellRecord:
        recorder.start(namespace)
        exec(code, namespace)
        recorder.finish(namespace, count, failed=False)
        return recorder.settle()[count]

    cell(1, "import torch\nx = torch.zeros(3)\nhistory = [1, 2]\ncfg = {'lr': 1}")
    assert cell(2, "y = x.add_(1)") == CellRecord(frozenset({"y"}), frozenset({"x"}))
    assert cell(3, "last = history.pop()").changed == {"history"}
    assert cell(4, "[cfg.update(lr=2) for _ in range(1)]").changed == {"cfg"}
    assert cell(5, "z = x + 1").changed == frozenset()  # reading is no change
    assert cell(6, "del z").deleted == {"z"}
    assert cell(7, "torch.rand(1)").drew == ("torch",)
    # (Not a cudnn flag: torch's own test helpers, imported by other tests, lock those.)
    precision = torch.get_float32_matmul_precision()
    try:
        settings = cell(8, "torch.set_float32_matmul_precision('medium')").settings
        assert "torch.set_float32_matmul_precision" in settings
    finally:
        torch.set_float32_matmul_precision(precision)


def test_a_fingerprint_sees_a_module_trained_and_a_container_filled():
    model = torch.nn.Linear(2, 2)
    before, whole = fingerprint(model)
    assert whole and fingerprint(model)[0] == before
    with torch.no_grad():
        model.weight.mul_(2)
    assert fingerprint(model)[0] != before
    items: list[Any] = [[1]]
    before, _ = fingerprint(items)
    items[0].append(2)
    assert fingerprint(items)[0] != before
    big = list(range(10_000))
    assert fingerprint(big)[1] is False  # too large to see whole: said, never guessed


def test_a_fingerprint_sees_what_a_module_or_an_optimizer_gains_and_changes_in_place():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    changes = [
        lambda: setattr(model[0], "history", []),  # a new attribute
        lambda: model[0].history.append(1.0),  # changed inside it
        lambda: model[1].register_forward_hook(lambda *a: None),
        lambda: setattr(model[0].weight, "no_decay", True),
        # hooks kept apart from ``register_hook``'s, and the optimizer's own hooks' dicts
        lambda: model[0].weight.register_post_accumulate_grad_hook(lambda p: None),
        lambda: opt.register_step_post_hook(lambda *a: None),
        lambda: opt.register_step_pre_hook(lambda *a: None),
        lambda: opt.step(),  # the moments, in place
        lambda: opt.state[model[0].bias]["exp_avg"].add_(1),
        lambda: model.train(False),
        lambda: opt.param_groups[0]["params"].append(torch.nn.Parameter(torch.ones(1))),
    ]
    for change in changes:
        before = [fingerprint(model)[0], fingerprint(opt)[0]]
        assert [fingerprint(model)[0], fingerprint(opt)[0]] == before  # reading moves nothing
        change()
        assert [fingerprint(model)[0], fingerprint(opt)[0]] != before, change
    # A non-leaf told to keep its grad (``h.retain_grad()``), then given one by a backward.
    hidden = model[0](torch.ones(1, 2))
    for change in (hidden.retain_grad, lambda: hidden.sum().backward()):
        before = fingerprint(hidden)[0]
        change()
        assert fingerprint(hidden)[0] != before, change
    bare = torch.nn.Module.__new__(torch.nn.Linear)  # never ran nn.Module.__init__
    assert fingerprint(bare)[1] is False


def test_functions_bound_to_the_global_generators_are_seen_whole():
    # Their state is the random state the record reads apart at each cell's start: ``from
    # random import shuffle`` is no name whose change may be missed.

    for function in (random.random, random.shuffle, np.random.rand, np.random.shuffle):
        assert fingerprint(function)[1] is True, function
    own = random.Random(0)  # a generator of one's own: where it stands is read
    before = fingerprint(own.random)
    assert before[1] is True
    own.random()
    assert fingerprint(own.random) != before


def test_a_c_callable_holding_state_is_not_seen_as_a_function():
    # ``sqlite3.connect(':memory:')`` is callable and written in C, as a function is; but it
    # holds a database an INSERT changes, which no walk can read: not seen whole. Functions,
    # ufuncs and operator's getters stay seen whole, by identity.
    import ctypes
    import operator
    import sqlite3

    con = sqlite3.connect(":memory:")
    try:
        assert fingerprint(con)[1] is False
        assert _see(con)[2] is False  # (a name's own look at a cell's end, too)
    finally:
        con.close()
    assert fingerprint(ctypes.CFUNCTYPE(None)(lambda: None))[1] is False  # its ``restype``
    for function in (len, [].append, str.join, np.add, np.sum, operator.itemgetter(1), F.relu):
        assert fingerprint(function)[1] is True, function


def test_an_insert_by_a_failed_cell_into_an_in_memory_database_is_named(recorded):
    cells = [
        "import sqlite3\ncon = sqlite3.connect(':memory:')\ncon.execute('create table t(x)')",
        "con.execute('insert into t values (1)')\nraise RuntimeError('CUDA out of memory')",
        "m = 1",
        "rows = con.execute('select count(*) from t').fetchone()[0] + m\n[][0]",
    ]
    saved = _run(recorded, cells)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    _new_process(recorded, ["con", "m", "sqlite3"])
    summary = _replay(recorded, saved)
    assert "con" in summary.split("then that cell", 1)[1], summary


def test_a_fingerprint_sees_what_a_data_descriptor_keeps_for_the_instance():
    # ``obj.lr = 0.5`` through a descriptor's ``__set__`` that keeps it in a WeakKeyDictionary
    # on the class: the instance's ``__dict__`` stays empty, yet ``obj.lr`` changed.
    class Positive:
        def __init__(self) -> None:
            self.values: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

        def __get__(self, obj: Any, owner: Any = None) -> Any:
            return self if obj is None else self.values.get(obj, 1.0)

        def __set__(self, obj: Any, value: float) -> None:
            self.values[obj] = value

    class Cfg:
        lr = Positive()

    cfg = Cfg()
    before, whole = fingerprint(cfg)
    assert whole and fingerprint(cfg)[0] == before
    cfg.lr = 0.5
    assert fingerprint(cfg)[0] != before


def test_a_setting_kept_by_a_descriptor_set_in_a_failed_cell_is_named(recorded):
    cells = [
        "import weakref\nclass Positive:\n    def __init__(self):\n"
        "        self.values = weakref.WeakKeyDictionary()\n"
        "    def __get__(self, obj, owner=None):\n"
        "        return self if obj is None else self.values.get(obj, 1.0)\n"
        "    def __set__(self, obj, v):\n        self.values[obj] = v\n"
        "class Cfg:\n    lr = Positive()\ncfg = Cfg()",
        "cfg.lr = 0.5\nraise RuntimeError('CUDA out of memory')",
        "seen = cfg.lr\n[][0]",
    ]
    saved = _run(recorded, cells)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    _new_process(recorded, ["weakref", "Positive", "Cfg", "cfg", "seen"])
    summary = _replay(recorded, saved)
    assert recorded.user_ns["seen"] == 1.0  # the failed cell's store is not repeated...
    assert "cfg" in summary.split("then that cell", 1)[1], summary  # ...and the plan says so


def test_a_fingerprint_sees_what_a_notebook_class_and_its_metaclass_hold():
    # ``r.tags.append(t)`` with ``tags = []`` on the class; a singleton a metaclass keeps.
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(
        "class Run:\n    tags = []\nclass Sub(Run):\n    pass\nr = Sub()\n"
        "class Single(type):\n    made = {}\nclass Cache(metaclass=Single):\n    pass",
        namespace,
    )
    r, cache = namespace["r"], namespace["Cache"]
    before, cache_before = fingerprint(r)[0], fingerprint(cache)[0]
    assert fingerprint(r)[0] == before and fingerprint(cache)[0] == cache_before
    r.tags.append("warm")
    namespace["Single"].made[cache] = object()
    assert fingerprint(r)[0] != before
    assert fingerprint(cache)[0] != cache_before


def test_a_notebook_class_with_properties_and_static_methods_is_seen_whole():
    # Walked with each instance: a ``property`` or ``staticmethod`` (C objects) by their functions.
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(
        "class A:\n    @property\n    def p(self):\n        return 1\n"
        "    @staticmethod\n    def s():\n        pass\n"
        "    @classmethod\n    def c(cls):\n        pass\na = A()",
        namespace,
    )
    assert fingerprint(namespace["A"])[1] and fingerprint(namespace["a"])[1]


def test_a_class_attribute_changed_through_an_instance_in_a_failed_cell_is_named(recorded):
    cells = [
        "class Run:\n    tags = []\nr = Run()",
        "r.tags.append('warm')\nraise RuntimeError('CUDA out of memory')",
        "n = len(r.tags)",
        "seen = n\n[][0]",
    ]
    saved = _run(recorded, cells)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    _new_process(recorded, ["Run", "r", "n", "seen"])
    summary = _replay(recorded, saved)
    named = summary.split("then that cell", 1)[1]
    assert re.search(r"\br\b", named) and re.search(r"\bn\b", named), summary


def test_an_attribute_a_failed_cell_set_through_a_property_kept_elsewhere_is_named(recorded):
    # The setter keeps the value in a global dict: the record sees ``overrides`` change, not
    # ``cfg``, yet ``cfg.lr`` (and what a later cell read from it) is what the cell set.
    cells = [
        "overrides = {}\nclass Cfg:\n    @property\n    def lr(self):\n"
        "        return overrides.get('lr', 1.0)\n    @lr.setter\n    def lr(self, v):\n"
        "        overrides['lr'] = v\ncfg = Cfg()",
        "cfg.lr = 0.5\nraise RuntimeError('CUDA out of memory')",
        "lr = cfg.lr",
        "seen = lr\n[][0]",
    ]
    saved = _run(recorded, cells)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    _new_process(recorded, ["overrides", "Cfg", "cfg", "lr", "seen"])
    summary = _replay(recorded, saved)
    named = summary.split("then that cell", 1)[1]
    assert re.search(r"\bcfg\b", named) and re.search(r"\blr\b", named), summary


def test_a_class_attribute_a_module_bumps_in_a_failed_cell_is_named_with_the_module(recorded):
    # ``type(self).calls += 1`` in ``forward``: the change is in the notebook's ``nn.Module``
    # class, which ``net.calls`` reads through.
    cells = [
        "import torch\nclass Net(torch.nn.Module):\n    calls = 0\n    def forward(self, x):\n"
        "        type(self).calls += 1\n        return x\nnet = Net()",
        "net(torch.ones(1))\nraise RuntimeError('CUDA out of memory')",
        "c = net.calls",
        "seen = c\n[][0]",
    ]
    saved = _run(recorded, cells)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    _new_process(recorded, ["Net", "net", "c", "seen"])
    summary = _replay(recorded, saved)
    named = summary.split("then that cell", 1)[1]
    assert re.search(r"\bnet\b", named) and re.search(r"\bc\b", named), summary


def test_a_fingerprint_sees_state_held_by_what_is_called():
    class Stopper:  # called, not a method named: ``stopper(val_loss)``
        def __init__(self) -> None:
            self.counter = 0

        def __call__(self, loss: float) -> None:
            self.counter += 1

    class Log:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write(self, line: str) -> None:
            self.lines.append(line)

    stopper, collect, write = Stopper(), functools.partial(print, []), Log().write
    model = torch.nn.Linear(2, 2)
    changes = [
        (stopper, lambda: stopper(0.5)),
        (collect, lambda: collect.args[0].append(1)),  # a partial's arguments
        (write, lambda: write("epoch 1")),  # a bound method's object, named nowhere else
        (model, lambda: model._register_state_dict_hook(lambda *a: None)),
        (model, lambda: model.register_load_state_dict_post_hook(lambda *a: None)),
    ]
    for value, change in changes:
        before, whole = fingerprint(value)
        assert whole and fingerprint(value)[0] == before
        change()
        assert fingerprint(value)[0] != before, value
    assert fingerprint(torch.nn.functional.relu) == fingerprint(torch.nn.functional.relu)


def test_a_fingerprint_sees_a_functions_attributes_and_a_slotted_objects_fields():
    # A call counter kept on a function (``log_step.n += 1``, a decorator's ``wrapper.calls``)
    # and ``@dataclass(slots=True)`` fields, private slots too: no ``__dict__`` holds them.
    def log_step() -> None:
        pass

    log_step.__module__ = "__main__"  # a notebook function
    log_step.n = 0  # type: ignore[attr-defined]

    @dataclasses.dataclass(slots=True)
    class Meter:
        n: int = 0

    class Private:
        __slots__ = ("__seen",)

    meter, private = Meter(), Private()
    changes = [
        (log_step, lambda: setattr(log_step, "n", 1)),
        (log_step, lambda: setattr(log_step, "calls", 0)),  # a new one
        (meter, lambda: setattr(meter, "n", 1)),
        (private, lambda: setattr(private, "_Private__seen", [])),
    ]
    for value, change in changes:
        before = fingerprint(value)
        assert before[1] and fingerprint(value) == before, value
        change()
        assert fingerprint(value)[0] != before[0], value
    assert not fingerprint(array.array("i", [1]))[1]  # a C type's state: still not seen whole


def test_a_fingerprint_sees_state_a_walk_met_only_by_identity():
    # A model's own private attribute (``self._calls += 1`` in ``forward``), an object held only
    # by a bound C method (``add = [].append``), a library class's attribute
    # (``tqdm.monitor_interval = 0``), one of an ABC's (its type is ABCMeta): each changed in
    # place while the fingerprint, seen whole, stayed the same.
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._calls = 0

    class Plain:
        interval = 10

    class Registry(abc.ABC):  # noqa: B024 (a registry, not an interface)
        items = (0,)

    net, add = Net(), [].append
    recent = collections.deque([0.5, 0.4], maxlen=2)  # the last losses: full, so each drops one
    changes = [
        (recent, lambda: recent.append(0.4)),
        (net, lambda: setattr(net, "_calls", 1)),
        (add, lambda: add(1)),
        (Plain, lambda: setattr(Plain, "interval", 0)),
        (Registry, lambda: setattr(Registry, "items", (1,))),
        # an array among a class's attributes, then another in its place (its ``==`` raises)
        (Plain, lambda: setattr(Plain, "table", np.zeros(3))),
        (Plain, lambda: setattr(Plain, "table", np.zeros(3))),
    ]
    for value, change in changes:
        before, seen = fingerprint(value), _see(value)
        assert before[1] and seen[2] and fingerprint(value) == before and _see(value) == seen
        change()
        assert fingerprint(value)[0] != before[0], value
        assert _see(value)[1] != seen[1], value


_MODULE_HOOKS = "torch.nn.modules.module.register_module_forward_hook"
_OPTIMIZER_HOOKS = "torch.optim.optimizer.register_optimizer_step_pre_hook"
_OPTIMIZER = sys.modules[torch.optim.Optimizer.__module__]  # (no attribute of torch.optim)


@pytest.mark.parametrize(
    ("register", "setting"),
    [
        (torch.nn.modules.module.register_module_forward_hook, _MODULE_HOOKS),
        (torch.nn.modules.module.register_module_full_backward_hook, _MODULE_HOOKS),
        (_OPTIMIZER.register_optimizer_step_pre_hook, _OPTIMIZER_HOOKS),
        (_OPTIMIZER.register_optimizer_step_post_hook, _OPTIMIZER_HOOKS),
    ],
)
def test_a_global_module_or_optimizer_hook_is_a_setting_a_cell_changes(register, setting):
    before = process_settings()
    handle = register(lambda *args: None)
    try:
        moved = settings_changed(before, process_settings())
    finally:
        handle.remove()
    assert moved == (setting,)


def test_a_process_group_started_is_a_setting_a_cell_changes(tmp_path):
    # ``dist.init_process_group`` binds no notebook name: the group lives in c10d's module state.
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("no torch.distributed, or a group already started")
    before = process_settings()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        moved = settings_changed(before, process_settings())
    finally:
        dist.destroy_process_group()
    assert moved == ("torch.distributed.init_process_group",)


_TINY = 1e-310  # a denormal


@pytest.mark.parametrize(
    ("setting", "read", "write"),
    [
        ("torch.set_warn_always", torch.is_warn_always_enabled, torch.set_warn_always),
        (
            "torch.autograd.set_multithreading_enabled",
            torch._C._is_multithreading_enabled,
            torch._C._set_multithreading_enabled,
        ),
        # (no getter: whether a denormal survives a product, as the reader sees it)
        ("torch.set_flush_denormal", lambda: _TINY * 1.0 == 0.0, torch.set_flush_denormal),
    ],
)
def test_a_torch_flag_a_helper_flips_is_a_setting_a_cell_changes(setting, read, write):
    was = read()
    before = process_settings()
    write(not was)
    try:
        moved = settings_changed(before, process_settings())
    finally:
        write(was)
    assert moved == (setting,)


_MODES = {
    "torch.autocast('cpu')": lambda: torch.autocast("cpu"),
    "torch.inference_mode": torch.inference_mode,  # (it turns grad mode off too)
    "torch.autograd.graph.saved_tensors_hooks": lambda: torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t
    ),
    "torch.autograd.graph.disable_saved_tensors_hooks": lambda: (
        torch.autograd.graph.disable_saved_tensors_hooks("not here")
    ),
}


@pytest.mark.parametrize("setting", list(_MODES))
def test_a_mode_entered_and_left_open_is_a_setting_a_cell_changes(setting):
    # ``torch.autocast("cpu").__enter__()`` in a cell: later cells' matmuls run in bfloat16.
    before = process_settings()
    context = _MODES[setting]()
    context.__enter__()
    try:
        moved = settings_changed(before, process_settings())
    finally:
        context.__exit__(None, None, None)
    assert setting in moved


_CWD = os.getcwd()
# (how a cell sets it, how a new process has it, what it reads now)
_SETTINGS = {
    "environ": (
        "os.environ['NBCG_SEED'] = '7'",
        "os.environ.pop('NBCG_SEED', None)",
        "os.environ.get('NBCG_SEED')",
    ),
    "chdir": ("os.chdir('/')", f"os.chdir({_CWD!r})", "os.getcwd()"),
    # The standard library's own: a division's digits, an interpreter setting.
    "decimal's context": (
        "decimal.setcontext(decimal.Context(prec=4))",
        "decimal.setcontext(decimal.Context())",
        "str(decimal.Decimal(1) / 3)",
    ),
    "the switch interval": (
        "sys.setswitchinterval(0.01)",
        "sys.setswitchinterval(0.005)",
        "sys.getswitchinterval()",
    ),
    "sys_path": (
        "sys.path.append('/nbcg-lib')",
        "sys.path[:] = [p for p in sys.path if p != '/nbcg-lib']",
        "'/nbcg-lib' in sys.path",
    ),
    "warnings": (
        "warnings.filterwarnings('error', message='nbcg')",
        "warnings.filters[:] = [f for f in warnings.filters if (f[1] and f[1].pattern) != 'nbcg']",
        "[f[1] and f[1].pattern for f in warnings.filters].count('nbcg')",
    ),
    "recursion": (
        "sys.setrecursionlimit(4321)",
        f"sys.setrecursionlimit({sys.getrecursionlimit()})",
        "sys.getrecursionlimit()",
    ),
    "seterr": (
        "np.seterr(divide='raise')",
        f"np.seterr(divide={np.geterr()['divide']!r})",
        "np.geterr()['divide']",
    ),
    "torch.hub.set_dir": (
        "torch.hub.set_dir('/tmp/nbcg-hub')",
        f"torch.hub.set_dir({torch.hub.get_dir()!r})",
        "torch.hub.get_dir()",
    ),
    "printoptions": (
        "np.set_printoptions(precision=3)",
        f"np.set_printoptions(precision={np.get_printoptions()['precision']})",
        "np.get_printoptions()['precision']",
    ),
    "flash_sdp": (
        "torch.backends.cuda.enable_flash_sdp(False)",
        "torch.backends.cuda.enable_flash_sdp(True)",
        "torch.backends.cuda.flash_sdp_enabled()",
    ),
    "mem_efficient_sdp": (
        "torch.backends.cuda.enable_mem_efficient_sdp(False)",
        "torch.backends.cuda.enable_mem_efficient_sdp(True)",
        "torch.backends.cuda.mem_efficient_sdp_enabled()",
    ),
    "warn_only": (
        "torch.use_deterministic_algorithms(False, warn_only=True)",
        "torch.use_deterministic_algorithms(False)",
        "torch.is_deterministic_algorithms_warn_only_enabled()",
    ),
    # A call counter's profile function: it runs at every later call of the cells.
    "profile": (
        "sys.setprofile(lambda frame, event, arg: None)",
        "sys.setprofile(None)",
        "sys.getprofile() is not None",
    ),
    "default_device": (
        "torch.set_default_device('meta')",
        "torch.set_default_device(None)",
        "str(torch.get_default_device())",
    ),
    # a library's function replaced by a started patcher: the text sees no patch of torch
    "mock_patch": (
        "__import__('unittest.mock').mock.patch('torch.nn.functional.gelu', abs).start()",
        "__import__('unittest.mock').mock.patch.stopall()",
        "torch.nn.functional.gelu(torch.tensor([-1.0])).item()",
    ),
    # State a library keeps that no record reads: only the statement, a library's function
    # handed constants alone and its value dropped, says the cell set something up.
    "socket's default timeout": (
        "socket.setdefaulttimeout(7.5)",
        "socket.setdefaulttimeout(None)",
        "socket.getdefaulttimeout()",
    ),
    "a logger's level, through a call": (
        "logging.getLogger('nbcg.effect').setLevel(logging.ERROR)",
        "logging.getLogger('nbcg.effect').setLevel(logging.NOTSET)",
        "logging.getLogger('nbcg.effect').level",
    ),
    "a registry": (
        "mimetypes.add_type('text/x-nbcg', '.nbcg')",
        "mimetypes.types_map.pop('.nbcg', None)",
        "mimetypes.guess_type('a.nbcg')[0]",
    ),
}


@pytest.mark.parametrize("setting", list(_SETTINGS))
@pytest.mark.parametrize("through", ["a call in the cell", "a notebook function"])
def test_a_setting_a_cell_changed_is_set_again_by_the_replay(recorded, setting, through):
    # Where the cell's text shows nothing (a function defined earlier sets it), what the record
    # read at the cell's end (or, for a library's own state, the call's statement) tells that
    # the cell must run again.
    change, default, read = _SETTINGS[setting]
    imports = "import os, sys, decimal, warnings, logging, mimetypes, socket, torch, numpy as np"
    cells = [imports, "y = 1", f"seen = {read}\n[][0]"]
    if through == "a call in the cell":
        cells.insert(1, change)
    else:
        cells[1:1] = [f"def configure():\n    {change}", "configure()"]
    try:
        saved = _run(recorded, cells)
        # only this test's cells (the shell's history holds other tests' cells too)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        recorded.run_cell(default)  # as a new process has it
        assert eval(read, recorded.user_ns) != before
        _new_process(recorded, ["y", "seen", "configure"])
        summary = _replay(recorded, saved)
        assert eval(read, recorded.user_ns) == before, summary
    finally:
        recorded.run_cell(default)


# (what a cell sets before it fails, how a new process has it, what the failing cell reads)
_SET_BEFORE_FAILING = {
    "a variable set": (
        "os.environ['NBCG_TOKEN'] = 'abc'",
        "os.environ.pop('NBCG_TOKEN', None)",
        "os.environ.get('NBCG_TOKEN')",
    ),
    "a variable removed": (
        "del os.environ['NBCG_GONE']",
        "os.environ['NBCG_GONE'] = 'here'",
        "os.environ.get('NBCG_GONE')",
    ),
    "%env": ("%env NBCG_TOKEN=xyz", "os.environ.pop('NBCG_TOKEN', None)", "%env NBCG_TOKEN"),
    "the directory": ("os.chdir('/')", f"os.chdir({_CWD!r})", "os.getcwd()"),
}


@pytest.mark.parametrize("setting", list(_SET_BEFORE_FAILING))
def test_what_a_failed_cell_set_in_the_environment_is_set_again(recorded, setting):
    # ``os.environ['HF_TOKEN'] = ...`` in a cell that then failed: it is not run again, and the
    # cells after it read the variable. The replay sets it again from the failed cell's record,
    # and the plan no longer names it as missing.
    change, default, read = _SET_BEFORE_FAILING[setting]
    cells = [
        "import os\nos.environ['NBCG_GONE'] = 'here'",
        f"{change}\nraise RuntimeError('boom')",
        f"seen = {read}\n[][0]",
    ]
    try:
        saved = _run(recorded, cells)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        record = mine[1].record
        assert record is not None and (record.environ or record.cwd)
        assert CellRecord.from_json(record.to_json()) == record  # as the next process reads it
        before = recorded.user_ns["seen"]
        recorded.run_cell(default)  # as a new process has it
        _new_process(recorded, ["seen"])
        plan = make_plan(recorded, saved)
        assert plan.set_again and plan.set_again[0][0] == 1
        assert not plan.failed_setup, plan.failed_setup
        summary = _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before
        # the plan says what it sets again: the variable's name (never its value), the directory
        said = "the working directory" if setting == "the directory" else "os.environ NBCG_"
        assert said in summary and "abc" not in summary and "xyz" not in summary, summary
    finally:
        recorded.run_cell(default)
        os.environ.pop("NBCG_TOKEN", None)
        os.environ.pop("NBCG_GONE", None)


def test_a_cell_that_succeeded_keeps_no_values_of_what_it_set(recorded):
    # It runs again in a replay, which sets them: its record holds no environment's values.
    try:
        recorded.run_cell("import os\nos.environ['NBCG_TOKEN'] = 'abc'", store_history=True)
        state = current_state(recorded)
        record = state.recorder.records[recorded.execution_count - 1]
        assert "os.environ" in record.settings
        assert record.environ == () and record.cwd == ""
    finally:
        os.environ.pop("NBCG_TOKEN", None)


# (the cells before the failing one, after the imports; what the failing cell reads)
_THROUGH_FUNCTIONS = {
    "a module's function patched": (
        ["x = torch.tensor([1.0, -1.0])", "def patch():\n    F.gelu = lambda t: t * 2", "patch()"],
        "F.gelu(x).tolist()",
    ),
    "a module's function patched two calls deep": (
        [
            "x = torch.tensor([1.0, -1.0])",
            "def inner():\n    F.gelu = lambda t: t * 2\n\ndef patch():\n    inner()",
            "patch()",
        ],
        "F.gelu(x).tolist()",
    ),
    "a library class's method patched": (
        [
            "act = torch.nn.GELU()\nx = torch.tensor([1.0, -1.0])",
            "def patch():\n    torch.nn.GELU.forward = lambda self, t: t * 3",
            "patch()",
        ],
        "act(x).tolist()",
    ),
    "weights scaled through .data by a function they are handed": (
        [
            "lin = torch.nn.Linear(2, 2)\nwith torch.no_grad():\n    lin.weight.fill_(1.0)",
            "def shrink(m):\n    for p in m.parameters():\n        p.data *= 0.5",
            "shrink(lin)",
        ],
        "lin.weight.sum().item()",
    ),
    "a module's function patched by a method": (
        [
            "x = torch.tensor([1.0, -1.0])",
            "class Patcher:\n    def apply(self):\n        F.gelu = lambda t: t * 2\n\n"
            "p = Patcher()",
            "p.apply()",
        ],
        "F.gelu(x).tolist()",
    ),
    "a module's function patched by a classmethod": (
        [
            "x = torch.tensor([1.0, -1.0])",
            "class Patcher:\n    @classmethod\n    def apply(cls):\n"
            "        F.gelu = lambda t: t * 2",
            "Patcher.apply()",
        ],
        "F.gelu(x).tolist()",
    ),
    "weights scaled through .data by a method": (
        [
            "lin = torch.nn.Linear(2, 2)\nwith torch.no_grad():\n    lin.weight.fill_(1.0)",
            "class Shrinker:\n    def __init__(self, m):\n        self.m = m\n\n"
            "    def step(self):\n        for q in self.m.parameters():\n"
            "            q.data *= 0.5\n\n"
            "s = Shrinker(lin)",
            "s.step()",
        ],
        "lin.weight.sum().item()",
    ),
    "random.Random": (
        ["rng = random.Random(1)", "def draw():\n    return rng.random()", "draw()"],
        "rng.random()",
    ),
    "np.random.default_rng": (
        ["rng = np.random.default_rng(0)", "def draw():\n    return rng.random()", "draw()"],
        "rng.random()",
    ),
    "np.random.Generator(MT19937)": (
        [
            "rng = np.random.Generator(np.random.MT19937(0))",
            "def draw():\n    return rng.random()",
            "draw()",
        ],
        "rng.random()",
    ),
    "np.random.RandomState": (
        ["rng = np.random.RandomState(0)", "def draw():\n    return rng.randn()", "draw()"],
        "rng.randn()",
    ),
}


@pytest.mark.parametrize("case", list(_THROUGH_FUNCTIONS))
def test_what_a_notebook_function_did_outside_the_names_is_done_again(recorded, case):
    # A library patched, a generator of one's own advanced, by a function defined in the
    # notebook: the calling cell binds nothing, and its record alone would skip it.
    body, read = _THROUGH_FUNCTIONS[case]
    imports = "import random, torch, numpy as np\nimport torch.nn.functional as F"
    cells = [imports, *body, "y = 1", f"seen = {read}\n[][0]"]
    gelu, forward = F.gelu, torch.nn.GELU.forward
    try:
        saved = _run(recorded, cells)
        # only this test's cells (the shell's history holds other tests' cells too)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        F.gelu, torch.nn.GELU.forward = gelu, forward  # as a new process imports them
        names = ["x", "act", "rng", "lin", "p", "s", "patch", "inner", "draw", "shrink", "y"]
        names.append("seen")
        _new_process(recorded, names)
        summary = _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before, summary
    finally:
        F.gelu, torch.nn.GELU.forward = gelu, forward


_CLASS_PATCHES = {
    "type(m)": "def patch(m):\n    type(m).forward = lambda self, t: t * 3\n\npatch(act)",
    "m.__class__": "def patch(m):\n    m.__class__.forward = lambda self, t: t * 3\n\npatch(act)",
    "setattr(type(m), ...)": (
        "def patch(m):\n    setattr(type(m), 'forward', lambda self, t: t * 3)\n\npatch(act)"
    ),
    "a module found in a global": (
        "def patch():\n    for layer in net.modules():\n"
        "        if isinstance(layer, torch.nn.GELU):\n"
        "            type(layer).forward = lambda self, t: t * 3\n\npatch()"
    ),
}


@pytest.mark.parametrize("kept", [True, False], ids=["instance restored", "instance rebuilt"])
@pytest.mark.parametrize("case", list(_CLASS_PATCHES))
def test_a_class_a_notebook_function_patches_through_an_instance_is_patched_again(
    recorded, case, kept
):
    # The record sees a library class by identity alone, and a restored instance comes back
    # with its class imported afresh: only running the calling cell again patches it.
    cells = [
        "import torch\nact = torch.nn.GELU()\nnet = torch.nn.Sequential(act)\n"
        "x = torch.tensor([1.0, -1.0])",
        _CLASS_PATCHES[case],
        "y = 1",
        "seen = act(x).tolist()\n[][0]",
    ]
    forward = torch.nn.GELU.forward
    try:
        saved = _run(recorded, cells)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        torch.nn.GELU.forward = forward  # as a new process imports it
        gone = ["patch", "y", "seen"] + ([] if kept else ["act", "net", "x"])
        _new_process(recorded, gone)
        summary = _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before, summary
    finally:
        torch.nn.GELU.forward = forward


_LIBRARY_PATCHES = {
    "a started mock.patch": (
        "from unittest import mock\n"
        "patcher = mock.patch('torch.nn.functional.gelu', lambda t: t * 2)\npatcher.start()"
    ),
    "a started mock.patch.object": (
        "from unittest import mock\nmock.patch.object(F, 'gelu', lambda t: t * 2).start()"
    ),
    "a mock.patch started by a function": (
        "from unittest import mock\n"
        "def go():\n    mock.patch.object(F, 'gelu', lambda t: t * 2).start()\n\ngo()"
    ),
    "vars(module)[name]": "vars(F)['gelu'] = lambda t: t * 2",
    "module.__dict__.update": "F.__dict__.update(gelu=lambda t: t * 2)",
    "a function's vars(module).update": (
        "def go():\n    vars(F).update(gelu=lambda t: t * 2)\n\ngo()"
    ),
    "setattr on sys.modules[name]": (
        "import sys\nsetattr(sys.modules['torch.nn.functional'], 'gelu', lambda t: t * 2)"
    ),
    "a module from importlib.import_module": (
        "import importlib\nm = importlib.import_module('torch.nn.functional')\n"
        "m.gelu = lambda t: t * 2"
    ),
}


@pytest.mark.parametrize("case", list(_LIBRARY_PATCHES))
def test_a_library_patched_by_a_route_the_text_does_not_spell_is_patched_again(recorded, case):
    # The record sees a library's module by identity alone: the patch is found in the text
    # (``vars(F)``, ``importlib``) or in what unittest.mock keeps (a started patcher).
    cells = [
        "import torch\nimport torch.nn.functional as F\nx = torch.tensor([1.0, -1.0])",
        _LIBRARY_PATCHES[case],
        "y = 1",
        "seen = F.gelu(x).tolist()\n[][0]",
    ]
    gelu = F.gelu
    try:
        saved = _run(recorded, cells)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        mock.patch.stopall()  # as a new process has it: nothing started,
        F.gelu = gelu  # and the function as torch defines it
        _new_process(recorded, ["y", "seen", "patcher", "m", "go"])
        summary = _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before, summary
    finally:
        mock.patch.stopall()
        F.gelu = gelu


def test_what_a_library_sets_as_it_is_imported_is_no_setting_of_the_cell(
    recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # numpy and torch add warnings filters when first imported, some libraries environment
    # variables: the import cell is not setup for that (the new process imports them again),
    # while a cell's own change of the same settings still is.
    (tmp_path / "nbcg_loud.py").write_text(
        "import os, warnings\nwarnings.filterwarnings('ignore', message='nbcg-loud')\n"
        "os.environ['NBCG_LOUD'] = '1'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    state = current_state(recorded)
    assert state is not None and state.recorder is not None
    filters = list(warnings.filters)
    try:
        recorded.run_cell("import nbcg_loud", store_history=True)
        loaded = state.recorder.records[recorded.execution_count - 1]
        recorded.run_cell("import warnings as w\nw.filterwarnings('ignore', message='mine')", True)
        own = state.recorder.records[recorded.execution_count - 1]
    finally:
        warnings.filters[:] = filters
        os.environ.pop("NBCG_LOUD", None)
        sys.modules.pop("nbcg_loud", None)
    assert loaded.settings == ()
    assert own.settings == ("warnings.filterwarnings",)


_OWN_MODULE = (
    "import torch.nn.functional as F\n\n_orig = F.gelu\n\n\n"
    "def install():\n    _patch()\n\n\ndef _patch():\n    F.gelu = lambda t: _orig(t) * 2\n\n\n"
    "def shrink(m):\n    for p in m.parameters():\n        p.data *= 0.5\n"
)


@pytest.mark.parametrize(
    ("body", "read"),
    [
        (["import nbcg_own11", "nbcg_own11.install()"], "F.gelu(torch.ones(1)).tolist()"),
        (
            [
                "from nbcg_own11 import shrink\nlin = torch.nn.Linear(2, 2)\n"
                "with torch.no_grad():\n    lin.weight.fill_(1.0)",
                "shrink(lin)",
            ],
            "lin.weight.sum().item()",
        ),
    ],
    ids=["a library patched", "weights scaled through .data"],
)
def test_what_a_function_of_the_notebooks_own_module_did_is_done_again(
    recorded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body, read
):
    # As a function defined in a cell (above), where it is a ``helpers.py`` beside the notebook
    # (``%%writefile``): the record sees neither the patch nor the write through ``.data``, and
    # the cell's text alone does not say what the module's function does.
    (tmp_path / "nbcg_own11.py").write_text(_OWN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cells = [
        "import torch\nimport torch.nn.functional as F",
        *body,
        "y = 1",
        f"seen = {read}\n[][0]",
    ]
    gelu = F.gelu
    try:
        saved = _run(recorded, cells)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        F.gelu = gelu  # as a new process imports it
        _new_process(recorded, ["lin", "y", "seen", "nbcg_own11", "shrink"], ["nbcg_own11"])
        summary = _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before, summary
    finally:
        F.gelu = gelu
        sys.modules.pop("nbcg_own11", None)


def test_an_abc_of_the_notebooks_own_module_is_seen_with_the_state_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # As a plain class's registry (``Registry.items``), where the class is an ABC: its type is
    # ABCMeta, not type.
    (tmp_path / "nbcg_abc.py").write_text(
        "from abc import ABC\n\nclass Callback(ABC):\n    items = []\n\n    @classmethod\n"
        "    def add(cls, x):\n        cls.items.append(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("nbcg_abc")
    try:
        before = _see_global(module.Callback, "nbcg_abc")
        module.Callback.add(3)
        assert _see_global(module.Callback, "nbcg_abc") != before
    finally:
        sys.modules.pop("nbcg_abc", None)


@pytest.mark.parametrize(
    "between",
    [
        # another name in a freed value's place: its id is often the freed one's
        lambda ns: (ns.pop("x"), ns.__setitem__("z", [5])),
        # the last key and another gone, a new one and the last back: the count adds up
        lambda ns: (
            ns.pop("last"),
            ns.pop("x"),
            ns.__setitem__("z", [5]),
            ns.__setitem__("last", 2),
        ),
    ],
    ids=["freed-id", "last-key-back"],
)
def test_names_bound_and_deleted_between_cells_are_not_the_next_cells(between):
    namespace: dict[str, Any] = {"a": 1, "x": [1], "last": 2}
    recorder = Recorder()
    recorder.prime(namespace)
    recorder.start(namespace)
    recorder.finish(namespace, 1, failed=False)
    between(namespace)  # a widget's callback, a restore
    recorder.start(namespace)
    namespace["z"].append(6)
    recorder.finish(namespace, 2, failed=False)
    record = recorder.records[2]
    assert (record.bound, record.changed, record.deleted) == (set(), {"z"}, set())


def test_a_cells_end_on_a_large_namespace_runs_no_collection_and_keeps_the_users_setting():
    import gc

    namespace: dict[str, Any] = {
        f"n{i}": {"step": i, "history": [float(j) for j in range(20)]} for i in range(400)
    }
    collections: list[int] = []
    inside = [False]

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and inside[0]:
            collections.append(info["generation"])

    recorder = Recorder()
    recorder.prime(namespace)
    gc.callbacks.append(count)
    try:
        for cell in range(5):
            recorder.start(namespace)
            namespace[f"n{cell}"]["history"].append(1.0)
            inside[0] = True
            recorder.finish(namespace, cell, failed=False)
            inside[0] = False
            assert recorder.records[cell].changed == {f"n{cell}"}
            assert gc.isenabled()
        assert collections == []  # thousands of fingerprints made, no collection among them
        gc.disable()
        recorder.start(namespace)
        recorder.finish(namespace, 9, failed=False)
        assert not gc.isenabled()  # the user's choice stays
    finally:
        gc.callbacks.remove(count)
        gc.enable()


def test_cells_run_before_the_extension_loaded_are_named_as_planned_from_text(shell: Any):
    shell.run_cell("early_base = [1, 2]", store_history=True)
    early = shell.execution_count - 1
    shell.run_line_magic("load_ext", "nb_cudaguard")
    try:
        saved = _run(shell, ["early_total = sum(early_base)", "early_out = early_total\n[][0]"], 1)
        # only this test's cells (the shell's history holds other tests' cells too)
        mine = tuple(c for c in saved.cells if c.count >= early)
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        _new_process(shell, ["early_base", "early_total", "early_out"])
        summary = plan_summary(make_plan(shell, saved), saved.cells)
        assert f"[{early}] ran before nb_cudaguard was loaded: planned from their text" in summary
        later = next(c.count for c in saved.cells if c.source.startswith("early_total"))
        assert f"[{later}] ran before" not in summary
    finally:
        for name in ("early_base", "early_total", "early_out"):
            shell.user_ns.pop(name, None)


STABLE = """
import json, sys
from nb_cudaguard.replay.analysis import analyse_cell
from nb_cudaguard.replay.planner import plan_replay
cells = json.loads(sys.argv[1])
facts = [analyse_cell(c, lambda s: s) for c in cells]
plan = plan_replay(facts, len(cells) - 1, set())
print(json.dumps([[s.index, list(s.reasons)] for s in plan.steps]))
"""


def test_the_plan_is_the_same_in_every_process():
    import json
    import os
    import subprocess

    cells = [
        "import torch\na = torch.ones(2)\nb = torch.zeros(2)\nc = torch.ones(3)",
        "d = [a, b, c]\ne = {'x': a, 'y': c}\nf, g, h = a + 1, b + 1, c + 1",
        "out = (a, b, c, d, e, f, g, h)",
    ]
    plans = set()
    for seed in ("1", "2", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", STABLE, json.dumps(cells)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        plans.add(done.stdout)
    assert len(plans) == 1, plans


def test_a_fingerprint_of_a_non_leaf_tensor_warns_of_nothing():
    import warnings

    leaf = torch.ones(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a non-leaf's .grad is read
        fingerprint({"y": leaf * 2, "leaf": leaf})


def test_names_put_back_are_seen_changed_rebound_or_deleted_since():
    import torch

    namespace = {"labels": torch.tensor([1, 2, 4]), "history": [0], "cfg": {"lr": 0.1}, "n": 3}
    recorder = Recorder()
    recorder.put_back(["labels", "history", "cfg", "n", "absent"], namespace)
    assert recorder.changed_since_put_back(namespace) == ()
    namespace["labels"][2] = 2  # a fix in place: the tensor's version moves
    namespace["history"].append(1)
    namespace["n"] = 4
    del namespace["cfg"]
    assert recorder.changed_since_put_back(namespace) == ("cfg", "history", "labels", "n")
    recorder.put_back(["labels"], namespace)  # the new baseline (a replay rebuilt it)
    assert "labels" not in recorder.changed_since_put_back(namespace)


def test_a_small_array_in_any_layout_is_read_whole_and_a_change_in_it_seen():
    import numpy as np

    from nb_cudaguard.replay.record import _see

    base = np.zeros((8, 8))
    column = base[:, ::2]  # not contiguous: its values were once not read, yet called whole
    before = _see(column)
    assert before[2] is True
    base[3, 2] = 1.0
    assert _see(column)[1] != before[1]
    large = np.zeros((400, 400))[:, ::2]
    assert _see(large)[2] is False  # sampled: a change between the samples may be missed


def test_plain_containers_of_tensors_and_histories_see_changes_in_place():
    from nb_cudaguard.replay.record import _see

    batch = [torch.zeros(3), torch.ones(2), 4]
    before = _see(batch)
    assert _see(batch) == before
    batch[0].add_(1)
    assert _see(batch)[1] != before[1]
    history: dict[str, Any] = {"loss": [0.5], "acc": [0.1]}
    before = _see(history)
    history["loss"].append(0.4)
    assert _see(history)[1] != before[1]
    history["loss"][0] = 0.3
    assert _see(history)[1] != _see({"loss": [0.5, 0.4], "acc": [0.1]})[1]


def test_the_random_states_read_at_a_cells_start_bring_its_draws_back_exactly():

    import numpy as np

    from nb_cudaguard.replay.rng import RngReader, drawn_from, encode_rng, restore_rng

    reader = RngReader()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a second value cached, drawn by the next gauss() without a draw
    states = reader.read()
    first = (random.gauss(0, 1), random.random(), np.random.rand(), torch.rand(2).tolist())
    assert drawn_from(states, reader.read()) == ("numpy", "random", "torch")
    restore_rng(encode_rng(states))
    assert (random.gauss(0, 1), random.random(), np.random.rand(), torch.rand(2).tolist()) == first
    random.gauss(0, 1)
    cached = reader.read()
    random.gauss(0, 1)  # only the cached value used: the generator's words did not move
    assert drawn_from(cached, reader.read()) == ("random",)


@pytest.mark.parametrize(
    "draw",
    [
        lambda: torch.rand(3),
        lambda: torch.randn(1, dtype=torch.float64),  # leaves a normal sample cached
        lambda: torch.randn(1, dtype=torch.float64),  # then takes it: no engine word moves
        lambda: torch.randint(0, 10, (4,)),
        lambda: torch.randperm(5),
        lambda: torch.multinomial(torch.ones(4), 2),
        lambda: torch.bernoulli(torch.full((3,), 0.5)),
        lambda: torch.nn.functional.dropout(torch.ones(8), 0.5),
        lambda: torch.empty(2).normal_(),
        lambda: torch.manual_seed(11),
        lambda: torch.set_rng_state(torch.manual_seed(12).get_state()),
    ],
)
def test_every_kind_of_torch_draw_is_seen_and_the_state_read_is_torchs_own(draw):
    from nb_cudaguard.replay.rng import RngReader, drawn_from

    torch.manual_seed(10)
    torch.randn(1, dtype=torch.float64)  # a cached sample for the draws that take it
    reader = RngReader()
    before = reader.read()
    assert reader._torch_view is not None  # this torch's engine is read through its memory
    assert drawn_from(before, reader.read()) == ()
    draw()
    after = reader.read()
    assert after["torch"] == torch.default_generator.get_state().numpy().tobytes()
    if after["torch"] != before["torch"]:
        assert drawn_from(before, after) == ("torch",)


def test_a_cached_normal_sample_taken_alone_is_a_draw():
    from nb_cudaguard.replay.rng import RngReader, drawn_from

    torch.manual_seed(10)
    torch.randn(1, dtype=torch.float64)  # draws two, returns one, caches the other
    reader = RngReader()
    before = reader.read()
    torch.randn(1, dtype=torch.float64)  # returns the cached one: only the cache moves
    assert drawn_from(before, reader.read()) == ("torch",)


@pytest.mark.parametrize("layout", ["read in memory", "unknown"])
def test_numpys_cached_normal_sample_taken_alone_is_a_draw(layout, monkeypatch):
    # numpy's legacy randn() draws two samples and caches one; the next randn() returns it and
    # moves no word of the generator, only the RandomState's cached-sample flag.
    from nb_cudaguard.replay import rng
    from nb_cudaguard.replay.rng import RngReader, drawn_from, encode_rng, restore_rng

    if layout == "unknown":  # as where numpy lays its RandomState out otherwise
        monkeypatch.setattr(rng, "_GAUSS_LAYOUT", [(np, None)])
    np.random.seed(4)
    np.random.randn()
    reader = RngReader()
    before = reader.read()
    assert (reader._numpy_gauss is None) == (layout == "unknown")
    np.random.randn()  # takes the cached sample
    after = reader.read()
    assert drawn_from(before, after) == ("numpy",)
    assert after["numpy"][3] == np.random.get_state()[3] == 0
    expected = np.random.randn(3).tolist()
    restore_rng(encode_rng(after))  # the state a failed cell started from, set again
    assert np.random.randn(3).tolist() == expected


def test_torch_random_state_comes_back_whatever_default_device_a_cell_set():
    encoded = encode_rng(rng_states())
    expected = torch.rand(3)
    torch.set_default_device("meta")  # as set_default_device("cuda") would on a GPU
    try:
        assert "torch" in restore_rng(encoded)
    finally:
        torch.set_default_device(None)
    assert torch.equal(torch.rand(3), expected)


def test_a_random_state_that_cannot_be_set_again_is_named_and_the_replay_goes_on(recorded):
    from dataclasses import replace

    saved = _run(recorded, ["import torch", "draw = torch.rand(3)\n[][0]"])
    failing = saved.cells[saved.failing]
    assert failing.record is not None and failing.record.rng
    broken = replace(failing.record, rng="not a kept state")
    # Only this test's two cells (the shell's history holds other tests' cells too).
    cells = (saved.cells[saved.failing - 1], replace(failing, record=broken))
    saved = replace(saved, cells=cells, failing=1)
    _new_process(recorded, ["draw"])
    plan = make_plan(recorded, saved)
    with capture_output() as captured:
        said = run_plan(recorded, saved, plan, blocking_on=True)
    assert "random state could not be set again" in captured.stdout
    assert "draws may differ" in captured.stdout
    assert "draw" in recorded.user_ns  # the failing cell ran (and failed as before)
    assert said.startswith("Replay stopped")


def test_the_replays_own_lines_do_not_go_through_a_print_or_stdout_a_cell_put_in_place(recorded):
    # A logging ``print`` and a tee on ``sys.stdout``, set by cells the replay runs again: the
    # replay's progress lines are no output of the notebook's.
    import builtins

    cells = [
        "import builtins, sys\nprinted = []\n_print = builtins.print\n"
        "def logged(*args, **kwargs):\n    printed.append(args)\n    _print(*args, **kwargs)\n"
        "class Tee:\n    def __init__(self, inner):\n        self.inner, self.lines = inner, []\n"
        "    def write(self, s):\n        self.lines.append(s)\n"
        "        return self.inner.write(s)\n"
        "    def flush(self):\n        pass",
        "builtins.print = logged\ntee = Tee(sys.stdout)\nsys.stdout = tee",
        "print('epoch', 1)",
        "seen = [list(printed), list(tee.lines)]\n"
        "builtins.print, sys.stdout = _print, tee.inner\n[][0]",
    ]
    original = builtins.print, sys.stdout
    try:
        saved = _run(recorded, cells)
        mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
        saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
        before = recorded.user_ns["seen"]
        _new_process(recorded, ["printed", "tee", "seen", "Tee", "logged", "_print"])
        _replay(recorded, saved)
        assert recorded.user_ns["seen"] == before
    finally:
        builtins.print, sys.stdout = original


def test_ipythons_previous_input_read_back_is_named(recorded):
    # ``note = _i``: IPython binds ``_i`` at every cell, so it is always "here"; but it is this
    # kernel's previous input (a ``%cudaguard`` line), not the previous kernel's.
    cells = ["lr = 0.1", "note = _i", "print(note)\n[][0]"]
    saved = _run(recorded, cells)
    # only this test's cells (the shell's history holds other tests' cells too)
    mine = saved.cells[saved.failing - len(cells) + 1 : saved.failing + 1]
    saved = dataclasses.replace(saved, cells=mine, failing=len(mine) - 1)
    assert recorded.user_ns["note"] == "lr = 0.1"
    _new_process(recorded, ["lr", "note"])
    summary = _replay(recorded, saved)
    assert "reads _i, not rebuilt" in summary, summary


def test_reading_a_series_is_no_change_of_it():
    # An index fills its ``_cache`` as it is read (``_engine``, ``is_unique``): a walk took that
    # for a change of every series over it (``y = df.pop("t")`` shares ``df``'s index), so a
    # cell that only printed ``df`` changed ``y``, and the replay ran again the failed cell
    # that bound it.
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "t": [0, 1, 0]})
    y = frame.pop("t")
    before = _see(y)
    assert y.loc[1] == 1 and frame.index.is_unique and frame.to_json()
    assert _see(y) == before


def test_a_frame_is_seen_whole_and_its_changes_in_place_are_seen():
    # A frame's block manager is a C object: a walk stopped there, never seeing a change.
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": [1.0, None], "b": [3, 4], "c": pd.Categorical(["x", "y"])})
    seen = _see(frame)
    assert seen[2]
    for change in (
        lambda f: f.loc.__setitem__((0, "a"), 9.0),
        lambda f: f.fillna({"a": 0.0}, inplace=True),
        lambda f: f.__setitem__("d", [5, 6]),
        lambda f: setattr(f, "columns", ["a", "B", "c", "d"]),
        lambda f: setattr(f.index, "name", "id"),
        lambda f: f.pop("a"),
        lambda f: f.loc.__setitem__((1, "c"), "x"),  # a categorical's codes, in place
    ):
        change(frame)
        now = _see(frame)
        assert now[1] != seen[1]
        seen = now
    assert _see(frame) == seen


def test_a_frame_changed_by_a_failed_cell_is_named_not_its_popped_column_rebuilt(recorded):
    pytest.importorskip("pandas")
    saved = _run(
        recorded,
        [
            "import pandas as pd\nframe12 = pd.DataFrame({'a': [1.0, 2.0], 't': [0, 1]})",
            "y12 = frame12.pop('t')\nraise RuntimeError('CUDA out of memory')",
            "cols12 = list(frame12.columns)",
            "print(frame12.to_json(), cols12)\n[][0]",
        ],
    )
    record = saved.cells[saved.failing - 2].record
    assert record is not None and "frame12" in record.changed  # (the text sees no change)
    assert "y12" not in (saved.cells[saved.failing].record or CellRecord()).changed
    _new_process(recorded, ["frame12", "y12", "cols12", "pd"])
    summary = plan_summary(make_plan(recorded, saved), saved.cells)
    assert "y12" not in summary
    assert "failed when it ran, after it bound or changed frame12" in summary


def test_reading_a_groupby_is_no_change_of_it():
    # Its grouper fills pandas' ``cache_readonly`` memo as it is read: a cell that only read
    # ``gb`` "changed gb", and the plan ran it again for that.
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"g": [1, 2, 1, 2], "a": [1.0, 2.0, 3.0, 4.0]})
    grouped = frame.groupby("g")
    before = _see(grouped)
    assert grouped["a"].mean().tolist() == [2.0, 3.0] and grouped.size().tolist() == [2, 2]
    assert _see(grouped)[1] == before[1]
    frame.loc[0, "a"] = 5.0  # the frame it holds, changed in place: a change of it
    assert _see(grouped)[1] != before[1]
