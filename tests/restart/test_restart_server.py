"""Restarting a kernel of a real Jupyter server from inside the kernel, as a frontend sees it."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import psutil
import pytest
from jupyter_harness import JupyterServer, wait_for_new_process
from pytorch_texts import RAISE_ASSERT

from nb_cudaguard.notebook.actions import BLOCKING_LABEL
from nb_cudaguard.restart.environment import Environment
from nb_cudaguard.restart.methods import Method, plan_restart

pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")

PLAN = "from nb_cudaguard.restart.methods import plan_restart; print(plan_restart().method.value)"


def test_the_kernel_finds_its_own_server_and_plans_a_rest_restart(server, server_kernel):
    kid, _ = server_kernel
    assert server.execute(kid, PLAN).stream.strip() == "rest"


def test_restart_kernel_blocking_gives_a_new_process_with_the_variable(server, server_kernel):
    kid, pid = server_kernel
    out = server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=True)")
    assert out.status == "ok"
    new_pid, value = wait_for_new_process(server, kid, pid)
    assert new_pid != pid and value == "1"


def test_the_next_ordinary_restart_does_not_have_it(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=True)")
    blocking_pid, _ = wait_for_new_process(server, kid, pid)
    server.restart_kernel(kid)  # the user's own restart, from the frontend
    _, value = wait_for_new_process(server, kid, blocking_pid)
    assert value is None


def test_a_plain_restart_kernel_has_no_variable(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=False)")
    _, value = wait_for_new_process(server, kid, pid)
    assert value is None


def test_the_magic_restarts_with_the_variable(server, server_kernel):
    kid, pid = server_kernel
    out = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restart")
    assert "CUDA_LAUNCH_BLOCKING=1" in out.stream
    _, value = wait_for_new_process(server, kid, pid)
    assert value == "1"


def test_the_buttons_click_handler_restarts_with_the_variable(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        failed = sock.execute(RAISE_ASSERT)
        assert failed.status == "error"
        sock.click(failed.button(BLOCKING_LABEL))  # exactly what JupyterLab sends for a click
    _, value = wait_for_new_process(server, kid, pid)
    assert value == "1"


def test_a_click_disables_the_buttons_and_says_what_to_do_before_the_kernel_goes(
    server, server_kernel
):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        failed = sock.execute(RAISE_ASSERT)
        clicked = sock.collect(sock.click(failed.button(BLOCKING_LABEL)), timeout=10, reply=False)
    assert sum(1 for s in clicked.widget_states if s.get("disabled") is True) == 2
    said = clicked.widget_text
    # What to do next: restore what was kept (keep_glue) and re-run the rest, or re-run it all.
    assert "its first cell offers to restore them" in said or (
        "re-run the notebook from the top" in said
    )
    assert "CUDA_LAUNCH_BLOCKING=1" in said
    wait_for_new_process(server, kid, pid)


def test_the_new_kernel_shows_the_banner_naming_the_crashing_cell(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        failed = sock.execute(RAISE_ASSERT)
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    shown = server.execute(kid, "%load_ext nb_cudaguard").displays
    banners = [d["text/plain"] for d in shown if "blocking mode is on" in d.get("text/plain", "")]
    assert len(banners) == 1
    assert f"cell [{failed.execution_count}]" in banners[0]


def test_the_kernel_our_restart_started_runs_our_commands_and_a_later_start_does_not(
    server, server_kernel
):
    kid, pid = server_kernel
    server.execute(kid, "count = 7\n%load_ext nb_cudaguard\n%cudaguard restart --no-blocking")
    new_pid, _ = wait_for_new_process(server, kid, pid)
    first = server.execute(kid, "%cudaguard restore")  # no %load_ext in this process
    assert first.status == "ok", first.errors
    # What the load shows reaches the first cell (the startup file's load had none to show in).
    assert any("count" in d.get("text/plain", "") for d in first.displays)
    assert "restored" in first.stream.lower()
    assert server.execute(kid, "print(count)").stream.strip() == "7"
    server.restart_kernel(kid)  # the user's own restart, from the frontend
    wait_for_new_process(server, kid, new_pid)
    later = server.execute(kid, "%cudaguard status")
    assert later.status == "error"
    assert "Line magic function `%cudaguard` not found" in later.stream


def test_after_the_blocking_button_the_first_cell_shows_the_banner_without_a_load_ext(
    server, server_kernel
):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        failed = sock.execute(RAISE_ASSERT)
        sock.click(failed.button(BLOCKING_LABEL))
    _, value = wait_for_new_process(server, kid, pid)
    assert value == "1"
    first = server.execute(kid, "x = 1")  # any cell: the extension is loaded already
    banners = [d["text/plain"] for d in first.displays if "blocking mode is on" in d["text/plain"]]
    assert len(banners) == 1 and f"cell [{failed.execution_count}]" in banners[0]
    status = server.execute(kid, "%cudaguard status")
    assert status.status == "ok" and "CUDA_LAUNCH_BLOCKING" in status.stream
    assert server.execute(kid, "y = 2").displays == []  # shown once, at the first cell


def test_a_hanging_atexit_handler_does_not_delay_the_restart(server, server_kernel):
    # Stands in for CUDA's teardown hanging after a sticky error: the server would wait for the
    # polite shutdown before killing the kernel.
    kid, pid = server_kernel
    server.execute(kid, "import atexit, time; atexit.register(time.sleep, 30)")
    old = psutil.Process(pid)
    started = time.monotonic()
    server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=True)")
    # Timed to the old process's end, not to the new kernel's start (which load can slow).
    with contextlib.suppress(psutil.TimeoutExpired):
        old.wait(timeout=10)
    gone_after = time.monotonic() - started
    _, value = wait_for_new_process(server, kid, pid)
    assert value == "1"
    assert gone_after < 2.5  # ~0.5 s; over 3 s when the server must kill it


def test_a_second_kernel_of_the_same_server_never_gets_it(server, server_kernel):
    kid, pid = server_kernel
    with server.new_kernel() as (other, other_pid):
        server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=True)")
        wait_for_new_process(server, kid, pid)
        server.restart_kernel(other)
        _, value = wait_for_new_process(server, other, other_pid)
        assert value is None


def test_a_stale_injection_is_ignored(server, server_kernel):
    kid, pid = server_kernel
    stale = (
        "from nb_cudaguard.restart import injection\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "import time; p = get_ipython().profile_dir\n"
        "injection.write_pending(p.location, p.startup_dir, running_kernel_connection(), "
        "now=time.time() - injection.TTL_S - 60)"
    )
    assert server.execute(kid, stale).status == "ok"
    server.restart_kernel(kid)
    _, value = wait_for_new_process(server, kid, pid)
    assert value is None


def test_the_server_token_never_appears_in_what_the_kernel_shows(server, server_kernel):
    kid, _ = server_kernel
    out = server.execute(
        kid,
        "from nb_cudaguard.restart.methods import plan_restart; p = plan_restart(); print(p); "
        "print(p.server); print(p.note, p.warning)",
    )
    assert "Server(" in out.stream
    assert server.token not in out.stream


def test_a_tokenless_server_falls_back_to_the_auto_restarter(tmp_path):
    server = JupyterServer(tmp_path, token="")
    try:
        kid = server.start_kernel()
        pid, _ = wait_for_new_process(server, kid, -1)
        assert server.execute(kid, PLAN).stream.strip() == "exit"
        server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=True)")
        _, value = wait_for_new_process(server, kid, pid, timeout=30)
        assert value == "1"
    finally:
        server.stop()


def test_an_unreachable_server_falls_back_to_ending_the_process(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runtime = Path(tmp_path)
    (runtime / "jpserver-4242.json").write_text(
        json.dumps({"pid": 4242, "url": f"http://127.0.0.1:{port}/", "token": "t0ken"})
    )
    plan = plan_restart(
        Environment.JUPYTER, str(runtime / "kernel-abc-123.json"), [4242], [runtime]
    )
    assert plan.method is Method.EXIT
    assert "did not answer" in plan.note


def test_on_colab_the_fallback_is_a_kill(tmp_path):
    plan = plan_restart(Environment.COLAB, str(tmp_path / "kernel-abc.json"), [], [tmp_path])
    assert plan.method is Method.KILL


def test_vscode_restarts_in_place(tmp_path):
    plan = plan_restart(Environment.VSCODE, str(tmp_path / "kernel-v2-1.json"), [], [tmp_path])
    assert plan.method is Method.EXECVE


def test_a_blocking_restart_after_dataparallel_or_a_process_group_says_so_first(
    server, server_kernel, tmp_path
):
    # CUDA_LAUNCH_BLOCKING=1 with DataParallel or NCCL can deadlock (pytorch#9163, nccl#750).
    kid, pid = server_kernel
    setup = (
        "import torch, torch.distributed as dist\n"
        "model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/pg', rank=0, "
        "world_size=1)\n"
        "%load_ext nb_cudaguard"
    )
    assert server.execute(kid, setup).status == "ok"
    out = server.execute(kid, "%cudaguard restart")
    text = out.stream
    assert "WARNING: this notebook may hang in blocking mode" in text
    assert "a torch.distributed process group is initialised" in text
    assert "`model` is a DataParallel model" in text
    assert "pytorch#9163" in text
    assert text.index("WARNING") < text.index("Restarting.")
    _, value = wait_for_new_process(server, kid, pid)
    assert value == "1"


def test_a_blocking_restart_of_a_single_gpu_notebook_has_no_such_warning(server, server_kernel):
    kid, pid = server_kernel
    out = server.execute(kid, "import torch\n%load_ext nb_cudaguard\n%cudaguard restart")
    assert "nb_cudaguard: Restarting." in out.stream
    assert "WARNING" not in out.stream
    wait_for_new_process(server, kid, pid)
