"""`nb-cudaguard explain` on what real multi-rank jobs print: gloo on CPU, world 2-3, one rank
raising PyTorch's exact device-assert exception between all-reduces after printing an H100's
device line to fd 2. The verdict names that rank, never a peer that merely died first."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from explain_jobs import JOB, by_hand, notebook_cell, run, spawn, torchrun

CAUSE = "An index is out of range for the tensor it reads from"  # the H100 line's rule
LATE = ("--late", "4", "--timeout", "1.5")  # the peers' collective times out first
TERMINATED = "terminated by the launcher (SIGTERM)"


def explain(target: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nb_cudaguard", "explain", *options, str(target)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def verdict_of(target: Path) -> dict[str, Any]:
    result = explain(target, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def roles(payload: dict[str, Any]) -> dict[int, tuple[str, str]]:
    return {r["rank"]: (r["role"], r["reason"]) for r in payload["distributed"]["ranks"]}


def saved(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jobs")


@pytest.fixture(scope="module")
def torchrun_log(jobs: Path) -> Path:
    return saved(jobs, "torchrun.log", run(torchrun(), jobs))


@pytest.fixture(scope="module")
def torchrun_victims_first(jobs: Path) -> Path:
    return saved(jobs, "late.log", run(torchrun(job_args=LATE), jobs))


@pytest.fixture(scope="module")
def torchrun_log_dir(jobs: Path) -> tuple[Path, Path]:
    logs = jobs / "log-dir"
    options = ("--log-dir", str(logs), "--redirects", "3", "--tee", "3")
    console = run(torchrun(*options, job_args=("--record", "--culprit", "2")), jobs)
    return saved(jobs, "tee.log", console), logs


def test_torchrun_console_names_the_rank_that_raised_and_its_peers_as_victims(torchrun_log):
    result = explain(torchrun_log)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("nb-cudaguard: rank 1 (")
    assert f"{CAUSE}; ranks 0 and 2 were stopped because of it." in first
    payload = verdict_of(torchrun_log)
    found = roles(payload)
    assert found[1] == ("culprit", CAUSE)
    # A peer prints that it lost its connection, unless the agent's SIGTERM comes first.
    stopped = {("victim", "connection closed by peer"), ("collateral", TERMINATED)}
    assert found[0] in stopped and found[2] in stopped
    assert payload["cause"] == "index-out-of-range"


def test_torchrun_rerun_is_torchrun_with_the_culprits_lines_kept_apart(torchrun_log):
    rerun = verdict_of(torchrun_log)["distributed"]["rerun"]
    command = rerun["command"]
    assert command.startswith("CUDA_LAUNCH_BLOCKING=1 torchrun ")
    # The entry point as torchrun's summary names it ("<script> FAILED").
    assert f"--local-ranks-filter 1 --redirects 3 --log-dir <dir> {JOB} <your script" in command
    assert rerun["placeholders"] is True  # the console log shows no command line
    assert "python failing_job.py" not in explain(torchrun_log).stdout
    assert f"python {JOB}" not in explain(torchrun_log).stdout


def test_a_victim_that_timed_out_first_is_never_blamed(torchrun_victims_first):
    log = torchrun_victims_first.read_text(encoding="utf-8")
    # What torchrun itself says: its root cause is the peer that timed out first.
    root = log[log.index("Root Cause (first observed failure)") :]
    named = int(re.findall(r"rank\s+: (\d) \(local_rank", root)[0])  # 0 or 2: a race
    assert named != 1, root
    payload = verdict_of(torchrun_victims_first)
    assert payload["distributed"]["culprit"] == 1
    assert roles(payload)[named] == ("victim", "collective timed out")
    assert payload["distributed"]["launcher_root_cause"] == named
    text = explain(torchrun_victims_first).stdout
    assert text.startswith(f"nb-cudaguard: rank 1 (localhost, local rank 1): {CAUSE}")
    assert f"names rank {named}, a victim (collective timed out)" in text


def test_a_log_dir_is_read_rank_by_rank(torchrun_log_dir):
    _console, logs = torchrun_log_dir
    assert list(logs.rglob("attempt_0/2/stderr.log"))
    payload = verdict_of(logs)
    assert payload["distributed"]["culprit"] == 2
    assert roles(payload)[0][0] in ("victim", "collateral")
    assert roles(payload)[1][0] in ("victim", "collateral")
    assert f"--log-dir {logs}" in payload["distributed"]["rerun"]["command"]
    assert "--local-ranks-filter 2" in payload["distributed"]["rerun"]["command"]


def test_a_tee_console_with_local_rank_prefixes_names_the_same_rank(torchrun_log_dir):
    console, _logs = torchrun_log_dir
    assert "[default2]:" in console.read_text(encoding="utf-8")
    payload = verdict_of(console)
    assert payload["distributed"]["culprit"] == 2
    culprit = next(r for r in payload["distributed"]["ranks"] if r["role"] == "culprit")
    assert culprit["local_rank"] == 2


def test_an_echoed_torchrun_command_is_rerun_as_it_was_typed(jobs: Path):
    command = torchrun(world=2, job_args=("--culprit", "0"))
    log = saved(jobs, "echoed.log", run(command, jobs, shell_echo=True))
    rerun = verdict_of(log)["distributed"]["rerun"]
    port = command[4]
    assert rerun["command"] == (
        f"CUDA_LAUNCH_BLOCKING=1 {sys.executable} -m torch.distributed.run "
        f"--nproc-per-node=2 {port} --local-ranks-filter 0 --redirects 3 --log-dir <dir> "
        f"{JOB} --culprit 0"
    )


def test_mp_spawn_names_the_process_that_raised(jobs: Path):
    log = saved(jobs, "spawn.log", run(spawn(), jobs))
    text = log.read_text(encoding="utf-8")
    named = int(re.findall(r"-- Process (\d) terminated with the following error:", text)[0])
    payload = verdict_of(log)
    # spawn quotes the culprit's traceback where it saw it die first (nearly always);
    # where it saw a peer first, the culprit's error is nowhere and no process is named.
    assert payload["distributed"]["culprit"] == (1 if named == 1 else None)
    assert payload["distributed"]["rerun"]["command"] == (
        f"CUDA_LAUNCH_BLOCKING=1 python {JOB} <your script's arguments>"
    )


def test_mp_spawn_reporting_a_victim_does_not_make_it_the_culprit(jobs: Path):
    log = saved(jobs, "spawn-late.log", run(spawn(job_args=LATE), jobs))
    text = log.read_text(encoding="utf-8")
    # spawn reports whichever peer it saw die first (0 or 2, a race), and the culprit's
    # exception appears nowhere: only its device line does.
    named = int(re.findall(r"-- Process (\d) terminated with the following error:", text)[0])
    assert named != 1
    assert "device-side assert triggered" not in text
    result = explain(log)
    assert result.returncode == 0
    assert result.stdout.startswith(
        f"nb-cudaguard: a process the log does not name: {CAUSE}; process {named} was stopped "
        "because of it."
    )
    assert roles(verdict_of(log)) == {named: ("victim", "collective timed out")}


def test_per_rank_records_order_by_evidence_not_by_clock(jobs: Path):
    records = jobs / "records"
    records.mkdir()
    by_hand(jobs, 3, ("--records", str(records), *LATE))
    written = {p.name: json.loads(p.read_text()) for p in records.glob("rank-*.json")}
    assert set(written) == {"rank-0.json", "rank-1.json", "rank-2.json"}
    assert written["rank-0.json"]["time"] < written["rank-1.json"]["time"]  # a victim first
    payload = verdict_of(records)
    assert payload["distributed"]["culprit"] == 1
    assert roles(payload)[0] == ("victim", "stopped by its peer")
    first = explain(records).stdout.splitlines()[0]
    host = written["rank-1.json"]["host"]
    assert first == (
        f"nb-cudaguard: rank 1 ({host}, local rank 1): {CAUSE}; ranks 0 and 2 were stopped "
        "because of it."
    )


def test_records_inside_torchelastic_error_files_are_read(jobs: Path):
    logs, records = jobs / "elastic-records", jobs / "unused-records"
    records.mkdir()
    run(torchrun("--log-dir", str(logs), job_args=("--records", str(records))), jobs)
    error_file = json.loads(next(logs.rglob("attempt_0/1/error.json")).read_text())
    assert error_file["message"]["extraInfo"]["nb_cudaguard"]["rank"] == 1
    payload = verdict_of(logs)
    assert payload["distributed"]["culprit"] == 1
    assert payload["assert_lines"][0]["file"] == "IndexKernelUtils.cu"


def test_a_job_without_a_cuda_error_is_no_cuda_error(jobs: Path):
    log = saved(jobs, "plain.log", run(torchrun(job_args=("--plain",)), jobs))
    result = explain(log)
    assert result.returncode == 1
    assert "no CUDA error found" in result.stderr
    assert result.stdout == ""


def test_a_notebook_launch_names_no_victim_and_reruns_from_a_cell(jobs: Path):
    log = saved(jobs, "notebook.log", run(notebook_cell(jobs), jobs))
    text = log.read_text(encoding="utf-8")
    assert "Cell In[1]" in text and "train FAILED" in text
    root = text[text.index("Root Cause (first observed failure)") :]
    assert re.search(r"rank\s+: 0 \(local_rank: 0\)", root)  # the launcher names the victim
    result = explain(log)
    assert result.returncode == 0
    first, *rest = result.stdout.splitlines()
    assert first == (
        f"nb-cudaguard: a rank the log does not name: {CAUSE}; rank 0 was stopped because of it."
    )
    assert '  import os; os.environ["CUDA_LAUNCH_BLOCKING"] = "1"' in rest
    assert "torchrun" not in result.stdout


def test_srun_label_lines_name_the_task_that_raised(jobs: Path):
    # Ranks started one process each, as `srun` starts them; `srun --label` puts each task's
    # number in front of every line it prints.
    outputs = by_hand(jobs, 3, ("--culprit", "2"))
    labelled = "\n".join(
        f"{task}: {line}" for task, out in enumerate(outputs) for line in out.splitlines()
    )
    log = saved(jobs, "srun.log", labelled)
    payload = verdict_of(log)
    assert payload["distributed"]["launcher"] == "srun"
    assert payload["distributed"]["culprit"] == 2
    assert roles(payload)[0] == roles(payload)[1] == ("victim", "connection closed by peer")
    assert payload["distributed"]["rerun"]["command"].startswith(
        "CUDA_LAUNCH_BLOCKING=1 srun --label "
    )
