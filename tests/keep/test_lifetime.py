"""A keep lives as long as its kernel: the one watcher of a user's keeps, with real processes
and real files."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from nb_cudaguard.keep import lifetime, store


@dataclasses.dataclass
class Keep:
    location: str
    connection: str
    ram: Path
    manifest: store.Manifest

    def places(self) -> list[Path]:
        return [store.keep_dir(self.location, self.connection), Path(str(self.manifest.ram))]

    def exists(self) -> bool:
        return all(p.exists() for p in self.places())

    def gone(self) -> bool:
        return not any(p.exists() for p in self.places())


def _keep(tmp_path: Path, name: str, profile: str = "profile") -> Keep:
    ram = tmp_path / "ram"
    ram.mkdir(mode=0o1777, exist_ok=True)
    connection = tmp_path / "runtime" / f"kernel-{name}.json"
    connection.parent.mkdir(exist_ok=True)
    connection.write_text("{}")
    location = str(tmp_path / profile)
    manifest = store.save(
        {"a": np.ones(1000)}, location, str(connection), store.SaveOptions(ram=[ram])
    )
    return Keep(location, str(connection), ram, manifest)


@pytest.fixture(autouse=True)
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own user: its own watcher and register (a detached watcher another test
    started may still be watching that test's keeps)."""
    place = tmp_path / "user-state"
    monkeypatch.setenv("NB_CUDAGUARD_USER_DIR", str(place))
    return place


@pytest.fixture
def kept(tmp_path: Path) -> Keep:
    return _keep(tmp_path, "1234")


