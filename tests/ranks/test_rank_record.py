"""The rank record, read back by torch's own elastic failure parser and by our reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from nb_cudaguard.ranks import record

LINE, CAUSE = H100_TORCH_2_11["cross-entropy-label"]


@pytest.fixture
def rank_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "ranks"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv(record.RANK_DIR_ENV, str(folder))
    return folder


def test_a_device_assert_gives_the_full_record(rank_env: Path) -> None:
    error = torch.AcceleratorError(ASSERT_2_9)
    found = record.failure_record(error, now=100.25, device_output=LINE + "\n")
    assert found is not None
    assert set(found) == {
        "nb_cudaguard_rank_record", "rank", "local_rank", "world_size", "host", "pid", "time",
        "kind", "cause_id", "headline", "exception", "device_lines", "diagnosis",
    }  # fmt: skip
    assert (found["rank"], found["local_rank"], found["world_size"]) == (3, 1, 4)
    assert found["kind"] == "cuda-error" and found["cause_id"] == CAUSE
    assert found["device_lines"] == [LINE]
    assert found["exception"].startswith("AcceleratorError: CUDA error: device-side assert")
    assert found["diagnosis"]["cause"] == CAUSE
    record.write(found, error)
    back = json.loads((rank_env / "rank-3.json").read_text())
    assert back == found and record.read_dir(rank_env) == [found]


def test_a_python_error_is_no_record(rank_env: Path) -> None:
    assert record.failure_record(ValueError("bad shape")) is None
    assert record.failure_record(RuntimeError("Connection closed by peer")) is None


def test_torchrun_reads_our_error_file_and_names_the_culprit_not_the_victim(
    rank_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    culprit = record.failure_record(torch.AcceleratorError(ASSERT_2_9), now=100.9)
    assert culprit is not None
    monkeypatch.setenv("RANK", "0")
    victim = record.stopped_record(culprit, now=101.0)  # the same second, once rounded
    files = {}
    for rank, rec in ((1, culprit), (0, victim)):
        path = tmp_path / f"error-{rank}.json"
        path.write_text(json.dumps(record.error_file_payload(rec, "Traceback ...\n")))
        files[rank] = ProcessFailure(local_rank=rank, pid=1, exitcode=1, error_file=str(path))
    assert files[1].timestamp < files[0].timestamp
    summary = ChildFailedError("train.py", {0: files[0], 1: files[1]})
    assert summary.get_first_failure()[0] == 1
    assert "nb_cudaguard: rank 3: " in str(files[1].message)
    assert victim["headline"] == f"stopped because rank 3 failed: {culprit['diagnosis']['title']}"
    assert record.culprit([victim, culprit]) == culprit


def test_the_rank_is_the_groups_where_one_started_else_the_environments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The fast paths a guard's start takes (c10d's default group read directly, RANK looked up
    # in os.environ's own dict) answer as the public calls do, before, in and after a group.
    import socket

    import torch.distributed as dist

    monkeypatch.delenv("RANK", raising=False)
    assert record.rank() is None
    monkeypatch.setenv("RANK", "2")
    assert record.rank() == 2
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    try:
        assert record.rank() == 0  # the group's, not the environment's
        assert record.identity()["world_size"] == 1
    finally:
        dist.destroy_process_group()
    assert record.rank() == 2
    monkeypatch.delenv("RANK")
    assert record.rank() is None
