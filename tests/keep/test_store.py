"""The keep store with real objects: what survives, what is refused and why, who may read it."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nb_cudaguard.keep import pickling, store

CELLS = """
import numpy as np, torch
from dataclasses import dataclass

torch.manual_seed(0)  # (unseeded, all four ReLUs were dead for the ones now and then: no step)
scale = 3

def times(v):
    return v * scale

@dataclass
class Config:
    lr: float = 0.1
    layers: int = 2

class Counter:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += scale
        return self.n

config = Config(0.5, 4)
counter = Counter()
counter.bump()
numbers = {"a": [1, 2.5, None], "b": (True, b"x"), 3: {4, 5}}
array = np.arange(12, dtype=np.float32).reshape(3, 4)
alias = array
tensor = torch.randn(4, 5)
half = torch.ones(3, dtype=torch.bfloat16)
model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.ones(2, 5)).sum().backward()
optimizer.step()
"""


@pytest.fixture
def profile(tmp_path: Path) -> tuple[str, str]:
    connection = tmp_path / "runtime" / "kernel-1234.json"
    connection.parent.mkdir()
    connection.write_text("{}")
    return str(tmp_path / "profile"), str(connection)


def notebook(code: str = CELLS) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(code, "<cell>", "exec"), namespace)
    return namespace


def save_and_restore(namespace, profile, **options):
    location, connection = profile
    manifest = store.save(
        namespace, location, connection, store.SaveOptions(hidden={"__builtins__"}, **options)
    )
    fresh: dict[str, object] = {"__name__": "__main__"}
    done = store.restore(fresh, location, connection)
    return manifest, done, fresh


def test_values_of_many_kinds_come_back_equal(profile):
    old = notebook()
    _, done, new = save_and_restore(old, profile)
    assert done.failed == ()
    assert new["scale"] == 3 and new["numbers"] == old["numbers"]
    assert (new["config"].lr, new["config"].layers) == (0.5, 4)
    assert np.array_equal(new["array"], old["array"]) and new["array"].dtype == np.float32
    assert torch.equal(new["tensor"], old["tensor"])
    assert torch.equal(new["half"], old["half"]) and new["half"].dtype == torch.bfloat16
    mine_and_theirs = zip(
        new["model"].state_dict().values(), old["model"].state_dict().values(), strict=True
    )
    for mine, theirs in mine_and_theirs:
        assert torch.equal(mine, theirs)
    for mine, theirs in zip(
        new["optimizer"].state_dict()["state"].values(),
        old["optimizer"].state_dict()["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert new["np"] is np and new["torch"] is torch  # modules are imported again, not kept


def test_notebook_functions_and_classes_come_back_working_in_the_new_namespace(profile):
    _, _, new = save_and_restore(notebook(), profile)
    assert new["times"](2) == 6
    assert isinstance(new["counter"], new["Counter"])
    assert new["counter"].n == 3 and new["counter"].bump() == 6
    new["scale"] = 10  # their globals are the namespace they came back to, as when defined
    assert new["times"](2) == 20 and new["counter"].bump() == 16


def test_shared_state_comes_back_shared(profile):
    _, _, new = save_and_restore(notebook(), profile)
    assert new["alias"] is new["array"]
    params = new["optimizer"].param_groups[0]["params"]
    assert all(p is q for p, q in zip(params, new["model"].parameters(), strict=True))
    before = new["model"][0].weight.detach().clone()
    new["model"](torch.ones(2, 5)).sum().backward()
    new["optimizer"].step()  # trains the restored model, not a copy of it
    assert not torch.equal(before, new["model"][0].weight)


def test_a_view_comes_back_a_view_of_its_restored_base(profile):
    ns = notebook("import torch\nbase = torch.arange(6.)\nview = base[2:5]\nrows = base.view(2, 3)")
    _, _, new = save_and_restore(ns, profile)
    assert new["view"]._base is new["base"] and new["rows"]._base is new["base"]
    assert new["view"].tolist() == [2.0, 3.0, 4.0]
    new["base"][3] = 30.0  # one memory, as before
    assert new["view"][1] == 30.0 and new["rows"][1, 0] == 30.0


def test_a_tensor_moved_to_shared_memory_comes_back_in_shared_memory(profile):
    # ``share_memory_()`` before handing a tensor to workers: still shared after the restart,
    # with its views on the same (shared) memory; a tensor never shared is not moved.
    ns = notebook(
        "import torch\nshared = torch.arange(6.).share_memory_()\nrows = shared.view(2, 3)\n"
        "plain = torch.ones(2)"
    )
    _, _, new = save_and_restore(ns, profile)
    assert new["shared"].is_shared() and new["rows"].is_shared()
    assert new["shared"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    new["shared"][4] = 40.0
    assert new["rows"][1, 1] == 40.0
    assert not new["plain"].is_shared()


def test_a_memoryview_comes_back_a_view_of_its_restored_object_or_is_not_kept(profile):
    # cloudpickle writes one as the bytes it shows: a ``bytes``, writing into nothing.
    ns = notebook(
        "frame = bytearray(4)\nview = memoryview(frame)\nro = memoryview(b'ab')\n"
        "part = memoryview(frame)[1:]\nwide = memoryview(frame).cast('i')"
    )
    manifest, _, new = save_and_restore(ns, profile)
    assert type(new["view"]) is memoryview and new["view"].obj is new["frame"]
    new["view"][0] = 7  # one memory, as before
    assert new["frame"][0] == 7 and new["ro"].tobytes() == b"ab" and new["ro"].readonly
    # A slice or a cast: not kept, so the replay builds it again (never a ``bytes``).
    assert {s.name for s in manifest.skipped} == {"part", "wide"}


def test_unrelated_values_of_one_dtype_are_written_once_each(profile):
    # dtypes, devices and classes are pickled by name and shared by everything: they must not
    # join unrelated arrays into one group (each would be written twice).
    namespace = {
        "a": np.ones(10, dtype=np.float32),
        "b": np.zeros(10, dtype=np.float32),
        "t": torch.ones(3),
        "u": torch.zeros(3),
        "m": torch.nn.Linear(2, 2),
        "n": torch.nn.Linear(2, 2),
    }
    location, connection = profile
    manifest = store.save(namespace, location, connection)
    files = [k.file for k in manifest.kept]
    assert len(set(files)) == len(files) == 6


def test_things_that_cannot_be_kept_are_listed_with_the_reason_and_the_rest_is_kept(
    profile, tmp_path
):
    namespace = notebook("x = 1\n")
    namespace["log"] = open(tmp_path / "log.txt", "w")  # noqa: SIM115
    namespace["conn"] = socket.socket()
    namespace["batches"] = (i for i in range(3))
    namespace["lock"] = threading.Lock()
    namespace["holder"] = {"lock": threading.RLock()}
    try:
        manifest, _, new = save_and_restore(namespace, profile)
    finally:
        namespace["log"].close()
        namespace["conn"].close()
    reasons = {s.name: s.reason for s in manifest.skipped}
    assert set(reasons) == {"log", "conn", "batches", "lock", "holder"}
    assert "open file" in reasons["log"] and "socket" in reasons["conn"]
    assert "generator" in reasons["batches"] and "lock" in reasons["lock"]
    assert reasons["holder"].startswith("cannot be saved (TypeError: cannot pickle")
    assert new["x"] == 1 and "log" not in new


LIBRARY_STATE = """
import enum


