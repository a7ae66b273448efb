"""Held-out cases, second round: what a user's notebook has beyond the first round's cases
(tests/replay/test_replay_heldout.py, whose harness this shares): library-like objects, large
arrays and tensor views, random generators held in names, process settings (environment, paths,
working directory, warnings, logging) and cells run under ``%%capture``.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

# --- 1. library-like objects: a tokenizer with __slots__, a dataset with __dict__ --------------

TOKENIZER = (
    "class Tokenizer:\n    __slots__ = ('vocab', 'pad')\n"
    "    def __init__(self):\n        self.vocab = {'<pad>': 0}\n        self.pad = 0\n"
    "    def add(self, *words):\n        for w in words:\n"
    "            self.vocab.setdefault(w, len(self.vocab))\n",
    "class Dataset:\n    def __init__(self, tok, texts):\n        self.tok = tok\n"
    "        self.rows = [[tok.vocab[w] for w in t.split()] for t in texts]\n",
    "tok = Tokenizer()\ntok.add('a', 'b')",
    "tok.add('c')\nds = Dataset(tok, ['a c', 'b'])",
    "ds.rows.append([0])\ntok.pad = 9",
)


@ALL
def test_a_tokenizer_with_slots_and_a_dataset_holding_it(server, server_kernel, restore):
    kid, pid = server_kernel
    fp = (
        "{'tok': [tok.vocab, tok.pad, type(tok) is Tokenizer], "
        "'ds': [ds.rows, ds.tok is tok, type(ds) is Dataset]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, TOKENIZER, fp, restore=restore))


# --- 2. large arrays and tensors changed where a sample does not look ---------------------------


@ALL
def test_a_large_array_changed_by_slice_assignment(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nfeats = np.zeros(100_000)",
        "feats[50_001:50_004] = 1.0",
    )
    fp = "{'feats': [float(feats.sum()), float(feats[50_002])]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_tensor_changed_through_data_and_numpy_views(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nt = torch.zeros(10_000)\nw = torch.zeros(10_000, requires_grad=True)",
        "t.numpy()[5_001] = 3.0",
        "w.data[7_003] = 2.0",
    )
    fp = "{'t': [t.sum().item(), t[5_001].item()], 'w': [w.sum().item(), w.requires_grad]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 3. iterators, partials, functions that bind globals ---------------------------------------


@ALL
def test_a_list_iterator_advanced_by_cells(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = ("it = iter([10, 20, 30, 40, 50])", "first = next(it)", "next(it)")
    fp = "{'it': next(it), 'first': first}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_function_that_binds_a_global_by_a_global_statement(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "def setup(lr):\n    global cfg\n    cfg = {'lr': lr, 'steps': []}",
        "setup(0.1)",
        "cfg['steps'].append(1)",
    )
    fp = "{'cfg': cfg}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_partial_over_a_list_called_by_cells(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "from functools import partial\nlog = []\n"
        "def record(into, x):\n    into.append(x)\n    return len(into)",
        "rec = partial(record, log)",
        "rec('a')\nrec('b')",
    )
    fp = "{'log': log, 'rec': rec.args[0] is log}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_itertools_counter_and_a_generator_inside_a_closure(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import itertools\nids = itertools.count()\n"
        "def make():\n    squares = (i * i for i in range(10))\n    return lambda: next(squares)",
        "nxt = make()\nfirst = next(ids), nxt()",
        "next(ids)\nnxt()",
    )
    fp = "{'ids': next(ids), 'nxt': nxt(), 'first': list(first)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 4. dataclasses, enums, class attributes changed through an instance -----------------------


@ALL
def test_dataclasses_frozen_and_not(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "from dataclasses import dataclass, field, replace\n"
        "@dataclass\nclass Run:\n    lr: float\n    tags: list = field(default_factory=list)\n"
        "@dataclass(frozen=True)\nclass Shape:\n    h: int\n    w: int",
        "run = Run(0.1)\nshape = Shape(2, 3)",
        "run.lr = 0.5\nrun.tags.append('warm')\nshape = replace(shape, w=4)",
    )
    fp = (
        "{'run': [run.lr, run.tags, type(run) is Run], "
        "'shape': [shape.h, shape.w, type(shape) is Shape]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_enum_member_held_in_a_name(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import enum\nclass Mode(enum.Enum):\n    TRAIN = 1\n    EVAL = 2",
        "mode = Mode.TRAIN",
        "mode = Mode.EVAL",
    )
    fp = "{'mode': [str(mode), mode is Mode.EVAL]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_class_attribute_changed_through_an_instance(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class Callback:\n    seen = []\n    calls = 0",
        "cb = Callback()",
        "cb.seen.append('epoch1')\nCallback.calls += 1",
    )
    fp = "{'cb': [cb.seen, type(cb) is Callback], 'Callback': [Callback.seen, Callback.calls]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_attribute_deleted_from_an_object(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class Box:\n    pass\nbox = Box()\nbox.a = 1\nbox.b = 2",
        "del box.a",
    )
    fp = "{'box': sorted(vars(box))}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 5. random generators: a seed set in a function, generators held in names -------------------


def test_torch_manual_seed_inside_a_function(server, server_kernel):
    kid, pid = server_kernel
    cells = (
        "import torch\ndef seed_all(s):\n    torch.manual_seed(s)",
        "seed_all(0)",
        "x = torch.rand(2)",
    )
    fp = "{'x': x.tolist(), 'torch_next': torch.rand(1).tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


@ALL
def test_a_numpy_generator_and_a_random_instance_held_in_names(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import numpy as np, random\nrng = np.random.default_rng(0)\nr = random.Random(0)",
        "a = rng.random(3).round(6).tolist()\nb = r.random()",
        "peek = rng.random()\nr.random()",
    )
    fp = "{'a': a, 'b': b, 'rng': float(rng.random()), 'r': r.random()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 6. views of tensors that require grad -------------------------------------------------------


@ALL
def test_views_of_a_leaf_that_requires_grad_and_of_a_parameter(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nw = torch.randn(3, requires_grad=True)\nv = w[1:]\n"
        "lin = torch.nn.Linear(3, 2)\nrow = lin.weight[0]",
        "with torch.no_grad():\n    w[2] = 5.0\n    lin.weight[0, 1] = 7.0",
    )
    fp = (
        "{'v': [v.tolist(), v._base is w, v.requires_grad], "
        "'row': [row.tolist(), row._base is lin.weight, row.requires_grad]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 7. a %%capture cell, a failing cell that changed state before it failed -------------------


@ALL
def test_a_captured_cell(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = ("%%capture out\nx = 5\nprint('hi', x)", "y = x + 1")
    fp = "{'out': out.stdout, 'x': x, 'y': y}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_the_failing_cell_itself_appends_before_it_fails(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = ("history = [1]",)
    # the failing cell appends to history (after its fingerprint is taken), then asserts
    fp = "{'history': list(history), 'zz': history.append(2)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 8. process settings: environment, sys.path, working directory, warnings, logging ----------


def test_environment_variables_set_in_cells(server, server_kernel):
    kid, pid = server_kernel
    cells = ("import os\nos.environ['NBCG_FLAG'] = '1'", "flag = os.environ['NBCG_FLAG']")
    fp = "{'environ': os.environ.get('NBCG_FLAG'), 'flag': flag}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


def test_a_directory_appended_to_sys_path(server, server_kernel):
    kid, pid = server_kernel
    (server.root / "libs").mkdir(exist_ok=True)
    (server.root / "libs" / "nbcg_lib.py").write_text("VALUE = 3\n")
    cells = ("import sys\nsys.path.append('libs')", "import nbcg_lib\nv = nbcg_lib.VALUE")
    fp = "{'path': 'libs' in sys.path, 'v': v}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


@ALL
def test_the_working_directory_changed_by_a_cell(server, server_kernel, restore):
    kid, pid = server_kernel
    (server.root / "data").mkdir(exist_ok=True)
    (server.root / "data" / "n.txt").write_text("4\n")
    cells = ("import os\nos.chdir('data')", "n = int(open('n.txt').read())")
    fp = "{'chdir': os.path.basename(os.getcwd()), 'n': n}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


def test_warnings_filters_and_logging_config(server, server_kernel):
    kid, pid = server_kernel
    cells = (
        "import warnings, logging\nwarnings.filterwarnings('ignore', message='nbcg-noise')",
        "logging.basicConfig(level=logging.INFO)\nlog = logging.getLogger('nbcg')\n"
        "log.setLevel(logging.DEBUG)",
    )
    fp = (
        "{'filterwarnings': any(f[1] is not None and f[1].pattern == 'nbcg-noise' "
        "for f in warnings.filters), 'basicConfig': logging.getLogger().level, "
        "'log': log.level}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


def test_torch_default_device_set_in_a_cell(server, server_kernel):
    kid, pid = server_kernel
    cells = ("import torch\ntorch.set_default_device('meta')", "z = torch.zeros(2)")
    fp = "{'set_default_device': str(torch.empty(1).device), 'z': str(z.device)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))
