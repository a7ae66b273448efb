"""Held-out cases, fourth round: what whole notebooks do that the first three rounds' small
cases do not (tests/replay/test_replay_heldout.py, whose harness this shares): orders that
change from process to process (string hashing), cells run twice, outputs read back through
``_``, names bound by ``exec`` and ``globals()``, memory shared between numpy and torch.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead


@ALL
def test_a_vocabulary_in_a_sets_order(server, server_kernel, restore):
    # min-char-rnn's first lines: the order of a set of strings changes with every process's
    # string hashing (PYTHONHASHSEED), so a replayed `list(set(data))` comes out in another order.
    kid, pid = server_kernel
    cells = (
        "data = 'hello world, the quick brown fox jumps over the lazy dog'",
        "chars = list(set(data))\nchar_to_ix = {ch: i for i, ch in enumerate(chars)}",
        "words = {w for w in data.split()}\nitos = [w for w in words]",
    )
    fp = "{'chars': chars, 'char_to_ix': char_to_ix, 'itos': itos, 'data': data}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


def test_a_restored_set_read_in_order_by_a_replayed_cell(server, server_kernel):
    # A set comes back from a restore laid out by this process's hashes: a list made from it
    # again comes out in another order, though the set itself is equal.
    kid, pid = server_kernel
    cells = (
        "text = 'to be or not to be that is the question whether tis nobler'",
        "vocab = set(text.split())",
        "first = list(vocab)[:4]\nranked = sorted(vocab)",
    )
    fp = "{'first': first, 'ranked': ranked, 'vocab': sorted(vocab)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore="vocab"))


@ALL
def test_a_training_cell_run_twice(server, server_kernel, restore):
    # The user ran the same training cell twice: the model had two epochs before the failure.
    kid, pid = server_kernel
    train = (
        "for _ in range(3):\n    opt.zero_grad()\n"
        "    loss = ((net(x) - y) ** 2).mean()\n    loss.backward()\n    opt.step()\n"
        "losses.append(round(loss.item(), 6))"
    )
    cells = (
        "import torch\ntorch.manual_seed(0)\nx = torch.randn(16, 3)\ny = x.sum(1, keepdim=True)",
        "net = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\nlosses = []",
        train,
        train,
    )
    fp = "{'w': net.weight.sum().item(), 'losses': losses, 'steps': len(opt.state)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_output_read_back_through_underscore(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = ("base = [3, 1, 2]", "sorted(base)", "top = _[-1] * 10\nagain = Out[3]")
    fp = "{'top': top, 'again': again}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_names_bound_through_exec_and_globals(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "exec('alpha = 5')",
        "globals()['beta'] = alpha + 1",
        "for i in range(3):\n    globals()[f'w{i}'] = i * beta",
    )
    fp = "{'alpha': alpha, 'beta': beta, 'w2': w2}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_tensor_sharing_memory_with_an_array(server, server_kernel, restore):
    # torch.from_numpy shares the array's memory: scaling the tensor in place scales the array.
    kid, pid = server_kernel
    cells = (
        "import numpy as np, torch\nfeats = np.arange(6, dtype=np.float32)",
        "t = torch.from_numpy(feats)",
        "t.mul_(2)",
        "feats[0] = -1",
    )
    fp = (
        "{'feats': feats.tolist(), 't': t.tolist(), "
        "'shared': bool(np.shares_memory(feats, t.numpy()))}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_earlier_cell_that_failed_half_way(server, server_kernel, restore):
    # A loop appended two items, then hit a KeyError: the list kept what it had appended.
    kid, pid = server_kernel
    cells = (
        "rows = []\nlookup = {'a': 1, 'b': 2}",
        "for k in ['a', 'b', 'c']:\n    rows.append(lookup[k])",
        "lookup['c'] = 3\ntotal = sum(rows)",
    )
    fp = "{'rows': rows, 'total': total, 'lookup': lookup}"
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,))
    assert_no_silent_difference(outcome)


@ALL
def test_a_time_measured_by_a_cell(server, server_kernel, restore):
    # A value read from the clock cannot come back by running the cell again.
    kid, pid = server_kernel
    cells = ("import time\nstarted = time.time()", "elapsed = round(time.time() - started, 3)")
    fp = "{'started': started, 'elapsed': elapsed}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_ema_weights_updated_from_a_model(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import copy, torch\ntorch.manual_seed(1)\nnet = torch.nn.Linear(4, 2)\n"
        "ema = copy.deepcopy(net)",
        "with torch.no_grad():\n    net.weight.add_(1.0)\n"
        "    for p, q in zip(ema.parameters(), net.parameters()):\n"
        "        p.mul_(0.9).add_(q, alpha=0.1)",
    )
    fp = "{'net': net.weight.sum().item(), 'ema': ema.weight.sum().item()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_early_stopping_state_and_a_best_state_dict(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import copy, torch\ntorch.manual_seed(2)\nnet = torch.nn.Linear(2, 1)\n"
        "best, bad, best_state = float('inf'), 0, None",
        "for val in [0.5, 0.4, 0.45, 0.47]:\n    if val < best:\n"
        "        best, bad = val, 0\n        best_state = copy.deepcopy(net.state_dict())\n"
        "    else:\n        bad += 1\n    with torch.no_grad():\n        net.weight.add_(0.1)",
        "net.load_state_dict(best_state)",
    )
    fp = "{'best': best, 'bad': bad, 'w': net.weight.sum().item()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_tokenizer_class_keeping_its_vocabulary_in_a_set(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class CharTokenizer:\n    def __init__(self, text):\n        self.chars = set(text)\n"
        "        self.stoi = {c: i for i, c in enumerate(self.chars)}\n"
        "    def encode(self, s):\n        return [self.stoi[c] for c in s]",
        "tok = CharTokenizer('hello world from a notebook')",
        "ids = tok.encode('hello')",
    )
    fp = "{'tok': tok.stoi, 'ids': ids}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


def test_numpy_and_python_process_settings(server, server_kernel):
    kid, pid = server_kernel
    cells = (
        "import numpy as np, sys\nnp.seterr(divide='ignore')\nnp.set_printoptions(precision=2)",
        "sys.setrecursionlimit(5000)",
        "shown = np.array2string(np.array([1 / 3]))",
    )
    fp = (
        "{'seterr': np.geterr()['divide'], 'set_printoptions': np.get_printoptions()['precision'],"
        " 'setrecursionlimit': sys.getrecursionlimit(), 'shown': shown}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


@ALL
def test_a_class_edited_after_an_instance_was_made(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class Head:\n    scale = 1\n    def out(self, x):\n        return x * self.scale",
        "old = Head()",
        "class Head:\n    scale = 3\n    def out(self, x):\n        return x * self.scale + 1",
        "new = Head()",
    )
    fp = "{'old': old.out(2), 'new': new.out(2), 'same': type(old) is type(new)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_string_hash_kept_as_a_key(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = ("names = ['ada', 'bob']", "buckets = {n: hash(n) % 8 for n in names}")
    fp = "{'buckets': buckets}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_checkpoint_loaded_then_overwritten_by_a_later_cell(server, server_kernel, restore):
    # The replay loads the file as the later cell left it: the fine-tuned weights, not the
    # pretrained ones the cell first loaded.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\ntorch.save(torch.nn.Linear(2, 1).state_dict(), "
        "'w.pt')",
        "net = torch.nn.Linear(2, 1)\nnet.load_state_dict(torch.load('w.pt'))",
        "with torch.no_grad():\n    tuned = net.weight.sum().item() + 1.0\n"
        "torch.save({'weight': torch.ones(1, 2), 'bias': torch.zeros(1)}, 'w.pt')",
    )
    fp = "{'net': net.weight.sum().item(), 'tuned': round(tuned, 4)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_log_file_appended_to_and_read_back(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "run = 'exp1'\nwith open('train.log', 'a') as f:\n    f.write(run + ' started\\n')",
        "seen = open('train.log').read().count('started')",
    )
    fp = "{'run': run, 'seen': seen}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))
