"""VS Code never restarts a dead kernel: the restart replaces the process in place (execve).

A real kernel with a VS Code-style connection file (``kernel-v2-*.json``; the stock kernelspec
passes it as ``-f``, so the plan is asked for VS Code explicitly) and a real
jupyter_client frontend, whose ZMQ sockets reconnect to the same ports.
"""

from __future__ import annotations

import time

import pytest
from conftest import kernel_env, managed_kernel

PROBE = "import os; _probe = (os.getpid(), os.environ.get('CUDA_LAUNCH_BLOCKING'))"


@pytest.fixture
def vscode_kernel(tmp_path):
    env = kernel_env(IPYTHONDIR=str(tmp_path / "ipython"))
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    manager, client = managed_kernel(tmp_path / "kernel-v2-4242abc.json", env)
    yield manager, client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def _probe(client, timeout: float = 20) -> tuple[int, str | None]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.execute_interactive(PROBE, timeout=2)
            reply = client.execute_interactive("", user_expressions={"p": "_probe"}, timeout=2)
            return eval(reply["content"]["user_expressions"]["p"]["data"]["text/plain"])
        except (TimeoutError, KeyError):
            if time.monotonic() > deadline:
                raise


def _restart(client, blocking: bool) -> None:
    code = (
        "from nb_cudaguard.restart.methods import plan_restart, restart_kernel\n"
        "from nb_cudaguard.restart.environment import Environment\n"
        "p = plan_restart(Environment.VSCODE)\n"
        f"restart_kernel(blocking={blocking}, plan=p)"
    )
    client.execute_interactive(code, timeout=20)
    time.sleep(0.6)  # the restart runs 0.3 s after the cell


def test_a_blocking_restart_in_place_keeps_the_pid_and_sets_the_variable(vscode_kernel):
    _, client = vscode_kernel
    client.execute_interactive("before_restart = 1", timeout=20)
    pid, _ = _probe(client)
    _restart(client, blocking=True)
    assert _probe(client) == (pid, "1")
    fresh = client.execute_interactive("", user_expressions={"x": "'before_restart' in dir()"})
    assert fresh["content"]["user_expressions"]["x"]["data"]["text/plain"] == "False"


def test_a_plain_restart_in_place_drops_the_variable_we_set(vscode_kernel):
    _, client = vscode_kernel
    pid, _ = _probe(client)
    _restart(client, blocking=True)
    _probe(client)
    _restart(client, blocking=False)
    assert _probe(client) == (pid, None)
