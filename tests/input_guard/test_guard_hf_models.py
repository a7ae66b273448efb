"""Real model code the guard was not written against: tiny, randomly initialised Hugging Face
models built from configs (no download), run bare and inside the guard, strict and deferred, with
every rule judged before the call as for a GPU's tensors (``device_path``).

Valid steps (forward, loss with -100 labels, backward; generation greedy, beam and sampled) must
give the same losses, logits, gradients and token ids, draw the same random numbers, and warn
the same; one real bad input per family (a label >= num_labels, a token id >= vocab_size,
position ids past max_position_embeddings, NaN sampling probabilities) must end in the guard's
own error. CI does not install transformers: there these skip.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
T: Any = transformers

from nb_cudaguard import GuardError, guard  # noqa: E402
from nb_cudaguard.input_guard.judge import STATS  # noqa: E402

V = 97  # vocabulary
B, L = 2, 7  # batch, sequence
MODES = ["strict", "deferred"]

Step = Callable[[Any], Any]


@pytest.fixture(autouse=True)
def quiet_and_single_threaded() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    verbosity = T.logging.get_verbosity()
    T.logging.set_verbosity_error()
    yield
    T.logging.set_verbosity(verbosity)
    torch.set_num_threads(threads)


def ids(low: int = 3) -> torch.Tensor:
    return torch.randint(low, V, (B, L))


def loss_and_logits(out: Any) -> tuple[torch.Tensor, ...]:
    out.loss.backward()
    found = [out.loss.detach()]
    for name in ("logits", "logits_per_image"):
        if getattr(out, name, None) is not None:
            found.append(getattr(out, name).detach())
    return tuple(found)


def causal_step(model: Any) -> Any:
    x = ids()
    mask = torch.ones_like(x)
    mask[1, -2:] = 0
    labels = x.masked_fill(mask == 0, -100)
    return loss_and_logits(model(input_ids=x, attention_mask=mask, labels=labels))


def llama_like(config_class: str, model_class: str) -> Callable[[], Any]:
    def build() -> Any:
        config = getattr(T, config_class)(
            vocab_size=V,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
            pad_token_id=0,
        )
        return getattr(T, model_class)(config)

    return build


def gpt2() -> Any:
    config = T.GPT2Config(
        vocab_size=V, n_positions=32, n_embd=16, n_layer=1, n_head=2, pad_token_id=1, eos_token_id=2
    )
    return T.GPT2LMHeadModel(config)


def roberta() -> Any:  # position ids count from padding_idx + 1 = 2
    config = T.RobertaConfig(
        vocab_size=V,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=12,
        num_labels=3,
        pad_token_id=1,
    )
    return T.RobertaForSequenceClassification(config)


def roberta_step(model: Any) -> Any:
    x = ids()
    x[1, -2:] = 1  # padding
    return loss_and_logits(
        model(input_ids=x, attention_mask=(x != 1).long(), labels=torch.tensor([0, 2]))
    )


def distilbert() -> Any:
    config = T.DistilBertConfig(
        vocab_size=V, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=32
    )
    return T.DistilBertForQuestionAnswering(config)


def distilbert_step(model: Any) -> Any:
    # positions outside the sequence are clamped to it and ignored (ignore_index=L)
    start, end = torch.tensor([1, 99]), torch.tensor([3, -1])
    return loss_and_logits(model(input_ids=ids(), start_positions=start, end_positions=end))


def t5() -> Any:
    config = T.T5Config(
        vocab_size=V,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return T.T5ForConditionalGeneration(config)


def bart() -> Any:
    config = T.BartConfig(
        vocab_size=V,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return T.BartForConditionalGeneration(config)


def seq2seq_step(model: Any) -> Any:
    labels = ids()
    labels[1, -3:] = -100  # decoder_input_ids are these shifted, -100 replaced by the pad id
    return loss_and_logits(model(input_ids=ids(), labels=labels))


def vit() -> Any:
    config = T.ViTConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    return T.ViTForImageClassification(config)


def vit_step(model: Any) -> Any:
    return loss_and_logits(
        model(pixel_values=torch.randn(B, 3, 16, 16), labels=torch.tensor([2, 0]))
    )


def clip() -> Any:
    text = dict(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        eos_token_id=2,
    )
    vision = dict(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    config = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
    return T.CLIPModel(config)


def clip_step(model: Any) -> Any:
    out = model(input_ids=ids(), pixel_values=torch.randn(B, 3, 16, 16), return_loss=True)
    return loss_and_logits(out)


def wav2vec2() -> Any:
    config = T.Wav2Vec2Config(
        vocab_size=12,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
        mask_time_prob=0.0,
    )
    return T.Wav2Vec2ForCTC(config)


def wav2vec2_step(model: Any) -> Any:
    labels = torch.randint(1, 12, (B, 5))
    labels[1, 3:] = -100
    return loss_and_logits(model(input_values=torch.randn(B, 400), labels=labels))


def mixtral() -> Any:
    config = T.MixtralConfig(
        vocab_size=V,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        output_router_logits=True,
    )
    return T.MixtralForCausalLM(config)


TRAINING: dict[str, tuple[Callable[[], Any], Step]] = {
    "gpt2 (labels -100 in padding)": (gpt2, causal_step),
    "llama (rotary, causal mask)": (llama_like("LlamaConfig", "LlamaForCausalLM"), causal_step),
    "mistral": (llama_like("MistralConfig", "MistralForCausalLM"), causal_step),
    "qwen2": (llama_like("Qwen2Config", "Qwen2ForCausalLM"), causal_step),
    "mixtral (experts: one_hot, index_add_)": (mixtral, causal_step),
    "roberta (padding_idx position ids)": (roberta, roberta_step),
    "distilbert question answering": (distilbert, distilbert_step),
    "t5 (relative position buckets)": (t5, seq2seq_step),
    "bart": (bart, seq2seq_step),
    "vit": (vit, vit_step),
    "clip": (clip, clip_step),
    "wav2vec2 ctc": (wav2vec2, wav2vec2_step),
}


def run(build: Callable[[], Any], step: Step, mode: str | None) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = build()
    torch.manual_seed(1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if mode is None:
            out = step(model)
        else:
            with guard(mode=mode):  # type: ignore[arg-type]
                out = step(model)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    after = torch.rand(4)  # the generator's state: the guard draws no random number
    return out, grads, [(w.category, str(w.message)) for w in seen], after


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def assert_unchanged(build: Callable[[], Any], step: Step, mode: str) -> None:
    bare = run(build, step, None)
    STATS.clear()
    inside = run(build, step, mode)
    assert STATS["calls"] > 0, "the guard checked nothing"
    assert STATS["check_failed"] == 0
    out, grads, warned, after = inside
    assert same(out, bare[0]), "outputs differ"
    assert same(grads, bare[1]), "gradients differ"
    assert warned == bare[2]
    assert same(after, bare[3]), "the guard drew random numbers"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(TRAINING))
def test_a_training_step_is_unchanged(name: str, mode: str, device_path: None) -> None:
    assert_unchanged(*TRAINING[name], mode)


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(3, V, (2, 5))
    mask = torch.ones_like(x)
    x[1, :2], mask[1, :2] = 1, 0  # left padding
    return x, mask


GENERATION: dict[str, dict[str, Any]] = {
    "greedy": dict(do_sample=False),
    "beam search": dict(num_beams=3, num_return_sequences=2),
    "sampling": dict(do_sample=True, top_k=10, top_p=0.9, temperature=0.7),
    "processors": dict(
        suppress_tokens=[5, 6], bad_words_ids=[[8], [9, 10]], repetition_penalty=1.2, min_length=8
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", list(GENERATION))
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generation_is_unchanged(family: str, kind: str, mode: str, device_path: None) -> None:
    def build() -> Any:
        if family == "gpt2":
            return gpt2().eval()
        return llama_like("LlamaConfig", "LlamaForCausalLM")().eval()

    def step(model: Any) -> Any:
        x, mask = prompt()
        with torch.no_grad():
            return model.generate(
                input_ids=x,
                attention_mask=mask,
                max_new_tokens=5,
                pad_token_id=1,
                eos_token_id=2,
                **GENERATION[kind],
            )

    assert_unchanged(build, step, mode)


def test_an_eval_under_inference_mode_is_unchanged(device_path: None) -> None:
    def step(model: Any) -> Any:
        with torch.inference_mode():
            return model(input_ids=ids()).logits

    assert_unchanged(lambda: gpt2().eval(), step, "deferred")


class NaNScores:
    """A logits processor gone wrong: a NaN among the scores, so softmax gives NaN rows."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[0, 5] = float("nan")
        return scores


