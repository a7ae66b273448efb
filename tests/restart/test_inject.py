"""The one-shot injection of CUDA_LAUNCH_BLOCKING=1 into the next process of one kernel."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, kernel_env, managed_kernel, ready_client, terminal_ipython

from nb_cudaguard.restart import injection
from nb_cudaguard.restart.startup_once import _nb_cudaguard_once
from nb_cudaguard.runtime import blocking

CONN = "/run/user/1000/jupyter/kernel-aaaa-1111.json"
OTHER = "/run/user/1000/jupyter/kernel-bbbb-2222.json"


@pytest.fixture
def profile(tmp_path):
    startup = tmp_path / "startup"
    startup.mkdir()
    return tmp_path, startup


def _files(profile) -> list[str]:
    """Our files in the profile (IPython keeps a README in the startup directory)."""
    return sorted(
        p.name
        for d in (profile[1], injection.state_dir(profile[0]))
        if d.is_dir()
        for p in d.iterdir()
        if p.name != "README"
    )


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


def test_every_directory_it_creates_is_private(tmp_path):
    location = tmp_path / "ipython" / "profile_default"
    injection.write_pending(location, location / "startup", CONN)
    for directory in (
        tmp_path / "ipython",
        location,
        location / "startup",
        location / "nb_cudaguard",
    ):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_pending_file_holds_only_the_allowlisted_variable(profile):
    data, _ = injection.write_pending(*profile, CONN, after_cell=7)
    content = json.loads(data.read_text())
    assert content["env"] == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert content["after_cell"] == 7
    assert content["kernel"] == os.path.realpath(CONN)


def test_startup_file_is_the_fixed_text_whatever_the_kernel(profile):
    _, one = injection.write_pending(*profile, CONN, after_cell=3)
    _, two = injection.write_pending(*profile, OTHER, after_cell=99)
    assert one.read_text() == two.read_text() == injection.startup_text()
    assert one != two


def test_the_startup_file_imports_the_standard_library_only():
    tree = ast.parse(injection.startup_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported and imported <= set(sys.stdlib_module_names)
    assert "__import__" not in injection.startup_text()  # nor a hidden import


def test_the_startup_file_uses_the_markers_names_of_the_package():
    text = injection.startup_text()
    assert f'"{blocking.MARKER}"' in text
    assert f'"{injection.STARTUP_PREFIX}"' in text


def test_writing_leaves_no_temporary_files(profile):
    injection.write_pending(*profile, CONN)
    assert not [n for n in _files(profile) if n.startswith(".tmp-")]


@pytest.mark.parametrize(
    "env",
    [{"LD_PRELOAD": "/tmp/evil.so"}, {"CUDA_LAUNCH_BLOCKING": "1; rm -rf ~"}, {}, ["x"]],
)
def test_variables_outside_the_allowlist_are_refused(profile, env):
    with pytest.raises(ValueError):
        injection.validate_env(env)


# --- the startup file's logic, called as IPython calls it (the script path) -------------------


def _once(profile, connection, environ, now=None) -> str:
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    return _nb_cudaguard_once(str(script), connection, environ, now)


def test_the_matching_kernel_gets_the_variable_and_the_marker(profile):
    injection.write_pending(*profile, CONN, after_cell=7)
    environ: dict[str, str] = {}
    assert _once(profile, CONN, environ) == "applied"
    assert environ == {"CUDA_LAUNCH_BLOCKING": "1", blocking.MARKER: "7"}
    assert blocking.marker(environ) == blocking.Marker(after_cell=7)


def test_a_plain_restart_loads_the_extension_and_sets_no_variable(profile, shell):
    injection.write_pending(*profile, CONN, env={}, load_extension=True)
    environ: dict[str, str] = {}
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    assert _nb_cudaguard_once(str(script), CONN, environ, shell=shell) == "applied"
    assert environ == {}
    assert "cudaguard" in shell.magics_manager.magics["line"]
    assert _files(profile) == []


def test_the_extension_is_loaded_only_where_asked(profile, shell):
    injection.write_pending(*profile, CONN)
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    assert _nb_cudaguard_once(str(script), CONN, {}, shell=shell) == "applied"
    assert "cudaguard" not in shell.magics_manager.magics["line"]


def test_the_injection_is_consumed_once(profile):
    injection.write_pending(*profile, CONN)
    _once(profile, CONN, {})
    assert _files(profile) == []
    environ: dict[str, str] = {}
    assert _once(profile, CONN, environ) == "no-data"
    assert environ == {}


def test_another_kernel_ignores_it_and_leaves_it_armed(profile):
    data, script = injection.write_pending(*profile, CONN)
    environ: dict[str, str] = {}
    assert _once(profile, OTHER, environ) == "not-this-kernel"
    assert environ == {}
    assert data.exists() and script.exists()


def test_a_stale_injection_is_not_applied_and_removed_by_its_own_kernel(profile):
    old = time.time() - injection.TTL_S - 1
    data, script = injection.write_pending(*profile, CONN, now=old)
    environ: dict[str, str] = {}
    assert _once(profile, CONN, environ) == "expired"
    assert environ == {}
    assert not data.exists() and not script.exists()


def test_a_tampered_pending_file_is_not_applied_and_nothing_is_deleted(profile):
    data, script = injection.write_pending(*profile, CONN)
    content = json.loads(data.read_text())
    content["env"]["PYTHONSTARTUP"] = "/tmp/evil.py"
    data.write_text(json.dumps(content))
    environ: dict[str, str] = {}
    assert _once(profile, CONN, environ) == "invalid"
    assert environ == {}
    assert data.exists() and script.exists()


def test_a_startup_file_without_its_data_deletes_nothing(profile):
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    script.write_text(injection.startup_text())
    assert _once(profile, CONN, {}) == "no-data"
    assert script.exists()


def test_leftovers_older_than_the_ttl_are_removed_when_the_next_restart_is_armed(profile):
    data, script = injection.write_pending(*profile, OTHER)
    past = time.time() - injection.TTL_S - 10
    for path in (data, script):
        os.utime(path, (past, past))
    injection.write_pending(*profile, CONN)
    assert not data.exists() and not script.exists()
    assert len(_files(profile)) == 2


def test_cancel_disarms_a_pending_injection(profile):
    injection.write_pending(*profile, CONN)
    injection.cancel(*profile, injection.kernel_key(CONN))
    assert _files(profile) == []


# --- real processes of the profile -------------------------------------------------------------


def _terminal_ipython(ipython_dir: Path, code: str, *pre: str) -> str:
    env = kernel_env(IPYTHONDIR=str(ipython_dir))
    proc = terminal_ipython(code + "\nexit\n", *pre, env=env)
    return proc.stdout + proc.stderr


def _start(tmp_path, pythonpath: str | None = None):
    env = kernel_env(IPYTHONDIR=str(tmp_path / "ipython"))
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    return managed_kernel(tmp_path / "kernel-x.json", env)


def _expression(client, code: str, expression: str) -> str:
    client.execute_interactive(code, timeout=30)
    reply = client.execute_interactive("", user_expressions={"v": expression}, timeout=30)
    return reply["content"]["user_expressions"]["v"]["data"]["text/plain"]


def _value(client) -> str:
    return _expression(client, "import os", "os.environ.get('CUDA_LAUNCH_BLOCKING')")


def _profile(tmp_path) -> tuple[Path, Path]:
    location = tmp_path / "ipython" / "profile_default"
    return location, location / "startup"


def _arm(tmp_path, manager) -> None:
    injection.write_pending(*_profile(tmp_path), manager.connection_file, after_cell=1)


def _restart(manager):
    manager.restart_kernel(now=True)
    return ready_client(manager)


def test_a_kernel_manager_restart_starts_the_next_process_with_the_variable(tmp_path):
    manager, client = _start(tmp_path)
    try:
        _arm(tmp_path, manager)
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "'1'"
        # The startup file never imported the package, and left no name behind.
        assert _expression(client, "import sys", "'nb_cudaguard' in sys.modules") == "False"
        assert _expression(client, "", "'_nb_cudaguard_once' in globals()") == "False"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _line(client, code: str) -> dict:
    """The reply to one cell, and what it printed."""
    printed: list[str] = []

    def output(msg: dict) -> None:
        if msg["msg_type"] in ("stream", "error"):
            printed.append(msg["content"].get("text") or msg["content"].get("evalue", ""))

    reply = client.execute_interactive(code, timeout=30, output_hook=output)
    return {"status": reply["content"]["status"], "printed": "".join(printed)}


def test_the_restarted_kernel_has_the_extension_loaded_and_the_next_one_does_not(tmp_path):
    manager, client = _start(tmp_path)
    try:
        injection.write_pending(
            *_profile(tmp_path), manager.connection_file, env={}, load_extension=True
        )
        client.stop_channels()
        client = _restart(manager)
        synced = _line(client, "%cudaguard sync")  # no %load_ext in this process
        assert synced["status"] == "ok", synced
        assert "end-of-cell CUDA synchronise is off" in synced["printed"]
        # Loaded as %load_ext loads it: IPython's extension manager knows it.
        again = _line(client, "%load_ext nb_cudaguard")
        assert again["status"] == "ok" and "already loaded" in again["printed"]
        assert _value(client) == "None"
        client.stop_channels()
        client = _restart(manager)  # the user's own restart: an ordinary start
        missing = _line(client, "%cudaguard sync")
        assert missing["status"] == "error" and "not found" in missing["printed"]
        assert _expression(client, "import sys", "'nb_cudaguard' in sys.modules") == "False"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_the_restart_after_that_is_normal_again(tmp_path):
    manager, client = _start(tmp_path)
    try:
        _arm(tmp_path, manager)
        client.stop_channels()
        client = _restart(manager)
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "None"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_kernel_that_cannot_import_nb_cudaguard_still_gets_the_variable(tmp_path):
    # Another virtual environment, an older version: here, a package that fails to import.
    shadow = tmp_path / "shadow" / "nb_cudaguard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not in this environment')\n")
    manager, client = _start(tmp_path, pythonpath=str(shadow.parent))
    try:
        _arm(tmp_path, manager)
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "'1'"
        marker = _expression(client, "", f"os.environ.get({blocking.MARKER!r})")
        assert marker == "'1'"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_other_ipython_processes_of_the_profile_neither_consume_nor_cancel_it(tmp_path):
    manager, client = _start(tmp_path)
    try:
        _arm(tmp_path, manager)
        location, startup = _profile(tmp_path)
        armed = _files((location, startup))
        assert len(armed) == 2
        # A terminal where nb_cudaguard cannot be imported, and one where it can.
        blocked = "import sys; sys.modules['nb_cudaguard'] = None"
        shown = _terminal_ipython(
            tmp_path / "ipython",
            "import os\nprint('seen:', os.environ.get('CUDA_LAUNCH_BLOCKING'))",
            blocked,
        )
        assert "seen: None" in shown
        shown = _terminal_ipython(
            tmp_path / "ipython", "import sys\nprint('nb' + '_cudaguard' in sys.modules)"
        )
        assert "False" in shown
        still = _files((location, startup))
        assert still == armed
        client.stop_channels()
        client = _restart(manager)
        assert _value(client) == "'1'"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.mark.parametrize("flag", [["-f", "{c}"], ["-f={c}"], ["--f={c}"], ["--f", "{c}"]])
def test_a_process_launched_with_the_connection_file_flag_is_recognised(profile, flag):
    # Without ipykernel's application (an older launcher), the launch arguments name the kernel.
    injection.write_pending(*profile, CONN, after_cell=2)
    script = injection.startup_path(profile[1], injection.kernel_key(CONN))
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from nb_cudaguard.restart.startup_once import _nb_cudaguard_once\n"
        f"env = {{}}\nprint(_nb_cudaguard_once({str(script)!r}, None, env), env)"
    )
    args = [a.format(c=CONN) for a in flag]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.startswith("applied {'CUDA_LAUNCH_BLOCKING': '1'")
