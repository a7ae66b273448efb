"""Keep and restore never leave the user in a silently different state (issue 22): a real Jupyter
server, a real restart, a websocket frontend."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_harness import (
    JupyterServer,
    nbconvert,
    outputs_of,
    save_notebook,
    wait_for_new_process,
)

from nb_cudaguard.notebook.keep_glue import DISCARD_LABEL, RESTORE_LABEL

pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")

TORCH_CELL_S = 60  # a cell importing torch in a fresh process on a loaded 2-core machine

WHERE = (
    "from pathlib import Path as _P\nfrom nb_cudaguard.keep import store as _store\n"
    "from nb_cudaguard.restart.environment import running_kernel_connection as _conn\n"
    "_loc = get_ipython().profile_dir.location\n"
    "_d = _store.keep_dir(_loc, _conn())\n"
    "_m = _store.read_manifest(_loc, _conn())\n"
    "_r = _P(_m.ram) if _m is not None and _m.ram else None\n"
    "print(json.dumps([str(_d), None if _r is None else str(_r)]))"
)


def _restart(server: JupyterServer, kid: str, pid: int, setup: str = "") -> tuple[int, str]:
    """Our restart (no blocking mode), after ``setup``; the new process's pid and what the old
    one said."""
    code = f"{setup}\n%load_ext nb_cudaguard\n%cudaguard restart --no-blocking"
    said = server.execute(kid, code, timeout=TORCH_CELL_S)
    assert said.status == "ok", said.messages
    new_pid, _ = wait_for_new_process(server, kid, pid, timeout=60)
    return new_pid, said.stream


def _kept_places(server: JupyterServer, kid: str) -> tuple[Path, Path | None]:
    out = server.execute(kid, "import json\n" + WHERE)
    assert out.status == "ok", out.messages
    profile, ram = json.loads(out.stream.strip().splitlines()[-1])
    return Path(profile), None if ram is None else Path(ram)


def _run(server: JupyterServer, kid: str, code: str, timeout: float = TORCH_CELL_S) -> str:
    out = server.execute(kid, code, timeout=timeout)
    assert out.status == "ok", (out.stream, [(e["ename"], e["evalue"]) for e in out.errors])
    return out.stream


# --- item 1 and 7: what shares state is one pickle graph, written once, restored together --------

SHARING = """
import numpy as np, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 8))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.ones(4, 512)).sum().backward(); opt.step()
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
features = np.arange(200_000, dtype=np.float32)
as_tensor = torch.from_numpy(features)
window = features[100:200]

class Rows(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return self.data[i]

rows = Rows(features)
"""

LINKS = """
import json, torch
params = opt.param_groups[0]["params"]
before = model[0].weight.detach().clone()
model(torch.ones(4, 512)).sum().backward(); opt.step(); sched.step()
features[150] = -1.0
print(json.dumps({
    "opt holds model": all(p is q for p, q in zip(params, model.parameters())),
    "opt trains model": not torch.equal(before, model[0].weight),
    "sched holds opt": sched.optimizer is opt,
    "lr stepped": opt.param_groups[0]["lr"],
    "from_numpy shares": float(as_tensor[150]),
    "dataset shares": float(rows.data[150]),
    "view shares": float(window[50]),
}))
"""


def test_names_restored_one_at_a_time_still_share_what_they_shared(server, server_kernel):
    kid, pid = server_kernel
    _restart(server, kid, pid, SHARING)
    _run(server, kid, "%load_ext nb_cudaguard")
    said = ""
    for name in ("model", "opt", "sched", "as_tensor", "rows", "window", "features"):
        said += _run(server, kid, f"%cudaguard restore {name}")
    # (torch warns that `sched` was made before a step it never took: pickling drops the
    # optimizer's step wrapper, with plain pickle as here)
    out = _run(server, kid, LINKS)
    links = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert links == {
        "opt holds model": True,
        "opt trains model": True,
        "sched holds opt": True,
        "lr stepped": pytest.approx(1e-4),
        "from_numpy shares": -1.0,
        "dataset shares": -1.0,
        "view shares": -1.0,
    }
    assert "came too" in said and "already restored" in said


# The save as the restart does it (keep_before_restart), with the bytes this process passed to
# write(2) counted by the kernel (/proc/self/io `wchar`) around it.
MEASURED_SAVE = """
import torch
from nb_cudaguard.notebook.keep_glue import keep_before_restart, where_kept
from nb_cudaguard.keep import store
def _wchar():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["wchar"])
_conn, _prof = where_kept(get_ipython())
_before = _wchar()
keep_before_restart(get_ipython(), _conn, _prof)
_written = _wchar() - _before
_m = store.read_manifest(_prof[0], _conn)
_grads = [p.grad for p in model.parameters() if p.grad is not None]  # kept with their leaves
_data = sum(t.numel() * t.element_size() for t in
            [*model.parameters(), *_grads, *(v for s in opt.state.values() for v in s.values())])
