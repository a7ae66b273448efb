"""Held-out cases, ninth round: state that lives outside the names a cell binds, not met by the
first eight rounds (tests/replay/test_replay_heldout.py, whose harness this shares): an array
memory-mapped from a data file the notebook did not write (``np.load(mmap_mode='r+')``) and
changed in place, so the file holds the change; process settings a failed cell set
(``sys.setrecursionlimit``, ``warnings.simplefilter``, ``torch.set_num_threads``); a library
class's method patched by a failed cell and reached only through an instance; a forward hook
that bumps a global through ``global`` during a failed cell's forward pass; weights tied by a
failed cell; a ``functools.cached_property`` filled by a failed cell before the data changed;
``SimpleNamespace``, ``UserDict`` and ``OrderedDict``-subclass configs changed by a helper in a
failed cell; a metrics dict keyed by an ``Enum``; an exception kept by an out-of-memory retry
loop; gradients accumulated by a failed cell's ``loss.backward()`` into a model it never names,
then stepped; a model cast to ``float64`` and put in eval mode by a failed cell; counters kept
as a function's attributes (``log_step.n += 1``, a decorator's ``wrapper.calls``) bumped by a
failed cell; a ``@dataclass(slots=True)`` meter updated by a forward hook in a failed cell; a
model's class patched through ``type(model).forward = ...`` by a failed cell.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, restores, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

np = pytest.importorskip("numpy")

OOM = "raise RuntimeError('CUDA out of memory')"


@ALL
def test_a_memory_mapped_data_file_scaled_in_place(server, server_kernel, restore):
    # Kaggle's precomputed features: a ``.npy`` in the input folder, opened ``r+`` and scaled
    # in place; the file now holds the scaled values.
    kid, pid = server_kernel
    np.save(server.root / "emb9.npy", np.array([[51.0, 102.0], [204.0, 255.0]]))
    cells = (
        "import numpy as np\nemb = np.load('emb9.npy', mmap_mode='r+')",
        "emb /= 255.0",
        "total = float(emb.sum())",
    )
    fp = "{'emb': np.asarray(emb).round(6).tolist(), 'total': round(total, 6)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_process_settings_set_by_a_failed_cell(server, server_kernel, restore):
    # A setup block at the top of a training cell that then ran out of memory.
    kid, pid = server_kernel
    cells = (
        "import sys, warnings, torch",
        "sys.setrecursionlimit(4321)\nwarnings.simplefilter('ignore')\n"
        f"torch.set_num_threads(1)\n{OOM}",
        "limit = sys.getrecursionlimit()",
    )
    fp = (
        "{'sys': sys.getrecursionlimit(), 'limit': limit, "
        "'warnings': [f[0] for f in warnings.filters if f[2] is Warning], "
        "'torch': torch.get_num_threads()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("act")
def test_a_library_method_patched_by_a_failed_cell_reached_through_an_instance(
    server, server_kernel, restore
):
    # A notebook swaps an activation's ``forward`` on the class (as Hugging Face notebooks patch
    # ``BertSelfAttention.forward``); the later cell only calls the instance.
    kid, pid = server_kernel
    cells = (
        "import torch\nact = torch.nn.GELU()\nx = torch.linspace(-2, 2, 5)",
        f"torch.nn.GELU.forward = lambda self, t: torch.relu(t)\n{OOM}",
        "y = [round(v, 4) for v in act(x).tolist()]",
    )
    fp = "{'act': [round(v, 4) for v in act(x).tolist()], 'y': y}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_forward_hook_bumping_a_global_in_a_failed_forward(server, server_kernel, restore):
    # The hook counts forward passes through ``global``; the failed cell never names ``n_fwd``.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\nn_fwd = 0\n"
        "def count(m, i, o):\n    global n_fwd\n    n_fwd += 1\n"
        "handle = net.register_forward_hook(count)",
        f"for _ in range(3):\n    out = net(torch.ones(1, 2))\n{OOM}",
        "seen = n_fwd",
    )
    fp = "{'n_fwd': n_fwd, 'seen': seen}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_weights_tied_by_a_failed_cell(server, server_kernel, restore):
    # ``dec.weight = enc.weight`` (a language model's tied embeddings), then an optimizer over
    # the unique parameters.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nenc = torch.nn.Embedding(5, 3)\n"
        "dec = torch.nn.Linear(3, 5, bias=False)",
        f"dec.weight = enc.weight\n{OOM}",
        "params = {id(p): p for p in [*enc.parameters(), *dec.parameters()]}\n"
        "opt = torch.optim.SGD(params.values(), lr=0.1)",
    )
    fp = (
        "{'dec': [dec.weight is enc.weight, round(dec.weight.sum().item(), 5)], "
        "'opt': len(opt.param_groups[0]['params'])}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_cached_property_filled_by_a_failed_cell_before_the_labels_changed(
    server, server_kernel, restore
):
    # Class weights cached on first use; a later cell relabels, the cache keeps the old counts.
    kid, pid = server_kernel
    cells = (
        "from functools import cached_property\nclass DS:\n    def __init__(self, labels):\n"
        "        self.labels = labels\n    @cached_property\n    def class_counts(self):\n"
        "        return [self.labels.count(c) for c in range(3)]\n"
        "ds = DS([0, 1, 1, 2, 2, 2])",
        f"print(ds.class_counts)\n{OOM}",
        "ds.labels[:] = [0, 0, 0, 0, 1, 2]",
    )
    fp = "{'ds': [ds.class_counts, ds.labels]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_namespace_userdict_and_ordereddict_configs_changed_by_a_failed_helper(
    server, server_kernel, restore
):
    # A sweep helper scales the learning rate in three config styles, then the cell fails.
    kid, pid = server_kernel
    cells = (
        "from types import SimpleNamespace\nfrom collections import UserDict, OrderedDict\n"
        "class Hp(UserDict):\n    pass\nclass Sched(OrderedDict):\n    pass\n"
        "cfg = SimpleNamespace(lr=1e-3, bs=32)\nhp = Hp(lr=1e-3)\nsched = Sched(warmup=10)",
        "def sweep(k):\n    cfg.lr *= k\n    hp['lr'] *= k\n    sched['warmup'] += k\n"
        f"sweep(10)\n{OOM}",
        "lrs = [cfg.lr, hp['lr'], sched['warmup']]",
    )
    fp = "{'cfg': cfg.lr, 'hp': hp['lr'], 'sched': sched['warmup'], 'lrs': lrs}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_metrics_dict_keyed_by_an_enum(server, server_kernel, restore):
    # Metrics per split, keyed by an ``Enum`` of the notebook's; looked up by member.
    kid, pid = server_kernel
    cells = (
        "from enum import Enum\nclass Split(Enum):\n    TRAIN = 'train'\n    VAL = 'val'\n"
        "metrics = {s: [] for s in Split}",
        "metrics[Split.TRAIN].append(0.9)\nmetrics[Split.VAL].append(1.1)",
        f"metrics[Split.VAL].append(1.0)\n{OOM}",
    )
    fp = (
        "{'metrics': {k.value: v for k, v in metrics.items()}, "
        "'Split': [metrics.get(s) for s in Split]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@ALL
def test_an_exception_kept_by_an_out_of_memory_retry_loop(server, server_kernel, restore):
    # Halve the batch size on OOM and keep the last error to show it.
    kid, pid = server_kernel
    cells = (
        "bs = 64\nlast_err = None\ndef fits(bs):\n    if bs > 16:\n"
        "        raise RuntimeError(f'CUDA out of memory at bs={bs}')\n    return True",
        "while True:\n    try:\n        fits(bs)\n        break\n"
        "    except RuntimeError as e:\n        last_err = e\n        bs //= 2",
    )
    fp = "{'bs': bs, 'last_err': repr(last_err)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("model")
def test_gradients_accumulated_by_a_failed_backward_then_stepped(server, server_kernel, restore):
    # Gradient accumulation: the failed cell's ``loss.backward()`` names only ``loss``.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.5)\nx = torch.ones(3, 2)",
        "loss = model(x).pow(2).mean()",
        f"loss.backward()\n{OOM}",
        "opt.step()",
    )
    fp = "{'model': [round(p.sum().item(), 5) for p in model.parameters()]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@ALL
def test_a_model_cast_to_float64_and_put_in_eval_by_a_failed_cell(server, server_kernel, restore):
    # Numerical check in double precision, evaluation mode, then a crash; a later cell predicts.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(4, 4), "
        "torch.nn.Dropout(0.5))\nx = torch.ones(2, 4)",
        f"model.to(torch.float64)\nmodel.eval()\n{OOM}",
        "torch.manual_seed(1)\npreds = model(x.to(model[0].weight.dtype)).sum().item()",
    )
    fp = "{'model': [str(model[0].weight.dtype), model.training], 'preds': round(preds, 5)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_function_attributes_counting_calls_in_a_failed_cell(server, server_kernel, restore):
    # A call-counting decorator (``wrapper.calls += 1``) and a function's own static counter
    # (``log_step.n += 1``): state on function objects, changed by calls in a failed cell.
    kid, pid = server_kernel
    cells = (
        "import functools\ndef counted(f):\n    @functools.wraps(f)\n    def wrapper(*a):\n"
        "        wrapper.calls += 1\n        return f(*a)\n    wrapper.calls = 0\n"
        "    return wrapper\n@counted\ndef train_step(x):\n    return x * 2\n"
        "def log_step(loss):\n    log_step.n += 1\nlog_step.n = 0",
        f"for i in range(3):\n    log_step(train_step(i))\n{OOM}",
        "done = train_step.calls",
    )
    fp = "{'train_step': train_step.calls, 'log_step': log_step.n, 'done': done}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_slotted_meter_updated_by_a_forward_hook_in_a_failed_cell(server, server_kernel, restore):
    # ``@dataclass(slots=True)``: no ``__dict__``; the hook updates it during the forward pass.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom dataclasses import dataclass\n@dataclass(slots=True)\n"
        "class Meter:\n    n: int = 0\n    total: float = 0.0\n"
        "    def update(self, v):\n        self.n += 1\n        self.total += v\n"
        "meter = Meter()\ntorch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\n"
        "net.register_forward_hook(lambda m, i, o: meter.update(o.sum().item()))",
        f"out = net(torch.ones(4, 2))\n{OOM}",
        "mean = meter.total / max(meter.n, 1)",
    )
    fp = "{'meter': [meter.n, round(meter.total, 5)], 'mean': round(mean, 5)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_models_class_patched_through_type_by_a_failed_cell(server, server_kernel, restore):
    # ``type(model).forward = ...`` (gradient checkpointing or a fix patched onto the class a
    # checkpoint's model came with): the cell names the instance only inside ``type()``.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(2, 2)\nx = torch.ones(1, 2)",
        "def forward_scaled(self, t):\n    return torch.nn.functional.linear(t, self.weight) * 0\n"
        f"type(model).forward = forward_scaled\n{OOM}",
        "pred = model(x).sum().item()",
    )
    fp = "{'model': model(x).sum().item(), 'pred': pred}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))
