"""Held-out cases, third round: what a user's training notebook has beyond the first two rounds
(tests/replay/test_replay_heldout.py, test_replay_heldout2.py, whose harness this shares):
module modes and buffers, in-place initialisers, gradients held in ``.grad``, optimizers and
schedulers that change their param groups, shuffles in place, the standard library's
containers changed by their own methods, and objects reached through other objects.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

# --- 1. modules: modes, buffers, in-place initialisers -----------------------------------------


@ALL
def test_batchnorm_running_stats_updated_by_a_forward_in_train_mode(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))",
        "x = torch.randn(8, 3)",
        "with torch.no_grad():\n    net(x)",  # a forward that only updates running stats
        "net.eval()",
    )
    fp = (
        "{'net': [net.training, net[1].training, net[1].running_mean.tolist(), "
        "int(net[1].num_batches_tracked)]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_registered_buffer_updated_in_place_by_a_method(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nclass Meter(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.register_buffer('total', torch.zeros(2))\n        self.n = 0\n"
        "    def update(self, v):\n        self.total += v\n        self.n += 1",
        "meter = Meter()",
        "meter.update(torch.tensor([1.0, 2.0]))",
        "meter.update(torch.tensor([0.5, 0.5]))",
    )
    fp = "{'meter': [meter.total.tolist(), meter.n, list(meter.state_dict())]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_model_apply_with_an_in_place_init_function(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\n"
        "mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))",
        "def init_fn(m):\n    if isinstance(m, torch.nn.Linear):\n"
        "        torch.nn.init.xavier_uniform_(m.weight)\n        torch.nn.init.zeros_(m.bias)",
        "mlp.apply(init_fn)",
        "torch.nn.init.constant_(mlp[2].bias, 0.25)",
    )
    fp = (
        "{'mlp': [round(mlp[0].weight.sum().item(), 6), mlp[0].bias.tolist(), "
        "mlp[2].bias.tolist()], 'torch_draw': torch.rand(1).tolist()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_requires_grad_switched_off_to_freeze_a_layer(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\n"
        "enc = torch.nn.Linear(3, 3)\nhead = torch.nn.Linear(3, 1)",
        "for p in enc.parameters():\n    p.requires_grad_(False)",
        "trainable = [n for n, p in head.named_parameters() if p.requires_grad]",
    )
    fp = (
        "{'enc': [p.requires_grad for p in enc.parameters()], "
        "'head': [p.requires_grad for p in head.parameters()], 'trainable': trainable}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 2. gradients, optimizers, schedulers ----------------------------------------------------


@ALL
def test_gradients_accumulated_by_backward_without_a_step(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nlin = torch.nn.Linear(3, 1)\nxs = torch.randn(4, 3)",
        "lin(xs).sum().backward()",
        "lin(xs[:2]).pow(2).sum().backward()",  # accumulates into .grad
    )
    fp = (
        "{'lin': [None if p.grad is None else round(p.grad.sum().item(), 5) "
        "for p in lin.parameters()]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_zero_grad_set_to_none_after_a_step(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nlin = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(lin.parameters(), lr=0.1)",
        "lin(torch.ones(1, 2)).sum().backward()\nopt.step()",
        "opt.zero_grad(set_to_none=True)",
    )
    fp = "{'lin': [[p.grad is None for p in lin.parameters()], round(lin.weight.sum().item(), 6)]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_lambda_lr_schedule_and_a_plateau_scheduler(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nw = torch.nn.Parameter(torch.ones(2))\n"
        "opt = torch.optim.AdamW([w], lr=1.0, weight_decay=0.1)\n"
        "warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: min(1.0, (e + 1) / 4))\n"
        "plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)",
        "for _ in range(2):\n    opt.zero_grad()\n    (w ** 2).sum().backward()\n"
        "    opt.step()\n    warm.step()",
        "plateau.step(1.0)\nplateau.step(2.0)",
    )
    fp = (
        "{'opt': [opt.param_groups[0]['lr'], opt.param_groups[0]['initial_lr'], "
        "int(opt.state[w]['step'])], 'w': [round(v, 6) for v in w.tolist()], "
        "'warm': warm.last_epoch, 'plateau': [plateau.num_bad_epochs, plateau.best]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_param_group_added_to_an_optimizer_later(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nbody = torch.nn.Linear(2, 2)\n"
        "tail = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(body.parameters(), lr=0.1)",
        "opt.add_param_group({'params': tail.parameters(), 'lr': 0.01})",
        "for g in opt.param_groups:\n    g['lr'] *= 0.5",
    )
    fp = (
        "{'opt': [[g['lr'] for g in opt.param_groups], "
        "opt.param_groups[1]['params'][0] is tail.weight]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_no_grad_decorated_evaluation_function(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nclf = torch.nn.Linear(2, 2)\nscores = {}",
        "@torch.no_grad()\ndef evaluate(name, x):\n    clf.eval()\n"
        "    scores[name] = clf(x).argmax(1).tolist()\n    return clf(x)",
        "out = evaluate('a', torch.ones(3, 2))",
    )
    fp = "{'clf': clf.training, 'scores': scores, 'out': [out.requires_grad, out.shape[0]]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 3. shuffles in place and a DataLoader drawing from its own generator ---------------------


@ALL
def test_random_shuffle_and_numpy_shuffle_in_place(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import random, numpy as np\nrandom.seed(0)\nnp.random.seed(0)\n"
        "order = list(range(8))\narr = np.arange(8)",
        "random.shuffle(order)\nnp.random.shuffle(arr)",
        "split = order[:3]",
    )
    fp = (
        "{'order': order, 'arr': arr.tolist(), 'split': split, "
        "'random_next': random.random(), 'np_next': float(np.random.rand())}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_dataloader_with_its_own_seeded_generator(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "g = torch.Generator().manual_seed(7)\n"
        "dl = DataLoader(list(range(10)), batch_size=5, shuffle=True, generator=g)",
        "epoch1 = [b.tolist() for b in dl]",
    )
    fp = (
        "{'epoch1': epoch1, 'dl': [b.tolist() for b in dl], "
        "'g': torch.rand(1, generator=g).tolist()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 4. the standard library's containers changed by their own methods ------------------------


@ALL
def test_counter_defaultdict_and_setdefault_filled_in_loops(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "from collections import Counter, defaultdict\n"
        "words = 'a b a c b a'.split()\ncounts = Counter()\nby_len = defaultdict(list)\nidx = {}",
        "for w in words:\n    counts[w] += 1\n    by_len[len(w)].append(w)\n"
        "    idx.setdefault(w, len(idx))",
        "counts.update(['z'])\nby_len[9]",  # a defaultdict read that inserts
    )
    fp = (
        "{'counts': dict(counts), 'by_len': dict(by_len), 'idx': idx, "
        "'by_len_type': type(by_len).__name__}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_sort_heapq_and_a_set_changed_in_place(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import heapq\nscores = [5, 1, 4]\nheap = []\nseen = {1}",
        "scores.sort(reverse=True)\nfor s in scores:\n    heapq.heappush(heap, -s)",
        "seen |= {7}\nseen.discard(1)\nbest = -heapq.heappop(heap)",
    )
    fp = "{'scores': scores, 'heap': heap, 'seen': sorted(seen), 'best': best}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_bytearray_array_and_deque_mutated(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import array, collections\nbuf = bytearray(b'ab')\n"
        "nums = array.array('i', [1, 2])\nwindow = collections.deque(maxlen=3)",
        "buf += b'cd'\nbuf[0] = 0x7a\nnums.append(3)\nnums[0] = 9",
        "for v in range(5):\n    window.append(v)",
    )
    fp = "{'buf': bytes(buf).decode(), 'nums': nums.tolist(), 'window': list(window)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_itertools_cycle_advanced_by_cells(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import itertools\ncolors = itertools.cycle(['r', 'g', 'b'])",
        "c1 = next(colors)",
        "next(colors)",
    )
    fp = "{'colors': next(colors), 'c1': c1}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 5. objects reached through other objects ----------------------------------------------------


@ALL
def test_nested_dict_of_lists_of_tensors_changed_in_place(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nhist = {'train': {'loss': []}, 'val': {'loss': []}}",
        "for i in range(3):\n    hist['train']['loss'].append(torch.tensor([float(i)]))",
        "hist['train']['loss'][1] += 10\nhist['val']['loss'].append(torch.zeros(1))",
    )
    fp = "{'hist': {k: [t.tolist() for t in v['loss']] for k, v in hist.items()}}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_object_mutated_through_a_list_alias(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class Cfg:\n    def __init__(self):\n        self.lr = 0.1",
        "cfg = Cfg()\nruns = [cfg]",
        "runs[0].lr = 0.01",
    )
    fp = "{'cfg': cfg.lr, 'runs': [runs[0] is cfg, runs[0].lr]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_property_with_a_side_effect_and_a_getattr_fallback(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "class Lazy:\n    def __init__(self):\n        self.loads = 0\n        self.extra = {}\n"
        "    @property\n    def data(self):\n        self.loads += 1\n        return [1, 2]\n"
        "    def __getattr__(self, name):\n"
        "        return self.extra.setdefault(name, len(self.extra))",
        "lz = Lazy()",
        "n = len(lz.data)\nlz.alpha\nlz.beta",
    )
    fp = "{'lz': [lz.loads, dict(lz.extra)], 'n': n}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_weakref_cache_and_a_helper_module_counter(server, server_kernel, restore):
    kid, pid = server_kernel
    (server.root / "nbcg_helpers3.py").write_text(
        "CALLS = {'n': 0}\n\ndef bump(k=1):\n    CALLS['n'] += k\n    return CALLS['n']\n"
    )
    cells = (
        "import weakref, nbcg_helpers3\nclass Blob:\n    pass\n"
        "blob = Blob()\ncache = weakref.WeakValueDictionary()",
        "cache['b'] = blob\nnbcg_helpers3.bump()",
        "nbcg_helpers3.bump(5)",
    )
    fp = (
        "{'cache': [k for k in cache], 'cache_is': cache.get('b') is blob, "
        "'nbcg_helpers3': nbcg_helpers3.CALLS['n']}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 6. hooks, tags on parameters, optimizer settings that are not numbers -----------------------


@ALL
def test_a_forward_hook_collecting_activations(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nbody = torch.nn.Linear(3, 2)\nacts = []",
        "body.register_forward_hook(lambda m, i, o: acts.append(o.shape[0]))",
        "with torch.no_grad():\n    body(torch.ones(5, 3))",
    )
    fp = "{'acts': list(acts), 'body': len(body._forward_hooks)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_gradient_clamping_hook_on_a_parameter(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nw = torch.nn.Parameter(torch.ones(2))",
        "w.register_hook(lambda g: g.clamp(-1, 1))",
    )
    fp = "{'w': torch.autograd.grad((w * 10).sum(), w)[0].tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_parameters_tagged_with_attributes_for_weight_decay_groups(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nenc2 = torch.nn.Linear(2, 2)",
        "enc2.bias.no_decay = True",
        "decay = [n for n, p in enc2.named_parameters() if not getattr(p, 'no_decay', False)]",
    )
    fp = "{'enc2': [getattr(p, 'no_decay', False) for p in enc2.parameters()], 'decay': decay}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_adam_betas_changed_in_the_param_groups(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\nw = torch.nn.Parameter(torch.ones(2))\nadam = torch.optim.Adam([w])",
        "for g in adam.param_groups:\n    g['betas'] = (0.5, 0.9)",
    )
    fp = "{'adam': list(adam.param_groups[0]['betas'])}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- 7. values no replay can bring back: the clock, fresh entropy, caches ----------------------


@ALL
def test_the_clock_and_fresh_entropy_read_into_names(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import time, uuid, numpy as np\nt0 = time.time()\nrun_id = uuid.uuid4().hex",
        "fresh = np.random.default_rng()\nnoise = fresh.normal(size=2).tolist()",
    )
    fp = "{'t0': t0, 'run_id': run_id, 'noise': noise}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_lru_cached_loader_filled_by_calls(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import functools\n@functools.lru_cache(maxsize=None)\ndef load(k):\n    return k * 2",
        "load(1)\nload(2)",
    )
    fp = "{'load': load.cache_info().currsize}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


def test_numpy_print_options_and_error_handling(server, server_kernel):
    kid, pid = server_kernel
    cells = (
        "import numpy as np",
        "np.set_printoptions(precision=2)\nnp.seterr(divide='ignore')",
        "half = np.ones(2) / 2",
    )
    fp = (
        "{'set_printoptions': np.get_printoptions()['precision'], "
        "'seterr': np.geterr()['divide'], 'half': half.tolist()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


def test_a_string_printed_under_numpy_print_options(server, server_kernel):
    kid, pid = server_kernel
    cells = (
        "import numpy as np",
        "np.set_printoptions(precision=2)",
        "shown = str(np.ones(1) / 3)",
    )
    fp = "{'shown': shown}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp))


# --- 8. files a later cell writes again, modules grown by later cells --------------------------


@ALL
def test_a_checkpoint_file_overwritten_after_it_was_loaded(server, server_kernel, restore):
    kid, pid = server_kernel
    # dst is read from a file a later cell writes again: the cell that wrote what dst read is
    # needed before dst's, though it binds nothing dst uses
    cells = (
        "import torch\ntorch.manual_seed(0)",
        "src = torch.nn.Linear(2, 1)\ntorch.save(src.state_dict(), 'nbcg_ckpt3.pt')",
        "dst = torch.nn.Linear(2, 1)\ndst.load_state_dict(torch.load('nbcg_ckpt3.pt'))",
        "torch.save({'weight': torch.full((1, 2), 5.0), 'bias': torch.zeros(1)}, 'nbcg_ckpt3.pt')",
    )
    fp = "{'dst': [round(v, 6) for v in dst.weight.flatten().tolist()]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_module_list_grown_and_a_submodule_replaced(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nblocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])",
        "blocks.append(torch.nn.Linear(2, 2))",
        "blocks[0] = torch.nn.Identity()",
    )
    fp = (
        "{'blocks': [type(b).__name__ for b in blocks], "
        "'blocks_w': round(blocks[1].weight.sum().item(), 6)}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_predictions_made_under_inference_mode(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(2, 2)",
        "with torch.inference_mode():\n    preds = m(torch.ones(3, 2))",
    )
    fp = "{'preds': [round(preds.sum().item(), 5), preds.is_inference(), preds.requires_grad]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))
