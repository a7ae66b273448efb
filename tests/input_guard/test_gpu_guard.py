"""On a real GPU: a caught violation leaves the CUDA context healthy; the same input unguarded
poisons it. Each case runs in a fresh process, because a poisoned context never recovers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import kernel_env

pytestmark = pytest.mark.gpu

# Each op gets bad inputs that only the device can catch (no host-side check on CUDA).
CASES = {
    "embedding": "F.embedding(torch.tensor([3, 10], device=dev), torch.randn(10, 4, device=dev))",
    "cross_entropy": (
        "F.cross_entropy(torch.randn(4, 5, device=dev), torch.tensor([0, 1, 5, 2], device=dev))"
    ),
    "nll_loss_2d": (
        "F.nll_loss(torch.randn(1, 3, 2, 2, device=dev), torch.full((1, 2, 2), 3, device=dev))"
    ),
    "gather": "torch.randn(3, 4, device=dev).gather(1, torch.tensor([[4]], device=dev))",
    "index_select": "torch.randn(3, 4, device=dev).index_select(0, torch.tensor([3], device=dev))",
    "getitem": "torch.randn(3, 4, device=dev)[torch.tensor([0, 7], device=dev)]",
    "binary_cross_entropy": (
        "F.binary_cross_entropy(torch.tensor([1.5], device=dev), torch.ones(1, device=dev))"
    ),
    "multinomial": ("torch.multinomial(torch.tensor([0.5, float('nan')], device=dev), 1)"),
    "ctc_loss": (
        "F.ctc_loss(torch.randn(6, 1, 5, device=dev).log_softmax(2), "
        "torch.tensor([[1, 999]], device=dev), (6,), (2,))"
    ),
}

SCRIPT = """
import torch, torch.nn.functional as F
import nb_cudaguard
dev = "cuda"
torch.ones(1, device=dev).sum().item()  # create the context first
guarded = {guarded}
try:
    if guarded:
        with nb_cudaguard.guard():
            {op}
    else:
        {op}
    torch.cuda.synchronize()
    print("RAISED: nothing")
except nb_cudaguard.GuardError:
    print("RAISED: GuardError")
except Exception as error:
    print("RAISED:", type(error).__name__, str(error).splitlines()[0])
try:
    print("AFTER:", torch.arange(3, device=dev).sum().item())
except Exception as error:
    print("AFTER: failed", str(error).splitlines()[0])
"""


def run(op: str, guarded: bool) -> str:
    code = textwrap.dedent(SCRIPT).format(op=op, guarded=guarded)
    done = subprocess.run(
        [sys.executable, "-c", code], env=kernel_env(), capture_output=True, text=True, timeout=180
    )
    return done.stdout


@pytest.mark.parametrize("name", list(CASES))
def test_a_caught_violation_leaves_the_cuda_context_healthy(name: str) -> None:
    out = run(CASES[name], guarded=True)
    assert "RAISED: GuardError" in out and "AFTER: 3" in out, out


@pytest.mark.parametrize("name", [n for n in CASES if n != "ctc_loss"])
def test_without_the_guard_the_same_input_poisons_the_context(name: str) -> None:
    out = run(CASES[name], guarded=False)
    assert "AFTER: failed" in out, out


def test_without_the_guard_a_bad_ctc_target_breaks_the_context_or_the_result() -> None:
    # CUDA does not check CTC targets: an out-of-range read may fault or return garbage
    out = run(CASES["ctc_loss"], guarded=False)
    assert "RAISED: GuardError" not in out, out


DEFERRED_SCRIPT = """
import torch, torch.nn.functional as F
import nb_cudaguard
from nb_cudaguard.input_guard.judge import STATS
dev = "cuda"
torch.manual_seed(0)
emb = torch.nn.Embedding(10, 4).to(dev)
head = torch.nn.Linear(4, 3).to(dev)
params = [*emb.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=0.1)
before = [p.detach().clone() for p in params]
ids = torch.tensor([[1, 2], [3, {bad_id}]], device=dev)
labels = torch.tensor([0, {bad_label}], device=dev)
try:
    with nb_cudaguard.guard(mode="deferred"):
        loss = F.cross_entropy(head(emb(ids).mean(1)), labels)
        loss.backward()
        print("TRANSFERS BEFORE STEP:", STATS["transfers"])
        opt.step()
    print("RAISED: nothing")
except nb_cudaguard.GuardError as error:
    print("RAISED: GuardError", str(error).splitlines()[0])
except Exception as error:
    print("RAISED:", type(error).__name__, str(error).splitlines()[0])