def _a_kernel_with(connection: str) -> subprocess.Popen[bytes]:
    """A process started as a kernel is, naming its connection file after ``-f``."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "-f", connection])


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def _until(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(condition())  # type: ignore[operator]


def _in_thread(keep: Keep, grace: float) -> tuple[threading.Thread, list[str]]:
    ended: list[str] = []
    watcher = threading.Thread(
        target=lambda: ended.append(
            lifetime.run(keep.location, poll=0.05, grace=grace, ram=[keep.ram])
        )
    )
    watcher.start()
    return watcher, ended


@pytest.fixture
def no_watcher_left(kept: Keep, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("NB_CUDAGUARD_KEEP_GRACE", "1")  # the detached watcher's
    monkeypatch.setenv("NB_CUDAGUARD_KEEP_RAM", str(kept.ram))
    yield
    pid = lifetime.watcher_pid()
    if pid is not None:
        os.kill(pid, 9)


def test_the_keep_is_discarded_once_its_kernel_is_gone(kept):
    Path(kept.connection).unlink()  # what Jupyter does when it shuts a kernel down
    assert lifetime.run(kept.location, poll=0.05, grace=0.2, ram=[kept.ram]) == "done"
    assert kept.gone()


def test_a_kernel_restarting_within_the_grace_keeps_it(kept):
    # A launcher that removed the connection file early (VS Code's, Colab's), restarting the
    # kernel: for a moment no process runs with it. One poll then must not discard the keep.
    old = _a_kernel_with(kept.connection)
    Path(kept.connection).unlink()
    watcher, ended = _in_thread(kept, grace=3.0)
    new = None
    try:
        time.sleep(0.5)
        _stop(old)
        time.sleep(1.0)  # the restart gap, a lot longer than the 0.05-0.14 s measured
        new = _a_kernel_with(kept.connection)
        time.sleep(3.5)  # longer than the grace: the new process is the kernel now
        assert not ended and kept.exists()
    finally:
        _stop(*(p for p in (old, new) if p is not None))
    watcher.join(15)
    assert ended == ["done"] and kept.gone()


def test_a_kernel_still_running_keeps_it_though_its_file_is_gone(kept):
    kernel = _a_kernel_with(kept.connection)
    client = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", kept.connection]
    )
    try:
        Path(kept.connection).unlink()
        watcher, ended = _in_thread(kept, grace=0.2)
        time.sleep(1.0)
        assert not ended and kept.exists()
        _stop(kernel)  # a client naming the file (not after -f) is no kernel: it does not count
        watcher.join(10)
        assert ended == ["done"]
    finally:
        _stop(kernel, client)


def test_a_newer_keep_of_the_same_kernel_is_watched_on(kept):
    newer = store.save(
        {"b": 2}, kept.location, kept.connection, store.SaveOptions(ram=[kept.ram])
    )  # our restart
    assert newer.created != kept.manifest.created
    watcher, ended = _in_thread(kept, grace=0.2)
    time.sleep(0.5)
    assert not ended and store.keep_dir(kept.location, kept.connection).exists()
    Path(kept.connection).unlink()
    watcher.join(10)
    assert ended == ["done"] and not store.keep_dir(kept.location, kept.connection).exists()


def test_the_watch_ends_once_everything_is_restored(kept):
    watcher, ended = _in_thread(kept, grace=0.2)
    time.sleep(0.3)
    assert not ended
    namespace: dict[str, object] = {}
    store.restore(namespace, kept.location, kept.connection)
    watcher.join(10)
    assert ended == ["done"] and "a" in namespace
    # the manifest stays, saying what was restored, for a later restore to tell
    assert store.read_manifest(kept.location, kept.connection) is not None


def test_one_watcher_watches_every_keep_of_the_user_across_profiles(
    tmp_path, kept, no_watcher_left, user_dir
):
    second = _keep(tmp_path, "5678")  # another kernel of the same profile
    third = _keep(tmp_path, "9012", profile="other-profile")  # another IPython profile's
    keeps = (kept, second, third)
    kernels = [_a_kernel_with(k.connection) for k in keeps]
    try:
        assert lifetime.watch(kept.location)
        assert _until(lambda: lifetime.watcher_pid() is not None, 20)
        pid = lifetime.watcher_pid()
        assert lifetime.watch(second.location)  # the second restart's save
        assert lifetime.watch(third.location)  # and one in the other profile
        assert sorted(lifetime.registered()) == sorted({kept.location, third.location})
        time.sleep(2.0)
        watchers = [  # of this user (other tests' kernels may have theirs)
            p.pid
            for p in psutil.process_iter(["environ"])
            if lifetime._ENV in (p.info["environ"] or {})
            and (p.info["environ"] or {}).get("NB_CUDAGUARD_USER_DIR") == str(user_dir)
        ]
        assert watchers == [pid]
        assert all(k.exists() for k in keeps)
    finally:
        _stop(*kernels)
    for keep in keeps:
        Path(keep.connection).unlink()
    assert _until(lambda: all(k.gone() for k in keeps), 20)
    assert pid is not None and _until(lambda: _ended(pid), 10)  # with no keep left, it ends
    assert lifetime.registered() == []


def _ended(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_the_watcher_holds_no_notebook_directory_and_imports_the_standard_library(
    tmp_path, kept, no_watcher_left, monkeypatch, user_dir
):
    # A directory on PYTHONPATH (or a site-packages) holding a module named as a standard one
    # (an old backport) must not be what the watcher imports; nor may it keep the directory
    # the notebook runs in (a mount the user wants to unmount, a folder to delete).
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "contextlib.py").write_text("raise ImportError('the shadowing module')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shadow), os.getcwd()]))
    notebook_dir = tmp_path / "notebook"
    notebook_dir.mkdir()
    monkeypatch.chdir(notebook_dir)
    kernel = _a_kernel_with(kept.connection)
    try:
        assert lifetime.watch(kept.location)
        assert _until(lambda: lifetime.watcher_pid() is not None, 20)
        pid = lifetime.watcher_pid()
        assert pid is not None
        assert psutil.Process(pid).cwd() == str(user_dir)
    finally:
        _stop(kernel)
    Path(kept.connection).unlink()
    assert _until(kept.gone, 20)


def test_a_manifest_dated_back_is_not_this_watchers_to_remove(kept):
    # Another writer's manifest (here: the same keep dated back past the time limit, as a test
    # of expiry does): removing it, and the message the next load gives, is the store's business
    # when it is read.
    watcher, ended = _in_thread(kept, grace=0.2)
    time.sleep(0.3)
    directory = store.keep_dir(kept.location, kept.connection)
    older = dataclasses.replace(kept.manifest, created=kept.manifest.created - store.TTL_S - 60)
    store.write_manifest(directory, older)
    time.sleep(0.5)
    assert not ended and kept.exists()
    with pytest.raises(store.StoreError, match="expired"):
        store.read_manifest(kept.location, kept.connection)
    watcher.join(10)
    assert ended == ["done"]


def test_a_keep_past_its_age_is_discarded_though_its_kernel_runs(tmp_path):
    keep = _keep(tmp_path, "old")
    directory = store.keep_dir(keep.location, keep.connection)
    aged = dataclasses.replace(keep.manifest, created=time.time() - store.TTL_S - 60)
    store.write_manifest(directory, aged)  # saved a day ago, its kernel still there
    assert lifetime.run(keep.location, poll=0.05, grace=0.2, ram=[keep.ram]) == "done"
    assert keep.gone()
