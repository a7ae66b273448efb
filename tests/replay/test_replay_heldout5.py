"""Held-out cases, fifth round: what Kaggle and Colab notebooks do between loading data and the
cell that fails, not met by the first four rounds (tests/replay/test_replay_heldout.py, whose
harness this shares): splits by ``random_split`` and ``np.random.permutation``, datasets that
cache what ``__getitem__`` drew, heads swapped and loaded with ``strict=False``, optimizer
state loaded from an in-memory copy, a CPU ``GradScaler``, functions handed to ``apply_`` and
``map`` that change globals, libraries patched by a cell, modules reloaded after an edit,
directory listings and files that later cells change, dicts keyed by ``id()``.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, restores, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead


@restores("val")
def test_random_split_with_and_without_a_generator(server, server_kernel, restore):
    # random_split draws a permutation from the global generator unless it is handed one
    # (torch/utils/data/dataset.py: ``randperm(sum(lengths), generator=generator)``).
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.utils.data import TensorDataset, random_split\n"
        "torch.manual_seed(0)\nds = TensorDataset(torch.arange(10))",
        "train, val = random_split(ds, [7, 3])",
        "a, b = random_split(ds, [5, 5], generator=torch.Generator().manual_seed(42))",
        "noise = torch.rand(2).tolist()",
    )
    fp = (
        "{'train': list(train.indices), 'val': list(val.indices), 'a': list(a.indices), "
        "'noise': noise}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("perm")
def test_a_permutation_split_under_a_numpy_seed(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nnp.random.seed(42)\nX = np.arange(20).reshape(10, 2)",
        "perm = np.random.permutation(len(X))\ntr_idx, va_idx = perm[:8], perm[8:]",
        "jitter = np.random.rand(3).round(4).tolist()",
    )
    fp = (
        "{'perm': perm.tolist(), 'tr_idx': tr_idx.tolist(), 'va_idx': va_idx.tolist(), "
        "'jitter': jitter}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("ds")
def test_a_dataset_caching_what_getitem_drew(server, server_kernel, restore):
    # A random augmentation drawn once per index and cached: the second read of item 0 is the
    # first's value, and the global generator moved only for items not in the cache.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(3)\n"
        "class Cached(torch.utils.data.Dataset):\n    def __init__(self, n):\n"
        "        self.n, self.cache = n, {}\n    def __len__(self):\n        return self.n\n"
        "    def __getitem__(self, i):\n        if i not in self.cache:\n"
        "            self.cache[i] = (torch.rand(2) + i).tolist()\n        return self.cache[i]",
        "ds = Cached(5)",
        "batch = [ds[i] for i in (0, 1, 0)]",
        "extra = torch.rand(1).item()",
    )
    fp = "{'ds': sorted(ds.cache.items()), 'batch': batch, 'extra': extra}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("sd")
def test_a_head_replaced_and_a_state_dict_loaded_non_strictly(server, server_kernel, restore):
    # Fine-tuning: a new head (drawn from the global generator), the backbone's weights loaded
    # with strict=False; the missing keys come back in the result.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))",
        "sd = {k: v.clone() + 1 for k, v in model.state_dict().items()}",
        "model[2] = nn.Linear(8, 5)",
        "res = model.load_state_dict({k: v for k, v in sd.items() if not k.startswith('2.')}, "
        "strict=False)\nmissing = list(res.missing_keys)",
    )
    fp = (
        "{'model': [round(v.sum().item(), 5) for v in model.state_dict().values()], "
        "'missing': missing, 'sd': round(sum(v.sum().item() for v in sd.values()), 5)}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("net")
def test_optimizer_state_loaded_from_an_in_memory_copy(server, server_kernel, restore):
    kid, pid = server_kernel
    train = (
        "for _ in range(2):\n    opt.zero_grad()\n    net(x).pow(2).mean().backward()\n"
        "    opt.step()"
    )
    cells = (
        "import copy, torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.Adam(net.parameters(), lr=0.1)\nx = torch.randn(8, 3)",
        train,
        "saved = copy.deepcopy(opt.state_dict())",
        train,
        "opt.load_state_dict(saved)",
    )
    fp = (
        "{'opt': [float(s['step']) for s in opt.state.values()], "
        "'net': round(net.weight.sum().item(), 6), "
        "'saved': [float(s['step']) for s in saved['state'].values()]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_grad_scaler_on_the_cpu(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.01)\nx = torch.randn(4, 3)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=16.0, growth_interval=1)",
        "for _ in range(3):\n    opt.zero_grad()\n"
        "    scaler.scale(net(x).pow(2).mean()).backward()\n    scaler.step(opt)\n"
        "    scaler.update()",
    )
    fp = "{'scaler': scaler.get_scale(), 'net': round(net.weight.sum().item(), 6)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("t")
def test_functions_handed_to_apply_and_map_change_globals(server, server_kernel, restore):
    # Tensor.apply_ and map call the notebook's function for each item: its global counter
    # and the list it appends to move though the cell never calls it by name.
    kid, pid = server_kernel
    cells = (
        "import torch\ncalls = 0\nseen = []\n"
        "def bump(v):\n    global calls\n    calls += 1\n    return v * 2\n"
        "def tokenize(s):\n    seen.append(s)\n    return s.split()",
        "t = torch.arange(4.0)\nt.apply_(bump)",
        "toks = list(map(tokenize, ['a b', 'c d e']))",
    )
    fp = "{'calls': calls, 'seen': seen, 't': t.tolist(), 'toks': toks}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_library_patched_by_a_cell(server, server_kernel, restore):
    # Old Kaggle code needs ``np.float``, gone since numpy 1.24: a cell puts it back. The patch
    # lives in the library's module, which a new process imports afresh; so does a stub put
    # into ``sys.modules``.
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nimport sys, torch, types",
        "np.float = float\ntorch.Tensor.as_list = torch.Tensor.tolist",
        "scores = [np.float(v) for v in ('1.5', '2')]",
        # a stub for a logger the notebook has no account for, put where ``import`` finds it
        "sys.modules['wandb5'] = types.SimpleNamespace(log=lambda **k: None, name='stub')",
        "import wandb5",
    )
    fp = (
        "{'np': hasattr(np, 'float'), 'torch': hasattr(torch.Tensor, 'as_list'), "
        "'scores': scores, 'wandb5': wandb5.name}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_helper_module_reloaded_after_an_edit(server, server_kernel, restore):
    # A name imported from the module before the edit keeps the old function; running the
    # import again in a new process finds the edited file.
    kid, pid = server_kernel
    cells = (
        "import importlib, sys\nsys.path.insert(0, '.')\n"
        "open('helper5.py', 'w').write('SCALE = 2\\ndef f(x):\\n    return x * SCALE\\n')",
        "import helper5\nfrom helper5 import f as f_old",
        "before = f_old(1)",
        "open('helper5.py', 'w').write('SCALE = 3\\ndef f(x):\\n    return x * SCALE + 1\\n')\n"
        "importlib.reload(helper5)",
        "now = helper5.f(1)",
    )
    fp = "{'f_old': f_old(1), 'before': before, 'now': now, 'helper5': helper5.SCALE}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_directory_listing_that_a_later_cell_grows(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import glob, os\nos.makedirs('shards5', exist_ok=True)\nfor n in 'ab':\n"
        "    open(f'shards5/{n}.txt', 'w').write(n)",
        "files = sorted(glob.glob('shards5/*.txt'))\nn_files = len(os.listdir('shards5'))",
        "open('shards5/c.txt', 'w').write('c')",
    )
    fp = "{'files': files, 'n_files': n_files}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_pickle_written_read_and_then_deleted(server, server_kernel, restore):
    # A cache file written, read back, then cleaned up by a later cell.
    kid, pid = server_kernel
    cells = (
        "import os, pickle\nstats = {'mean': 0.5, 'std': 0.25}\n"
        "with open('stats5.pkl', 'wb') as f:\n    pickle.dump(stats, f)",
        "with open('stats5.pkl', 'rb') as f:\n    loaded = pickle.load(f)\nloaded['n'] = 3",
        "os.remove('stats5.pkl')",
    )
    fp = "{'loaded': loaded, 'stats': stats}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_dict_keyed_by_id(server, server_kernel, restore):
    # ``{id(p): name}`` to name parameters in a log: an object's id is its address in this
    # process (https://docs.python.org/3/library/functions.html#id).
    kid, pid = server_kernel
    cells = (
        "import torch\nnet = torch.nn.Linear(2, 2)",
        "names = {id(p): n for n, p in net.named_parameters()}",
        "found = [names.get(id(p)) for p in net.parameters()]",
    )
    fp = (
        "{'names': sorted(names), 'found': found, "
        "'names.match': [names.get(id(p)) for p in net.parameters()]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("scores")
def test_a_structured_array_changed_through_a_field_view(server, server_kernel, restore):
    # ``recs['score']`` is a view into the structured array: writing through it writes recs.
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nrecs = np.zeros(3, dtype=[('id', 'i4'), ('score', 'f4')])",
        "scores = recs['score']",
        "scores[:] = [0.5, 0.75, 1.0]\nrecs['id'] = np.arange(3) + 10",
        "scores[1] = -1",
    )
    fp = (
        "{'recs': recs.tolist(), 'scores': scores.tolist(), "
        "'scores.shared': bool(np.shares_memory(recs, scores))}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_zip_iterator_advanced_by_next(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "xs = [1, 2, 3]\nys = 'abcde'\npairs = zip(xs, ys)",
        "first = next(pairs)",
        "xs.append(4)\nsecond = next(pairs)",
    )
    fp = "{'first': first, 'second': second, 'pairs': list(pairs), 'xs': xs}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("cfg")
def test_a_shallow_copy_of_a_config_changed_inside(server, server_kernel, restore):
    # ``dict.copy()`` and ``copy.copy`` copy the outer dict only: the copy's lists are the
    # source's (https://docs.python.org/3/library/copy.html), so appending through the copy
    # changes the source too.
    kid, pid = server_kernel
    cells = (
        "import copy\ncfg = {'lr': 0.1, 'augs': ['crop']}",
        "cfg_b = cfg.copy()\ncfg_c = copy.copy(cfg)",
        "cfg_b['lr'] = 0.01\ncfg_b['augs'].append('flip')",
        "cfg_c['augs'].append('blur')",
    )
    fp = "{'cfg': cfg, 'cfg_b': cfg_b, 'cfg_c': cfg_c}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_sys_argv_set_for_argparse_in_a_notebook(server, server_kernel, restore):
    # Colab's way to run a script's argument parser in a notebook: set sys.argv, then parse.
    kid, pid = server_kernel
    cells = (
        "import argparse, sys\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, default=1.0)",
        "sys.argv = ['train.py', '--lr', '0.05']",
        "args = parser.parse_args()",
    )
    fp = "{'args': vars(args), 'sys': sys.argv[1:]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))
