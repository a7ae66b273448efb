"""A keep lives as long as its kernel: the watcher, with real processes and real files."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nb_cudaguard.keep import lifetime, store


@pytest.fixture
def kept(tmp_path: Path) -> tuple[str, str, Path, store.Manifest]:
    ram = tmp_path / "ram"
    ram.mkdir(mode=0o1777)
    connection = tmp_path / "runtime" / "kernel-1234.json"
    connection.parent.mkdir()
    connection.write_text("{}")
    location = str(tmp_path / "profile")
    manifest = store.save({"a": np.ones(1000)}, location, str(connection), ram=[ram])
    return location, str(connection), ram, manifest


def _places(location: str, connection: str, manifest: store.Manifest) -> list[Path]:
    return [store.keep_dir(location, connection), Path(str(manifest.ram))]


def _a_kernel_with(connection: str) -> subprocess.Popen[bytes]:
    """A process started as a kernel is, naming its connection file after ``-f``."""
    code = "import time; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code, "-f", connection])


def test_the_keep_is_discarded_once_its_kernel_is_gone(kept):
    location, connection, ram, manifest = kept
    Path(connection).unlink()  # what Jupyter does when it shuts a kernel down
    assert lifetime.run(location, connection, manifest.created, poll=0.05, ram=[ram]) == (
        "discarded"
    )
    assert not any(p.exists() for p in _places(location, connection, manifest))


def test_a_kernel_still_running_keeps_it_though_its_file_is_gone(kept):
    location, connection, ram, manifest = kept
    kernel = _a_kernel_with(connection)
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", connection])
    try:
        Path(connection).unlink()
        ended: list[str] = []
        watcher = threading.Thread(
            target=lambda: ended.append(
                lifetime.run(location, connection, manifest.created, poll=0.05, ram=[ram])
            )
        )
        watcher.start()
        time.sleep(1.0)
        assert not ended and all(p.exists() for p in _places(location, connection, manifest))
        kernel.kill()  # a client naming the file (not after -f) is no kernel: it does not count
        kernel.wait()
        watcher.join(10)
        assert ended == ["discarded"]
    finally:
        for process in (kernel, client):
            process.kill()
            process.wait()


def test_a_restart_of_ours_keeps_it_and_a_newer_keep_ends_the_watch(kept):
    location, connection, ram, manifest = kept
    newer = store.save({"b": 2}, location, connection, ram=[ram])  # our next restart's save
    assert newer.created != manifest.created
    assert lifetime.run(location, connection, manifest.created, poll=0.05, ram=[ram]) == (
        "replaced"
    )
    assert store.keep_dir(location, connection).exists()


def test_the_watcher_runs_detached_and_cleans_up_after_its_kernel(kept):
    location, connection, _, manifest = kept
    kernel = _a_kernel_with(connection)
    try:
        assert lifetime.watch(location, connection, manifest.created)
        time.sleep(2.0)
        assert all(p.exists() for p in _places(location, connection, manifest))
    finally:
        kernel.kill()
        kernel.wait()
    Path(connection).unlink()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and store.keep_dir(location, connection).exists():
        time.sleep(0.1)
    assert not any(p.exists() for p in _places(location, connection, manifest))


def test_a_manifest_changed_to_an_older_date_is_not_this_watchers_to_remove(kept):
    # Another writer's manifest (here: the same keep dated back past the time limit, as a test
    # of expiry does) ends this watcher; removing it, and the message the next load would give,
    # is the store's business when it is read.
    location, connection, ram, manifest = kept
    directory = store.keep_dir(location, connection)
    older = dataclasses.replace(manifest, created=manifest.created - store.TTL_S - 60)
    store.write_manifest(directory, older)
    assert lifetime.run(location, connection, manifest.created, poll=0.05, ram=[ram]) == (
        "replaced"
    )
    assert all(p.exists() for p in _places(location, connection, manifest))
    with pytest.raises(store.StoreError, match="expired"):
        store.read_manifest(location, connection)
