"""Held-out cases, round 15a: the state of torch training code that the earlier rounds did not
cover (tests/replay/test_replay_heldout.py, whose harness this shares): hooks of every kind
(a module's forward pre and full backward hooks with a handle removed in a failed cell, a
parameter's post-accumulate-grad hook, an optimizer's step hook, a global optimizer step hook,
global module hooks from a helper), a parameter appended to an optimizer's group by hand, a
non-leaf told to ``retain_grad()``, autocast, inference mode and autograd's saved-tensor hooks
entered and never left, ``set_warn_always``, ``set_flush_denormal`` and autograd's
multithreading flag from a helper, a
layer frozen, a model made double, pruned, loaded with ``strict=False`` and given a buffer in
failed cells, weights initialised by ``model.apply`` after a seed inside a helper, a
``GradScaler("cpu")`` beside an EMA copy, a ``ReduceLROnPlateau`` with an early-stopping
counter, and a ``DataLoader`` shuffling a ``random_split`` subset by a generator of its own,
beside a ``BatchSampler`` of a ``SubsetRandomSampler``, each taken partly.

Found silent differences, fixed with this round: a cell that only registered a parameter's
``register_post_accumulate_grad_hook`` or an optimizer's ``register_step_post_hook``, appended
a parameter to ``opt.param_groups[0]["params"]`` or called ``h.retain_grad()`` was skipped
(none changed the fingerprint: these are part of it now, replay/record.py); so was a cell that
registered a global ``register_optimizer_step_pre_hook`` (through a helper), one that entered
``torch.autocast("cpu")`` and left it entered (``amp.__enter__()``), and one that pushed
``saved_tensors_hooks(pack, unpack)`` (settings now, with inference mode,
``disable_saved_tensors_hooks``, ``set_warn_always`` and the multithreading flag,
replay/settings.py); so was one whose helper called ``torch.set_flush_denormal(True)``, which
has no getter (read by a product of Python floats, which obeys the same CPU flags). A restore
dropped a retained non-leaf grad (keep/pickling.py keeps it), and brought back a ``loss`` that
autograd computed as a leaf, while the plan took it for kept: the failing cell's
``loss.backward()`` reached nothing (the keep marks such names; the replay builds them again).
What a failed cell did (the model frozen, made double, pruned, loaded, a hook removed, a
scheduler stepped) cannot be repeated: the plan names what it bound or changed and what was
built from it later. The other cases passed as written.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

OOM = "raise RuntimeError('CUDA out of memory')"


# --- hooks ------------------------------------------------------------------------------------


@ALL
def test_module_hooks_with_a_handle_removed_in_a_failed_cell(server, server_kernel, restore):
    # A forward pre hook doubling the input and a full backward hook counting calls; the user
    # removes the pre hook in a cell that then fails, and runs forward and backward.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\n"
        "net = torch.nn.Linear(3, 2)\ncalls = []\n"
        "pre = net.register_forward_pre_hook(lambda m, a: (a[0] * 2,))\n"
        "back = net.register_full_backward_hook(lambda m, gi, go: calls.append(1))",
        f"pre.remove()\n{OOM}",
        "x = torch.ones(1, 3, requires_grad=True)\ny = net(x).sum()\ny.backward()",
    )
    fp = (
        "{'y': y.item(), 'calls': len(calls), 'pre': len(net._forward_pre_hooks), "
        "'net': net.weight.grad.tolist()}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,))
    assert_no_silent_difference(outcome)


@ALL
def test_what_parameters_and_an_optimizer_gain_that_binds_nothing(server, server_kernel, restore):
    # Hooks (a count of accumulated grads, a log of each step's lr), a parameter appended to a
    # group's list by hand, a non-leaf told to keep its grad: no cell binds a name for them.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "extra = torch.nn.Parameter(torch.zeros(1))\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\naccumulated, lrs = [], []",
        "net.weight.register_post_accumulate_grad_hook(lambda p: accumulated.append(1))",
        "opt.register_step_post_hook(lambda o, a, k: lrs.append(o.param_groups[0]['lr']))",
        "opt.param_groups[0]['params'].append(extra)",
        "for _ in range(2):\n    opt.zero_grad()\n"
        "    (net(torch.ones(2, 3)).sum() + extra.sum()).backward()\n    opt.step()",
        "h = net(torch.ones(2, 3)) * 2",
        "h.retain_grad()",
        "h.sum().backward()",
    )
    fp = (
        "{'accumulated': len(accumulated), 'lrs': lrs, 'net': net.weight.tolist(), "
        "'extra': extra.tolist(), 'h': h.grad.tolist() if h.is_leaf or h.retains_grad else None}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_global_optimizer_step_hook_halving_the_lr(server, server_kernel, restore):
    # ``register_optimizer_step_pre_hook``: every optimizer's every step, through a helper.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.optim.optimizer import register_optimizer_step_pre_hook\n"
        "torch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)",
        "def halve(o, args, kwargs):\n    for g in o.param_groups:\n        g['lr'] *= 0.5\n"
        "def install():\n    register_optimizer_step_pre_hook(halve)",
        "install()",
        "for _ in range(2):\n    opt.zero_grad()\n    net(torch.ones(2, 3)).sum().backward()\n"
        "    opt.step()",
    )
    fp = "{'opt': opt.param_groups[0]['lr'], 'net': net.weight.tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_global_module_hooks_installed_by_a_helper(server, server_kernel, restore):
    # A debugging helper hooks every module: a forward pre hook scaling inputs, a full backward
    # hook recording which modules saw gradients; no module's own state changes.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.nn.modules import module as M\ntorch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())\nseen = []\n"
        "def debug():\n"
        "    M.register_module_forward_pre_hook(lambda m, a: tuple(t * 2 for t in a))\n"
        "    M.register_module_full_backward_hook(lambda m, gi, go: seen.append(type(m).__name__))",
        "debug()",
        "x = torch.ones(1, 3, requires_grad=True)\ny = net(x).sum()\ny.backward()",
    )
    fp = "{'y': y.item(), 'seen': seen, 'x': x.grad.tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- modes left entered -------------------------------------------------------------------------


@ALL
def test_autocast_and_inference_mode_entered_and_left(server, server_kernel, restore):
    # ``__enter__()`` by hand (a context manager's body cut out of a ``with``): never left; a
    # helper that makes torch warn always, flush denormals and run autograd on one thread.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 2)\n"
        "def strict():\n    torch.set_warn_always(True)\n    torch.set_flush_denormal(True)\n"
        "    torch.autograd.set_multithreading_enabled(False).__enter__()",
        "strict()",
        "amp = torch.autocast('cpu', dtype=torch.bfloat16)\namp.__enter__()",
        "y = net(torch.ones(1, 3))",
        "mode = torch.inference_mode()\nmode.__enter__()",
        "z = net(torch.ones(1, 3))",
    )
    fp = (
        "{'y': str(y.dtype), 'z': [str(z.dtype), z.is_inference()], "
        "'torch': [torch.is_autocast_enabled('cpu'), torch.is_inference_mode_enabled(), "
        "torch.is_warn_always_enabled(), torch._C._is_multithreading_enabled(), "
        "(torch.tensor([1e-310], dtype=torch.float64) * 1).tolist()]}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_saved_tensors_hooks_entered_and_left(server, server_kernel, restore):
    # Activation offloading sketched by hand: pack hooks counting what autograd saves.
    kid, pid = server_kernel
    cells = (
        "import torch\npacked = []\ndef pack(t):\n    packed.append(tuple(t.shape))\n    return t",
        "hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)\nhooks.__enter__()",
        "w = torch.ones(3, requires_grad=True)\nloss = (w * w).sum()",
    )
    fp = "{'packed': packed, 'loss': loss.item()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


# --- what a failed cell did to the model -------------------------------------------------------


@ALL
def test_a_seeded_init_helper_then_a_layer_frozen_in_a_failed_cell(server, server_kernel, restore):
    # ``reset(net, 3)``: the seed inside the helper, ``net.apply(init)``; then the user freezes
    # the first layer in a cell that fails, and trains.
    kid, pid = server_kernel
    cells = (
        "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))\n"
        "def init(m):\n    if isinstance(m, torch.nn.Linear):\n"
        "        torch.nn.init.normal_(m.weight)\n        torch.nn.init.zeros_(m.bias)\n"
        "def reset(model, seed):\n    torch.manual_seed(seed)\n    model.apply(init)",
        "reset(net, 3)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)",
        f"net[0].requires_grad_(False)\n{OOM}",
        "for _ in range(2):\n    opt.zero_grad()\n"
        "    net(torch.ones(4, 3)).pow(2).mean().backward()\n    opt.step()",
    )
    fp = (
        "{'net': [[round(p.sum().item(), 5), p.requires_grad] for p in net.parameters()], "
        "'torch': torch.rand(1).item()}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,))
    assert_no_silent_difference(outcome)


@ALL
def test_a_model_made_double_and_pruned_in_failed_cells(server, server_kernel, restore):
    # A parametrization through a helper, then ``double()`` and ``l1_unstructured`` in cells
    # that fail; the forward after them.
    kid, pid = server_kernel
    cells = (
        "import torch\nimport torch.nn.utils.parametrize as P\n"
        "import torch.nn.utils.prune as prune\ntorch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))\n"
        "class Sym(torch.nn.Module):\n    def forward(self, X):\n"
        "        return X.triu() + X.triu(1).T\n"
        "def symmetric(layer):\n    P.register_parametrization(layer, 'weight', Sym())",
        "symmetric(net[0])",
        f"net.double()\n{OOM}",
        f"prune.l1_unstructured(net[1], name='weight', amount=0.5)\n{OOM}",
        "out = net(torch.ones(1, 4, dtype=net[1].weight.dtype)).tolist()",
    )
    fp = (
        "{'out': out, 'net': [sorted(net.state_dict()), str(net[1].weight.dtype), "
        "type(net[0]).__name__]}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(2, 3))
    assert_no_silent_difference(outcome)


@ALL
def test_a_buffer_and_a_non_strict_load_in_a_failed_cell(server, server_kernel, restore):
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 2)\n"
        "ckpt = {'weight': torch.zeros(2, 3), 'scale': torch.full((2,), 3.0)}",
        "net.register_buffer('scale', torch.ones(2))\n"
        f"res = net.load_state_dict(ckpt, strict=False)\n{OOM}",
        "out = (net(torch.ones(1, 3)) * getattr(net, 'scale', 1)).tolist()",
    )
    fp = "{'out': out, 'net': [sorted(net.state_dict()), net.weight.sum().item()]}"
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,))
    assert_no_silent_difference(outcome)


# --- training loops' own state -----------------------------------------------------------------


@ALL
def test_a_grad_scaler_and_an_ema_copy(server, server_kernel, restore):
    # ``GradScaler("cpu")`` growing each step, an EMA ``deepcopy`` updated in the loop by a
    # helper; one more EMA update and scaler update in a cell that fails.
    kid, pid = server_kernel
    cells = (
        "import torch, copy\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "ema = copy.deepcopy(net)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 4, growth_interval=1)\n"
        "def ema_update(decay=0.9):\n    with torch.no_grad():\n"
        "        for e, p in zip(ema.parameters(), net.parameters()):\n"
        "            e.mul_(decay).add_(p, alpha=1 - decay)",
        "for _ in range(3):\n    opt.zero_grad()\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        loss = net(torch.randn(4, 3)).pow(2).mean()\n"
        "    scaler.scale(loss).backward()\n    scaler.step(opt)\n    scaler.update()\n"
        "    ema_update()",
        f"ema_update(0.5)\nscaler.update(1.0)\n{OOM}",
        "gap = (ema.weight - net.weight).abs().sum().item()",
    )
    fp = (
        "{'scaler': scaler.get_scale(), 'ema': ema.weight.tolist(), 'net': net.weight.tolist(), "
        "'gap': gap, 'loss': str(loss.dtype)}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,))
    assert_no_silent_difference(outcome)


@ALL
def test_plateau_scheduler_and_early_stopping_counter(server, server_kernel, restore):
    # The validation loop's bookkeeping: the scheduler's bad epochs, the user's patience count;
    # one epoch's step in a cell that fails after it.
    kid, pid = server_kernel
    cells = (
        "import torch\nnet = torch.nn.Linear(1, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=1.0)\n"
        "sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=1)\nbest, bad = 1e9, 0\n"
        "def epoch(v):\n    global best, bad\n    sched.step(v)\n    if v < best:\n"
        "        best, bad = v, 0\n    else:\n        bad += 1",
        "for v in [1.0, 0.9, 0.95]:\n    epoch(v)",
        f"epoch(0.97)\n{OOM}",
        "stop = bad >= 3",
    )
    fp = (
        "{'opt': opt.param_groups[0]['lr'], 'bad': bad, 'best': best, 'stop': stop, "
        "'sched': [sched.num_bad_epochs, sched.best]}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,))
    assert_no_silent_difference(outcome)


# --- data order ---------------------------------------------------------------------------------


@ALL
def test_a_shuffled_loader_over_a_split_and_a_batch_sampler(server, server_kernel, restore):
    # ``random_split`` and ``DataLoader(shuffle=True)`` share a generator of their own; a
    # ``BatchSampler`` of a ``SubsetRandomSampler`` has another. Each taken partly, one batch in
    # a cell that fails.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.utils.data import DataLoader, random_split, BatchSampler, "
        "SubsetRandomSampler\ng = torch.Generator().manual_seed(0)\n"
        "train, val = random_split(list(range(20)), [15, 5], generator=g)\n"
        "dl = DataLoader(train, batch_size=4, shuffle=True, generator=g)\nit = iter(dl)\n"
        "h = torch.Generator().manual_seed(1)\n"
        "bs = BatchSampler(SubsetRandomSampler(range(10), generator=h), 3, drop_last=False)",
        "b1 = next(it).tolist()\nfirst = list(bs)",
        f"b2 = next(it).tolist()\n{OOM}",
        "b3 = next(it).tolist()\nsecond = list(bs)",
    )
    fp = (
        "{'b1': b1, 'b3': b3, 'it': next(it).tolist(), 'val': list(val.indices), "
        "'first': first, 'second': second, 'g': torch.rand(1, generator=g).item(), "
        "'h': torch.rand(1, generator=h).item()}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,))
    assert_no_silent_difference(outcome)


# --- autograd graphs ------------------------------------------------------------------------


@ALL
def test_a_loss_kept_with_its_graph_for_the_failing_cells_backward(server, server_kernel, restore):
    # A cell computes the outputs and the loss; the next (the failing one) calls
    # ``loss.backward()``. A restored ``loss`` is a leaf: its backward would reach nothing, the
    # model's grads would stay empty, and a device assert raised in backward would not come
    # back. It is built again from the restored model instead.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 2)\nx = torch.ones(4, 3)",
        "out = model(x)\nloss = out.pow(2).sum()\nlog = {'loss': loss, 'step': 1}",
    )
    fp = (
        "{'loss': [loss.item(), loss.is_leaf, type(loss.grad_fn).__name__], "
        "'log': [log['loss'] is loss, log['step']], 'out': out.grad_fn is not None, "
        "'reaches': [type(f).__name__ for f, _ in loss.grad_fn.next_functions] "
        "if loss.grad_fn else None}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_loss_left_by_a_training_loop_read_by_the_failing_cell(server, server_kernel, restore):
    # The loss of a training loop's last step, read by the next cell. Restored, it is a leaf;
    # its cell cannot be run again (it would step the restored model once more): named.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.ones(4, 3)",
        "for _ in range(3):\n    loss = model(x).pow(2).mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()",
    )
    fp = (
        "{'loss': [round(loss.item(), 6), loss.is_leaf], "
        "'w': [round(v, 6) for v in model.weight.flatten().tolist()]}"
    )
    outcome = run_case(server, kid, pid, cells, fp, restore=restore)
    assert_no_silent_difference(outcome)
    if restore == "":
        assert "loss (the cell that made it also changes model" in outcome.plan
