"""Held-out cases, seventh round: what Kaggle, Colab and Hugging Face notebooks do with what a
cell changed before it failed, not met by the first six rounds (tests/replay/test_replay_heldout.py,
whose harness this shares): values written to a file by a later cell and read back by another
(``torch.save``/``torch.load``, ``json``, ``pickle``, ``np.save``, a text file written in a failed
``with open`` block, a checkpoint copied by ``shutil``, a log appended to across cells, a user's
fix dumped again); weights
copied between models through ``state_dict``, a "best model" deep-copied under an ``if``; a
config dataclass, a numpy ``Generator``, a ``random.Random``, a ``nonlocal`` counter, a bounded
``deque``, a ``defaultdict`` and an iterator changed by a failed cell (one that fails half-way
through a loop), and a generator that then shuffles in place; process state a failed cell set
(an environment variable, torch's default dtype);
scikit-learn estimators fitted on an array a failed cell changed; thresholds bound by ``exec``;
a name deleted by a function's ``global`` statement.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, restores, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

OOM = "raise RuntimeError('CUDA out of memory')"


@restores("w", "w2")
def test_a_tensor_saved_and_loaded_after_a_failed_cell_changed_it(server, server_kernel, restore):
    # The failed cell's change is in the file that a later cell saved and another loaded: the
    # loaded copy shares no object with ``w``, only the file.
    kid, pid = server_kernel
    cells = (
        "import torch\nw = torch.zeros(3)",
        f"w.add_(1)\n{OOM}",
        "torch.save(w, 'w7.pt')\nsaved_norm = w.norm().item()",
        "w2 = torch.load('w7.pt')",
    )
    fp = "{'w': w.tolist(), 'w2': w2.tolist(), 'saved_norm': saved_norm}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("hist", "loaded")
def test_a_history_dumped_to_json_after_a_failed_append(server, server_kernel, restore):
    # Kaggle notebooks write the training history to JSON for a later plotting cell.
    kid, pid = server_kernel
    cells = (
        "import json\nhist = [0.9, 0.7]",
        f"hist.append(0.5)\n{OOM}",
        "with open('hist7.json', 'w') as f:\n    json.dump(hist, f)\nbest = min(hist)",
        "with open('hist7.json') as f:\n    loaded = json.load(f)\nn_epochs = len(loaded)",
    )
    fp = "{'hist': hist, 'loaded': loaded, 'n_epochs': n_epochs, 'best': best}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("stats")
def test_stats_pickled_through_a_helper_after_a_failed_update(server, server_kernel, restore):
    # The path is a name bound in another cell; the dict is updated by a failed cell.
    kid, pid = server_kernel
    cells = (
        "import pickle\nPATH = 'stats7.pkl'\nstats = {'mean': 0.0}",
        f"stats['mean'] = 0.5\n{OOM}",
        "pickle.dump(stats, open(PATH, 'wb'))\nshift = -stats['mean']",
        "back = pickle.load(open(PATH, 'rb'))\nscale = 1 + back['mean']",
    )
    fp = "{'stats': stats, 'back': back, 'scale': scale, 'shift': shift}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_features_saved_with_numpy_after_a_loop_failed_half_way(server, server_kernel, restore):
    # Feature extraction over a dataset stops at a bad batch after some appends; the features
    # so far are cached with np.save and read back.
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nfeats = []",
        "for i in range(5):\n    feats.append(i * 2)\n    if i == 2:\n        "
        "raise RuntimeError('CUDA error: device-side assert triggered')",
        "np.save('feats7.npy', np.array(feats))\nn_feats = len(feats)",
        "arr = np.load('feats7.npy')\ntotal = int(arr.sum())",
    )
    fp = "{'feats': feats, 'arr': arr.tolist(), 'total': total, 'n_feats': n_feats}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_file_written_in_a_failed_with_block_then_read(server, server_kernel, restore):
    # The ``with`` block wrote (and closed) the file before the error; a later cell reads it.
    kid, pid = server_kernel
    cells = (
        "lines = ['a', 'b']",
        "with open('out7.txt', 'w') as f:\n    f.write('\\n'.join(lines))\n    lines.append('c')\n"
        f"    {OOM}",
        "text = open('out7.txt').read()\nn_lines = len(text.splitlines())",
    )
    fp = "{'lines': lines, 'text': text, 'n_lines': n_lines}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("net", "best")
def test_a_checkpoint_copied_by_shutil_then_loaded(server, server_kernel, restore):
    # The usual "keep the best checkpoint" dance: save to a run folder, copy to best.pt, load it
    # into a fresh model; the weights were changed by a failed cell.
    kid, pid = server_kernel
    cells = (
        "import os, shutil, torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\n"
        "os.makedirs('run7', exist_ok=True)",
        f"with torch.no_grad():\n    net.weight.mul_(2)\n{OOM}",
        "torch.save(net.state_dict(), os.path.join('run7', 'last.pt'))\n"
        "shutil.copy('run7/last.pt', 'run7/best.pt')\nw_sum = net.weight.sum().item()",
        "best = torch.nn.Linear(2, 1)\nbest.load_state_dict(torch.load('run7/best.pt'))",
    )
    fp = (
        "{'net': net.weight.flatten().tolist(), 'best': best.weight.flatten().tolist(), "
        "'files': sorted(os.listdir('run7')), 'w_sum': w_sum}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_log_file_appended_across_cells_and_by_a_failed_one(server, server_kernel, restore):
    # A training log opened in append mode by each epoch's cell; a later cell counts its lines.
    kid, pid = server_kernel
    cells = (
        "open('train7.log', 'w').close()",
        "with open('train7.log', 'a') as f:\n    f.write('epoch 1\\n')",
        f"with open('train7.log', 'a') as f:\n    f.write('epoch 2\\n')\n{OOM}",
        "logged = open('train7.log').read().splitlines()",
    )
    fp = "{'logged': logged}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@restores("net", "ema")
def test_weights_copied_into_another_model_through_state_dict(server, server_kernel, restore):
    # A teacher/EMA model takes the student's weights with load_state_dict(state_dict()): it
    # holds none of the student's tensors, only copies of their values.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\n"
        "ema = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.5)",
        f"net(torch.ones(1, 2)).sum().backward()\nopt.step()\n{OOM}",
        "ema.load_state_dict(net.state_dict())",
    )
    fp = "{'net': net.weight.flatten().tolist(), 'ema': ema.weight.flatten().tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("net", "best_model")
def test_a_best_model_deep_copied_under_an_if(server, server_kernel, restore):
    # ``if val < best: best_model = copy.deepcopy(net)``: the copy and the flag follow the
    # weights a failed cell changed.
    kid, pid = server_kernel
    cells = (
        "import copy, torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\n"
        "best, best_model = float('inf'), None",
        f"with torch.no_grad():\n    net.bias.fill_(-3.0)\n{OOM}",
        "val = net(torch.ones(1, 2)).item()\nif val < best:\n    best = val\n"
        "    best_model = copy.deepcopy(net)",
    )
    fp = (
        "{'net': net.bias.item(), 'best': best, "
        "'best_model': best_model.bias.item() if best_model else None}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("cfg", "opt")
def test_a_config_dataclass_changed_by_a_failed_cell(server, server_kernel, restore):
    # The learning rate is lowered in the config by a cell that then failed; the optimizer is
    # built from it later.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom dataclasses import dataclass\n@dataclass\nclass Cfg:\n"
        "    lr: float = 0.1\n    epochs: int = 3\ncfg = Cfg()\nnet = torch.nn.Linear(2, 1)",
        f"cfg.lr /= 10\ncfg.epochs += 2\n{OOM}",
        "opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)\nsteps = cfg.epochs * 10",
    )
    fp = "{'cfg': vars(cfg), 'opt': opt.param_groups[0]['lr'], 'steps': steps}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("rng", "idx")
def test_a_numpy_generator_drawn_from_by_a_failed_cell(server, server_kernel, restore):
    # ``rng = np.random.default_rng(seed)`` held in a name; a failed cell drew from it, and the
    # later permutation follows that draw.
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nrng = np.random.default_rng(0)",
        f"noise = rng.normal(size=3)\n{OOM}",
        "idx = rng.permutation(6).tolist()",
    )
    fp = "{'idx': idx, 'rng.next': float(rng.random())}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("r", "order")
def test_a_random_instance_shuffling_after_a_failed_cell(server, server_kernel, restore):
    # ``r = random.Random(seed)`` shuffles the file list; a failed cell drew from it first.
    kid, pid = server_kernel
    cells = (
        "import random\nr = random.Random(7)\nfiles = [f'img{i}.png' for i in range(6)]",
        f"aug = r.random()\n{OOM}",
        "order = files[:]\nr.shuffle(order)\nval_files = order[:2]",
    )
    fp = "{'order': order, 'val_files': val_files, 'r.next': r.random()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("tick")
def test_a_nonlocal_step_counter_bumped_by_a_failed_cell(server, server_kernel, restore):
    # A closure's counter (``nonlocal``) numbers the steps; the failed cell bumped it once.
    kid, pid = server_kernel
    cells = (
        "def make_counter():\n    n = 0\n    def tick():\n        nonlocal n\n        n += 1\n"
        "        return n\n    return tick\ntick = make_counter()",
        f"tick()\n{OOM}",
        "step = tick()",
    )
    fp = "{'step': step, 'tick.next': tick()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("recent")
def test_a_bounded_deque_of_losses_after_a_failed_loop(server, server_kernel, restore):
    # A moving average over the last three losses; the failed cell's loop pushed two before it
    # raised, dropping the oldest ones.
    kid, pid = server_kernel
    cells = (
        "from collections import deque\nrecent = deque([0.9, 0.8, 0.7], maxlen=3)",
        "for v in (0.6, 0.5, float('nan')):\n    if v != v:\n"
        "        raise RuntimeError('CUDA error: device-side assert triggered')\n"
        "    recent.append(v)",
        "avg = round(sum(recent) / len(recent), 6)\nsmooth = [round(avg * 2, 6)]",
    )
    fp = "{'recent': list(recent), 'avg': avg, 'smooth': smooth}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("counts", "vocab")
def test_a_defaultdict_counter_and_a_vocab_built_from_it(server, server_kernel, restore):
    # Token counts filled by a loop that failed on a bad line; the vocabulary built later keeps
    # the tokens counted at least twice.
    kid, pid = server_kernel
    cells = (
        "from collections import defaultdict\ncounts = defaultdict(int)\n"
        "for t in 'a b a c'.split():\n    counts[t] += 1",
        "for line in ['b c', None]:\n    for t in line.split():\n        counts[t] += 1",
        "vocab = sorted(t for t, c in counts.items() if c >= 2)\n"
        "stoi = {t: i for i, t in enumerate(vocab)}",
    )
    fp = "{'counts': dict(counts), 'vocab': vocab, 'stoi': stoi}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("X", "clf")
def test_a_sklearn_model_fitted_on_an_array_a_failed_cell_scaled(server, server_kernel, restore):
    # Standardisation done in place by a cell that then failed; the classifier is fitted after.
    pytest.importorskip("sklearn")
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nfrom sklearn.linear_model import LogisticRegression\n"
        "X = np.array([[0.0, 1.0], [1.0, 3.0], [2.0, 2.0], [3.0, 5.0]])\n"
        "y = np.array([0, 0, 1, 1])",
        f"X -= X.mean(axis=0)\nX /= X.std(axis=0)\n{OOM}",
        "clf = LogisticRegression().fit(X, y)\nacc = clf.score(X, y)",
    )
    fp = (
        "{'X': X.round(6).tolist(), 'clf': clf.coef_.round(6).tolist(), "
        "'clf.b': clf.intercept_.round(6).tolist(), 'acc': acc}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_threshold_bound_by_exec_after_a_failed_cell(server, server_kernel, restore):
    # A tuned threshold pasted as code and run with exec; it reads the scores a failed cell
    # extended.
    kid, pid = server_kernel
    cells = (
        "scores = [0.2, 0.6]",
        f"scores.append(0.9)\n{OOM}",
        "exec('thr = sum(scores) / len(scores)')",
        "preds = [s > thr for s in scores]",
    )
    fp = "{'scores': scores, 'thr': round(thr, 6), 'preds': preds}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_cache_deleted_by_a_function_with_global(server, server_kernel, restore):
    # ``free()`` deletes the notebook's cache through ``global``; a later cell rebuilds a
    # smaller one only if it is gone.
    kid, pid = server_kernel
    cells = (
        "cache = {'emb': [1, 2, 3]}\ndef free():\n    global cache\n    del cache",
        "free()",
        "if 'cache' not in globals():\n    cache = {'emb': []}\nsize = len(cache['emb'])",
    )
    fp = "{'cache': cache, 'size': size}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("hist")
def test_a_users_fix_written_to_a_file_that_a_later_cell_reads(server, server_kernel, restore):
    # The user drops a bad value from the restored history; the cell that dumps it runs again
    # (for ``best``) and the later cell reads the fixed file.
    kid, pid = server_kernel
    cells = (
        "import json\nhist = [0.9, 0.7, -1.0]",
        "json.dump(hist, open('fix7.json', 'w'))\nbest = min(hist)",
        "loaded = json.load(open('fix7.json'))",
    )
    out = run_case(
        server,
        kid,
        pid,
        cells,
        "{'hist': hist, 'best': best, 'loaded': loaded}",
        restore=restore,
        after=("hist.pop()",) if restore is not None else (),
    )
    assert_no_silent_difference(out)


@restores("perm")
def test_a_numpy_generator_shuffling_in_place_after_a_failed_draw(server, server_kernel, restore):
    # ``rng.shuffle(perm)`` orders the array in place by the generator's state, which lacks the
    # failed cell's draw.
    kid, pid = server_kernel
    cells = (
        "import numpy as np\nrng = np.random.default_rng(3)\nperm = np.arange(6)",
        f"drop = rng.random(2)\n{OOM}",
        "rng.shuffle(perm)\nfold = perm[:2].tolist()",
    )
    fp = "{'perm': perm.tolist(), 'fold': fold}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_an_environment_variable_set_by_a_failed_cell(server, server_kernel, restore):
    # ``os.environ`` is the process's: the new one lacks what the failed cell set before it
    # raised (a tokenizers or W&B switch), and a later cell read it.
    kid, pid = server_kernel
    cells = (
        "import os",
        f"os.environ['NBCG7_MODE'] = 'offline'\n{OOM}",
        "mode = os.environ.get('NBCG7_MODE', 'online')",
    )
    fp = "{'mode': mode, 'os.environ': os.environ.get('NBCG7_MODE')}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_the_default_dtype_set_by_a_failed_cell(server, server_kernel, restore):
    # ``torch.set_default_dtype`` is process state too: a later cell's tensor follows it.
    kid, pid = server_kernel
    cells = (
        "import torch",
        f"torch.set_default_dtype(torch.float64)\n{OOM}",
        "x = torch.zeros(2)",
    )
    fp = "{'x': str(x.dtype), 'torch.default_dtype': str(torch.get_default_dtype())}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("batch")
def test_an_iterator_advanced_by_a_failed_cell(server, server_kernel, restore):
    # ``it = iter(loader)``; a cell took a batch and then failed; the next cell's batch is the
    # one after.
    kid, pid = server_kernel
    cells = (
        "data = list(range(10))\nit = iter([data[i : i + 2] for i in range(0, 10, 2)])",
        f"batch = next(it)\n{OOM}",
        "batch = next(it)\nseen = sum(batch)",
    )
    fp = "{'batch': batch, 'seen': seen}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))
