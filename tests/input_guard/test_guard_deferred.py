"""guard(mode="deferred"): no read-back per checked call, the call runs on safe values, and the
first violation is raised before the next optimizer step, at .item(), or when the block ends.

On CPU, as on a GPU: the op never completes on an offending value (it would raise its own error),
which is what proves that the launch was made safe. These tests run the device path: verdicts
left on the device as summaries (what CUDA tensors get, forced here on CPU tensors). Tensors in
host memory have nothing to defer: there a violation is raised at the call, as the CPU op raises
its own error there (the last tests, on both host paths).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard import deferral, judge
from nb_cudaguard.input_guard.deferral import MAX_PENDING, pending
from nb_cudaguard.input_guard.errors import GuardIndexError
from nb_cudaguard.input_guard.judge import STATS


@pytest.fixture(autouse=True)
def path(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, guard_checks_first: None
) -> str:
    """The device path unless a test asks for a host one (``host_path``)."""
    chosen = getattr(request, "param", "device")
    monkeypatch.setattr(judge, "TRUST_HOST_OPS", chosen == "cpu op first")
    monkeypatch.setattr(deferral, "HOST_VERDICTS_AT_ONCE", chosen != "device")
    return "host" if chosen != "device" else "device"


host_paths = pytest.mark.parametrize("path", ["cpu op first", "host"], indirect=True)


def deferred(**options: object) -> object:
    return guard(mode="deferred", **options)  # type: ignore[arg-type]


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


def batches(bad_step: int, bad_labels: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    out = []
    for step in range(4):
        ids, labels = torch.randint(0, 20, (4, 5)), torch.randint(0, 3, (4,))
        if step == bad_step:
            if bad_labels:
                labels[2] = 3  # one class too many
            else:
                ids[1, 4] = 20  # one token id too many
        out.append((ids, labels))
    return out


def train(model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[dict]:
    """Runs the loop; returns the weights after each completed step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    states = []
    for ids, labels in data:
        loss = F.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


@pytest.mark.parametrize("bad_labels", [True, False], ids=["label", "token id"])
def test_a_bad_batch_raises_before_its_optimizer_step(bad_labels: bool) -> None:
    torch.manual_seed(0)
    model = Classifier()
    data = batches(bad_step=2, bad_labels=bad_labels)
    completed: list[dict] = []
    with pytest.raises(GuardError) as caught, deferred():
        completed = train(model, data[:2])  # steps 0 and 1: fine
        train_step_2 = data[2]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        loss = F.cross_entropy(model(train_step_2[0]), train_step_2[1])
        loss.backward()
        optimizer.step()  # the pre-hook reads the verdicts here and raises
    after_two = completed[-1]
    assert all(torch.equal(model.state_dict()[k], after_two[k]) for k in after_two)
    assert isinstance(caught.value, IndexError)  # as the CPU op would have raised
    assert "Valid:" in str(caught.value) and "No optimizer step has run" in str(caught.value)


def test_the_weights_after_a_rejected_step_equal_those_of_the_step_before() -> None:
    torch.manual_seed(0)
    guarded_model = Classifier()
    torch.manual_seed(0)
    reference = Classifier()
    data = batches(bad_step=1)
    expected = train(reference, data[:1])[-1]
    with pytest.raises(GuardError), deferred():
        train(guarded_model, data)
    assert all(torch.equal(guarded_model.state_dict()[k], expected[k]) for k in expected)


def test_valid_batches_train_exactly_as_without_the_guard() -> None:
    torch.manual_seed(0)
    bare_model = Classifier()
    torch.manual_seed(0)
    guarded_model = Classifier()
    data = batches(bad_step=-1)
    data[0][1][0] = -100  # an ignored label stays ignored
    bare = train(bare_model, data)
    with deferred():
        guarded = train(guarded_model, data)
    for b, g in zip(bare, guarded, strict=True):
        assert all(torch.equal(b[k], g[k]) for k in b)


