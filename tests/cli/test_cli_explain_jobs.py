"""`nb-cudaguard explain` on a multi-rank job through the command line: stdin, directories, and
the JSON that stays the single-process payload with `distributed` beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ranks"))
from explain_jobs import run, spawn


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nb_cudaguard", "explain", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


@pytest.fixture(scope="module")
def spawn_log(tmp_path_factory: pytest.TempPathFactory) -> str:
    return run(spawn(world=2), tmp_path_factory.mktemp("spawn"))


def test_a_job_log_on_stdin_gets_its_verdict(spawn_log: str):
    result = cli("-", stdin=spawn_log)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nb-cudaguard: process 1: ")


def test_the_json_is_the_diagnosis_payload_with_the_job_beside_it(spawn_log: str):
    payload = json.loads(cli("--json", "-", stdin=spawn_log).stdout)
    assert payload["schema_version"] == 1
    assert payload["cause"] == "index-out-of-range"
    assert payload["action"]["setting"] == "script"
    assert payload["action"]["command"].startswith("CUDA_LAUNCH_BLOCKING=1 python ")
    assert payload["distributed"]["launcher"] == "spawn"
    assert payload["distributed"]["culprit"] == 1


def test_a_directory_without_rank_logs_is_a_usage_error(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("nothing here", encoding="utf-8")
    result = cli(str(tmp_path))
    assert result.returncode == 2
    assert "is a directory" in result.stderr


def test_a_log_dir_whose_ranks_hold_no_cuda_error_is_status_1(tmp_path: Path):
    folder = tmp_path / "run" / "attempt_0" / "0"
    folder.mkdir(parents=True)
    (folder / "stderr.log").write_text(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "train.py", line 3, in <module>\n'
        "[rank0]: KeyError: 'labels'\n",
        encoding="utf-8",
    )
    result = cli("--json", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout.strip() == "null"
    assert "no CUDA error found" in result.stderr
