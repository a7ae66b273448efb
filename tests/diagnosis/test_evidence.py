"""Evidence read from real modules, configs, tokenizers and CPU tensors; never from CUDA memory."""

from __future__ import annotations

import warnings
from collections import UserDict
from dataclasses import dataclass

import pytest
import torch
from pytorch_texts import HEADLINE
from torch import nn

from nb_cudaguard import diagnose


def device_line(file: str, cond: str) -> str:
    return (
        f"/pytorch/aten/src/ATen/native/cuda/{file}:250: kernel: block: [0,0,0], "
        f"thread: [5,0,0] Assertion `{cond}` failed."
    )


NLL = device_line("Loss.cu", "t >= 0 && t < n_classes")
INDEX_SELECT = device_line(
    "IndexKernelUtils.cu",
    'ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"',
)
BCE = device_line("Loss.cu", "input_val >= zero && input_val <= one")
MULTINOMIAL = device_line(
    "TensorCompare.cu", "probability tensor contains either `inf`, `nan` or element < 0"
)


# Named like Hugging Face's classes: the evidence code recognises configs and tokenizers by
# their class name and attributes, as it must without importing transformers.
@dataclass
class TinyBertConfig:
    vocab_size: int = 100
    num_labels: int = 2
    max_position_embeddings: int = 16
    type_vocab_size: int = 2
    pad_token_id: int = 0
    model_type: str = "bert"


class TinyTokenizer:
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class TinyBert(nn.Module):
    def __init__(self, config: TinyBertConfig) -> None:
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, 8, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, 8)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, 8)
        self.classifier = nn.Linear(8, config.num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.word_embeddings(input_ids).mean(1))


def test_label_equal_to_class_count_is_reported_with_the_valid_range():
    model = TinyBert(TinyBertConfig())
    labels = torch.tensor([0, 1, 2, 1])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "labels": labels})
    assert (
        "`labels` contains 2 but the classifier `model.classifier` has 2 outputs " in d.evidence[0]
    )
    assert "(valid: 0..1 or -100)" in d.evidence[0]


def test_one_based_labels_rank_the_off_by_one_cause_first():
    model = TinyBert(TinyBertConfig(num_labels=3))
    labels = torch.tensor([1, 2, 3, 3])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "labels": labels})
    assert d.likely_causes[0].startswith("labels are numbered 1..C")


def test_minus_one_padding_labels_rank_the_ignore_index_cause_first():
    model = TinyBert(TinyBertConfig(num_labels=3))
    labels = torch.tensor([0, 2, -1, -1])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "labels": labels})
    assert "-1" in d.evidence[0]
    assert d.likely_causes[0].startswith("padding labels are -1")


def test_void_label_255_ranks_the_segmentation_cause_first():
    head = nn.Conv2d(3, 21, 1)
    loss_fn = nn.CrossEntropyLoss()
    classifier = nn.Linear(4, 21)
    masks = torch.tensor([[0, 5, 255], [20, 255, 1]])
    ns = {"head": head, "classifier": classifier, "loss_fn": loss_fn, "masks": masks}
    d = diagnose(HEADLINE, device_output=NLL, namespace=ns)
    assert "255" in d.evidence[0]
    assert "255" in d.likely_causes[0]


def test_a_segmentation_head_of_1x1_convolutions_gives_the_number_of_classes():
    # As on the GPU (catalogue case segmentation-void-255): a Conv2d head, no Linear at all.
    model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.Conv2d(64, 64, 1))
    model.classifier = nn.Conv2d(64, 21, 1)
    masks = torch.tensor([[0, 5, 255], [20, 255, 1]])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "masks": masks})
    assert d.evidence[0].startswith("`masks` contains 255 but the classifier `model.classifier`")
    assert "has 21 outputs" in d.evidence[0]


def test_a_1x1_convolution_not_named_as_a_head_is_no_classifier():
    model = nn.Sequential(nn.Conv2d(3, 64, 1), nn.ReLU())
    masks = torch.tensor([[0, 5, 255]])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "masks": masks})
    assert d.evidence == ()


def test_labels_in_a_batch_dict_are_read():
    model = TinyBert(TinyBertConfig())
    batch = {"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([5])}
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "batch": batch})
    assert "`batch['labels']` contains 5" in d.evidence[0]


