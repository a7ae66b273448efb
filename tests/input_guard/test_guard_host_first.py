"""Host memory's shortcut, the CPU op run first and the rules only when it raises: only where the
CPU kernel rejects every value its CUDA kernel asserts on (``ops.CPU_CHECKS``), never for a
random op (it would draw first), never past the size line (it would compute for long first)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard import judge, ops

pytestmark = pytest.mark.usefixtures("cpu_op_first")

# Values the CPU op takes but the CUDA kernel asserts on (EmbeddingBag.cu: end >= begin).
CPU_TAKES_CUDA_ASSERTS = {
    "embedding_bag offsets [0, 3, 1], mode=max": lambda: F.embedding_bag(
        torch.tensor([0, 1, 2, 3]), torch.randn(5, 2), torch.tensor([0, 3, 1]), mode="max"
    ),
    "embedding_bag offsets [0, -1], include_last_offset": lambda: F.embedding_bag(
        torch.tensor([0, 1]),
        torch.randn(5, 2),
        torch.tensor([0, -1]),
        include_last_offset=True,
    ),
    # found by the OpInfo oracle: a difference of offsets overflowed, a comparison does not
    "embedding_bag offsets [0, 3, int64 min], include_last_offset": lambda: F.embedding_bag(
        torch.tensor([0, 1, 1, 0, 1, 4]),
        torch.randn(5, 2, dtype=torch.float64),
        torch.tensor([0, 3, -(2**63)]),
        include_last_offset=True,
    ),
    "torch.embedding_bag offsets [0, 2, 1], mode=max": lambda: torch.embedding_bag(
        torch.randn(5, 2), torch.tensor([0, 1, 2]), torch.tensor([0, 2, 1]), mode=2
    ),
}


@pytest.mark.parametrize("call", CPU_TAKES_CUDA_ASSERTS.values(), ids=CPU_TAKES_CUDA_ASSERTS.keys())
@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_values_only_the_cuda_kernel_refuses_are_refused_on_host_memory(
    call: Any, mode: str
) -> None:
    call()  # the CPU op takes them
    with pytest.raises(GuardError, match="offsets out of order"), guard(mode=mode):
        call()


def test_every_op_names_the_requirements_it_states() -> None:
    # the shortcut's list is read against these: an op that could state a requirement its
    # `states` omits would let the CPU op first past it
    cases = {
        "embedding_bag": (
            (torch.tensor([0, 9]), torch.randn(5, 2), torch.tensor([0, 3])),
            {"input", "offsets"},
        ),
        "cross_entropy": ((torch.randn(2, 3), torch.tensor([0, 3])), {"target"}),
        "binary_cross_entropy": ((torch.rand(2), torch.rand(2)), {"input", "target"}),
        "getitem": ((torch.randn(3, 3), (torch.tensor([0]), torch.tensor([1]))), {"index"}),
    }
    by_name: dict[str, ops.OpCheck] = {}
    for check in ops.CHECKS:
        by_name.setdefault(check.name, check)  # the outer entry point (F.x, not torch.x)
    for name, (args, expected) in cases.items():
        found = {r.argument.split()[0] for r in by_name[name].extract(args, {})}
        assert found == expected <= by_name[name].states, name


def test_the_shortcut_list_covers_only_requirements_the_ops_state() -> None:
    for check in ops.CHECKS:
        assert check.cpu_checks <= check.states, check.name
    shortcut = {c.name for c in ops.CHECKS if c.cpu_rejects}
    assert "embedding_bag" not in shortcut and "ctc_loss" not in shortcut
    assert not shortcut & {"bernoulli", "multinomial", "poisson"}


RANDOM_BAD = {
    "bernoulli": lambda: torch.bernoulli(torch.tensor([0.5, 1.5])),
    "Tensor.bernoulli_": lambda: torch.zeros(3).bernoulli_(torch.tensor([0.5, 0.5, -1.0])),
    "multinomial": lambda: torch.multinomial(torch.tensor([[0.5, -0.5], [0.2, 0.8]]), 1),
    "multinomial zero row": lambda: torch.multinomial(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), 2),
    "poisson": lambda: torch.poisson(torch.tensor([1.0, -2.0])),
}


@pytest.mark.parametrize("call", RANDOM_BAD.values(), ids=RANDOM_BAD.keys())
@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_refused_random_call_draws_no_random_number(call: Any, mode: str) -> None:
    torch.manual_seed(7)
    before = torch.get_rng_state()
    with pytest.raises(GuardError), guard(mode=mode):
        call()
    assert torch.equal(torch.get_rng_state(), before)


def test_a_valid_random_call_draws_as_without_the_guard() -> None:
    probs = torch.rand(4, 5)
    torch.manual_seed(3)
    bare = torch.multinomial(probs, 2), torch.bernoulli(probs)
    torch.manual_seed(3)
    with guard():
        guarded = torch.multinomial(probs, 2), torch.bernoulli(probs)
    assert all(torch.equal(b, g) for b, g in zip(bare, guarded, strict=True))


def aten_ops(call: Any) -> list[str]:
    """The aten ops a call ran (PyTorch's profiler), whatever it raised."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, contextlib.suppress(GuardError):
        call()
    return [event.name for event in prof.events()]


def test_past_the_size_line_the_op_never_runs_before_its_bad_call_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logits, labels = torch.randn(64, 32), torch.full((64,), 40)  # 2048 elements

    def bad_call() -> None:
        with guard():
            F.cross_entropy(logits, labels)

    assert "aten::_log_softmax" in aten_ops(bad_call)  # below the line: the CPU op first
    monkeypatch.setattr(judge, "HOST_FIRST_LINE", 1000)  # stands in for 8192 x 32000
    assert "aten::_log_softmax" not in aten_ops(bad_call)


def test_a_large_bad_cross_entropy_is_refused_in_milliseconds() -> None:
    logits = torch.zeros(1024, 32000)  # 32.8 M elements, 131 MB: past the line
    labels = torch.zeros(1024, dtype=torch.long)
    labels[5] = 32000
    start = time.perf_counter()
    with pytest.raises(GuardError), guard():
        F.cross_entropy(logits, labels)
    refused = time.perf_counter() - start
    start = time.perf_counter()
    with pytest.raises(IndexError):
        F.cross_entropy(logits, labels)
    bare = time.perf_counter() - start
    assert refused < bare / 5, (refused, bare)
