"""What a GuardError says: the op, the argument, the values and positions, the valid range and
where it comes from, the user's line, and a fix."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nb_cudaguard import GuardError, guard


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(30, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids))


model = Model()  # module level, as in a notebook's namespace


def message(call: object) -> str:
    with guard(), pytest.raises(GuardError) as caught:
        call()  # type: ignore[operator]
    return str(caught.value)


def test_names_the_op_and_the_argument() -> None:
    text = message(lambda: F.cross_entropy(torch.randn(2, 5), torch.tensor([1, 5])))
    assert text.startswith("F.cross_entropy: class index out of range in target")


def test_shows_the_offending_value_and_its_position() -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    ids[1, 2] = 31
    text = message(lambda: model(ids))
    assert "31 at [1, 2]" in text


def test_counts_the_offending_values() -> None:
    text = message(lambda: F.embedding(torch.tensor([30, 31, 1, 40]), torch.randn(30, 2)))
    assert "3 bad values" in text


def test_names_the_module_the_bound_comes_from() -> None:
    text = message(lambda: model(torch.tensor([[3, 30]])))
    assert "nn.Embedding(30, 8) at model.encoder.word_embeddings" in text


def test_states_the_valid_range_with_ignore_index() -> None:
    text = message(lambda: F.cross_entropy(torch.randn(2, 5), torch.tensor([-1, 0])))
    assert "0 <= value < 5, or == ignore_index (-100)" in text
    assert "input.shape[1] = 5, the number of classes" in text


def test_names_the_users_line() -> None:
    text = message(lambda: model(torch.tensor([99])))
    assert "test_guard_messages.py, line" in text and "model(torch.tensor([99]))" in text


def test_bce_outside_zero_one_suggests_bce_with_logits() -> None:
    text = message(lambda: nn.BCELoss()(torch.tensor([3.0]), torch.tensor([1.0])))
    assert "BCEWithLogitsLoss" in text


def test_says_the_context_is_still_healthy() -> None:
    text = message(lambda: torch.randn(3)[torch.tensor([3])])
    assert "CUDA context is healthy" in text


def test_names_the_rank_of_a_distributed_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    text = message(lambda: torch.randn(3)[torch.tensor([3])])
    assert text.startswith("x[index] [rank 3]:")


def test_the_error_carries_the_structured_violation() -> None:
    with guard(), pytest.raises(GuardError) as caught:
        torch.randn(3, 4).gather(1, torch.tensor([[4]]))
    found = caught.value.violation.finding
    assert (found.argument, found.count, found.samples) == ("index", 1, (("[0, 0]", "4"),))


def test_multinomial_zero_row_is_named_as_such() -> None:
    text = message(lambda: torch.multinomial(torch.tensor([[1.0, 1.0], [0.0, 0.0]]), 1))
    assert "a row of probabilities sums to 0" in text and "row [1]" in text


class Config:
    num_labels = 3
    vocab_size = 30


class WithConfig(Model):
    def __init__(self) -> None:
        super().__init__()
        self.config = Config()


configured = WithConfig()


def test_a_loss_message_names_the_classifier_and_num_labels() -> None:
    text = message(
        lambda: F.cross_entropy(configured(torch.tensor([[1, 2]])).mean(1), torch.tensor([5]))
    )
    assert "the classifier nn.Linear(in_features=8, out_features=3, bias=True) at " in text
    assert "configured.head; config.num_labels = 3" in text


def test_a_deferred_loss_message_names_the_classifier_too() -> None:
    with pytest.raises(GuardError) as caught, guard(mode="deferred"):
        F.cross_entropy(model(torch.tensor([[1, 2]])).mean(1), torch.tensor([5]))
    text = str(caught.value)
    assert "the classifier nn.Linear(in_features=8, out_features=3, bias=True) at " in text
