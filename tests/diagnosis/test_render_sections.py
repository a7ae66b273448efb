"""Details headings say what each error is: only a device assert is what the GPU checked."""

from __future__ import annotations

from pytorch_texts import H100_TORCH_2_11, HEADLINE, ILLEGAL_ADDRESS_2_11

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.render import to_text


def _text(pasted: str) -> str:
    diagnosis = diagnose(pasted)
    assert diagnosis is not None
    return to_text(diagnosis)


def test_a_device_assert_with_the_gpus_line_says_what_the_gpu_checked():
    text = _text(H100_TORCH_2_11["cross-entropy-label"][0] + "\n" + HEADLINE)
    assert "What the GPU checked:" in text


def test_an_illegal_address_is_no_check_of_the_gpus():
    text = _text(ILLEGAL_ADDRESS_2_11)
    assert "What the GPU checked" not in text
    assert "What it means:" in text


def test_a_non_sticky_error_says_its_explanation_once_in_the_headline():
    text = _text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.02 GiB is free."
    )
    assert "What the GPU checked" not in text
    assert text.count("no restart is needed") == 1
