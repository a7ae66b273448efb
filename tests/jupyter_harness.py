"""A real Jupyter server on 127.0.0.1 and a minimal frontend over its kernel websocket.

Shared by the server tests (through the ``server`` and ``server_kernel`` fixtures of
tests/conftest.py), the browser test and the benchmarks. Everything a server writes (runtime
files, IPython profile, notebooks) lives under one temporary directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# This harness's servers read no config files (JUPYTER_NO_CONFIG), so the server extension that a
# pip install enables through this file is given on the command line, from the same file.
SERVER_CONFIG = ROOT / "jupyter-config" / "jupyter_server_config.d" / "nb_cudaguard.json"


def installed_extensions() -> tuple[str, ...]:
    """The server arguments that enable what the package's shipped config enables."""
    enabled = json.loads(SERVER_CONFIG.read_text())["ServerApp"]["jpserver_extensions"]
    return tuple(f"--ServerApp.jpserver_extensions={k}={v}" for k, v in enabled.items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        IPYTHONDIR=str(base / "ipython"),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_NO_CONFIG="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
    )
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    env.update(extra)
    return env


# Installed for the agent test (jupyter-mcp-server needs jupyter-collaboration), their frontend
# parts expect the collaboration server extension, which these servers do not load (no config
# files): JupyterLab and Notebook 7 would wait for a document forever. A user's JupyterLab
# without them, as the browser tests mean to see it.
_COLLABORATION_FRONTENDS = (
    "@jupyter/docprovider-extension",
    "@jupyter/collaboration-extension",
    "@datalayer/jupyter-server-nbmodel",
)


def _without_collaboration(base: Path) -> tuple[str, ...]:
    """The frontend's arguments: an app settings directory whose page config disables them (the
    one page config read without config files)."""
    settings = base / "app-settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "page_config.json").write_text(
        json.dumps({"disabledExtensions": list(_COLLABORATION_FRONTENDS)})
    )
    return tuple(f"--{app}.app_settings_dir={settings}" for app in ("LabApp", "JupyterNotebookApp"))


