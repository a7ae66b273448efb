"""The saved cells: private files, for the next process of this kernel only, read once."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from nb_cudaguard.replay import history
from nb_cudaguard.replay.history import Cell, cells_path, load_cells, save_cells
from nb_cudaguard.restart.injection import kernel_key

CELLS = [Cell("x = 1", 1, False), Cell("%cudaguard status", 2, None), Cell("x[0]", 3, True)]


@pytest.fixture
def where(tmp_path):
    profile = tmp_path / "profile_default"
    profile.mkdir()
    connection = tmp_path / "runtime" / "kernel-abc.json"
    connection.parent.mkdir()
    connection.write_text("{}")
    return str(profile), str(connection)


def _save(where, now):
    return save_cells(*where, CELLS, 2, now=now)


def _next_process(created):
    """A process that began a second after the save (what our restart gives)."""
    return {"now": created + 5, "started": created + 1, "image_started": created + 1}


def test_the_next_process_of_the_kernel_reads_the_cells_once(where):
    created = time.time()
    _save(where, created)
    saved, why = load_cells(*where, **_next_process(created))
    assert why == ""
    assert saved is not None and saved.cells == tuple(CELLS) and saved.failing == 2
    assert saved.failing_cell == CELLS[2]
    again, why = load_cells(*where, **_next_process(created))
    assert again is None and "no cells were saved" in why


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_file_is_private(where):
    path = _save(where, time.time())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path == cells_path(where[0], kernel_key(where[1]))


def test_another_kernel_finds_nothing(where, tmp_path):
    created = time.time()
    _save(where, created)
    other = tmp_path / "runtime" / "kernel-other.json"
    other.write_text("{}")
    saved, why = load_cells(where[0], str(other), **_next_process(created))
    assert saved is None and "no cells were saved" in why


def test_a_file_naming_another_kernel_is_refused(where, tmp_path):
    created = time.time()
    path = _save(where, created)
    data = json.loads(path.read_text())
    data["kernel"] = str(tmp_path / "elsewhere.json")
    path.write_text(json.dumps(data))
    saved, why = load_cells(*where, **_next_process(created))
    assert saved is None and "another kernel" in why


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_file_others_can_read_is_not_trusted_nor_removed(where):
    created = time.time()
    path = _save(where, created)
    path.chmod(0o644)
    saved, why = load_cells(*where, **_next_process(created))
    assert saved is None and "not private" in why
    assert path.exists()


@pytest.mark.skipif(os.name != "posix", reason="symlinks")
def test_a_symlink_is_not_followed(where, tmp_path):
    created = time.time()
    path = _save(where, created)
    target = tmp_path / "real.json"
    path.rename(target)
    path.symlink_to(target)
    saved, why = load_cells(*where, **_next_process(created))
    assert saved is None and "cannot read" in why


def test_an_expired_record_is_removed(where):
    created = time.time() - history.TTL_S - 60
    path = _save(where, created)
    saved, why = load_cells(*where, now=time.time(), started=created + 1, image_started=created + 1)
    assert saved is None and "expired" in why
    assert not path.exists()


def test_a_process_started_later_than_our_restart_gets_nothing(where):
    # The user's restart from the Kernel menu, minutes after ours (whose process never read it).
    created = time.time() - 600
    path = _save(where, created)
    data = json.loads(path.read_text())
    data["pid"] = os.getpid() + 1  # written by the old process
    path.write_text(json.dumps(data))
    saved, why = load_cells(
        *where, now=time.time(), started=created + 590, image_started=time.time()
    )
    assert saved is None and "not started by nb_cudaguard's restart" in why


def test_the_process_that_wrote_it_does_not_read_it_back(where):
    created = time.time()
    _save(where, created)
    saved, why = load_cells(
        *where, now=created + 1, started=created - 100, image_started=created - 50
    )
    assert saved is None and "this very process" in why


def test_a_restart_in_place_keeps_the_pid_and_still_reads_it(where):
    # execve (VS Code): same pid, the process began long ago, the Python image just now.
    created = time.time()
    _save(where, created)
    saved, why = load_cells(
        *where, now=created + 2, started=created - 3600, image_started=created + 1
    )
    assert why == "" and saved is not None


def test_garbage_is_removed_and_reported(where):
    path = _save(where, time.time())
    path.write_text("{not json")
    saved, why = load_cells(*where, **_next_process(time.time()))
    assert saved is None and "unreadable" in why
    assert not path.exists()


def test_the_oldest_cells_go_first_beyond_the_cap(where, monkeypatch):
    monkeypatch.setattr(history, "MAX_CELLS", 2)
    created = time.time()
    save_cells(*where, CELLS, 2, now=created)
    saved, _ = load_cells(*where, **_next_process(created))
    assert saved is not None
    assert saved.cells == tuple(CELLS[1:]) and saved.failing == 1


def test_this_process_start_time_is_read_from_proc():
    started = history.process_started()
    if started is None:
        pytest.skip("no /proc")
    assert time.time() - 3600 * 24 * 365 < started <= time.time() + 2


def test_part_of_a_cell_keeps_which_part_across_the_restart(where):
    # what a replay ran of a failed cell before the statement that raised (replay/prefix.py)
    created = time.time()
    cells = [Cell("a = 1\n", 1, False, 0.5, None, ran_before=2), *CELLS]
    save_cells(*where, cells, 3, now=created)
    saved, why = load_cells(*where, **_next_process(created))
    assert saved is not None and saved.cells == tuple(cells), why