def test_valid_labels_give_no_evidence_sentence():
    model = TinyBert(TinyBertConfig())
    d = diagnose(
        HEADLINE, device_output=NLL, namespace={"model": model, "labels": torch.tensor([0, 1])}
    )
    assert d.evidence == ()


def test_added_tokens_without_resize_are_named():
    config = TinyBertConfig(vocab_size=100)
    model = TinyBert(config)
    tokenizer = TinyTokenizer(102)
    input_ids = torch.tensor([[5, 100, 101]])
    ns = {"model": model, "tokenizer": tokenizer, "input_ids": input_ids}
    d = diagnose(HEADLINE, device_output=INDEX_SELECT, namespace=ns)
    text = " ".join(d.evidence)
    assert "token id 101 in `input_ids` >= vocab size 100: one of the 2 added token(s)." in text
    assert text.count("model.resize_token_embeddings(len(tokenizer))") == 1  # said once
    assert d.likely_causes[0].startswith("a token id >=")


def test_an_id_past_the_embedding_blames_no_tokenizer_where_there_is_none():
    # As on the GPU (catalogue case embedding-id-too-large-short): a bare nn.Embedding.
    emb = nn.Embedding(10, 4)
    d = diagnose(
        HEADLINE,
        device_output=INDEX_SELECT,
        namespace={"emb": emb, "input_ids": torch.tensor([[1, 2, 10]])},
    )
    assert d.evidence == ("token id 10 in `input_ids` >= vocab size 10.",)
    d = diagnose(
        HEADLINE,
        device_output=INDEX_SELECT,
        namespace={"emb": emb, "tokenizer": TinyTokenizer(8), "input_ids": torch.tensor([[10]])},
    )
    assert d.evidence == (
        "token id 10 in `input_ids` >= vocab size 10: the tokenizer (len 8) does not match the "
        "model.",
    )


def test_sequence_longer_than_max_position_embeddings_is_named_and_ranked_first():
    model = TinyBert(TinyBertConfig(max_position_embeddings=16))
    input_ids = torch.ones(1, 40, dtype=torch.long)
    d = diagnose(
        HEADLINE, device_output=INDEX_SELECT, namespace={"model": model, "input_ids": input_ids}
    )
    assert any("sequence length 40 but max_position_embeddings is 16" in s for s in d.evidence)
    assert "longer than" in d.likely_causes[0]


def test_token_type_ids_on_a_one_type_model_are_named_and_ranked_first():
    model = TinyBert(TinyBertConfig(type_vocab_size=1, model_type="roberta"))
    batch = {"input_ids": torch.tensor([[0, 5, 2]]), "token_type_ids": torch.tensor([[0, 0, 1]])}
    d = diagnose(HEADLINE, device_output=INDEX_SELECT, namespace={"model": model, "batch": batch})
    assert any("type_vocab_size is 1" in s for s in d.evidence)
    assert "token_type_ids" in d.likely_causes[0]


def test_bce_loss_on_logits_is_named_and_ranked_first():
    model = nn.Sequential(nn.Linear(4, 1))
    ns = {"model": model, "criterion": nn.BCELoss(), "outputs": torch.tensor([-2.0, 0.5, 3.0])}
    d = diagnose(HEADLINE, device_output=BCE, namespace=ns)
    assert any("outside [0, 1]" in s for s in d.evidence)
    assert any("not a Sigmoid" in s for s in d.evidence)
    assert d.likely_causes[0].startswith("BCELoss applied to logits")


def test_reading_a_tensor_that_requires_grad_warns_of_nothing():
    # A model's outputs require grad: torch warns when one is turned into a Python number, and
    # that warning lands under the user's failing cell (seen in demo 05).
    layer = nn.Linear(4, 1)
    with torch.no_grad():  # outside [0, 1] whatever the random init (-0.5 <= bias <= 0.5)
        layer.weight.fill_(1.0)
    outputs = layer(torch.ones(3, 4)).squeeze(1) * 10
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns = {"criterion": nn.BCELoss(), "outputs": outputs}
        d = diagnose(HEADLINE, device_output=BCE, namespace=ns)
    assert any("`outputs` has values outside [0, 1]" in s for s in d.evidence)
    assert [str(w.message) for w in caught] == []