class JupyterServer:
    """``jupyter server`` (or ``jupyter lab``) as a subprocess; always stop() it."""

    def __init__(
        self,
        base: Path,
        token: str = "test-token",
        app: str = "jupyter_server",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.base = base
        self.token = token
        self._shutdown: threading.Thread | None = None  # a kernel's shutdown going on beside
        self._ahead: Future[str] | None = None  # a kernel starting for the next caller
        self.port = free_port()
        for sub in ("runtime", "ipython", "config", "root"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        self.root = base / "root"
        self.env = isolated_env(base)
        args = [
            sys.executable,
            "-m",
            app,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={token}",
            "--ServerApp.password=",
            # A tokenless server refuses API writes without the browser's XSRF cookie; this
            # harness has none, so such a server must accept them (the kernel still sees no token).
            f"--ServerApp.disable_check_xsrf={not token}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root
            args.append("--allow-root")
        if app != "jupyter_server":
            args.extend(_without_collaboration(base))
        args.extend(extra_args)
        self.log = open(base / "server.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root
        )
        self.url = f"http://127.0.0.1:{self.port}"
        try:
            self._wait_ready(60)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {(self.base / 'server.log').read_text()}")
            try:
                if self.request("GET", "/api/status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("Jupyter server did not start")

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        if method == "POST" and data is None:
            data = b""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            return error.code, None

    def start_kernel(self) -> str:
        status, info = self.request("POST", "/api/kernels", {"name": "python3"})
        assert status == 201, status
        return str(info["id"])

    @contextlib.contextmanager
    def new_kernel(
        self, wait_shutdown: bool = True, ahead: bool = False
    ) -> Iterator[tuple[str, int]]:
        """A kernel started through this server, once it answers: its id and its process's pid.
        Shut down on exit; with ``wait_shutdown=False`` the shutdown goes on beside the caller's
        next step (a kernel that imported torch takes 0.6 s more to exit: torch's teardown), one
        at a time, and stop() waits for it. With ``ahead``, the next caller's kernel starts at
        once too, idle beside this one while the caller works, and that caller takes it (a
        kernel takes ~0.8 s to answer: the held-out rounds start hundreds)."""
        kid = self._take_ahead() or self.start_kernel()
        if ahead:
            pool = ThreadPoolExecutor(1)
            self._ahead = pool.submit(self.start_kernel)
            pool.shutdown(wait=False)
        try:
            pid, _ = wait_for_new_process(self, kid, old_pid=-1)
            yield kid, pid
        finally:
            self._join_shutdown()
            if wait_shutdown:
                self.request("DELETE", f"/api/kernels/{kid}")
            else:
                self._shutdown = threading.Thread(
                    target=self.request, args=("DELETE", f"/api/kernels/{kid}"), daemon=True
                )
                self._shutdown.start()

    def _take_ahead(self) -> str | None:
        ahead, self._ahead = self._ahead, None
        return ahead.result(60) if ahead is not None else None

    def _join_shutdown(self) -> None:
        if self._shutdown is not None:
            self._shutdown.join(60)
            self._shutdown = None

    def restart_kernel(self, kid: str) -> None:
        status, _ = self.request("POST", f"/api/kernels/{kid}/restart")
        assert status == 200, status

    def connect(self, kid: str) -> KernelSocket:
        return KernelSocket(self, kid)

    def execute(self, kid: str, code: str, timeout: float = 30, silent: bool = False) -> Reply:
        """Run one cell over a websocket of its own, as a frontend that opens a notebook does."""
        with self.connect(kid) as sock:
            return sock.execute(code, timeout=timeout, silent=silent)

    def stop(self) -> None:
        self._join_shutdown()
        with contextlib.suppress(Exception):  # (one that did not start has nothing to end)
            ahead = self._take_ahead()
            if ahead is not None and self.process.poll() is None:
                self.request("DELETE", f"/api/kernels/{ahead}")
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


@dataclass
class Reply:
    """What one execute_request produced."""

    status: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    execution_count: int | None = None
    msg_id: str = ""  # the request's: a frontend shows later output with it as parent there too

    @property
    def stream(self) -> str:
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream")

    @property
    def displays(self) -> list[dict[str, Any]]:
        return [
            m["content"]["data"]
            for m in self.messages
            if m["msg_type"] in ("display_data", "execute_result")
        ]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] == "error"]

    def comm_opens(self) -> list[dict[str, Any]]:
        return [m["content"] for m in self.messages if m["msg_type"] == "comm_open"]

    def button(self, description: str) -> str:
        """The comm id of the widget button with this label, which a click is sent to."""
        return next(
            c["comm_id"]
            for c in self.comm_opens()
            if c["data"]["state"].get("description") == description
        )

    @property
    def widget_states(self) -> list[dict[str, Any]]:
        """The state updates the kernel sent to widgets (a button disabled, a label's text)."""
        return [
            m["content"]["data"].get("state", {})
            for m in self.messages
            if m["msg_type"] == "comm_msg"
        ]

    @property
    def widget_text(self) -> str:
        """What the widgets' updates said, one after the other."""
        return " ".join(s["value"] for s in self.widget_states if "value" in s)


class KernelSocket:
    """A frontend's view of one kernel: its websocket channel, JSON protocol."""

    def __init__(self, server: JupyterServer, kid: str, timeout: float = 10) -> None:
        import websocket

        self.session = uuid.uuid4().hex
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kid}/channels?session_id={self.session}"
        header = [f"Authorization: token {server.token}"] if server.token else []
        self.ws = websocket.create_connection(url, timeout=timeout, header=header)

    def __enter__(self) -> KernelSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": "test",
                        "session": self.session,
                        "msg_type": msg_type,
                        "version": "5.3",
                        "date": "",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                    "channel": channel,
                    "buffers": [],
                }
            )
        )
        return msg_id

    def collect(
        self, msg_id: str, timeout: float, reply: bool = True, cell: Reply | None = None
    ) -> Reply:
        """iopub messages of one request until it goes idle, and the shell reply's status;
        with ``cell`` (an earlier execute's reply), also the output sent meanwhile with that
        cell's request as parent, which a frontend adds to that cell's outputs."""
        deadline = time.monotonic() + timeout
        status: str | None = None if reply else "none"
        count: int | None = None
        idle = False
        messages: list[dict[str, Any]] = []
        while not (idle and status is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete reply to {msg_id}")
            self.ws.settimeout(remaining)
            msg = json.loads(self.ws.recv())
            parent = msg.get("parent_header", {}).get("msg_id")
            if cell is not None and parent == cell.msg_id and msg["channel"] == "iopub":
                if msg["msg_type"] != "status":
                    messages.append(msg)
                continue
            if parent != msg_id:
                continue
            if msg["channel"] == "shell":
                status = msg["content"].get("status", "ok")
                count = msg["content"].get("execution_count")
            elif msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
            elif msg["channel"] == "iopub":
                messages.append(msg)
        return Reply(status, messages, count, msg_id)

    def execute(self, code: str, timeout: float = 30, silent: bool = False) -> Reply:
        """One cell as a frontend runs it; ``silent``: as a frontend runs its own code, which
        IPython runs without the cell events (no cell of the user's)."""
        msg_id = self.send(
            "shell",
            "execute_request",
            {"code": code, "silent": silent, "store_history": not silent},
        )
        return self.collect(msg_id, timeout)

    def click(self, comm_id: str) -> str:
        """What a widget frontend sends when a Button is clicked (a comm_msg has no reply)."""
        return self.send(
            "shell",
            "comm_msg",
            {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}},
        )

    def close(self) -> None:
        self.ws.close()


