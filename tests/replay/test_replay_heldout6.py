"""Held-out cases, sixth round: what Kaggle, Colab and Hugging Face notebooks do between loading
data and the cell that fails, not met by the first five rounds (tests/replay/test_replay_heldout.py,
whose harness this shares): the global generator held in a name (``torch.manual_seed``'s result)
or saved and set back, draws under ``fork_rng``, schedules stepped inside gradient-accumulation
loops, averaged (SWA) models, modules whose parametrizations or pruning draw and update buffers,
hooks on tensors, names bound under ``%time`` / ``%%time`` and by walrus assignments in
comprehensions, an augmented assignment that changes a list and then raises, configs changed by
``setattr`` with computed names, scripts run by ``%run``, parameters written from a flat vector;
and what later cells compute, without sharing an object, from a list that a cell appended to
before it failed (or that the user fixed after a restore): counts through ``len``, flags set
under an ``if`` or a ``try``, an early stopper's method, functions, lambdas and ``class CFG``
bodies that read it as a global, walrus targets and calls inside comprehensions.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, restores, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead


@restores("g")
def test_the_default_generator_held_in_a_name(server, server_kernel, restore):
    # ``torch.manual_seed`` returns the default generator itself
    # (torch/random.py: ``return default_generator.manual_seed(seed)``); notebooks keep it and
    # hand it to a DataLoader, whose shuffles then move the global generator.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.utils.data import DataLoader\ng = torch.manual_seed(0)\n"
        "dl = DataLoader(list(range(8)), batch_size=4, shuffle=True, generator=g)",
        "first = next(iter(dl)).tolist()",
        "noise = torch.rand(2).tolist()",
    )
    fp = (
        "{'g': g is torch.default_generator, 'first': first, 'noise': noise, "
        "'g.next': torch.rand(1, generator=g).item()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("state")
def test_the_rng_state_saved_and_set_back(server, server_kernel, restore):
    # Reproducible augmentation: save the generator's state, draw, set it back, draw the same.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(1)\nstate = torch.get_rng_state()",
        "a = torch.rand(2).tolist()",
        "torch.set_rng_state(state)\nb = torch.rand(2).tolist()",
        "c = torch.rand(1).tolist()",
    )
    fp = "{'a': a, 'b': b, 'c': c, 'state': state.sum().item()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("aug")
def test_draws_under_fork_rng(server, server_kernel, restore):
    # ``fork_rng`` puts the generator's state back when its block ends: the draws inside it
    # leave the global generator where it was.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(2)",
        "with torch.random.fork_rng():\n    torch.manual_seed(99)\n"
        "    aug = torch.rand(2).tolist()",
        "after = torch.rand(2).tolist()",
    )
    fp = "{'aug': aug, 'after': after, 'next': torch.rand(1).item()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("sched", "acc", "norms")
def test_a_one_cycle_schedule_stepped_in_a_gradient_accumulation_loop(
    server, server_kernel, restore
):
    # The optimizer steps every second micro-batch; the step count lives in a dict, the clipped
    # gradient norms in a list, and OneCycleLR's last_epoch moves with each step.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(0)\nnet = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=10)\n"
        "acc = {'micro': 0, 'steps': 0}\nnorms = []\nxs = torch.randn(6, 4, 3)",
        "for x in xs:\n    (net(x).pow(2).mean() / 2).backward()\n    acc['micro'] += 1\n"
        "    if acc['micro'] % 2 == 0:\n"
        "        norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0).item())\n"
        "        opt.step()\n        sched.step()\n        opt.zero_grad()\n"
        "        acc['steps'] += 1",
    )
    fp = (
        "{'sched': sched.last_epoch, 'lr': sched.get_last_lr(), 'acc': acc, "
        "'norms': [round(n, 6) for n in norms], 'net': round(net.weight.sum().item(), 6), "
        "'opt': opt.param_groups[0]['lr']}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("swa")
def test_an_averaged_model_updated_in_place(server, server_kernel, restore):
    # torch.optim.swa_utils.AveragedModel copies the model and counts its updates in the buffer
    # n_averaged; SWALR changes the optimizer's learning rate.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.optim.swa_utils import AveragedModel, SWALR\n"
        "torch.manual_seed(0)\nnet = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nx = torch.randn(5, 2)",
        "swa = AveragedModel(net)\nswa_sched = SWALR(opt, swa_lr=0.05, anneal_epochs=2)",
        "for _ in range(3):\n    opt.zero_grad()\n    net(x).pow(2).mean().backward()\n"
        "    opt.step()\n    swa.update_parameters(net)\n    swa_sched.step()",
    )
    fp = (
        "{'swa': [round(p.sum().item(), 6) for p in swa.parameters()], "
        "'swa.n': int(swa.n_averaged), 'net': round(net.weight.sum().item(), 6), "
        "'opt': round(opt.param_groups[0]['lr'], 6)}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("out")
def test_spectral_norm_updated_by_forward_passes(server, server_kernel, restore):
    # A GAN's discriminator: the spectral_norm parametrization draws its vectors u, v from the
    # global generator when registered and runs a power iteration on each training forward.
    # (The parametrized module's class is made at run time, so disc itself is not kept.)
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.nn.utils.parametrizations import spectral_norm\n"
        "torch.manual_seed(0)\ndisc = spectral_norm(torch.nn.Linear(4, 3))",
        "x = torch.randn(2, 4)\nfor _ in range(3):\n    out = disc(x)",
        "z = torch.rand(1).item()",
    )
    fp = (
        "{'disc': round(disc.weight.sum().item(), 6), "
        "'disc.u': round(disc.parametrizations.weight[0]._u.sum().item(), 6), "
        "'out': round(out.sum().item(), 6), 'z': z}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("net")
def test_random_pruning_adds_a_mask_and_a_hook(server, server_kernel, restore):
    # torch.nn.utils.prune.random_unstructured draws its mask from the global generator and
    # replaces ``weight`` by ``weight_orig`` * ``weight_mask`` through a forward pre-hook.
    kid, pid = server_kernel
    cells = (
        "import torch\nimport torch.nn.utils.prune as prune\ntorch.manual_seed(0)\n"
        "net = torch.nn.Linear(4, 4)",
        "prune.random_unstructured(net, name='weight', amount=0.5)",
        "sparsity = (net.weight == 0).float().mean().item()",
    )
    fp = (
        "{'net': sorted(n for n, _ in net.named_buffers()), "
        "'net.mask': net.weight_mask.flatten().tolist(), 'sparsity': sparsity, "
        "'net.hooks': len(net._forward_pre_hooks)}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_tensor_hook_counting_backward_passes(server, server_kernel, restore):
    # A hook registered on a tensor runs on each backward through it and appends to a list.
    kid, pid = server_kernel
    cells = (
        "import torch\ngrads = []\nw = torch.ones(2, requires_grad=True)\n"
        "handle = w.register_hook(lambda g: grads.append(g.sum().item()))",
        "(w * 3).sum().backward()",
        "(w * 5).sum().backward()",
    )
    fp = "{'grads': grads, 'w': w.grad.tolist()}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_names_bound_under_time_magics(server, server_kernel, restore):
    # ``%time`` and ``%%time`` run their statement in the user namespace: the names it binds are
    # the notebook's, and its draws move the global generator.
    kid, pid = server_kernel
    cells = (
        "import torch\ntorch.manual_seed(4)",
        "%time x = torch.rand(2).tolist()",
        "%%time\ny = torch.rand(1).tolist()\nx.append(0.5)",
        "w = torch.rand(1).tolist()",
    )
    fp = "{'x': x, 'y': y, 'w': w}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_walrus_assignments_in_comprehensions(server, server_kernel, restore):
    # An assignment expression in a comprehension binds in the enclosing scope (PEP 572): the
    # cell's module namespace; ``any`` stops at the first hit.
    kid, pid = server_kernel
    cells = (
        "xs = [1, 4, 2, 7]\nlast = None",
        "doubled = [last := v * 2 for v in xs if v > 1]",
        "found = any((hit := v) > 3 for v in xs)",
    )
    fp = "{'last': last, 'doubled': doubled, 'found': found, 'hit': hit}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_an_augmented_assignment_that_changes_a_list_then_raises(server, server_kernel, restore):
    # ``t[0] += [v]`` extends the list in place, then fails to store it back into the tuple
    # (the Python FAQ's "a_tuple[i] += ['item'] raises an exception when the addition works").
    kid, pid = server_kernel
    cells = (
        "pair = ([1], 'tag')\nlog = pair[0]",
        "pair[0] += [2]",
        "n = len(log)",
    )
    fp = "{'pair': pair, 'log': log, 'n': n}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@restores("cfg")
def test_a_config_changed_by_setattr_with_computed_names(server, server_kernel, restore):
    # Overrides from a dict (a sweep, the command line) put onto a namespace config.
    kid, pid = server_kernel
    cells = (
        "import types\ncfg = types.SimpleNamespace(lr=0.1, bs=32, tag='base')\n"
        "overrides = {'lr': 0.01, 'bs': 64}",
        "for k, v in overrides.items():\n    setattr(cfg, k, v)",
        "vars(cfg).update(tag='sweep')",
        "steps = 1000 // cfg.bs",
    )
    fp = "{'cfg': vars(cfg), 'steps': steps}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@ALL
def test_a_script_run_by_percent_run_then_edited(server, server_kernel, restore):
    # ``%run utils6.py`` runs the file and binds its names in the notebook; a later cell edits
    # the file, so running it again in a new process binds the edited names.
    kid, pid = server_kernel
    cells = (
        "open('utils6.py', 'w').write('SCALE = 2\\nitems = [1, 2]\\n')",
        "%run utils6.py",
        "items.append(SCALE)",
        "open('utils6.py', 'w').write('SCALE = 5\\nitems = []\\n')",
    )
    fp = "{'SCALE': SCALE, 'items': items}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("vec", "net")
def test_parameters_written_from_a_flat_vector(server, server_kernel, restore):
    # torch.nn.utils.vector_to_parameters sets each parameter's ``.data`` to a view of the
    # vector: the parameters then share the vector's memory.
    kid, pid = server_kernel
    cells = (
        "import torch\nfrom torch.nn.utils import parameters_to_vector, vector_to_parameters\n"
        "torch.manual_seed(0)\nnet = torch.nn.Linear(2, 2)",
        "vec = parameters_to_vector(net.parameters()) * 0 + 1",
        "vector_to_parameters(vec, net.parameters())",
        "vec[0] = 7",
    )
    fp = (
        "{'net': [p.flatten().tolist() for p in net.parameters()], 'vec': vec.tolist(), "
        "'net.shared': net.weight.data_ptr() == vec.data_ptr()}"
    )
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore))


@restores("losses")
def test_a_count_of_a_restored_list_the_user_fixed(server, server_kernel, restore):
    # The user drops the bad value from the restored list before the replay: what the replayed
    # cells compute from it follows the fix (the plan must say so).
    kid, pid = server_kernel
    cells = (
        "losses = [0.9, 0.7, -1.0]  # -1: a logging bug",
        "n_epochs = len(losses)\nlast = float(losses[-1])",
    )
    out = run_case(
        server,
        kid,
        pid,
        cells,
        "{'losses': losses, 'n_epochs': n_epochs, 'last': last}",
        restore=restore,
        after=("losses.pop()",) if restore is not None else (),
    )
    assert_no_silent_difference(out)


@ALL
def test_early_stopping_decided_under_an_if(server, server_kernel, restore):
    # The patience counter and the stop flag are set under an ``if`` that reads the losses: their
    # values depend on the losses though no assignment reads them. A cell that appended a loss
    # then failed is not run again.
    kid, pid = server_kernel
    cells = (
        "losses = [0.5, 0.4]\nbest, bad = float('inf'), 0",
        "losses.append(0.45)\nraise RuntimeError('out of memory')",
        "for v in losses:\n    if v < best:\n        best, bad = v, 0\n    else:\n"
        "        bad += 1\nstop = False\nif bad >= 1:\n    stop = True",
    )
    fp = "{'losses': losses, 'best': best, 'bad': bad, 'stop': stop}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_an_early_stopper_stepped_with_the_last_loss(server, server_kernel, restore):
    # The stopper's method reads the loss it is handed: its state is computed from the history
    # though it holds no part of it. The cell that appended a loss then failed is not run again.
    kid, pid = server_kernel
    cells = (
        "hist = [0.5, 0.4]\nclass Stopper:\n    def __init__(self):\n"
        "        self.best, self.bad = float('inf'), 0\n    def step(self, v):\n"
        "        if v < self.best:\n            self.best, self.bad = v, 0\n        else:\n"
        "            self.bad += 1\nstopper = Stopper()",
        "hist.append(0.6)\nraise RuntimeError('CUDA out of memory')",
        "stopper.step(hist[-1])",
    )
    fp = "{'hist': hist, 'stopper': vars(stopper)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_function_that_sets_a_global_from_the_history(server, server_kernel, restore):
    # ``summarize`` reads the history as a global and assigns the mean: called after a cell that
    # appended to the history and then failed.
    kid, pid = server_kernel
    cells = (
        "hist = [0.5, 0.4]\nmean_loss = None\ndef summarize():\n    global mean_loss\n"
        "    mean_loss = sum(hist) / len(hist)",
        "hist.append(0.6)\nraise RuntimeError('CUDA out of memory')",
        "summarize()",
    )
    fp = "{'hist': hist, 'mean_loss': mean_loss}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_flag_set_in_a_try_that_reads_the_history(server, server_kernel, restore):
    # A notebook guards a computation with try/except: which branch ran depends on the history,
    # which lacks the append of a cell that then failed.
    kid, pid = server_kernel
    cells = (
        "hist = [0.5]",
        "hist.append(0.4)\nraise RuntimeError('CUDA out of memory')",
        "try:\n    gain = hist[-2] - hist[-1]\n    have_gain = True\nexcept IndexError:\n"
        "    gain, have_gain = 0.0, False",
    )
    fp = "{'hist': hist, 'gain': gain, 'have_gain': have_gain}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_class_counting_its_instances_and_a_failed_cell_that_made_one(
    server, server_kernel, restore
):
    # ``Model.instances += 1`` in ``__init__``: a cell that built a model and then failed counted
    # one more; the replay does not run it again.
    kid, pid = server_kernel
    cells = (
        "class Model:\n    instances = 0\n    def __init__(self):\n"
        "        Model.instances += 1\n        self.id = Model.instances\nm1 = Model()",
        "m2 = Model()\nraise RuntimeError('CUDA out of memory')",
        "n_models = Model.instances",
    )
    fp = "{'Model': Model.instances, 'n_models': n_models, 'm1': m1.id}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_what_notebook_functions_return_from_the_history(server, server_kernel, restore):
    # A metric function and a report class read the history as a global: what they return
    # follows it, and it lacks the append of a cell that then failed.
    kid, pid = server_kernel
    cells = (
        "hist = [0.5, 0.4]\ndef best_epoch():\n"
        "    return min(range(len(hist)), key=hist.__getitem__)\n"
        "class Report:\n    def __init__(self):\n        self.last = hist[-1]",
        "hist.append(0.3)\nraise RuntimeError('CUDA out of memory')",
        "best = best_epoch()\nreport = Report()",
    )
    fp = "{'hist': hist, 'best': best, 'report': vars(report)}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_walrus_targets_in_comprehensions_after_a_failed_append(server, server_kernel, restore):
    # The names bound by ``:=`` in a comprehension take the last item's value: the list lacks
    # the append of a cell that then failed.
    kid, pid = server_kernel
    cells = (
        "scores = [0.2, 0.9]",
        "scores.append(0.95)\nraise RuntimeError('CUDA out of memory')",
        "ranks = [last := round(s * 10) for s in scores]\n"
        "found = any((hit := s) > 0.5 for s in scores)",
    )
    fp = "{'scores': scores, 'ranks': ranks, 'last': last, 'found': found, 'hit': hit}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_metrics_defined_as_lambdas(server, server_kernel, restore):
    # ``acc = lambda: ...`` reads the predictions as globals; ``log`` appends to a list: called
    # after a cell that appended a prediction and then failed.
    kid, pid = server_kernel
    cells = (
        "preds, labels = [1, 0], [1, 1]\nseen = []\n"
        "acc = lambda: sum(p == y for p, y in zip(preds, labels)) / len(preds)\n"
        "log = lambda v: seen.append(round(v, 4))",
        "preds.append(1)\nlabels.append(1)\nraise RuntimeError('CUDA out of memory')",
        "score = acc()\nlog(score)",
    )
    fp = "{'preds': preds, 'labels': labels, 'score': score, 'seen': seen}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_cfg_class_and_a_counter_bumped_in_a_comprehension(server, server_kernel, restore):
    # Kaggle's ``class CFG:`` computes its attributes when the class is made; a function that
    # counts with ``global`` is called once per item of a comprehension.
    kid, pid = server_kernel
    cells = (
        "classes = ['cat', 'dog']\nn_seen = 0\ndef see(c):\n    global n_seen\n"
        "    n_seen += 1\n    return c.upper()",
        "classes.append('bird')\nraise RuntimeError('CUDA out of memory')",
        "class CFG:\n    num_classes = len(classes)\n    lr = 1e-3\n"
        "names = [see(c) for c in classes]",
    )
    fp = "{'classes': classes, 'CFG': CFG.num_classes, 'n_seen': n_seen, 'names': names}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))
