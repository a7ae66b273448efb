"""On a real GPU: the recorder reads CUDA's generators by their seed and offset, so a cell that
draws on the GPU is told from one that does not, and the state it keeps sets them back."""

from __future__ import annotations

import pytest

from nb_cudaguard.replay.rng import RngReader, drawn_from, encode_rng, restore_rng

pytestmark = pytest.mark.gpu


def test_a_cuda_draw_moves_the_cuda_state_and_the_kept_state_sets_it_back() -> None:
    import torch

    torch.ones(1, device="cuda")
    reader = RngReader()
    before = reader.read()
    (torch.ones(3, device="cuda") * 2).sum().item()  # CUDA work that draws nothing
    after_work = reader.read()
    assert drawn_from(before, after_work) == ()
    torch.randn(3, device="cuda")
    after_draw = reader.read()
    assert drawn_from(after_work, after_draw) == ("cuda",)
    kept = encode_rng(after_draw)
    first = torch.randn(5, device="cuda")
    assert "cuda" in restore_rng(kept)
    assert torch.equal(torch.randn(5, device="cuda"), first)
    assert drawn_from(after_draw, reader.read()) == ("cuda",)  # the draw after the restore
