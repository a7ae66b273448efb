"""Shared fixtures: a real IPython shell, a real Jupyter kernel, a real Jupyter server with a
kernel of its own, and the `gpu` marker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from jupyter_harness import JupyterServer

ROOT = Path(__file__).resolve().parents[1]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_modules_first(items)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _longest_modules_first(items: list[pytest.Item]) -> None:
    """The longest modules first, the others in their order: by the kernels they restart (about
    5 s each) and the minutes a module says it takes besides (``pytest.mark.minutes(n)``: the
    peer suites' three runs). ``pytest -n auto --dist loadfile`` (the README's command) gives
    each worker whole modules in this order, so a long one is not the last to start while the
    other worker is idle. Tests keep their order within a module."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    seconds: Counter[str] = Counter()
    for item in items:
        # Only test functions have fixtures (a doctest or another plugin's item has none).
        if "server_kernel" in getattr(item, "fixturenames", ()):
            seconds[module(item)] += 5
        marker = item.get_closest_marker("minutes")
        if marker is not None:
            seconds[module(item)] = max(seconds[module(item)], 60 * marker.args[0])
    order = {name: rank for rank, name in enumerate(dict.fromkeys(map(module, items)))}
    items.sort(key=lambda item: (-seconds[module(item)], order[module(item)]))


@pytest.fixture(scope="session", autouse=True)
def keep_ram_in_a_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every restart keeps the namespace, in RAM where there is room (``keep/store.py``): the
    tests' kernels put it in a temporary directory instead of the machine's /dev/shm, where
    what no test restores would stay until it expires. Tests of the real places set it back."""
    values = {
        "NB_CUDAGUARD_KEEP_RAM": str(tmp_path_factory.mktemp("keep-ram")),
        # The watcher waits 30 s after a kernel's shutdown before it discards its keep (a
        # restart by a launcher that removed the connection file early); the tests that shut
        # kernels down wait 3 s (tests/keep/test_lifetime.py covers the grace itself).
        "NB_CUDAGUARD_KEEP_GRACE": "3",
        # The user's one keep watcher and its register of profiles (keep/lifetime.py): the
        # tests' own, not the machine user's.
        "NB_CUDAGUARD_USER_DIR": str(tmp_path_factory.mktemp("user-state")),
    }
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def guard_checks_first(request: pytest.FixtureRequest) -> None:
    """tests/input_guard/ test the guard's rules as a GPU's calls run them: every check judged
    before the call. By default a call on host memory runs first and is checked only when the CPU
    op raises (``judge.TRUST_HOST_OPS``): valid inputs would never reach a rule there, and a
    false alarm could not show. Tests of that shortcut ask for ``cpu_op_first``."""
    if request.node.path.parent.name == "input_guard":
        from nb_cudaguard.input_guard import judge

        request.getfixturevalue("monkeypatch").setattr(judge, "TRUST_HOST_OPS", False)


@pytest.fixture
def cpu_op_first(guard_checks_first: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's default for host memory: the CPU op first, the check only when it raises."""
    from nb_cudaguard.input_guard import judge

    monkeypatch.setattr(judge, "TRUST_HOST_OPS", True)


@pytest.fixture
def device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deferred guard as a CUDA tensor meets it, on CPU tensors: verdicts left on the device
    and read later. Host memory itself has nothing to defer (its violations raise at the call)."""
    from nb_cudaguard.input_guard import deferral, judge

    monkeypatch.setattr(judge, "TRUST_HOST_OPS", False)
    monkeypatch.setattr(deferral, "HOST_VERDICTS_AT_ONCE", False)


@pytest.fixture
def shell() -> Iterator[Any]:
    """A real InteractiveShell, with nb_cudaguard unloaded again afterwards."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    yield ip
    if "nb_cudaguard" in ip.extension_manager.loaded:
        ip.extension_manager.unload_extension("nb_cudaguard")


TERMINAL_ARGV = [
    "--simple-prompt",
    "--colors=NoColor",
    "--no-banner",
    "--HistoryManager.enabled=False",
]


def terminal_ipython(
    script: str, *pre: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A real terminal IPython, in a process of its own, reading ``script`` from its standard
    input; the Python lines ``pre`` run before it starts."""
    start = f"from IPython import start_ipython; start_ipython(argv={TERMINAL_ARGV!r})"
    return subprocess.run(
        [sys.executable, "-c", "\n".join([*pre, start])],
        input=script,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )


def kernel_env(**extra: str) -> dict[str, str]:
    """The environment for a kernel that imports this checkout's nb_cudaguard."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


@dataclass
class CellOutput:
    """What iopub said about one execute_request."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)

    def of_type(self, msg_type: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["msg_type"] == msg_type]

    @property
    def displays(self) -> list[dict[str, Any]]:
        return [m["content"]["data"] for m in self.of_type("display_data")]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m["content"] for m in self.of_type("error")]

    @property
    def stream(self) -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream"))


class Kernel:
    """A real ipykernel started through jupyter_client."""

    def __init__(self, env: dict[str, str]) -> None:
        from jupyter_client.manager import start_new_kernel

        self.manager, self.client = start_new_kernel(
            kernel_name="python3", env=env, extra_arguments=[], startup_timeout=60
        )

    def execute(self, code: str, timeout: float = 60) -> CellOutput:
        client = self.client
        for _ in range(5):
            msg_id = client.execute(code)
            reply = client.get_shell_msg(timeout=timeout)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = client.get_shell_msg(timeout=timeout)
            # ipykernel 6 aborts requests that arrive while it still stops after an error,
            # which can be just after the failed cell's idle status: the cell never ran.
            if reply["content"].get("status") != "aborted":
                break
            time.sleep(0.05)
        output = CellOutput(reply=reply["content"])
        while True:
            msg = client.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return output
            output.messages.append(msg)

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def managed_kernel(connection_file: Path, env: dict[str, str]) -> tuple[Any, Any]:
    """A kernel started by a jupyter_client KernelManager at a chosen connection file (what our
    restart keys its files on, and how it tells VS Code's kernels apart), and a ready client."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3", connection_file=str(connection_file))
    manager.start_kernel(env=env)
    return manager, ready_client(manager)


def ready_client(manager: Any) -> Any:
    """A client of ``manager``'s kernel once the kernel answers, after a start or a restart."""
    client = manager.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return client


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    k = Kernel(kernel_env())
    try:
        yield k
    finally:
        k.shutdown()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    """A real Jupyter server on 127.0.0.1 (tests/jupyter_harness.py), one per test module: the
    modules' tests share its IPython profile, not another module's."""
    from jupyter_harness import JupyterServer

    s = JupyterServer(tmp_path_factory.mktemp("server"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def server_kernel(
    server: JupyterServer, request: pytest.FixtureRequest
) -> Iterator[tuple[str, int]]:
    """A kernel started through ``server``, once it answers: its id and its process's pid. Its
    shutdown goes on beside the next test (the server waits for it before it stops). In a
    module marked ``kernels_ahead`` (one whose tests change nothing a kernel's start reads),
    the next test's kernel starts while this test runs."""
    ahead = request.node.get_closest_marker("kernels_ahead") is not None
    with server.new_kernel(wait_shutdown=False, ahead=ahead) as started:
        yield started


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable
