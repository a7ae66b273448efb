"""Real multi-rank jobs on CPU (gloo) whose output the explain tests read: torchrun, mp.spawn and
ranks started by hand, each with one rank raising PyTorch's exact device-assert exception.

Every run has a time limit and kills its whole process group when it runs out, so no rank
outlives a test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

JOB = Path(__file__).with_name("failing_job.py")
LIMIT = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    return env


def run(command: list[str], cwd: Path, shell_echo: bool = False) -> str:
    """The job's console output (stdout and stderr as one stream, as a terminal shows it)."""
    if shell_echo:  # bash -x echoes the command as "+ ...", as CI logs of launch scripts do
        command = ["bash", "-xc", " ".join(command)]
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        raise
    assert process.returncode != 0, "the job was meant to fail"
    return out.decode("utf-8", "replace")


def torchrun(*options: str, world: int = 3, job_args: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
        f"--master-port={free_port()}", *options, str(JOB), *job_args,
    ]  # fmt: skip


def spawn(world: int = 3, job_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, str(JOB), "--spawn", str(world), "--port", str(free_port()), *job_args]


def by_hand(cwd: Path, world: int, job_args: tuple[str, ...]) -> list[str]:
    """One process per rank, no launcher (as ``srun`` starts them): nobody kills the others."""
    port = str(free_port())
    processes = []
    for rank in range(world):
        env = _env() | {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        }  # fmt: skip
        processes.append(
            subprocess.Popen(
                [sys.executable, str(JOB), *job_args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=LIMIT)[0].decode("utf-8", "replace"))
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    return outputs


# What accelerate's notebook_launcher does in a cell (accelerate/launchers.py): elastic_launch
# with start_method="fork" and a function as the entry point, no restarts.
NOTEBOOK_CELL = """\
import argparse, sys
sys.path.insert(0, {folder!r})
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
import failing_job

def train():
    # The culprit raises late: its peer's collective times out first, and is what the
    # launcher reports.
    failing_job.elastic_main(argparse.Namespace(culprit=1, late=4.0, timeout=1.5, records="",
                                                plain=False, port=0))

config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="nb",
                      rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:{port}",
                      start_method="fork", monitor_interval=0.1, max_restarts=0)
elastic_launch(config, train)()
"""


def notebook_cell(cwd: Path) -> list[str]:
    """IPython running the launcher's cell: the traceback the notebook's user sees."""
    cell = NOTEBOOK_CELL.format(folder=str(JOB.parent), port=free_port())
    (cwd / "cell.py").write_text(cell, encoding="utf-8")
    return [
        sys.executable, "-m", "IPython", "--colors=NoColor", "--no-banner",
        "-c", f"exec(open({str(cwd / 'cell.py')!r}).read())",
    ]  # fmt: skip
