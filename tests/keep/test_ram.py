"""The keep's files in RAM: used where it has room, the profile otherwise, private and cleaned up.

The RAM roots are real directories: a temporary one, or a real tmpfs mounted for the test (a
small one, as Docker gives ``/dev/shm``), so that ``statvfs`` answers for real.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nb_cudaguard.keep import store, swap

MB = 1024**2


@pytest.fixture
def profile(tmp_path: Path) -> tuple[str, str]:
    connection = tmp_path / "runtime" / "kernel-1234.json"
    connection.parent.mkdir()
    connection.write_text("{}")
    return str(tmp_path / "profile"), str(connection)


@pytest.fixture
def ram(tmp_path: Path) -> Path:
    root = tmp_path / "ram"
    root.mkdir()
    root.chmod(0o1777)  # like /dev/shm: everyone may create entries in it
    return root


def _tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=1777", "tmpfs", str(path)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_shm(tmp_path: Path) -> Iterator[Path]:
    """64 MB, as Docker's default /dev/shm (Colab and Kaggle containers have such)."""
    yield from _tmpfs(tmp_path / "shm64", 64)


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with 64 MB of room for a keep above ``RAM_MARGIN``."""
    yield from _tmpfs(tmp_path / "shm128", 64 + store.RAM_MARGIN // MB)


def _files(manifest: store.Manifest) -> dict[str, bool]:
    return {k.name: k.ram for k in manifest.kept if k.file}


def test_values_go_to_ram_where_there_is_room_and_come_back(profile, ram):
    location, connection = profile
    data = {"a": np.arange(1000.0), "b": [np.ones(10), np.zeros(5)], "n": 3}
    manifest = store.save(data, location, connection, store.SaveOptions(ram=[ram]))
    where = store.ram_dir(ram, location, connection)
    assert manifest.ram == str(where)
    assert _files(manifest) == {"a": True, "b": True, "n": True}
    assert sorted(p.name for p in store.keep_dir(location, connection).iterdir()) == [
        store.MANIFEST
    ]
    fresh: dict[str, object] = {}
    done = store.restore(fresh, location, connection)
    assert done.failed == ()
    assert np.array_equal(fresh["a"], data["a"]) and fresh["n"] == 3
    # The RAM is given back; the profile keeps only the record of what was restored.
    assert not where.exists()
    assert [p.name for p in store.keep_dir(location, connection).iterdir()] == [store.MANIFEST]


def test_the_ram_files_are_private_to_the_user(profile, ram):
    location, connection = profile
    store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    where = store.ram_dir(ram, location, connection)
    assert where.parent.name == f"nb_cudaguard-{os.geteuid()}"
    assert where.parent.stat().st_mode & 0o777 == 0o700
    assert where.stat().st_mode & 0o777 == 0o700
    files = list(where.iterdir())
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)


def test_a_ram_base_others_can_enter_is_not_used(profile, ram):
    location, connection = profile
    base = ram / f"nb_cudaguard-{os.geteuid()}"
    base.mkdir()
    base.chmod(0o777)  # made by someone else's hand: files there could be swapped
    manifest = store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    assert manifest.ram is None and _files(manifest) == {"a": False}
    assert list(base.iterdir()) == []


def test_ram_files_others_could_write_are_refused(profile, ram):
    location, connection = profile
    store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    store.ram_dir(ram, location, connection).chmod(0o755)
    with pytest.raises(store.StoreError, match="other users"):
        store.restore({}, location, connection)


def test_a_manifest_naming_another_ram_directory_is_refused(profile, ram, tmp_path):
    location, connection = profile
    manifest = store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    elsewhere = tmp_path / "elsewhere" / f"nb_cudaguard-{os.geteuid()}" / "keep-0123456789ab"
    store.write_manifest(
        store.keep_dir(location, connection),
        store.Manifest.from_json(manifest.to_json().replace(str(manifest.ram), str(elsewhere))),
    )
    with pytest.raises(store.StoreError, match="another kernel's RAM"):
        store.restore({}, location, connection)


def test_a_small_shm_like_dockers_is_passed_over_for_the_profile(profile, small_shm):
    location, connection = profile
    assert store.ram_room(small_shm, store.memory_available()) == 0  # 64 MB, all of it margin
    manifest = store.save(
        {"a": np.ones(1000)}, location, connection, store.SaveOptions(ram=[small_shm])
    )
    assert manifest.ram is None and _files(manifest) == {"a": False}
    assert list(small_shm.iterdir()) == []


def test_what_does_not_fit_in_ram_goes_to_the_profile(profile, shm):
    location, connection = profile
    room = store.ram_room(shm, store.memory_available())
    assert 60 * MB < room <= 64 * MB

    class Holder:  # its size cannot be told before pickling: RAM is tried, then the profile
        def __init__(self, array):
            self.array = array

    data = {
        "small": np.ones(10 * MB // 8),
        "big": np.ones(80 * MB // 8),  # said by its size: straight to the profile
        "hidden": Holder(np.ones(60 * MB // 8)),  # over what is left in RAM once written
        "last": np.ones(1 * MB // 8),
    }
    manifest = store.save(data, location, connection, store.SaveOptions(ram=[shm]))
    assert manifest.skipped == ()
    assert _files(manifest) == {"small": True, "big": False, "hidden": False, "last": True}
    assert not [p for p in store.ram_dir(shm, location, connection).iterdir() if "v2" in p.name]
    fresh: dict[str, object] = {}
    assert store.restore(fresh, location, connection).failed == ()
    assert fresh["hidden"].array.shape == (60 * MB // 8,)  # type: ignore[attr-defined]
    assert float(fresh["big"].sum()) == 80 * MB // 8  # type: ignore[attr-defined]


def test_ram_is_capped_by_the_memory_available(ram):
    free = os.statvfs(ram).f_bavail * os.statvfs(ram).f_frsize
    assert store.ram_room(ram, 100 * MB) == min(50 * MB, free - store.RAM_MARGIN)
    assert store.ram_room(ram, None) == 0  # unknown: nothing goes to RAM


def test_the_first_root_with_room_is_used(profile, ram, small_shm):
    location, connection = profile
    manifest = store.save(
        {"a": np.ones(1000)}, location, connection, store.SaveOptions(ram=[small_shm, ram])
    )
    assert manifest.ram == str(store.ram_dir(ram, location, connection))


def test_discard_removes_the_ram_files_too(profile, ram):
    location, connection = profile
    store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    store.discard_keep(location, connection, ram=[])  # found through the manifest
    assert not store.ram_dir(ram, location, connection).exists()
    assert not store.keep_dir(location, connection).exists()


def test_a_save_that_never_finished_leaves_nothing_in_ram_at_the_next(profile, ram):
    location, connection = profile
    leftover = store.ram_dir(ram, location, connection)
    leftover.mkdir(parents=True, mode=0o700)
    leftover.parent.chmod(0o700)
    (leftover / "v7.bin").write_bytes(b"half written")
    store.save({"b": 1}, location, connection, store.SaveOptions(ram=[ram]))
    assert not (leftover / "v7.bin").exists()


def test_ram_leftovers_of_other_kernels_expire_at_the_next_save(profile, ram, tmp_path):
    location, connection = profile
    other = str(tmp_path / "runtime" / "kernel-gone.json")
    store.save({"a": np.ones(100)}, location, other, store.SaveOptions(ram=[ram]))
    gone = store.ram_dir(ram, location, other)
    old = time.time() - store.TTL_S - 60
    os.utime(gone, (old, old))
    store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    assert not gone.exists()
    assert store.ram_dir(ram, location, connection).exists()


def test_an_expired_keep_removes_its_ram_files(profile, ram):
    location, connection = profile
    store.save({"a": np.ones(100)}, location, connection, store.SaveOptions(ram=[ram]))
    with pytest.raises(store.StoreError, match="expired"):
        store.read_manifest(location, connection, now=time.time() + store.TTL_S + 60)
    assert not store.ram_dir(ram, location, connection).exists()


def test_ram_files_of_an_earlier_restart_are_carried_and_stay_in_ram(profile, ram):
    location, connection = profile
    first = np.arange(50.0)
    store.save({"a": first, "b": 1}, location, connection, store.SaveOptions(ram=[ram]))
    manifest = store.save({"b": 2}, location, connection, store.SaveOptions(ram=[ram]))
    assert _files(manifest) == {"b": True, "a": True}
    fresh: dict[str, object] = {}
    assert store.restore(fresh, location, connection).failed == ()
    assert np.array_equal(fresh["a"], first) and fresh["b"] == 2
    assert not list(store.ram_dir(ram, location, connection).parent.iterdir())


def test_a_ram_file_lost_to_a_reboot_is_reported_and_the_rest_restored(profile, ram):
    location, connection = profile
    store.save({"a": np.ones(10), "b": 2}, location, connection, store.SaveOptions(ram=[ram]))
    where = store.ram_dir(ram, location, connection)
    kept = {k.name: k.file for k in store.read_manifest(location, connection).kept}  # type: ignore[union-attr]
    (where / str(kept["a"])).unlink()
    fresh: dict[str, object] = {}
    done = store.restore(fresh, location, connection)
    assert fresh == {"b": 2}
    assert done.failed == (("a", "its file in RAM (the machine restarted since?) is gone"),)


def test_no_ram_roots_keeps_everything_in_the_profile(profile, monkeypatch):
    monkeypatch.setenv(store.RAM_ENV, "")
    assert store.ram_roots() == []
    location, connection = profile
    manifest = store.save({"a": np.ones(10)}, location, connection)
    assert manifest.ram is None and _files(manifest) == {"a": False}


def test_the_default_roots_are_the_users_runtime_directory_then_dev_shm(monkeypatch):
    monkeypatch.delenv(store.RAM_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert store.ram_roots() == [Path("/run/user/1000"), Path("/dev/shm")]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert store.ram_roots() == [Path("/dev/shm")]


def test_a_file_the_old_process_was_still_writing_is_removed_at_the_offer(profile, ram):
    # The process ended while a value past the deadline was being written: not in the
    # manifest, and in RAM nothing else would free it before the restore.
    location, connection = profile
    manifest = store.save({"a": np.ones(10)}, location, connection, store.SaveOptions(ram=[ram]))
    where = store.ram_dir(ram, location, connection)
    (where / "v9.bin").write_bytes(b"cut short")
    (store.keep_dir(location, connection) / "v8.bin").write_bytes(b"cut short")
    store.remove_unlisted(location, connection, manifest)
    assert sorted(p.name for p in where.iterdir()) == ["v0.bin"]
    assert sorted(p.name for p in store.keep_dir(location, connection).iterdir()) == [
        store.MANIFEST
    ]
    fresh: dict[str, object] = {}
    assert store.restore(fresh, location, connection).failed == ()


def test_a_save_that_fails_leaves_nothing_in_ram(profile, ram, monkeypatch):
    location, connection = profile

    def broken(*args, **kwargs):
        raise OSError("the profile's disk is full")

    monkeypatch.setattr(swap, "write_manifest", broken)  # the real write, failing as a disk
    with pytest.raises(OSError, match="disk is full"):
        store.save({"a": np.ones(10)}, location, connection, store.SaveOptions(ram=[ram]))
    assert not store.ram_dir(ram, location, connection).exists()


def test_what_a_save_cut_short_left_is_removed_by_the_next(profile, ram):
    # Its process ended while it wrote (the kernel killed mid-save): in RAM, that is memory.
    location, connection = profile
    store.save({"a": np.ones(10)}, location, connection, store.SaveOptions(ram=[ram]))
    final = store.ram_dir(ram, location, connection)
    left = [
        final.with_name(f".{final.name}-new-999"),
        store.keep_dir(location, connection).with_name(
            f".{store.keep_dir(location, connection).name}-new-999"
        ),
    ]
    for place in left:
        place.mkdir(mode=0o700)
        (place / "v0.bin").write_bytes(b"half written")
    store.save({"b": 2}, location, connection, store.SaveOptions(ram=[ram]))
    assert not any(place.exists() for place in left)
