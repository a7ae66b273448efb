"""What a GuardError says: the op, the argument, the values and positions, the valid range and
where it comes from, the user's line, and a fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


USER_CODE = """
import torch
from nb_cudaguard import GuardError, guard

table = torch.nn.Embedding(30, 8)


def lookup(ids):
    return table(ids)


def message():
    try:
        with guard():
            lookup(torch.tensor([99]))
    except GuardError as error:
        return str(error)
"""


def test_code_without_source_is_not_named_as_where_the_call_came_from(tmp_path: Path) -> None:
    # `python -c`, or a test runner's worker (pytest-xdist over execnet), starts in exec'd
    # "<string>" code that no message can quote: the outermost line with source is the user's
    (tmp_path / "user_code.py").write_text(USER_CODE)
    done = subprocess.run(
        [sys.executable, "-c", "import user_code; print(user_code.message())"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = done.stdout
    assert "your line: " in text and "return table(ids)" in text, text + done.stderr
    assert "<string>" not in text, text
    assert "reached from: " in text and "lookup(torch.tensor([99]))" in text, text


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


# --- the classifier: one finder for the guard's message and the panel's evidence --------------
class Segmenter(nn.Module):
    """A segmentation net as torchvision builds one: 1x1 convolutions inside the backbone, and
    a 1x1 convolution as the per-pixel classifier (no Linear anywhere)."""

    def __init__(self, classes: int = 21) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 1))
        self.classifier = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, classes, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.backbone(images))


def void_masks(classes: int = 21) -> torch.Tensor:
    masks = torch.randint(0, classes, (2, 4, 4))
    masks[:, 0, :] = 255  # an object border: "void" pixels
    return masks


def test_a_segmentation_loss_names_the_1x1_convolution_head_and_hints_ignore_index_255() -> None:
    segmenter = Segmenter()
    masks = void_masks()
    text = message(lambda: F.cross_entropy(segmenter(torch.randn(2, 3, 4, 4)), masks))
    assert "the classifier nn.Conv2d(16, 21, kernel_size=(1, 1), stride=(1, 1)) at " in text
    assert "segmenter.classifier.1 (input.shape[1] = 21" in text
    assert "How to fix it\n  255 is the label segmentation masks give 'void' pixels" in text
    assert "`nn.CrossEntropyLoss(ignore_index=255)`" in text


def test_a_deferred_segmentation_loss_hints_ignore_index_255_too() -> None:
    segmenter = Segmenter()
    with pytest.raises(GuardError) as caught, guard(mode="deferred"):
        F.nll_loss(segmenter(torch.randn(2, 3, 4, 4)).log_softmax(1), void_masks())
    assert "`nn.CrossEntropyLoss(ignore_index=255)`" in str(caught.value)


def test_no_255_hint_where_255_is_not_among_the_bad_labels() -> None:
    text = message(lambda: F.cross_entropy(torch.randn(2, 300), torch.tensor([255, 300])))
    assert "300 at [1]" in text and "255" not in text.split("How to fix it")[1]
    masks = void_masks()
    masks[1, 1, 1] = 21
    text = message(lambda: F.cross_entropy(torch.randn(2, 21, 4, 4), masks, ignore_index=255))
    assert "21 at [1, 1, 1]" in text and "255" not in text.split("How to fix it")[1]


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.fc = nn.Linear(8, 7)  # ImageNet-style head, replaced in use by the model's own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class FineTuned(nn.Module):
    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(8, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def _segmentation() -> tuple[dict[str, object], str]:
    return {"model": Segmenter(), "masks": void_masks()}, "F.cross_entropy(model(x), masks)"


def _fine_tuned() -> tuple[dict[str, object], str]:
    backbone = Backbone()
    labels = torch.tensor([1, 7])
    return {"backbone": backbone, "model": FineTuned(backbone), "labels": labels}, (
        "F.cross_entropy(model(x), labels)"
    )


@pytest.mark.parametrize(
    ("case", "inputs", "head"),
    [
        (_segmentation, torch.randn(2, 3, 4, 4), "model.classifier.1"),
        (_fine_tuned, torch.randn(2, 4), "model.head"),
    ],
    ids=["1x1-convolution-head", "model-built-on-a-backbone"],
)
def test_the_guard_and_the_panel_name_the_same_classifier(
    case: object, inputs: torch.Tensor, head: str
) -> None:
    from pytorch_texts import H100_TORCH_2_11, HEADLINE

    from nb_cudaguard import diagnose

    namespace, call = case()  # type: ignore[operator]
    namespace.update(F=F, x=inputs)
    with guard(), pytest.raises(GuardError) as caught:
        exec(call, namespace)  # the namespace a notebook's cell runs in
    owner = caught.value.violation.owner or ""
    panel = diagnose(
        HEADLINE,
        device_output=H100_TORCH_2_11["segmentation-void-255"][0],
        namespace=namespace,
    )
    assert panel is not None
    assert f"the classifier `{head}` has" in panel.evidence[0]
    assert owner.startswith("the classifier ") and owner.endswith(f" at {head}")
