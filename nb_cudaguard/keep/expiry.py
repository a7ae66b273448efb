"""A keep's end: discarded, its unlisted files removed, every keep past its age removed."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..files.keys import state_dir
from ..files.private import NotPrivate, read_private
from .manifest import MANIFEST, TTL_S, Manifest, ram_of
from .places import StoreError, check_private, discard, keep_dir, ram_base, ram_dir, ram_roots


def remove_unlisted(
    profile_location: str | os.PathLike[str], connection: str, manifest: Manifest
) -> None:
    """Remove the files of this kernel's keep that its manifest does not name: a value the old
    process was still writing when it ended (past the save's deadline). Where that was in RAM,
    nothing else would free it before the restore."""
    listed = {(k.file, k.ram) for k in manifest.kept if k.file}
    places = [(keep_dir(profile_location, connection), False)]
    with contextlib.suppress(StoreError):
        ram = ram_of(manifest, profile_location, connection)
        places += [(ram, True)] if ram is not None else []
    for place, in_ram in places:
        for path in place.glob("*.bin"):
            if (path.name, in_ram) not in listed:
                with contextlib.suppress(OSError):
                    path.unlink()


def discard_keep(
    profile_location: str | os.PathLike[str],
    connection: str,
    ram: Iterable[Path] | None = None,
) -> None:
    """Remove this kernel's keep: its profile directory and its RAM directories (under each of
    ``ram``, default ``ram_roots()``, and the one its manifest names)."""
    directory = keep_dir(profile_location, connection)
    places = [ram_dir(root, profile_location, connection) for root in _roots(ram)]
    with contextlib.suppress(StoreError, OSError, ValueError, NotPrivate):
        named = ram_of(
            Manifest.from_json(read_private(directory / MANIFEST).decode("utf-8")),
            profile_location,
            connection,
        )
        places += [named] if named is not None else []
    for place in places:
        with contextlib.suppress(StoreError, OSError):
            check_private(place.parent, directory=True)  # never follow a base someone else made
            discard(place)
    discard(directory)


def _roots(ram: Iterable[Path] | None) -> list[Path]:
    return ram_roots() if ram is None else list(ram)


def remove_expired(
    profile_location: str | os.PathLike[str],
    now: float | None = None,
    ram: Iterable[Path] | None = None,
) -> None:
    """Remove every kernel's keep directories older than ``TTL_S``, in the profile and in RAM
    (under each of ``ram``, default ``ram_roots()``): leftovers of kernels that never came back,
    and of saves that never finished."""
    now = time.time() if now is None else now
    place = state_dir(profile_location)
    patterns = ("keep-*", ".keep-*-earlier-*", ".keep-*-new-*")
    directories = [d for p in patterns for d in place.glob(p)]
    for root in _roots(ram):
        base = ram_base(root)
        with contextlib.suppress(StoreError, OSError):
            check_private(base, directory=True)
            directories += [d for p in patterns for d in base.glob(p)]
    for directory in directories:
        with contextlib.suppress(OSError):
            info = directory.lstat()
            mine = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
            if mine and now - info.st_mtime > TTL_S:
                discard(directory)