PROBE = "import os; print(os.getpid(), os.environ.get('CUDA_LAUNCH_BLOCKING'))"


def probe(server: JupyterServer, kid: str, timeout: float = 5) -> tuple[int, str | None]:
    """(pid, CUDA_LAUNCH_BLOCKING) of the kernel's current process, over a fresh websocket;
    silent, so that the new process's first cell is still the test's."""
    out = server.execute(kid, PROBE, timeout=timeout, silent=True).stream.split()
    return int(out[0]), None if out[1] == "None" else out[1]


def wait_for_new_process(
    server: JupyterServer, kid: str, old_pid: int, timeout: float = 30
) -> tuple[int, str | None]:
    """Poll until the kernel answers from a process other than ``old_pid``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            pid, value = probe(server, kid, timeout=max(0.5, min(5, deadline - time.monotonic())))
            if pid != old_pid:
                return pid, value
        except Exception as error:  # restarting: refused, closed or no reply yet
            last = error
        time.sleep(0.05)
    raise TimeoutError(f"kernel {kid} did not come back in a new process ({last!r})")


def outputs_of(messages: list[dict[str, Any]], cell: Reply) -> list[dict[str, Any]]:
    """The nbformat outputs a frontend gives ``cell`` from these iopub messages: those with the
    cell's request as parent, in order (JupyterLab's OutputArea, which stays attached to the
    cell's request after it ran)."""
    outputs: list[dict[str, Any]] = []
    for msg in messages:
        if msg.get("parent_header", {}).get("msg_id") != cell.msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            outputs.append(
                {"output_type": "stream", "name": content["name"], "text": content["text"]}
            )
        elif kind in ("display_data", "execute_result"):
            output = {"output_type": kind, "data": content["data"], "metadata": content["metadata"]}
            if kind == "execute_result":
                output["execution_count"] = content["execution_count"]
            outputs.append(output)
        elif kind == "error":
            outputs.append(
                {"output_type": "error"} | {k: content[k] for k in ("ename", "evalue", "traceback")}
            )
        elif kind == "clear_output":
            outputs.clear()
    return outputs


def save_notebook(
    server: JupyterServer, name: str, cells: list[tuple[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """Save code cells (source, outputs) through the server's contents API, as a frontend saves,
    and read the file back as written (the server's pre-save hooks applied)."""
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {
                "cell_type": "code",
                "id": f"cell-{i}",
                "source": source,
                "metadata": {},
                "execution_count": None,
                "outputs": outputs,
            }
            for i, (source, outputs) in enumerate(cells)
        ],
    }
    status, _ = server.request(
        "PUT", f"/api/contents/{name}", {"type": "notebook", "content": notebook}
    )
    assert status in (200, 201), status
    saved: dict[str, Any] = json.loads((server.root / name).read_text())
    return saved


def nbconvert(server: JupyterServer, name: str, to: str = "markdown") -> str:
    """The saved notebook ``name`` as ``jupyter nbconvert --to <to>`` writes it."""
    done = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", to, "--stdout", str(server.root / name)],
        capture_output=True,
        text=True,
        timeout=180,
        env=server.env,
        check=True,
    )
    return done.stdout
