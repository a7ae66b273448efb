"""The repro script: the failing op replayed on CPU with the notebook's inputs, run for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pytorch_texts import ASSERT_2_9
from torch import nn

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.repro import replay_script

LOSS_LINE = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
    "block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
)
EMBEDDING_LINE = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectLargeIndex: block: [5,0,0], "
    "thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
)
BCE_LINE = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:94: operator(): block: [0,0,0], thread: [0,0,0] "
    "Assertion `input_val >= zero && input_val <= one` failed.\n"
)


def run_script(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "repro.py"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_label_replay_raises_the_readable_cpu_error(tmp_path: Path):
    diagnosis = diagnose(LOSS_LINE + ASSERT_2_9)
    assert diagnosis is not None
    namespace = {
        "labels": torch.tensor([0, 2, 3, 1]),
        "model": nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)),
    }
    replay = replay_script(diagnosis, namespace=namespace)
    assert replay is not None
    assert "torch.tensor([0, 2, 3, 1], dtype=torch.int64)" in replay.script
    assert "num_classes = 3" in replay.script
    result = run_script(tmp_path, replay.script)
    assert result.returncode == 1
    assert "IndexError: Target 3 is out of bounds." in result.stderr


def test_segmentation_labels_keep_their_shape(tmp_path: Path):
    diagnosis = diagnose(LOSS_LINE + ASSERT_2_9)
    assert diagnosis is not None
    masks = torch.zeros(2, 4, 4, dtype=torch.long)
    masks[1, 2, 3] = 255  # a 'void' pixel without ignore_index=255
    replay = replay_script(diagnosis, namespace={"mask": masks, "proj": nn.Conv2d(3, 5, 1)})
    # No head: nothing says how many classes there are, so no replay is invented.
    assert replay is None
    for head in (nn.Linear(3, 5), nn.Conv2d(3, 5, 1)):  # a 1x1 conv head classifies pixels
        replay = replay_script(diagnosis, namespace={"mask": masks, "classifier": head})
        assert replay is not None
        assert "torch.randn(2, 5, 4, 4" in replay.script
        assert "Target 255 is out of bounds." in run_script(tmp_path, replay.script).stderr


def test_token_id_replay_raises_index_out_of_range(tmp_path: Path):
    diagnosis = diagnose(EMBEDDING_LINE + ASSERT_2_9)
    assert diagnosis is not None
    ids = torch.randint(0, 100, (2, 8))
    ids[1, 3] = 100
    encoder = nn.ModuleDict({"word_embeddings": nn.Embedding(100, 16, padding_idx=0)})
    replay = replay_script(diagnosis, namespace={"input_ids": ids, "encoder": encoder})
    assert replay is not None
    assert "nn.Embedding(100, 8, padding_idx=0)" in replay.script
    assert "IndexError: index out of range in self" in run_script(tmp_path, replay.script).stderr


def test_bce_replay_raises_the_range_error(tmp_path: Path):
    diagnosis = diagnose(BCE_LINE + ASSERT_2_9)
    assert diagnosis is not None and diagnosis.cause == "probability-out-of-range"
    replay = replay_script(diagnosis, namespace={"probs": torch.tensor([0.2, 1.7, -0.3])})
    assert replay is not None
    result = run_script(tmp_path, replay.script)
    assert "all elements of input should be between 0 and 1" in result.stderr


def test_without_device_lines_the_family_with_a_bad_value_is_chosen(tmp_path: Path):
    diagnosis = diagnose(ASSERT_2_9)
    assert diagnosis is not None and diagnosis.cause == "unknown-assert"
    namespace = {
        "input_ids": torch.tensor([[1, 2, 3]]),  # in range for the embedding below
        "emb": nn.Embedding(10, 4),
        "labels": torch.tensor([1, 4]),
        "fc": nn.Linear(4, 4),
    }
    replay = replay_script(diagnosis, namespace=namespace)
    assert replay is not None and "cross_entropy" in replay.op


@pytest.mark.parametrize(
    "namespace",
    [{}, {"labels": torch.tensor([0, 1]), "fc": nn.Linear(4, 3)}],
    ids=["nothing", "labels in range"],
)
def test_no_replay_is_written_without_a_bad_input(namespace: dict[str, object]):
    diagnosis = diagnose(LOSS_LINE + ASSERT_2_9)
    assert diagnosis is not None
    assert replay_script(diagnosis, namespace=namespace) is None


def test_cuda_tensors_are_never_read():
    diagnosis = diagnose(LOSS_LINE + ASSERT_2_9)
    assert diagnosis is not None
    meta = torch.tensor([0, 5], device="meta")  # a non-CPU tensor stands in for a CUDA one
    assert replay_script(diagnosis, namespace={"labels": meta, "fc": nn.Linear(2, 3)}) is None


def test_a_huge_label_tensor_is_cut_to_its_bad_values(tmp_path: Path):
    diagnosis = diagnose(LOSS_LINE + ASSERT_2_9)
    assert diagnosis is not None
    masks = torch.zeros(4, 256, 256, dtype=torch.long)
    masks[2, 7, 9] = 255
    replay = replay_script(diagnosis, namespace={"masks": masks, "fc": nn.Linear(3, 5)})
    assert replay is not None
    assert len(replay.script) < 5_000
    assert "Target 255 is out of bounds." in run_script(tmp_path, replay.script).stderr