def nan_sampling(model: Any) -> Any:
    x, mask = prompt()
    with torch.no_grad():
        processors = T.LogitsProcessorList([NaNScores()])
        return model.generate(
            input_ids=x,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=2,
            pad_token_id=1,
            logits_processor=processors,
        )


def with_ids(model: Any, x: torch.Tensor, **kwargs: Any) -> Any:
    return loss_and_logits(model(input_ids=x, labels=x.clamp(0, V - 1), **kwargs))


BAD: dict[str, tuple[Callable[[], Any], Step, str]] = {
    "gpt2 token id == vocab_size": (
        gpt2,
        lambda m: with_ids(m, torch.tensor([[5, V, 7]])),
        "F.embedding: token id out of range",
    ),
    "gpt2 position ids past n_positions": (
        gpt2,
        lambda m: with_ids(m, ids(), position_ids=torch.arange(30, 30 + L).expand(B, L)),
        "F.embedding: position id out of range",
    ),
    "gpt2 sampling from NaN probabilities": (
        lambda: gpt2().eval(),
        nan_sampling,
        "torch.multinomial: probabilities contain NaN",
    ),
    "llama label >= vocab_size": (
        llama_like("LlamaConfig", "LlamaForCausalLM"),
        lambda m: loss_and_logits(m(input_ids=ids(), labels=torch.full((B, L), V + 3))),
        "F.cross_entropy: class index out of range",
    ),
    "roberta label == num_labels": (
        roberta,
        lambda m: loss_and_logits(m(input_ids=ids(), labels=torch.tensor([0, 3]))),
        "F.cross_entropy: class index out of range",
    ),
    "roberta sequence longer than its positions": (
        roberta,
        lambda m: loss_and_logits(
            m(input_ids=torch.randint(3, V, (B, 11)), labels=torch.tensor([0, 1]))
        ),
        "index out of range",
    ),
    "t5 label >= vocab_size": (
        t5,
        lambda m: loss_and_logits(
            m(input_ids=ids(), labels=torch.tensor([[5, 6, V], [4, -100, -100]]))
        ),
        "F.cross_entropy: class index out of range",
    ),
    "vit label == num_labels": (
        vit,
        lambda m: loss_and_logits(
            m(pixel_values=torch.randn(B, 3, 16, 16), labels=torch.tensor([3, 0]))
        ),
        "F.cross_entropy: class index out of range",
    ),
    "clip token id == vocab_size": (
        clip,
        lambda m: clip_step_with(m, torch.tensor([[5, V, 2]])),
        "F.embedding: token id out of range",
    ),
}


def clip_step_with(model: Any, x: torch.Tensor) -> Any:
    out = model(input_ids=x, pixel_values=torch.randn(1, 3, 16, 16), return_loss=True)
    return loss_and_logits(out)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_input_is_caught_with_the_guards_error(
    name: str, mode: str, device_path: None
) -> None:
    build, step, words = BAD[name]
    torch.manual_seed(0)
    model = build()
    with pytest.raises(GuardError, match=words), guard(mode=mode):  # type: ignore[arg-type]
        step(model)
