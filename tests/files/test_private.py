"""Private files: made 0600/0700, checked on the open descriptor, never through a link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nb_cudaguard.files.private import (
    NotPrivate,
    check_dir,
    create,
    open_private,
    private_dir,
    read_private,
    write_atomic,
)

posix = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and links")
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_directories_and_files_are_made_private(tmp_path):
    directory = tmp_path / "a" / "b"
    private_dir(directory)
    assert mode(tmp_path / "a") == mode(directory) == 0o700
    write_atomic(directory / "data.json", "{}")
    assert mode(directory / "data.json") == 0o600
    assert read_private(directory / "data.json") == b"{}"
    assert [p.name for p in directory.iterdir()] == ["data.json"]  # no temporary file left


@posix
def test_an_existing_directory_of_ours_is_tightened_only_where_asked(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(0o777)
    with pytest.raises(NotPrivate, match="other users"):
        private_dir(directory, tighten=False)  # in a shared root: others may have put files in
    private_dir(directory)
    assert mode(directory) == 0o700


@posix
def test_nothing_is_written_or_read_through_a_link(tmp_path):
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("not yours")
    theirs.chmod(0o600)
    link = tmp_path / "file"
    link.symlink_to(theirs)
    with pytest.raises(FileExistsError):
        create(link)
    with pytest.raises(NotPrivate, match="symbolic link"):
        open_private(link)
    assert theirs.read_text() == "not yours"
    directory = tmp_path / "real"
    private_dir(directory)
    (tmp_path / "dirlink").symlink_to(directory)
    with pytest.raises(NotPrivate, match="symbolic link"):
        check_dir(tmp_path / "dirlink")
    with pytest.raises(NotPrivate, match="symbolic link"):
        private_dir(tmp_path / "dirlink")


@posix
def test_a_file_others_can_read_or_write_is_refused(tmp_path):
    path = tmp_path / "data"
    write_atomic(path, b"x")
    path.chmod(0o640)
    with pytest.raises(NotPrivate, match="other users"):
        read_private(path)


@as_root
def test_another_users_file_or_directory_is_refused(tmp_path):
    path = tmp_path / "data"
    write_atomic(path, b"x")
    os.chown(path, 65534, 65534)
    with pytest.raises(NotPrivate, match="another user"):
        read_private(path)
    directory = tmp_path / "dir"
    private_dir(directory)
    os.chown(directory, 65534, 65534)
    with pytest.raises(NotPrivate, match="another user"):
        private_dir(directory)


def test_a_missing_file_is_said_as_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_private(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        check_dir(tmp_path / "nothing")