def test_the_bad_call_runs_on_safe_values_and_the_error_comes_at_block_end() -> None:
    weight = torch.arange(12.0).reshape(4, 3)
    with pytest.raises(GuardIndexError) as caught, deferred():
        out = F.embedding(torch.tensor([1, 7]), weight)  # the bare CPU op raises IndexError
        reached = True
    assert reached
    assert torch.equal(out[0], weight[1])  # valid ids are looked up as usual
    message = str(caught.value)
    assert "7 at [1]" in message and "0 <= value < 4" in message


def test_the_verdict_is_read_where_the_code_synchronises_anyway() -> None:
    logits = torch.randn(3, 4)
    with deferred():
        loss = F.cross_entropy(logits, torch.tensor([0, 9, 1]))
        assert pending() == 1
        with pytest.raises(GuardIndexError, match="9 at \\[1\\]"):
            loss.item()
        assert pending() == 0


def test_no_read_back_per_checked_call() -> None:
    STATS.clear()
    emb = nn.Embedding(10, 2)
    with deferred():
        for _ in range(5):
            emb(torch.tensor([1, 2]))
        assert STATS["transfers"] == 0
        assert pending() == 5
    assert STATS["transfers"] == 1  # one read for all five


def test_a_loop_that_never_synchronises_is_read_every_max_pending_calls() -> None:
    emb = nn.Embedding(10, 2)
    calls = 0
    with pytest.raises(GuardIndexError, match="10 at \\[0\\]"), deferred():
        for step in range(MAX_PENDING + 3):
            emb(torch.tensor([10 if step == 0 else 1]))  # only the first call is bad
            calls += 1
    # every call leaves a verdict, read when MAX_PENDING wait (inside the last call)
    assert calls == MAX_PENDING - 1


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.randn(3, 4).gather(1, torch.tensor([[4], [0], [-1]])),
        lambda: torch.randn(3, 4).index_select(0, torch.tensor([3])),
        lambda: torch.zeros(3).index_add_(0, torch.tensor([5]), torch.ones(1)),
        lambda: torch.randn(3, 4)[torch.tensor([0, 3])],
        lambda: torch.randn(3, 4)[:, [1, 4]],
        lambda: torch.randn(3, 4)[[0, 1], torch.tensor([2, -5])],
        lambda: torch.zeros(3, 4).__setitem__((torch.tensor([3]),), 1.0),
        lambda: torch.zeros(3, 4).index_put_((torch.tensor([7]),), torch.ones(4)),
        lambda: torch.arange(6).take(torch.tensor([6])),
        lambda: F.nll_loss(torch.randn(2, 3, 2, 2), torch.full((2, 2, 2), 3)),
        lambda: F.multi_margin_loss(torch.randn(2, 3), torch.tensor([0, 3])),
        lambda: F.binary_cross_entropy(torch.tensor([0.5, 1.5]), torch.ones(2)),
        lambda: F.binary_cross_entropy(torch.tensor([0.5]), torch.tensor([float("nan")])),
        lambda: torch.multinomial(torch.tensor([0.5, float("nan")]), 1),
        lambda: torch.multinomial(torch.tensor([[0.0, 0.0], [0.5, 0.5]]), 1),
        lambda: torch.bernoulli(torch.tensor([0.5, -0.1])),
        lambda: torch.poisson(torch.tensor([1.0, -2.0])),
        lambda: F.one_hot(torch.tensor([0, 5]), 3),
        lambda: torch.repeat_interleave(torch.tensor([1, -1])),
        lambda: torch.repeat_interleave(torch.tensor([1, 2]), output_size=4),
        lambda: F.max_unpool1d(torch.randn(1, 1, 2), torch.tensor([[[0, 4]]]), 2),
        lambda: F.embedding_bag(torch.tensor([1, 2, 3]), torch.randn(5, 2), torch.tensor([1])),
    ],
)
def test_no_offending_value_reaches_the_op(call: object) -> None:
    # The bare CPU op raises for each of these; under the deferred guard it must not, and the
    # guard's own error comes at the end with the CPU op's class.
    with pytest.raises(Exception) as bare:
        call()  # type: ignore[operator]
    with pytest.raises(GuardError) as caught, deferred():
        call()  # type: ignore[operator]
        ran_through = True
    assert ran_through
    assert isinstance(caught.value, type(bare.value))


