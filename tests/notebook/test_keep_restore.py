"""Keep and restore across a real restart: a real Jupyter server, a websocket frontend."""

from __future__ import annotations

import json
import re

import pytest
from jupyter_harness import wait_for_new_process
from pytorch_texts import RAISE_ASSERT

from nb_cudaguard.notebook.actions import PLAIN_LABEL
from nb_cudaguard.notebook.keep_glue import RESTORE_LABEL

pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")

# Cells that import torch into a fresh process or restore torch objects: seconds each (4.5 s
# measured on a loaded 2-core machine), so twice the other cells' 30 s.
TORCH_CELL_S = 60

STATE = """
import numpy as np, torch, threading
from dataclasses import dataclass

@dataclass
class Config:
    lr: float = 0.1

class Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab
    def encode(self, word):
        return self.vocab.get(word, unk)

unk = 0
config = Config(0.25)
tokenizer = Tokenizer({"a": 1, "b": 2})
count = 42
labels = {"cat": 0, "dog": [1, 2, (3, None)]}
array = np.random.rand(300, 200)
tensor = torch.randn(64, 32)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.ones(2, 8)).sum().backward(); optimizer.step()
def scaled(x):
    return x * count
log = open("keep-test.log", "w")
batches = (i for i in range(10))
lock = threading.Lock()
"""

FINGERPRINT = """
import hashlib, pickle
def _h(data):
    return hashlib.sha256(data).hexdigest()
def _fingerprint():
    params = optimizer.param_groups[0]["params"]
    out = {
        "count": count, "labels": labels, "config": (type(config).__name__, config.lr),
        "encode": tokenizer.encode("b"), "scaled": scaled(2),
        "array": _h(array.tobytes()),
        "tensor": _h(tensor.numpy().tobytes()),
        "model": [_h(p.detach().numpy().tobytes()) for p in model.parameters()],
        "adam": [_h(s["exp_avg"].numpy().tobytes()) for s in optimizer.state.values()],
        "shared": all(p is q for p, q in zip(params, model.parameters())),
    }
    return json.dumps(out, sort_keys=True, default=str)
import json
print(_fingerprint())
"""


def _fingerprint(server, kid) -> dict:
    out = server.execute(kid, FINGERPRINT)
    assert out.status == "ok", out.messages
    return json.loads(out.stream.strip().splitlines()[-1])


def test_variables_of_many_kinds_survive_a_blocking_restart_and_come_back_equal(
    server, server_kernel
):
    kid, pid = server_kernel
    assert server.execute(kid, STATE, timeout=TORCH_CELL_S).status == "ok"
    before = _fingerprint(server, kid)
    said = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restart").stream
    assert "Kept " in said and "its first cell offers to restore them" in said
    for name, reason in (("log", "an open file"), ("batches", "a generator"), ("lock", "a lock")):
        assert f"`{name}` ({reason}" in said
    _, blocking = wait_for_new_process(server, kid, pid)
    assert blocking == "1"
    offer = server.execute(kid, "%load_ext nb_cudaguard")
    text = "\n".join(d.get("text/plain", "") for d in offer.displays)
    assert "the previous process of this kernel kept" in text
    assert "array" in text and "numpy.ndarray float64 (300, 200)" in text
    assert "Not kept:" in text and "log" in text and "open it again" in text
    restored = server.execute(kid, "%cudaguard restore", timeout=TORCH_CELL_S)
    assert restored.status == "ok" and "Restored" in restored.stream
    assert _fingerprint(server, kid) == before


def test_the_restore_button_restores(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "count = 7\nwords = ['a', 'b']")
    server.execute(kid, "import nb_cudaguard; nb_cudaguard.restart_kernel(blocking=False)")
    wait_for_new_process(server, kid, pid)
    with server.connect(kid) as sock:
        offer = sock.execute("%load_ext nb_cudaguard")
        clicked = sock.collect(sock.click(offer.button(RESTORE_LABEL)), timeout=20, reply=False)
        assert "Restored" in clicked.widget_text
        assert sock.execute("print(count, words)").stream.strip() == "7 ['a', 'b']"


