"""Private files and directories: made, written and read the one way everything here uses.

A profile or a RAM filesystem (``/dev/shm``) may be shared with other users, and what is read
back may be unpickled (code runs) or decide what the next process does. So:

- a file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600: a name someone else
  put there (a file, a symbolic link to theirs) makes the creation fail instead of writing
  through it; a directory is made 0700;
- a file or directory is checked on what was opened (``fstat`` of the descriptor, opened with
  ``O_NOFOLLOW``), never on the name before opening it, so nothing can be swapped in between:
  it must be a regular file (a directory), owned by this user, with no group or other bits;
- a file others read whole or not at all is written under a temporary name and renamed.

``NotPrivate`` says why a path is refused. Where the platform has no ``O_NOFOLLOW`` or user ids
(Windows), the checks it cannot make are left out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class NotPrivate(Exception):
    """A path that is not this user's alone (or not what it should be): not used."""


def _check(info: os.stat_result, path: Path, directory: bool) -> None:
    if directory and not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{path} is not a directory")
    if not directory and not stat.S_ISREG(info.st_mode):
        raise NotPrivate(f"{path} is not a regular file")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise NotPrivate(f"{path} belongs to another user")
    if os.name == "posix" and info.st_mode & 0o077:
        raise NotPrivate(f"{path} can be read or written by other users")


def _open(path: Path, flags: int) -> int:
    """``os.open`` without following a link at ``path``; a link there is ``NotPrivate``."""
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC)
    except OSError as error:
        if _NOFOLLOW and (os.path.islink(path) or error.errno == getattr(os, "ELOOP", -1)):
            raise NotPrivate(f"cannot read {path}: a symbolic link, not followed") from None
        raise


def make_dirs(path: Path) -> None:
    """Create ``path`` and every missing directory on the way to it, each 0700; an existing one
    is left as it is (IPython's startup directory, a parent that is not ours)."""
    missing = []
    for parent in (path, *path.parents):
        if parent.exists():
            break
        missing.append(parent)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=0o700)


def private_dir(path: Path, tighten: bool = True) -> None:
    """``path`` as a directory of this user's alone: made (0700, with any missing parents) if
    missing; with ``tighten``, an existing one of ours with group or other bits is made 0700
    again (where others could not have put anything in it: not in a world-writable root).
    Raises ``NotPrivate`` for a link, a non-directory, another user's directory, or one of ours
    others can enter (without ``tighten``)."""
    make_dirs(path)
    fd = _open(path, os.O_RDONLY | _DIRECTORY)
    try:
        info = os.fstat(fd)
        mine = os.name == "posix" and info.st_uid == os.geteuid()
        if tighten and mine and stat.S_ISDIR(info.st_mode) and info.st_mode & 0o077:
            os.fchmod(fd, 0o700)
            info = os.fstat(fd)
        _check(info, path, directory=True)
    finally:
        os.close(fd)


def check_dir(path: Path) -> None:
    """Raise ``NotPrivate`` unless ``path`` is a directory of this user's alone (not a link);
    ``FileNotFoundError`` where there is none."""
    fd = _open(path, os.O_RDONLY | _DIRECTORY)
    try:
        _check(os.fstat(fd), path, directory=True)
    finally:
        os.close(fd)


def create(path: Path) -> BinaryIO:
    """A new file of this user's alone (0600), open for writing. Fails if anything is at
    ``path`` already (``FileExistsError``), a link included."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        _check(os.fstat(fd), path, directory=False)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        raise


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` (0600) so that readers see it whole or not at all: a new file under a
    temporary name in the same directory, flushed to the disk, then renamed over ``path``."""
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".tmp-{os.getpid()}-{secrets.token_hex(4)}-{path.name}")
    try:
        with create(tmp) as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def open_private(path: Path) -> BinaryIO:
    """``path`` open for reading, once the open file is known to be a regular file of this
    user's alone (``NotPrivate`` otherwise; ``FileNotFoundError`` where there is none)."""
    fd = _open(path, os.O_RDONLY)
    try:
        _check(os.fstat(fd), path, directory=False)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_private(path: Path) -> bytes:
    """The bytes of ``path``, read through ``open_private``."""
    with open_private(path) as handle:
        return handle.read()


def check_file(path: Path) -> None:
    """Raise ``NotPrivate`` unless ``path`` is a regular file of this user's alone (not a link)."""
    with open_private(path):
        pass