torch.cuda.synchronize()
print("UNCHANGED:", all(torch.equal(a, b) for a, b in zip(before, params)))
print("AFTER:", torch.arange(3, device=dev).sum().item())
"""


@pytest.mark.parametrize(("bad_id", "bad_label"), [(10, 1), (4, 3)], ids=["token id", "label"])
def test_a_deferred_violation_on_cuda_raises_before_the_step_and_keeps_the_context(
    bad_id: int, bad_label: int
) -> None:
    code = textwrap.dedent(DEFERRED_SCRIPT).format(bad_id=bad_id, bad_label=bad_label)
    done = subprocess.run(
        [sys.executable, "-c", code], env=kernel_env(), capture_output=True, text=True, timeout=180
    )
    out = done.stdout
    assert "TRANSFERS BEFORE STEP: 0" in out, out + done.stderr  # no sync per checked call
    assert "RAISED: GuardError" in out, out + done.stderr
    assert "UNCHANGED: True" in out and "AFTER: 3" in out, out + done.stderr


BEHIND_SCRIPT = """
import time, torch
import nb_cudaguard
from nb_cudaguard.input_guard import deferral
dev = "cuda"
torch.manual_seed(0)
emb = torch.nn.Embedding(10, 4).to(dev)
opt = torch.optim.SGD(emb.parameters(), lr=0.1)
torch.cuda.synchronize()
# Once, as a first read in a process does: the reads' kernels loaded (CUDA's lazy loading), the
# side stream made and its first memory allocated (a device allocation is one of the operations
# that synchronise streams: CUDA C++ Programming Guide, "Implicit Synchronization"). On the H200 a
# first read behind the queue waited for the 0.5 s queued before it, so neither read is timed
# before both ran once.
for marking in (False, True):
    deferral._STATE.marking = marking
    with nb_cudaguard.guard(mode="deferred"):
        emb(torch.tensor([1], device=dev)).sum().backward()
        opt.step()
    torch.cuda.synchronize()
deferral._STATE.marking = False


def step(name, bad_id, queued):
    start = time.perf_counter()
    try:
        with nb_cudaguard.guard(mode="deferred"):
            emb(torch.tensor([1, bad_id], device=dev)).sum().backward()
            if queued:
                torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU work queued after the check
            else:
                torch.cuda.synchronize()  # the GPU keeps up with the host
            start = time.perf_counter()
            opt.step()
        outcome = "STEP"
    except nb_cudaguard.GuardError:
        outcome = "RAISED"
    waited = time.perf_counter() - start
    torch.cuda.synchronize()
    print(name, outcome, round(waited, 3), "marking" if deferral._STATE.marking else "plain")


step("first", 3, queued=True)  # a plain read: it waits, and the marks turn on
step("behind", 3, queued=True)  # the read behind the queue
step("bad", 10, queued=True)  # a violation is still raised
step("idle", 3, queued=False)  # a read behind that found nothing queued: the marks turn off
step("again", 3, queued=True)
deferral.READ_BEHIND = False
step("off", 3, queued=True)
step("off again", 3, queued=True)
print("AFTER:", torch.arange(3, device=dev).sum().item())
"""


def test_the_deferred_verdicts_are_read_without_waiting_for_the_work_queued_after_them() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BEHIND_SCRIPT)],
        env=kernel_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout
    steps = {
        words[0].replace("_", " "): (words[1], float(words[2]), words[3])
        for words in (line.replace("off again", "off_again").split() for line in out.splitlines())
        if len(words) == 4
    }
    assert set(steps) == {"first", "behind", "bad", "idle", "again", "off", "off again"}, (
        out + done.stderr
    )
    assert [outcome for outcome, _, _ in steps.values()].count("RAISED") == 1, out
    assert steps["bad"][0] == "RAISED", out
    # marks cost a little on every call: a thread starts without them, and a plain read that
    # waited for the GPU (0.5 s queued after the check) turns them on
    assert steps["first"][1] > 0.3 and steps["first"][2] == "marking", out
    # behind the queue: the step waits for the embedding's summary, not the 0.5 s after it
    assert steps["behind"][1] < 0.1 and steps["behind"][2] == "marking", out
    # a read behind that found the stream idle turns them off: the next read is plain again
    assert steps["idle"][2] == "plain" and steps["again"][1] > 0.3, out
    # READ_BEHIND off: every read waits for the whole stream
    assert steps["off"][1] > 0.3 and steps["off again"][1] > 0.3, out
    assert "AFTER: 3" in out, out + done.stderr