print(_written, _m.total, _data)
"""


def test_a_model_and_its_optimizer_are_written_once(server, server_kernel):
    kid, _ = server_kernel
    setup = (
        "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(1024, 4096), "
        "torch.nn.Linear(4096, 1024))\nopt = torch.optim.Adam(model.parameters())\n"
        "model(torch.ones(2, 1024)).sum().backward(); opt.step()"
    )
    _run(server, kid, setup)  # ~34 MB of parameters, as much of gradients, ~67 MB of Adam state
    written, kept, data = map(int, _run(server, kid, MEASURED_SAVE).split()[-3:])
    assert data <= kept < data * 1.01  # the file holds each tensor once
    assert written < data * 1.05  # and each was written once (before: model, opt, both again)


# --- item 4: a save that fails never deletes an earlier keep --------------------------------------


@pytest.fixture(params=["tmpfs", "rlimit"])
def full_state_dir(
    request: pytest.FixtureRequest, server: JupyterServer
) -> Iterator[tuple[str, Path]]:
    """How the profile's state directory (where the manifest goes) fills up: a real tmpfs of
    its own, filled to the last byte (where one can be mounted: root); or a file size limit
    (RLIMIT_FSIZE) in the kernel, under which the manifest cannot be written but the values'
    small files can."""
    state = server.base / "ipython" / "profile_default" / "nb_cudaguard"
    state.mkdir(parents=True, exist_ok=True)
    if request.param == "rlimit":
        yield "rlimit", state
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(state)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield "tmpfs", state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


FILL = """
import os
_filler = os.path.join(get_ipython().profile_dir.location, "nb_cudaguard", "filler")
with open(_filler, "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError as error:
        print("full:", error.strerror)
"""
# Every later file of this process may hold at most 2 kB: the values' files are smaller, the
# manifest of 40 names is not.
LIMIT = "import resource\nresource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))"
NAMES = "\n".join(f"name_{i} = {i}" for i in range(40))
MORE_NAMES = "\n".join(f"more_{i} = {i}" for i in range(80))


def test_a_second_keep_that_cannot_be_written_leaves_the_first(
    server, server_kernel, full_state_dir
):
    how, state = full_state_dir
    kid, pid = server_kernel
    pid, said = _restart(server, kid, pid, f"epochs = 12\nwords = ['a', 'b']\n{NAMES}")
    assert "Kept 43 variables" in said  # and `os`, of the harness's probe
    # The new process does not restore; its own restart finds no room for its manifest (a
    # longer one than the first's, which a save may remove first).
    if how == "tmpfs":
        assert "full: No space left on device" in _run(server, kid, FILL)
    limit = LIMIT if how == "rlimit" else ""
    pid, said = _restart(server, kid, pid, f"epochs = 99\n{MORE_NAMES}\n{limit}")
    if how == "tmpfs":
        (state / "filler").unlink()
    out = _run(server, kid, "%load_ext nb_cudaguard\n%cudaguard restore\nprint(epochs, words)")
    assert out.strip().endswith("12 ['a', 'b']")
    assert "Nothing was kept (" in said
    assert "What an earlier restart kept is still there for the new kernel" in said


# --- item 5: a name made again in the new kernel is not overwritten ------------------------------


def test_restore_leaves_a_name_made_again_unless_forced(server, server_kernel):
    kid, pid = server_kernel
    _restart(server, kid, pid, "labels = [1, 2, 3]\nepochs = 5")
    said = _run(server, kid, "labels = 'made again'\n%load_ext nb_cudaguard\n%cudaguard restore")
    assert _run(server, kid, "print(repr(labels), epochs)").strip() == "'made again' 5"
    assert "Left as you made them in this kernel: `labels`" in said
    assert "--force labels" in said
    _run(server, kid, "%cudaguard restore --force labels")
    assert _run(server, kid, "print(labels)").strip() == "[1, 2, 3]"


def test_the_restore_button_leaves_a_name_made_again_too(server, server_kernel):
    kid, pid = server_kernel
    _restart(server, kid, pid, "count = 7\nwords = ['a']")
    with server.connect(kid) as sock:
        offer = sock.execute("count = 8\n%load_ext nb_cudaguard")
        clicked = sock.collect(sock.click(offer.button(RESTORE_LABEL)), timeout=30, reply=False)
        assert sock.execute("print(count, words)").stream.strip() == "8 ['a']"
        assert "Left as you made them in this kernel: <code>count</code>" in clicked.widget_text


def test_what_the_restore_button_did_stays_in_the_saved_and_converted_notebook(
    server, server_kernel
):
    kid, pid = server_kernel
    _restart(server, kid, pid, "count = 7\nwords = ['a']")
    with server.connect(kid) as sock:
        offer = sock.execute("%load_ext nb_cudaguard")
        button = offer.button(RESTORE_LABEL)
        clicked = sock.collect(sock.click(button), timeout=30, reply=False, cell=offer)
    outputs = outputs_of(offer.messages + clicked.messages, offer)
    save_notebook(server, "restored.ipynb", [("%load_ext nb_cudaguard", outputs)])
    status, reopened = server.request("GET", "/api/contents/restored.ipynb")
    assert status == 200
    # (The cell's stream output is IPython's: our restart loaded the extension already.)
    shown = [
        o["data"]["text/plain"] for o in reopened["content"]["cells"][0]["outputs"] if "data" in o
    ]
    restored = [t for t in shown if "Restored " in t]
    assert len(restored) == 1, shown
    assert "`count`" in restored[0] and "`words`" in restored[0]
    assert "Restored " in nbconvert(server, "restored.ipynb")


def test_a_restore_from_code_disables_the_offers_buttons(server, server_kernel):
    kid, pid = server_kernel
    _restart(server, kid, pid, "count = 7")
    with server.connect(kid) as sock:
        offer = sock.execute("%load_ext nb_cudaguard")
        buttons = {offer.button(RESTORE_LABEL), offer.button(DISCARD_LABEL)}
        restored = sock.execute("%cudaguard restore")
        disabled = {
            m["content"]["comm_id"]
            for m in restored.messages
            if m["msg_type"] == "comm_msg"
            and m["content"]["data"].get("state", {}).get("disabled") is True
        }
        assert disabled == buttons
        assert "<code>count</code>" in restored.widget_text  # the offer says what happened


# --- item 6: kept files do not outlive their kernel; keep --stop frees its buffers ---------------


def _gone(*paths: Path | None, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(p is not None and p.exists() for p in paths):
            return True
        time.sleep(0.2)
    return False


BIG = "import numpy as np\nbig = np.ones(2_000_000)"


def test_kept_files_go_when_the_kernel_is_shut_down_without_restoring(server):
    kid = server.start_kernel()
    try:
        pid, _ = wait_for_new_process(server, kid, -1)
        _restart(server, kid, pid, BIG)
        profile, ram = _kept_places(server, kid)  # the new process never loads nb_cudaguard
        assert profile.exists() and ram is not None and ram.exists()
    finally:
        server.request("DELETE", f"/api/kernels/{kid}")
    assert _gone(profile, ram)


def test_kept_files_go_when_the_server_stops(tmp_path):
    own = JupyterServer(tmp_path / "server")
    try:
        kid = own.start_kernel()
        pid, _ = wait_for_new_process(own, kid, -1)
        _restart(own, kid, pid, BIG)
        _run(own, kid, "%load_ext nb_cudaguard")  # offered, and left alone
        profile, ram = _kept_places(own, kid)
        assert profile.exists() and ram is not None and ram.exists()
    finally:
        own.stop()
    assert _gone(profile, ram)


def test_kept_files_survive_our_own_restarts_until_restored(server, server_kernel):
    kid, pid = server_kernel
    pid, _ = _restart(server, kid, pid, BIG)
    pid, _ = _restart(server, kid, pid, "")  # a crash again before the restore: carried
    time.sleep(3)  # the first keep's watcher has looked at it meanwhile
    out = _run(server, kid, "%load_ext nb_cudaguard\n%cudaguard restore big\nprint(big.sum())")
    assert out.strip().endswith("2000000.0")


RSS = "print(int(open('/proc/self/statm').read().split()[1]) * 4096)"


def test_stopping_the_snapshots_frees_their_buffers(server, server_kernel):
    kid, _ = server_kernel
    _run(server, kid, "import torch\nmodel = torch.nn.Linear(4096, 8192)")  # 134 MB of weights
    _run(server, kid, "%load_ext nb_cudaguard\n%cudaguard keep model")
    _run(server, kid, "x = 1")  # the first snapshot: a CPU copy of every tensor
    taken = int(_run(server, kid, RSS))
    _run(server, kid, "%cudaguard keep --stop")
    freed = taken - int(_run(server, kid, RSS))
    assert freed > 120e6


# --- issue 23 item 7: what restore says when there is nothing (more) to restore ------------------


def test_restore_says_what_was_kept_and_what_was_restored_already(server, server_kernel):
    kid, pid = server_kernel
    _restart(server, kid, pid, "alpha = 1\nbeta = 2")
    out = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restore nonexistent")
    assert out.status == "error"
    assert "not kept: nonexistent" in out.stream and "alpha, beta" in out.stream
    _run(server, kid, "%cudaguard restore alpha")
    again = server.execute(kid, "%cudaguard restore alpha beta")
    assert again.status == "ok"
    assert "`alpha` was already restored" in again.stream and "Restored `beta`" in again.stream
    _run(server, kid, "%cudaguard restore")  # the rest (the harness's `os`)
    last = server.execute(kid, "%cudaguard restore")
    assert last.status == "ok" and "nothing was kept" not in last.stream
    assert "`alpha`, `beta`, `os` were already restored" in last.stream
    assert "Nothing else is kept." in last.stream


# --- the notebook's own modules: a name bound from one stays that module's object -------------

HELPERS = """
registry = []
settings = {"lr": 0.1}

def register(item):
    registry.append(item)
    return len(registry)
"""

OWN_MODULE = """
import helpers
from helpers import registry, register, settings
register("a"); register("b")
settings["lr"] = 0.5
"""

SAME_OBJECTS = """
import json, helpers
register("c")
print(json.dumps({
    "registry is helpers.registry": registry is helpers.registry,
    "settings is helpers.settings": settings is helpers.settings,
    "registry": registry,
    "helpers.registry": helpers.registry,
    "lr": helpers.settings["lr"],
}))
"""


def test_names_from_the_notebooks_own_module_stay_that_modules_objects(server, server_kernel):
    (server.root / "helpers.py").write_text(HELPERS)  # a module next to the notebook
    kid, pid = server_kernel
    _restart(server, kid, pid, OWN_MODULE)
    out = _run(server, kid, "%load_ext nb_cudaguard\n%cudaguard restore\n" + SAME_OBJECTS)
    said = json.loads(out.strip().splitlines()[-1])
    assert said == {
        "registry is helpers.registry": True,
        "settings is helpers.settings": True,
        "registry": ["a", "b", "c"],  # what it held before the restart, and the module adds to it
        "helpers.registry": ["a", "b", "c"],
        "lr": 0.5,
    }
