"""A job launched from a cell of a real kernel with ``%load_ext nb_cudaguard``: accelerate's
``notebook_launcher`` (fork, torch's elastic agent) and torch's ``mp.spawn``, gloo on CPU, rank 1
failing between all-reduces. The launcher's exception names no CUDA error (or a victim); the panel
must still appear every time, name rank 1 and its cause, and tell the truth about this kernel."""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import CellOutput, Kernel, kernel_env
from jupyter_harness import free_port

from nb_cudaguard.diagnosis.schema import MIME_TYPE

HERE = Path(__file__).resolve().parent
WIDGET = "application/vnd.jupyter.widget-view+json"

pytest.importorskip("accelerate")


@pytest.fixture
def job_kernel(tmp_path: Path) -> Iterator[Kernel]:
    env = kernel_env()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    k = Kernel(env)
    stacks = tmp_path / "stacks.txt"
    try:
        # SIGUSR1 makes the kernel, and every rank it forks (the handler is inherited), write
        # its threads' stacks to one file: what a hung launch is shown with (_run)
        loaded = k.execute(
            "%load_ext nb_cudaguard\nimport rank_job, faulthandler, signal\n"
            f"_stacks = open({str(stacks)!r}, 'a')\n"
            "faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)"
        )
        assert loaded.reply["status"] == "ok", loaded.stream
        k.stacks = stacks  # type: ignore[attr-defined]
        yield k
    finally:
        k.shutdown()


def _run(kernel: Kernel, code: str, timeout: float = 90) -> CellOutput:
    """``code``'s output in ``kernel``; a launch that has not ended in ``timeout`` s fails with the
    process tree and every process's stacks, not a bare ``Empty`` (it happened once in CI)."""
    try:
        return kernel.execute(code, timeout=timeout)
    except queue.Empty:
        pid = kernel.manager.provisioner.pid  # type: ignore[union-attr]
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        described = []
        for proc in tree:
            try:
                described.append(
                    f"{proc.pid} {proc.status()} {' '.join(proc.cmdline()).split()[:4]}"
                )
                proc.send_signal(signal.SIGUSR1)
            except psutil.Error as error:
                described.append(f"{proc.pid}: {error}")
        time.sleep(2)
        stacks = kernel.stacks.read_text()  # type: ignore[attr-defined]
        pytest.fail(
            f"the launch did not end in {timeout} s\n" + "\n".join(described) + "\n" + stacks
        )


def _panel(cell: object) -> dict[str, object]:
    payloads = [d[MIME_TYPE] for d in cell.displays if MIME_TYPE in d]  # type: ignore[attr-defined]
    assert len(payloads) == 1, cell.stream  # type: ignore[attr-defined]
    assert not [d for d in cell.displays if WIDGET in d]  # type: ignore[attr-defined]
    return payloads[0]  # type: ignore[no-any-return]


def _check(payload: dict[str, object], cause: str) -> None:
    assert str(payload["title"]).startswith("Rank 1 failed: ")
    assert payload["cause"] == cause
    assert "needs no restart" in str(payload["explanation"])
    action = payload["action"]
    assert isinstance(action, dict) and action["restart_kernel"] == "not-needed"


def test_notebook_launcher_panel_every_time(job_kernel: Kernel) -> None:
    for mode, cause in (
        ("cuda", "label-out-of-range"),
        ("cuda", "label-out-of-range"),
        ("guard", "not-sticky"),
    ):
        cell = _run(
            job_kernel,
            "from accelerate import notebook_launcher\n"
            f"notebook_launcher(rank_job.train, args=({mode!r},), num_processes=2, "
            f"use_port='{free_port()}')",
        )
        assert cell.reply["status"] == "error"
        assert cell.errors[0]["ename"] == "ChildFailedError"
        payload = _panel(cell)
        _check(payload, cause)
    # the kernel never initialised CUDA, and says so: no restart was needed
    probe = job_kernel.execute("import torch; print(torch.cuda.is_initialized())")
    assert probe.stream.strip() == "False"


def test_mp_spawn_panel_names_the_culprit_not_the_victim(job_kernel: Kernel) -> None:
    cell = _run(
        job_kernel,
        "import os, torch.multiprocessing as mp\n"
        f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_port()}')\n"
        "mp.spawn(rank_job.spawn_main, args=(3, 'cuda'), nprocs=3)",
    )
    assert cell.reply["status"] == "error"
    _check(_panel(cell), "label-out-of-range")
