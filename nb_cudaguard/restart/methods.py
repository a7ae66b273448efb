"""Restart this kernel from inside it, optionally with CUDA_LAUNCH_BLOCKING=1 in the new process.

The only cure for a poisoned CUDA context is a new process (NVIDIA: "the process must be
terminated and relaunched", https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html).
How to get one depends on who manages the kernel (docs/restart.md), tried in this order:

1. ``REST``: the Jupyter server that started this kernel (``jpserver-<pid>.json`` whose pid is an
   ancestor of this process) is asked ``POST /api/kernels/<id>/restart`` with its token, from a
   thread after a short delay: the call blocks until this process is gone.
2. ``KILL`` (Colab) / ``EXIT`` (Kaggle, a tokenless or unreachable server, a plain kernel manager):
   the process ends with ``os._exit`` and the manager's auto-restarter starts a new one.
3. ``EXECVE`` (VS Code, which never restarts a dead kernel): the kernel is replaced in place, same
   PID, ports and connection file, with the new environment.

``exit()`` and ``kernel.do_shutdown`` are never used: they run atexit handlers, and CUDA's teardown
can hang after a sticky error, so the kernel would never come back. For the same reason a REST
restart, which asks the kernel to shut down politely, finds an atexit handler of ours registered
last (so it runs first) that ends the process at once.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..files.keys import kernel_key
from ..runtime.blocking import BLOCKING, MARKER
from . import injection
from .environment import (
    _ASK_IPYKERNEL,
    Environment,
    detect,
    kernel_id,
    launch_args,
    running_kernel_connection,
)
from .server import Server, ancestors, api_request, find_server, runtime_dirs, server_knows_kernel

DELAY_S = 0.3  # lets the reply, the widget update and fd output reach the frontend first
POST_TIMEOUT_S = 60.0


class Method(str, enum.Enum):
    REST = "rest"
    KILL = "kill"
    EXIT = "exit"
    EXECVE = "execve"


@dataclass(frozen=True)
class RestartPlan:
    """How this kernel will be restarted, and what to tell the user about it."""

    method: Method
    environment: Environment
    connection_file: str | None
    kernel_id: str | None = None
    server: Server | None = None
    note: str = ""  # why this method (a fallback says what it fell back from)
    warning: str = ""  # said before the restart (blocking mode with several GPUs, ...)
    kept: str = ""  # what was kept for the new process to restore (keep/), said after


class RestartError(RuntimeError):
    """This process cannot be restarted from inside (not a kernel)."""


# --- choosing and doing --------------------------------------------------------------------------


def plan_restart(
    environment: Environment | None = None,
    connection: str | None = _ASK_IPYKERNEL,
    candidate_pids: Sequence[int] | None = None,
    directories: Iterable[Path] | None = None,
) -> RestartPlan:
    """How to restart this kernel. ``connection`` is its connection file (by default asked of
    ipykernel); None, or a process that is not a kernel, raises ``RestartError``."""
    if connection == _ASK_IPYKERNEL:
        connection = running_kernel_connection()
    environment = detect(connection=connection) if environment is None else environment
    if environment is Environment.TERMINAL or connection is None:
        raise RestartError(
            "this is not a Jupyter kernel (terminal IPython, an in-process kernel or a script): "
            "there is no kernel process to restart"
        )
    if environment is Environment.VSCODE:
        return RestartPlan(
            Method.EXECVE, environment, connection, note="VS Code never restarts a dead kernel"
        )
    kid = kernel_id(connection) if connection else None
    note = "no Jupyter server found among this kernel's parents"
    if kid is not None:
        pids = ancestors() if candidate_pids is None else candidate_pids
        dirs = runtime_dirs(connection) if directories is None else directories
        server = find_server(dirs, pids)
        if server is not None:
            if server_knows_kernel(server, kid):
                return RestartPlan(Method.REST, environment, connection, kid, server)
            note = (
                "the Jupyter server has no token"
                if not server.token
                else "the Jupyter server did not answer"
            )
    method = Method.KILL if environment is Environment.COLAB else Method.EXIT
    return RestartPlan(method, environment, connection, kid, note=note)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _end_process(method: Method) -> None:
    _flush()
    time.sleep(0.05)  # ipykernel forwards flushed text from a thread: give it a moment
    if method is Method.KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _exit_now() -> None:
    _flush()
    os._exit(0)


def _rest_restart(plan: RestartPlan) -> None:
    assert plan.server is not None and plan.kernel_id is not None
    # The server asks the kernel to shut down: skip the atexit handlers (CUDA teardown can hang).
    atexit.register(_exit_now)
    try:
        api_request(plan.server, f"kernels/{plan.kernel_id}/restart", "POST", POST_TIMEOUT_S)
    except Exception:
        # Reached only if the server failed us while we still live: let it auto-restart us.
        _end_process(Method.EXIT)


def _execve_environment(blocking: bool, after_cell: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if MARKER in env:  # blocking mode came from us: it ends now
        env.pop(MARKER)
        for name in BLOCKING:
            env.pop(name, None)
    if blocking:
        env.update(BLOCKING)
        env[MARKER] = "" if after_cell is None else str(after_cell)
    return env


def _execve_in_place(env: dict[str, str]) -> None:
    _flush()
    import multiprocessing

    for child in multiprocessing.active_children():  # DataLoader workers & co.
        with contextlib.suppress(Exception):
            child.terminate()
    # ipykernel points fd 1/2 at pipes it reads from a thread that will not survive exec: put the
    # originals back, or the new kernel's C-level output is lost.
    for fd, stream in ((1, sys.__stdout__), (2, sys.__stderr__), (1, sys.stdout), (2, sys.stderr)):
        original = getattr(stream, "_original_stdstream_copy", None)
        if isinstance(original, int):
            with contextlib.suppress(OSError):
                os.dup2(original, fd)
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):
                    os.set_inheritable(int(name), False)
    args = launch_args()
    os.execve(sys.executable, [sys.executable, *args[1:]], env)


def restart_kernel(
    blocking: bool = True,
    *,
    after_cell: int | None = None,
    profile: tuple[str, str] | None = None,
    plan: RestartPlan | None = None,
    delay: float = DELAY_S,
    connection: str | None = _ASK_IPYKERNEL,
    warning: str = "",
    load_extension: bool = False,
) -> RestartPlan:
    """Restart this kernel; with ``blocking``, its next process alone gets CUDA_LAUNCH_BLOCKING=1.

    Returns at once with the plan; the kernel goes away ``delay`` seconds later, so that this
    cell's output and reply still reach the frontend. Re-run the notebook from the top afterwards.
    ``profile`` is the IPython profile's (location, startup directory), where a blocking restart
    leaves its one-shot startup file; ``after_cell`` is the cell that crashed, named in the new
    kernel's banner. ``connection`` is the kernel's connection file (None: not a kernel);
    ``warning`` is said with the plan (blocking mode with several GPUs, ...);
    ``load_extension``: the new process loads nb_cudaguard at its start (the kernel that asks
    has it loaded). Raises ``RestartError`` where there is no kernel to restart; nothing else
    ever ends the process.
    """
    plan = plan_restart(connection=connection) if plan is None else plan
    if warning:
        plan = replace(plan, warning=warning)
    # execve carries the variable in the environment it passes; the startup file only loads.
    env = BLOCKING if blocking and plan.method is not Method.EXECVE else {}
    if profile is None or plan.connection_file is None:
        if env:
            raise RestartError("cannot find this kernel's IPython profile or connection file")
    elif env:
        injection.write_pending(
            *profile,
            plan.connection_file,
            after_cell=after_cell,
            env=env,
            load_extension=load_extension,
        )
    elif load_extension:
        try:
            injection.write_pending(*profile, plan.connection_file, env={}, load_extension=True)
        except Exception:  # OSError, NotPrivate: the extension is never worth a failed restart
            injection.cancel(*profile, kernel_key(plan.connection_file))
    else:
        injection.cancel(*profile, kernel_key(plan.connection_file))

    action: Callable[[], None]
    if plan.method is Method.REST:
        action = lambda: _rest_restart(plan)  # noqa: E731
    elif plan.method is Method.EXECVE:
        environment = _execve_environment(blocking, after_cell)
        action = lambda: _execve_in_place(environment)  # noqa: E731
    else:
        action = lambda: _end_process(plan.method)  # noqa: E731

    def later() -> None:
        time.sleep(delay)
        action()

    if plan.method in (Method.REST, Method.EXIT):  # the frontend is not told: tell it (frontend.py)
        from .frontend import nudge_after_restart

        nudge_after_restart(plan.connection_file)
    _flush()
    threading.Thread(target=later, name="nb_cudaguard-restart", daemon=True).start()
    return plan