def test_nan_in_bce_input_is_named_and_its_range_is_not_made_up():
    # nan_to_num would turn NaN into 0 and report "min 0" for probabilities that have no 0.
    probs = torch.tensor([0.5, float("nan"), 0.7])
    d = diagnose(HEADLINE, device_output=BCE, namespace={"probs": probs})
    assert d.evidence == ("`probs` has values outside [0, 1]: it contains NaN.",)
    mixed = torch.tensor([1.5, float("nan"), 0.7])
    d = diagnose(HEADLINE, device_output=BCE, namespace={"probs": mixed})
    assert d.evidence == ("`probs` has values outside [0, 1]: it contains NaN; min 0.7, max 1.5.",)


def test_half_precision_model_ranks_fp16_overflow_first_for_sampling():
    model = nn.Linear(4, 4).half()
    d = diagnose(HEADLINE, device_output=MULTINOMIAL, namespace={"model": model})
    assert any("float16" in s for s in d.evidence)
    assert "fp16" in d.likely_causes[0]


def test_evidence_comes_from_the_failing_frames_too():
    def train_step(labels):
        raise RuntimeError(HEADLINE)

    model = TinyBert(TinyBertConfig())
    try:
        train_step(torch.tensor([7]))
    except RuntimeError as error:
        d = diagnose(error, device_output=NLL, namespace={"model": model})
    assert "`labels` contains 7" in d.evidence[0]


def test_non_cpu_tensors_are_never_read():
    # A meta tensor has no values: reading one raises, as a CUDA tensor does after a sticky error.
    model = TinyBert(TinyBertConfig())
    labels = torch.empty(4, dtype=torch.long, device="meta")
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "labels": labels})
    assert d.cause == "label-out-of-range"
    assert d.evidence == ()


def test_without_namespace_diagnose_reads_only_the_texts():
    d = diagnose(HEADLINE, device_output=NLL)
    assert d.evidence == ()


@pytest.mark.parametrize("value", [object(), {"labels": "not a tensor"}, TinyTokenizer(-1)])
def test_strange_objects_do_not_break_the_diagnosis(value):
    d = diagnose(HEADLINE, device_output=INDEX_SELECT, namespace={"thing": value})
    assert d.cause == "index-out-of-range"


def test_unknown_assert_without_device_lines_still_reports_found_evidence():
    model = TinyBert(TinyBertConfig())
    d = diagnose(HEADLINE, namespace={"model": model, "labels": torch.tensor([0, 2])})
    assert d.cause == "unknown-assert"
    assert any("`labels` contains 2" in s for s in d.evidence)


# --- evidence follows the objects, not the kernel family (issue 9, item 5) ----------------------
GATHER = device_line(
    "ScatterGatherKernel.cu",
    'idx_dim >= 0 && idx_dim < index_size && "scatter gather kernel index out of bounds"',
)


class TinyRobertaEmbeddings(nn.Module):
    """Like transformers' RobertaEmbeddings: positions numbered from padding_idx + 1."""

    def __init__(self, rows: int = 18, pad: int = 1) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(100, 8, padding_idx=pad)
        self.position_embeddings = nn.Embedding(rows, 8, padding_idx=pad)


def test_a_tokenizer_larger_than_the_embedding_is_named_whatever_kernel_fired():
    model = TinyBert(TinyBertConfig(vocab_size=100))
    ns = {"model": model, "tokenizer": TinyTokenizer(103), "labels": torch.tensor([0, 1])}
    d = diagnose(HEADLINE, device_output=NLL, namespace=ns)
    assert d.cause == "label-out-of-range"
    assert any("len(tokenizer) is 103 but the embedding has 100 rows" in s for s in d.evidence)


def test_roberta_style_positions_count_the_padding_offset():
    model = nn.Module()
    model.embeddings = TinyRobertaEmbeddings(rows=18, pad=1)
    input_ids = torch.ones(1, 17, dtype=torch.long)  # 17 > 16 usable, though < 18 rows
    d = diagnose(HEADLINE, device_output=GATHER, namespace={"model": model, "input_ids": input_ids})
    assert any(
        "sequence length 17 but max_position_embeddings is 18 (16 usable positions)" in s
        for s in d.evidence
    )
    assert "longer than" in d.likely_causes[0] or d.cause == "index-out-of-range"


