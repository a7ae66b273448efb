"""Real jobs, real launchers (torchrun, mp.spawn), gloo on CPU: one rank fails mid-training.

The culprit writes its record at once, torchrun's own "Root Cause" shows our verdict for it, and
every peer, blocked in the next all-reduce, stops within 5 s with one line, though the culprit's
process lingers (as a GPU process's CUDA teardown can) and the collective's timeout is 120 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from jupyter_harness import free_port

from nb_cudaguard.ranks import peers

HERE = Path(__file__).resolve().parent
JOB = HERE / "rank_job.py"
STOP_S = 5.0
RUN_TIMEOUT_S = 90  # the job's own collective timeout is 120 s: a hang fails here first


_GROUPS: list[int] = []


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """Whatever a failed test left of its job ends with it (each job has its own session)."""
    yield
    while _GROUPS:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(_GROUPS.pop(), signal.SIGKILL)


def _env(rank_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update({"NB_CUDAGUARD_RANK_DIR": str(rank_dir), "LINGER_S": "60", **extra})
    return env


def _run(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    _GROUPS.append(proc.pid)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end in {RUN_TIMEOUT_S} s:\n{out[-4000:]}")
    ended = time.time()
    return subprocess.CompletedProcess(argv, proc.returncode, out, ""), ended


def _records(rank_dir: Path) -> dict[int, dict[str, object]]:
    found = {}
    for path in rank_dir.glob("rank-*.json"):
        data = json.loads(path.read_text())
        found[int(data["rank"])] = data
    return found


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _check(
    records: dict[int, dict[str, object]],
    world: int,
    kind: str,
    out: str,
    ended: float,
) -> None:
    """Every rank has its record: the launchers SIGTERM all ranks once the first stopped peer
    exits, so this fails unless each peer's watcher found the failure before that."""
    assert sorted(records) == list(range(world)), out[-4000:]
    culprit = records[1]
    assert culprit["kind"] == kind and culprit["world_size"] == world
    failed_at = float(culprit["time"])  # type: ignore[arg-type]
    for rank, rec in records.items():
        if rank == 1:
            continue
        assert rec["kind"] == "stopped-by-peer"
        assert float(rec["time"]) - failed_at < STOP_S  # type: ignore[arg-type]
        assert rec["cause_id"] == culprit["cause_id"]
    lines = [ln for ln in out.splitlines() if "stopped because rank 1 failed: " in ln]
    assert len(lines) >= world - 1, out[-4000:]
    # the whole job ended long before the lingering culprit or the collective's timeout
    assert ended - failed_at < 20, out[-4000:]
    deadline = time.time() + 10
    while not all(_gone(int(r["pid"])) for r in records.values()):  # type: ignore[arg-type]
        assert time.time() < deadline, "a rank outlived its job"
        time.sleep(0.2)


def _torchrun(world: int, mode: str) -> list[str]:
    """torchrun's command line for the job: ``world`` ranks on this host, in ``mode``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world}",
        f"--master-port={free_port()}",
        str(JOB),
        mode,
    ]


def test_torchrun_device_assert_names_rank_1_and_stops_the_others(tmp_path: Path) -> None:
    world = 3
    argv = _torchrun(world, "cuda")
    done, ended = _run(argv, _env(tmp_path))
    assert done.returncode != 0
    records = _records(tmp_path)
    _check(records, world, "cuda-error", done.stdout, ended)
    assert records[1]["cause_id"] == "label-out-of-range"  # from the H100's line on fd 2
    assert records[1]["device_lines"] and "Loss.cu" in records[1]["device_lines"][0]  # type: ignore[index]
    # torchrun's own summary: the root cause is rank 1, with our verdict
    root = done.stdout.split("Root Cause (first observed failure):", 1)[1]
    assert "rank      : 1 (local_rank: 1)" in root
    assert "nb_cudaguard: rank 1: A class label is outside" in root


def test_torchrun_guard_refusal_is_the_culprits_record(tmp_path: Path) -> None:
    world = 2
    argv = _torchrun(world, "guard")
    done, ended = _run(argv, _env(tmp_path))
    records = _records(tmp_path)
    _check(records, world, "guard-refusal", done.stdout, ended)
    assert "GuardIndexError" in str(records[1]["exception"])
    assert "CUDA error" not in done.stdout  # refused before any kernel: nothing poisoned


def test_mp_spawn_world_4_stops_the_peers(tmp_path: Path) -> None:
    world = 4
    code = (
        "import torch.multiprocessing as mp, rank_job\n"
        f"mp.spawn(rank_job.spawn_main, args=({world}, 'cuda'), nprocs={world})\n"
    )
    env = _env(tmp_path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    done, ended = _run([sys.executable, "-c", code], env)
    assert done.returncode != 0
    records = _records(tmp_path)
    _check(records, world, "cuda-error", done.stdout, ended)
    # the whole job, not only the first stopped peer, ended soon after the failure
    assert ended - float(records[1]["time"]) < STOP_S + 3  # type: ignore[arg-type]


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_real_device_assert(tmp_path: Path) -> None:
    done, ended = _run(_torchrun(2, "device"), _env(tmp_path, LINGER_S="0"))
    assert done.returncode != 0
    records = _records(tmp_path)
    _check(records, 2, "cuda-error", done.stdout, ended)
    assert records[1]["cause_id"] == "index-out-of-range"
    assert records[1]["device_lines"], done.stdout[-4000:]  # read from the rank's real fd 2


# A peer forked from a kernel while the kernel's IOPub thread held sys.stdout's and sys.stderr's
# buffer locks (it flushes notebook_launcher's "Launching training" line as the launcher forks):
# nothing in the child ever releases them. It still stops, and its line still reaches the cell.
_FORKED_WHILE_HELD = """
import os, sys, threading, time
import torch.distributed
from nb_cudaguard.ranks import peers
culprit = {"rank": 1, "exception": "RuntimeError: the culprit's error"}
held, release = threading.Event(), threading.Event()
def hold():
    with sys.stdout._buffer_lock, sys.stderr._buffer_lock:
        held.set()
        release.wait()
print("buffered before the fork", end="")
threading.Thread(target=hold, daemon=True).start()
held.wait()
started = time.monotonic()
pid = os.fork()
if pid == 0:
    peers._stop_for(culprit)
release.set()
while time.monotonic() - started < 15:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = None
code = None if status is None else os.waitstatus_to_exitcode(status)
print("\\nEXIT", code, round(time.monotonic() - started, 1))
"""


def test_a_peer_forked_while_the_kernels_streams_were_locked_still_stops(kernel) -> None:
    cell = kernel.execute(_FORKED_WHILE_HELD, timeout=60)
    assert cell.reply["status"] == "ok", cell.errors
    exit_line = [ln for ln in cell.stream.splitlines() if ln.startswith("EXIT ")]
    assert exit_line, cell.stream
    _, code, seconds = exit_line[0].split()
    assert code == str(peers.EXIT_CODE) and float(seconds) < STOP_S, cell.stream
    # (its line goes to fd 2: this kernel leaves fd 2 on the test process's stderr)