def test_no_keep_keeps_nothing(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "count = 7")
    said = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restart --no-keep").stream
    assert "Kept" not in said
    wait_for_new_process(server, kid, pid)
    offer = server.execute(kid, "%load_ext nb_cudaguard")
    assert not any("kept" in d.get("text/plain", "") for d in offer.displays)
    assert "nothing to restore" in str(server.execute(kid, "%cudaguard restore").messages)


def test_another_kernel_cannot_restore_them(server, server_kernel):
    kid, pid = server_kernel
    with server.new_kernel() as (other, _):
        server.execute(kid, "secret = 'mine'\n%load_ext nb_cudaguard\n%cudaguard restart")
        wait_for_new_process(server, kid, pid)
        out = server.execute(other, "%load_ext nb_cudaguard\n%cudaguard restore")
        assert out.status == "error" and "nothing to restore" in str(out.messages)
        restored = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restore secret")
        assert restored.status == "ok"
        assert server.execute(kid, "print(secret)").stream.strip() == "mine"


def test_the_kept_files_are_private_and_gone_after_a_full_restore(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "import numpy as np\nbig = np.ones(1000)\n%load_ext nb_cudaguard")
    server.execute(kid, "%cudaguard restart --no-blocking")
    wait_for_new_process(server, kid, pid)
    check = (
        "import os, stat\nfrom pathlib import Path\nfrom nb_cudaguard.keep import store\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "loc, conn = get_ipython().profile_dir.location, running_kernel_connection()\n"
        "d = store.keep_dir(loc, conn)\n"
        "r = Path(store.read_manifest(loc, conn).ram)\n"
        "for x in (d, r.parent, r):\n"
        "    print(oct(x.stat().st_mode & 0o777), sorted({oct(f.stat().st_mode & 0o777) "
        "for f in x.iterdir() if f.is_file()}))"
    )
    # The values' files are in RAM (here the tests' stand-in for /dev/shm), the manifest in
    # the profile: all private.
    assert server.execute(kid, check).stream.split("\n")[:3] == [
        "0o700 ['0o600']",
        "0o700 []",
        "0o700 ['0o600']",
    ]
    server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restore")
    out = server.execute(kid, "print([p.name for p in d.iterdir()], r.exists(), big.sum())")
    # The values' files are gone, the RAM directory too; the record of what was restored stays.
    assert out.stream.strip() == "['manifest.json'] False 1000.0"


def test_discard_deletes_the_kept_files_in_ram_and_in_the_profile(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "import numpy as np\nbig = np.ones(1000)\n%load_ext nb_cudaguard")
    server.execute(kid, "%cudaguard restart --no-blocking")
    wait_for_new_process(server, kid, pid)
    where = (
        "from pathlib import Path\nfrom nb_cudaguard.keep import store\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "loc, conn = get_ipython().profile_dir.location, running_kernel_connection()\n"
        "d = store.keep_dir(loc, conn)\nr = Path(store.read_manifest(loc, conn).ram)\n"
        "print(d.exists(), r.exists())"
    )
    assert server.execute(kid, where).stream.strip() == "True True"
    out = server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restore --discard")
    assert "Deleted" in out.stream
    assert server.execute(kid, "print(d.exists(), r.exists())").stream.strip() == "False False"
    assert server.execute(kid, "%cudaguard restore").status == "error"


def test_expired_files_are_not_restored(server, server_kernel):
    kid, pid = server_kernel
    server.execute(kid, "count = 7\n%load_ext nb_cudaguard\n%cudaguard restart --no-blocking")
    wait_for_new_process(server, kid, pid)
    age = (
        "import json, time\nfrom nb_cudaguard.keep import store\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "d = store.keep_dir(get_ipython().profile_dir.location, running_kernel_connection())\n"
        "m = json.loads((d / store.MANIFEST).read_text())\n"
        "m['created'] -= store.TTL_S + 60\n"
        "store.write_manifest(d, store.Manifest.from_json(json.dumps(m)))"
    )
    # Silent, as a frontend's own code runs: the new kernel's first cell is still to come.
    assert server.execute(kid, age, silent=True).status == "ok"
    offer = server.execute(kid, "%load_ext nb_cudaguard")
    assert any("expired" in d.get("text/plain", "") for d in offer.displays)
    out = server.execute(kid, "%cudaguard restore")
    assert out.status == "error"
    assert server.execute(kid, "print('count' in dir())").stream.strip() == "False"