def test_an_error_the_bad_values_caused_later_is_reported_as_the_violation() -> None:
    with pytest.raises(GuardError) as caught, deferred():
        F.embedding(torch.tensor([9]), torch.randn(4, 2))
        raise ValueError("downstream of garbage")
    assert isinstance(caught.value.__context__, ValueError)


def test_ctrl_c_in_a_deferred_block_drops_the_pending_verdicts() -> None:
    with pytest.raises(KeyboardInterrupt), deferred():
        F.embedding(torch.tensor([9]), torch.randn(4, 2))
        raise KeyboardInterrupt
    assert pending() == 0


def test_the_optimizer_hook_is_removed_when_the_block_ends() -> None:
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    before = len(_global_optimizer_pre_hooks)
    with deferred():
        assert len(_global_optimizer_pre_hooks) == before + 1
        with deferred():
            assert len(_global_optimizer_pre_hooks) == before + 1
    assert len(_global_optimizer_pre_hooks) == before


def test_a_strict_block_inside_a_deferred_one_raises_at_once() -> None:
    with deferred():
        with pytest.raises(GuardIndexError), guard():
            F.embedding(torch.tensor([9]), torch.randn(4, 2))
        assert pending() == 0


def test_a_tensor_changed_in_place_after_the_call_is_said_so() -> None:
    labels = torch.tensor([0, 7])
    with pytest.raises(GuardError) as caught, deferred():
        F.cross_entropy(torch.randn(2, 3), labels)
        labels[1] = 1  # the buffer is reused before the verdict is read
    assert "modified in place" in str(caught.value)


def test_a_call_under_inference_mode_is_checked_too() -> None:
    # tensors made under torch.inference_mode() have no version counter: asking for it raised
    # inside the guard, which then let the call through unchecked (a device-side assert on a GPU)
    STATS.clear()
    weight = torch.arange(12.0).reshape(4, 3)
    with pytest.raises(GuardIndexError, match="0 <= value < 4"), deferred():
        with torch.inference_mode():
            out = F.embedding(torch.tensor([1, 7]), weight)
        assert torch.equal(out[0], weight[1])
    with pytest.raises(GuardError, match="class index"), deferred(), torch.inference_mode():
        F.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3]))
    with deferred(), torch.inference_mode():
        loss = F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, -100]))
    assert loss.item() == pytest.approx(math.log(3))
    assert STATS["check_failed"] == 0


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode"):
        guard(mode="lazy")


# --- host memory: nothing to defer ----------------------------------------------------------------
@host_paths
def test_on_host_memory_a_violation_is_raised_at_the_call_as_the_cpu_op_raises_it() -> None:
    weight = torch.randn(4, 2)
    with deferred():
        try:  # code that handles the CPU op's own error (PyTorch Geometric does) still does
            F.embedding(torch.tensor([1, 7]), weight)
            handled = False
        except IndexError as error:
            handled = isinstance(error, GuardError)
        assert handled
        assert pending() == 0
        assert F.embedding(torch.tensor([1, 3]), weight).shape == (2, 2)


@host_paths
def test_on_host_memory_no_verdict_is_left_to_read() -> None:
    STATS.clear()
    emb = nn.Embedding(10, 2)
    with deferred():
        for _ in range(5):
            emb(torch.tensor([1, 2]))
        assert pending() == 0
    assert STATS["transfers"] == 0


@host_paths
def test_on_host_memory_the_error_quotes_pytorchs_own_words() -> None:
    count = torch.zeros(1)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 0 with size 1"), deferred():
        count.scatter_add_(0, torch.tensor([0, 1]), torch.ones(2))  # as PyG's degree() calls it
    assert not count.any()