class Shared:  # accelerate's PartialState: every instance's __dict__ is the class's
    _shared_state = {}

    def __init__(self, **settings):
        self.__dict__ = self._shared_state
        self.__dict__.update(settings)


class Single:  # a singleton kept on the class
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance


class Mode(enum.Enum):
    FAST = 1
"""


def test_what_a_library_class_holds_is_not_copied_and_its_cells_build_it_again(
    profile, tmp_path, monkeypatch
):
    # A copy restored apart from its class would be a second instance the class does not hold:
    # ``Shared()`` in the new process would start from an empty state.
    (tmp_path / "libstate.py").write_text(LIBRARY_STATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace = notebook(
        "import libstate\nstate = libstate.Shared(device='cpu')\nholder = {'state': state}\n"
        "single = libstate.Single()\nmode = libstate.Mode.FAST\nplain = [1, 2]\n"
        "class Mine:\n    _instance = None\n"
        "mine = Mine._instance = Mine()"
    )
    try:
        manifest, _, new = save_and_restore(namespace, profile)
        reasons = {s.name: s.reason for s in manifest.skipped}
        assert set(reasons) == {"state", "holder", "single"}, reasons
        assert "libstate.Shared that its class keeps (Shared._shared_state)" in reasons["state"]
        assert "(Single._instance)" in reasons["single"]
        assert "a replay builds it again from its cells" in reasons["holder"]
        # An enum's member finds its class's own again; a notebook class travels with what it
        # holds.
        assert new["mode"] is sys.modules["libstate"].Mode.FAST
        assert new["plain"] == [1, 2] and new["mine"] is new["Mine"]._instance
    finally:
        sys.modules.pop("libstate", None)


def test_ipython_names_are_not_kept_and_only_counted(profile):
    namespace = notebook("y = 2\n")
    namespace.update({"In": [""], "Out": {}, "_": 1, "__": 2, "_i3": "y = 2", "_7": 5, "exit": 0})
    namespace["get_ipython"] = lambda: None
    namespace["_private"] = 4  # a user's name with an underscore is theirs
    manifest, _, _ = save_and_restore(namespace, profile)
    assert {k.name for k in manifest.kept} == {"y", "_private"}
    assert manifest.ipython_names >= 8 and manifest.skipped == ()


def test_files_are_private_to_the_user(profile):
    location, connection = profile
    store.save(notebook(), location, connection)
    directory = store.keep_dir(location, connection)
    assert directory.stat().st_mode & 0o777 == 0o700
    files = list(directory.iterdir())
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)


def test_a_file_others_could_write_is_refused(profile):
    location, connection = profile
    store.save(notebook("z = 1\n"), location, connection)
    (store.keep_dir(location, connection) / store.MANIFEST).chmod(0o644)
    with pytest.raises(store.StoreError, match="other users"):
        store.restore({}, location, connection)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root"
)
def test_a_file_another_user_owns_is_refused(profile):
    location, connection = profile
    store.save(notebook("z = 1\n"), location, connection)
    os.chown(store.keep_dir(location, connection) / store.MANIFEST, 65534, 65534)
    with pytest.raises(store.StoreError, match="belongs to another user"):
        store.restore({}, location, connection)


def test_another_kernel_finds_nothing_and_a_foreign_manifest_is_refused(profile, tmp_path):
    location, connection = profile
    store.save(notebook("z = 1\n"), location, connection)
    other = str(tmp_path / "runtime" / "kernel-other.json")
    assert store.read_manifest(location, other) is None
    # The same directory under the other kernel's key: the manifest still names the first.
    os.rename(store.keep_dir(location, connection), store.keep_dir(location, other))
    with pytest.raises(store.StoreError, match="another kernel"):
        store.restore({}, location, other)


def test_expired_keeps_are_not_restored_and_are_removed(profile):
    location, connection = profile
    store.save(notebook("z = 1\n"), location, connection)
    later = time.time() + store.TTL_S + 60
    with pytest.raises(store.StoreError, match="expired"):
        store.read_manifest(location, connection, now=later)
    assert not store.keep_dir(location, connection).exists()


def test_leftovers_of_other_kernels_expire_at_the_next_save(profile, tmp_path):
    location, connection = profile
    other = str(tmp_path / "runtime" / "kernel-gone.json")
    store.save(notebook("z = 1\n"), location, other)
    old = time.time() - store.TTL_S - 60
    os.utime(store.keep_dir(location, other), (old, old))
    store.save(notebook("z = 1\n"), location, connection)
    assert not store.keep_dir(location, other).exists()
    assert store.keep_dir(location, connection).exists()


def test_a_full_restore_removes_the_files_a_partial_one_keeps_the_rest(profile):
    location, connection = profile
    store.save(notebook(), location, connection)
    fresh: dict[str, object] = {}
    done = store.restore(fresh, location, connection, ["tensor", "scale"])
    assert set(fresh) == {"tensor", "scale"}
    assert "alias" in {k.name for k in done.remaining}
    again = store.restore(fresh, location, connection, ["scale"])
    assert [k.name for k in again.already] == ["scale"] and again.restored == ()
    store.restore(fresh, location, connection)
    assert fresh["alias"] is fresh["array"]
    directory = store.keep_dir(location, connection)
    assert [p.name for p in directory.iterdir()] == [store.MANIFEST]  # the record only
    record = store.read_manifest(location, connection)
    assert record is not None and record.kept == ()
    assert {k.name for k in record.restored} >= {"tensor", "scale", "alias", "array"}


def test_what_an_earlier_restart_kept_and_nobody_restored_is_carried_into_the_next(profile):
    # A crash again before the restore: the names not defined now are not lost.
    location, connection = profile
    first = notebook("import numpy as np\na = np.arange(5)\nalias = a\nb = 2\n")
    store.save(first, location, connection)
    second = notebook("b = 3\nc = 4\n")
    manifest = store.save(second, location, connection)
    notes = {k.name: k.note for k in manifest.kept}
    assert notes["a"] == notes["alias"] == "kept at an earlier restart" and notes["b"] == ""
    fresh: dict[str, object] = {}
    store.restore(fresh, location, connection)
    assert fresh["b"] == 3 and fresh["c"] == 4  # the newer values win
    assert list(fresh["a"]) == [0, 1, 2, 3, 4] and fresh["alias"] is fresh["a"]
    assert not list(store.state_dir(location).glob(".keep-*"))


def test_a_variable_over_the_size_cap_is_skipped_saying_so(profile):
    namespace = notebook("import numpy as np\nbig = np.zeros(1_000_000)\nsmall = np.zeros(10)\n")
    manifest, _, new = save_and_restore(namespace, profile, variable_cap=100_000)
    assert [s.name for s in manifest.skipped] == ["big"]
    assert "over the size cap" in manifest.skipped[0].reason
    assert new["small"].shape == (10,)


def test_a_large_pure_python_value_is_stopped_at_the_cap_while_it_is_pickled(profile):
    import tracemalloc

    namespace = {"many": list(range(2_000_000)), "few": [1, 2, 3]}  # ~10 MB pickled, in band
    location, connection = profile
    tracemalloc.start()
    try:
        manifest = store.save(
            namespace, location, connection, store.SaveOptions(variable_cap=1_000_000)
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.name for s in manifest.skipped] == ["many"]
    assert "over the size cap" in manifest.skipped[0].reason
    assert peak < 4_000_000  # stopped near the cap, not after pickling it all in memory


class SlowToSave:
    def __reduce__(self):
        time.sleep(3)
        return (SlowToSave, ())


def test_a_save_that_takes_too_long_keeps_what_was_written_and_returns_in_time(profile):
    namespace = notebook("a = 1\n")
    namespace["slow"] = SlowToSave()
    namespace["b"] = 2
    started = time.monotonic()
    manifest, _, new = save_and_restore(namespace, profile, timeout=0.5)
    assert time.monotonic() - started < 2.5
    assert manifest.timed_out
    assert new["a"] == 1 and "slow" not in new
    reasons = {s.name: s.reason for s in manifest.skipped}
    assert "not saved in time" in reasons["slow"] and "not saved in time" in reasons["b"]


def test_arrays_and_tensors_are_written_out_of_band_at_their_size(profile):
    location, connection = profile
    namespace = {"a": np.ones(1_000_000), "t": torch.ones(500_000)}
    manifest = store.save(namespace, location, connection)
    sizes = {k.name: k.size for k in manifest.kept}
    assert 8_000_000 <= sizes["a"] < 8_001_000
    assert 2_000_000 <= sizes["t"] < 2_001_000


def test_tensor_views_and_requires_grad_survive(profile):
    base = torch.arange(20.0).reshape(4, 5)
    namespace = {"view": base[1:3, ::2], "leaf": torch.ones(3, requires_grad=True)}
    _, _, new = save_and_restore(namespace, profile)
    assert torch.equal(new["view"], base[1:3, ::2]) and new["view"].stride() == (5, 2)
    assert new["leaf"].requires_grad and new["leaf"].is_leaf


def test_views_of_tensors_that_require_grad_stay_views_of_their_base(profile):
    w = torch.randn(3, requires_grad=True)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        frozen = w[:2]
    namespace = {"w": w, "v": w[1:], "lin": lin, "row": lin.weight[0], "frozen": frozen}
    _, _, new = save_and_restore(namespace, profile)
    assert new["v"]._base is new["w"] and new["v"].requires_grad
    assert new["row"]._base is new["lin"].weight and new["row"].requires_grad
    assert new["frozen"]._base is new["w"] and new["frozen"].requires_grad == frozen.requires_grad
    assert torch.equal(new["row"], lin.weight[0])


def test_the_file_is_checked_before_anything_is_unpickled(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"not a keep file at all, but long enough to have a trailer")
    with pytest.raises(pickling.BadFile), path.open("rb") as handle:
        pickling.load(handle)


def test_closures_and_odd_tensors_come_back(profile):
    code = (
        "import torch\n"
        "def make(k):\n"
        "    def add(v):\n"
        "        return v + k + later\n"
        "    later = 1\n"
        "    return add\n"
        "add3 = make(3)\n"
        "def unbound():\n"
        "    def inner():\n"
        "        return value\n"
        "    return inner\n"
        "    value = 2  # never runs: the closure's cell stays empty\n"
        "inner = unbound()\n"
        "empty = torch.empty(0, 3)\n"
        "transposed = torch.arange(6.0).reshape(2, 3).t()\n"
        "ints = torch.arange(5)\n"
    )
    _, done, new = save_and_restore(notebook(code), profile)
    assert done.failed == ()
    assert new["add3"](1) == 5
    with pytest.raises(NameError):
        new["inner"]()  # as before the restart
    assert new["empty"].shape == (0, 3)
    assert torch.equal(new["transposed"], torch.arange(6.0).reshape(2, 3).t())
    assert new["transposed"].stride() == (1, 3)
    assert torch.equal(new["ints"], torch.arange(5))


# --- state shared between names: one pickle graph, each byte written once --------------------


SHARED = """
import numpy as np, torch
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 4))
opt = torch.optim.Adam(model.parameters())
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
model(torch.ones(2, 64)).sum().backward(); opt.step(); sched.step()
base = np.arange(10_000.0)
as_tensor = torch.from_numpy(base[100:])
back = as_tensor[:50].numpy()
window = base[10:20]
unrelated = np.ones(1000)
"""


def test_what_shares_state_is_written_once_into_one_file(profile):
    location, connection = profile
    manifest = store.save(
        notebook(SHARED), location, connection, store.SaveOptions(hidden={"__builtins__"})
    )
    files = {k.name: k.file for k in manifest.kept}
    assert files["model"] == files["opt"] == files["sched"]
    assert files["base"] == files["as_tensor"] == files["back"] == files["window"]
    assert len({files["model"], files["base"], files["unrelated"]}) == 3
    sizes = {k.name: k.size for k in manifest.kept}
    # The file holds what they share once: less than their pickles alone add up to.
    assert manifest.total < sizes["model"] + sizes["opt"] + sizes["sched"]
    assert manifest.written == manifest.total  # nothing was written twice


def test_a_name_comes_back_with_every_name_it_shares_state_with(profile):
    location, connection = profile
    store.save(notebook(SHARED), location, connection, store.SaveOptions(hidden={"__builtins__"}))
    fresh: dict[str, object] = {}
    done = store.restore(fresh, location, connection, ["opt"])
    assert {k.name for k in done.along} == {"model", "sched"}
    params = fresh["opt"].param_groups[0]["params"]
    assert all(p is q for p, q in zip(params, fresh["model"].parameters(), strict=True))
    assert fresh["sched"].optimizer is fresh["opt"]
    store.restore(fresh, location, connection, ["back"])
    fresh["base"][120] = -1.0
    assert fresh["as_tensor"][20] == -1.0 and fresh["back"][20] == -1.0
    fresh["window"][0] = -2.0
    assert fresh["base"][10] == -2.0


def test_a_name_defined_again_is_left_and_so_is_what_shares_state_with_it(profile):
    location, connection = profile
    store.save(notebook(SHARED), location, connection, store.SaveOptions(hidden={"__builtins__"}))
    fresh: dict[str, object] = {"model": "mine", "unrelated": "mine too"}
    done = store.restore(fresh, location, connection)
    assert fresh["model"] == "mine" and fresh["unrelated"] == "mine too"
    assert {k.name for k in done.skipped} == {"model", "unrelated"}
    # A restored `opt` would train the kept model, not "mine": the file comes back whole or not.
    assert set(done.held) == {("opt", ("model",)), ("sched", ("model",))}
    assert "opt" not in fresh and "base" in fresh
    assert {k.name for k in done.remaining} == {"model", "opt", "sched", "unrelated"}
    forced = store.restore(fresh, location, connection, ["model"], force=True)
    assert {k.name for k in forced.restored} == {"model", "opt", "sched"}
    params = fresh["opt"].param_groups[0]["params"]
    assert all(p is q for p, q in zip(params, fresh["model"].parameters(), strict=True))


def test_a_save_whose_manifest_cannot_be_written_leaves_the_earlier_keep(profile):
    import resource

    location, connection = profile
    store.save(
        notebook("epochs = 12\n"), location, connection, store.SaveOptions(hidden={"__builtins__"})
    )
    many = notebook("\n".join(f"name_{i} = {i}" for i in range(60)))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # A real write error (EFBIG): the values' files are small, the manifest of 60 names is not.
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        with pytest.raises(OSError):
            store.save(many, location, connection, store.SaveOptions(hidden={"__builtins__"}))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    fresh: dict[str, object] = {}
    store.restore(fresh, location, connection)
    assert fresh == {"epochs": 12}
    assert [p.name for p in store.state_dir(location).iterdir()] == [
        store.keep_dir(location, connection).name
    ]


def test_a_carried_name_says_its_partner_of_then_is_not_the_one_kept_now(profile):
    location, connection = profile
    first = notebook(
        "import torch\nmodel = torch.nn.Linear(2, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), 0.1)\n"
    )
    store.save(first, location, connection, store.SaveOptions(hidden={"__builtins__"}))
    second = notebook("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    manifest = store.save(second, location, connection, store.SaveOptions(hidden={"__builtins__"}))
    notes = {k.name: k.note for k in manifest.kept}
    assert "kept at an earlier restart" in notes["opt"]
    assert "shares state with the `model` of then, not with the one kept now" in notes["opt"]


def test_gradients_held_in_grad_come_back(profile):
    # ``loss.backward()`` without an optimizer step: the gradients are state the next step uses
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 1)
    leaf = torch.ones(2, requires_grad=True)
    lin(torch.randn(4, 3)).sum().backward()
    (leaf * 3).sum().backward()
    # a non-leaf told to keep its grad (``h.retain_grad()``): its grad too
    hidden = leaf * 2
    hidden.retain_grad()
    (hidden * 5).sum().backward()
    namespace = {"lin": lin, "leaf": leaf, "none": torch.nn.Linear(2, 2), "hidden": hidden}
    _, _, new = save_and_restore(namespace, profile)
    assert torch.equal(new["hidden"].grad, hidden.grad)
    assert torch.equal(new["lin"].weight.grad, lin.weight.grad)
    assert torch.equal(new["lin"].bias.grad, lin.bias.grad)
    assert torch.equal(new["leaf"].grad, leaf.grad) and new["leaf"].is_leaf
    assert new["none"].weight.grad is None
    assert type(new["lin"].weight) is torch.nn.Parameter and new["lin"].weight.requires_grad


def test_what_held_a_tensor_autograd_computed_is_marked_as_back_without_its_graph(profile):
    # ``loss = out.sum()`` comes back a leaf: ``loss.backward()`` would no longer reach the
    # model. The keep says which names held such a tensor (a replay builds them again); a view
    # of a leaf comes back a view of it, graph and all, and a leaf has none to lose.
    lin = torch.nn.Linear(3, 2)
    out = lin(torch.ones(4, 3))
    loss = out.pow(2).sum()
    namespace = {
        "lin": lin,
        "loss": loss,
        "history": {"losses": [loss.detach()], "last": out},
        "row": lin.weight[0],
        "detached": loss.detach(),
    }
    manifest, done, new = save_and_restore(namespace, profile)
    marked = {k.name for k in manifest.kept if k.graph}
    assert marked == {"loss", "history"}, manifest.kept
    assert {k.name for k in done.restored if k.graph} == {"loss", "history"}
    assert new["loss"].is_leaf and new["row"].grad_fn is not None
    assert new["row"]._base is new["lin"].weight


def test_a_tensors_hooks_and_attributes_come_back(profile):
    # ``w.register_hook(clip)`` and tags (``p.no_decay = True``) move no data: kept all the same
    w = torch.nn.Parameter(torch.ones(2))
    w.register_hook(lambda g: g.clamp(-1, 1))
    w.no_decay = True
    t = torch.zeros(2)
    t.tag = "mask"
    _, _, new = save_and_restore({"w": w, "t": t}, profile)
    assert torch.autograd.grad((new["w"] * 10).sum(), new["w"])[0].tolist() == [1.0, 1.0]
    assert new["w"].no_decay is True and new["t"].tag == "mask"


def test_a_tensor_made_under_inference_mode_comes_back_one(profile):
    with torch.inference_mode():
        preds = torch.ones(3) * 2
    _, _, new = save_and_restore({"preds": preds, "plain": torch.ones(2)}, profile)
    assert new["preds"].is_inference() and torch.equal(new["preds"], preds)
    assert not new["plain"].is_inference()
