"""The one-shot injection of CUDA_LAUNCH_BLOCKING=1 into the next process of one kernel."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from conftest import kernel_env

from nb_cudaguard.restart import injection
from nb_cudaguard.runtime import blocking

CONN = "/run/user/1000/jupyter/kernel-aaaa-1111.json"
OTHER = "/run/user/1000/jupyter/kernel-bbbb-2222.json"


@pytest.fixture
def profile(tmp_path):
    startup = tmp_path / "startup"
    startup.mkdir()
    return tmp_path, startup


def test_pending_file_is_private_and_its_directory_too(profile):
    data, script = injection.write_pending(*profile, CONN, after_cell=7)
    assert stat.S_IMODE(data.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(script.stat().st_mode) == 0o600


def test_an_existing_state_directory_is_made_private(profile):
    directory = injection.state_dir(profile[0])
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    injection.write_pending(*profile, CONN)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_pending_file_holds_only_the_allowlisted_variable(profile):
    data, _ = injection.write_pending(*profile, CONN, after_cell=7)
    content = json.loads(data.read_text())
    assert content["env"] == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert content["after_cell"] == 7
    assert content["kernel"] == os.path.realpath(CONN)


def test_startup_file_is_the_fixed_text_whatever_the_kernel(profile):
    _, one = injection.write_pending(*profile, CONN, after_cell=3)
    _, two = injection.write_pending(*profile, OTHER, after_cell=99)
    assert one.read_text() == two.read_text() == injection.STARTUP_TEXT
    assert one != two


def test_writing_leaves_no_temporary_files(profile):
    injection.write_pending(*profile, CONN)
    names = [p.name for d in (profile[1], injection.state_dir(profile[0])) for p in d.iterdir()]
    assert not [n for n in names if n.startswith(".tmp-")]


@pytest.mark.parametrize(
    "env",
    [{"LD_PRELOAD": "/tmp/evil.so"}, {"CUDA_LAUNCH_BLOCKING": "1; rm -rf ~"}, {}, ["x"]],
)
def test_variables_outside_the_allowlist_are_refused(profile, env):
    with pytest.raises(ValueError):
        injection.validate_env(env)


def test_the_matching_kernel_gets_the_variable_and_the_marker(profile):
    injection.write_pending(*profile, CONN, after_cell=7)
    environ: dict[str, str] = {}
    applied = injection.apply_pending(*profile, CONN, environ)
    assert applied is not None
    assert environ == {"CUDA_LAUNCH_BLOCKING": "1", blocking.MARKER: "7"}
    assert blocking.marker(environ) == blocking.Marker(after_cell=7)


def test_the_injection_is_consumed_once(profile):
    injection.write_pending(*profile, CONN)
    injection.apply_pending(*profile, CONN, {})
    environ: dict[str, str] = {}
    assert injection.apply_pending(*profile, CONN, environ) is None
    assert environ == {}
    assert list(profile[1].iterdir()) == []


def test_another_kernel_ignores_it_and_leaves_it_armed(profile):
    data, script = injection.write_pending(*profile, CONN)
    environ: dict[str, str] = {}
    assert injection.apply_pending(*profile, OTHER, environ) is None
    assert environ == {}
    assert data.exists() and script.exists()


def test_a_stale_injection_is_ignored_and_removed(profile):
    old = time.time() - injection.TTL_S - 1
    data, script = injection.write_pending(*profile, CONN, now=old)
    environ: dict[str, str] = {}
    assert injection.apply_pending(*profile, CONN, environ) is None
    assert environ == {}
    assert not data.exists() and not script.exists()


def test_a_tampered_pending_file_is_not_applied_and_removed(profile):
    data, script = injection.write_pending(*profile, CONN)
    content = json.loads(data.read_text())
    content["env"]["PYTHONSTARTUP"] = "/tmp/evil.py"
    data.write_text(json.dumps(content))
    environ: dict[str, str] = {}
    assert injection.apply_pending(*profile, CONN, environ) is None
    assert environ == {}
    assert not data.exists() and not script.exists()


def test_an_orphan_startup_file_removes_itself(profile):
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    script.write_text(injection.STARTUP_TEXT)
    injection.apply_pending(*profile, OTHER, {})
    assert not script.exists()


def test_cancel_disarms_a_pending_injection(profile):
    data, script = injection.write_pending(*profile, CONN)
    injection.cancel(*profile, injection.kernel_key(CONN))
    assert not data.exists() and not script.exists()


# --- a real kernel, restarted by its kernel manager ----------------------------------------


def _start(tmp_path):
    from jupyter_client.manager import KernelManager

    env = kernel_env(IPYTHONDIR=str(tmp_path / "ipython"))
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    manager = KernelManager(kernel_name="python3", connection_file=str(tmp_path / "kernel-x.json"))
    manager.start_kernel(env=env)
    client = manager.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def _value(client) -> str:
    client.execute_interactive(
        "import os; _v = os.environ.get('CUDA_LAUNCH_BLOCKING')",
        timeout=30,
    )
    reply = client.execute_interactive("", user_expressions={"v": "_v"}, timeout=30)
    return reply["content"]["user_expressions"]["v"]["data"]["text/plain"]


def _arm(client) -> None:
    client.execute_interactive(
        "from nb_cudaguard.restart import injection\n"
        "from nb_cudaguard.restart.environment import connection_file, launch_args\n"
        "_p = get_ipython().profile_dir\n"
        "injection.write_pending(_p.location, _p.startup_dir, connection_file(launch_args()), "
        "after_cell=1)",
        timeout=30,
    )


def _restart(manager):
    manager.restart_kernel(now=True)
    client = manager.blocking_client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return client


def test_a_kernel_manager_restart_starts_the_next_process_with_the_variable(tmp_path):
    manager, client = _start(tmp_path)
    try:
        _arm(client)
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "'1'"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_the_restart_after_that_is_normal_again(tmp_path):
    manager, client = _start(tmp_path)
    try:
        _arm(client)
        client.stop_channels()
        client = _restart(manager)
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "None"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