def test_a_sequence_that_fits_the_usable_positions_gives_no_sentence():
    model = nn.Module()
    model.embeddings = TinyRobertaEmbeddings(rows=18, pad=1)
    input_ids = torch.ones(1, 16, dtype=torch.long)
    d = diagnose(HEADLINE, device_output=GATHER, namespace={"model": model, "input_ids": input_ids})
    assert not any("sequence length" in s for s in d.evidence)


@dataclass
class TinyT5Config:
    vocab_size: int = 100
    is_encoder_decoder: bool = True
    model_type: str = "t5"


class TinyT5(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = TinyT5Config()
        self.shared = nn.Embedding(100, 8)
        self.lm_head = nn.Linear(8, 100, bias=False)


def test_seq2seq_labels_are_read_as_decoder_token_ids_against_the_shared_embedding():
    labels = torch.tensor([[5, 100, -100, -100]])
    d = diagnose(
        HEADLINE, device_output=INDEX_SELECT, namespace={"model": TinyT5(), "labels": labels}
    )
    text = " ".join(d.evidence)
    assert "token id 100 in `labels` >= vocab size 100 (the decoder's shared embedding)" in text
    assert "classifier" not in text


def test_decoder_input_ids_past_the_shared_embedding_are_named():
    batch = {"decoder_input_ids": torch.tensor([[0, 7, 120]])}
    d = diagnose(
        HEADLINE, device_output=INDEX_SELECT, namespace={"model": TinyT5(), "batch": batch}
    )
    assert any("token id 120 in `batch['decoder_input_ids']`" in s for s in d.evidence)


@pytest.mark.parametrize(
    ("types", "value", "words"),
    [
        (1, 1, "this model has one token type; drop token_type_ids"),
        (2, 2, "valid token types are 0..1"),
    ],
)
def test_token_type_ids_are_worded_for_every_type_vocab_size(types, value, words):
    model = TinyBert(TinyBertConfig(type_vocab_size=types))
    batch = {
        "input_ids": torch.tensor([[0, 5, 2]]),
        "token_type_ids": torch.tensor([[0, 0, value]]),
    }
    d = diagnose(HEADLINE, device_output=INDEX_SELECT, namespace={"model": model, "batch": batch})
    assert any(f"contains {value} but type_vocab_size is {types}: {words}" in s for s in d.evidence)


def test_void_255_ranks_first_even_when_other_labels_are_too_large():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 3, 1))
    model.classifier = nn.Conv2d(4, 3, 1)
    masks = torch.tensor([[[0, 2, 255], [3, 1, 255]]])
    d = diagnose(HEADLINE, device_output=NLL, namespace={"model": model, "masks": masks})
    assert "255" in d.likely_causes[0] and "ignore_index=255" in " ".join(d.fixes)


class BatchEncoding(UserDict):  # what Hugging Face collators return: a UserDict, not a dict
    pass


def test_hugging_face_collator_batches_are_read():
    model = TinyBert(TinyBertConfig(vocab_size=100))
    batch = BatchEncoding(input_ids=torch.tensor([[1, 150]]), attention_mask=torch.ones(1, 2))
    d = diagnose(HEADLINE, device_output=INDEX_SELECT, namespace={"model": model, "batch": batch})
    assert any("token id 150 in `batch['input_ids']` >= vocab size 100" in s for s in d.evidence)


@pytest.mark.parametrize(
    ("line", "ns"),
    [
        (INDEX_SELECT, {"x": torch.tensor([[5, 500]])}),
        (INDEX_SELECT, {"inputs": torch.tensor([[5, 500]])}),
        (BCE, {"out": torch.tensor([2.0, -1.0])}),
        (BCE, {"p": torch.tensor([float("nan")])}),
    ],
    ids=["x", "inputs", "out", "p"],
)
def test_a_tensor_is_never_blamed_for_a_generic_name_alone(line, ns):
    model = TinyBert(TinyBertConfig(vocab_size=100))
    d = diagnose(HEADLINE, device_output=line, namespace={"model": model, **ns})
    name = next(iter(ns))
    assert not any(f"`{name}`" in s for s in d.evidence)