def test_the_button_under_a_crash_keeps_the_variables_too(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("epochs = 12\n%load_ext nb_cudaguard")
        failed = sock.execute(RAISE_ASSERT)
        clicked = sock.collect(sock.click(failed.button(PLAIN_LABEL)), timeout=20, reply=False)
    assert re.search(r"Kept \d+ variables \(\d+ B\) for the new kernel", clicked.widget_text)
    wait_for_new_process(server, kid, pid)
    server.execute(kid, "%load_ext nb_cudaguard\n%cudaguard restore epochs")
    assert server.execute(kid, "print(epochs)").stream.strip() == "12"


def test_snapshots_are_taken_after_successful_cells_and_status_shows_their_cost(
    server, server_kernel
):
    kid, _ = server_kernel
    setup = (
        "import torch\nmodel = torch.nn.Linear(4, 2)\n%load_ext nb_cudaguard\n%cudaguard keep model"
    )
    out = server.execute(kid, setup, timeout=TORCH_CELL_S)
    assert "model (no complete snapshot yet)" in out.stream
    server.execute(kid, "with torch.no_grad(): model.bias.add_(1)")
    failed = server.execute(kid, "model.bias.add_(1); 1/0")
    assert failed.status == "error"
    status = server.execute(kid, "%cudaguard status").stream
    assert "model (last good after cell" in status
    assert "snapshot cost per cell:" in status
    stop = server.execute(kid, "%cudaguard keep --stop").stream
    assert "no snapshots" in stop


def test_a_save_that_fails_still_restarts_and_says_nothing_was_kept(server, server_kernel):
    kid, pid = server_kernel
    block = (
        "from nb_cudaguard.keep import store\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "_d = store.keep_dir(get_ipython().profile_dir.location, running_kernel_connection())\n"
        "import shutil; shutil.rmtree(_d.parent, ignore_errors=True)\n"
        "_d.parent.write_text('a file where the directory goes')\n"
        "count = 7\n%load_ext nb_cudaguard"
    )
    assert server.execute(kid, block).status == "ok"
    out = server.execute(kid, "%cudaguard restart --no-blocking")
    assert out.status == "ok"
    assert "Nothing was kept (" in out.stream
    new_pid, _ = wait_for_new_process(server, kid, pid)
    assert new_pid != pid
    cleanup = (
        "import os; os.unlink(os.path.join(get_ipython().profile_dir.location, 'nb_cudaguard'))"
    )
    assert server.execute(kid, cleanup).status == "ok"  # the other tests share this profile


def test_a_snapshotted_cpu_object_is_kept_as_it_is_at_the_restart(server, server_kernel):
    # Snapshots exist for GPU memory, which cannot be read after a crash; a CPU object can be,
    # so it is written as it is now, changes made by a failed cell included.
    kid, pid = server_kernel
    setup = (
        "import torch\nmodel = torch.nn.Linear(4, 2)\n"
        "with torch.no_grad(): model.bias.fill_(1.0)\n"
        "%load_ext nb_cudaguard\n%cudaguard keep model"
    )
    assert server.execute(kid, setup, timeout=TORCH_CELL_S).status == "ok"
    assert server.execute(kid, "x = 1").status == "ok"  # a snapshot: bias 1.0
    assert server.execute(kid, "with torch.no_grad(): model.bias.fill_(5.0)\n1/0").status == "error"
    server.execute(kid, "%cudaguard restart --no-blocking")
    wait_for_new_process(server, kid, pid)
    offer = server.execute(kid, "%load_ext nb_cudaguard")
    text = "\n".join(d.get("text/plain", "") for d in offer.displays)
    assert "model" in text and "snapshot" not in text
    server.execute(kid, "%cudaguard restore model", timeout=TORCH_CELL_S)
    assert server.execute(kid, "print(model.bias.tolist())").stream.strip() == "[5.0, 5.0]"
