"""What a keep holds, written beside it: the manifest, written and read back checked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files.private import NotPrivate, read_private, write_atomic
from .places import StoreError, check_private, discard, keep_dir, kernel_path, ram_dir

FORMAT = 3  # 3: one file per group of names that share state, memory written once
READABLE = frozenset({3})
TTL_S = 24 * 3600.0  # a day: a notebook left overnight still finds its state; older is a leftover
MANIFEST = "manifest.json"
_FILE_NAME = re.compile(r"^[vc]\d+\.bin$")


@dataclass(frozen=True)
class Kept:
    name: str
    type: str
    size: int  # its own pickle's size, what it holds shared or not
    file: str | None  # None for a module (re-imported by name); names sharing a file share state
    kind: str = "value"  # value | module | snapshot
    module: str | None = None
    note: str = ""
    ram: bool = False  # the file is in the manifest's RAM directory, not the profile's
    global_of: str | None = None  # ``module:attribute`` of the notebook's own module it was
    graph: bool = False  # it held a tensor autograd computed: restored as a leaf, graph lost


@dataclass(frozen=True)
class Skipped:
    name: str
    type: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    kernel: str
    created: float
    kept: tuple[Kept, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    ipython_names: int = 0  # IPython's own names, not kept (it recreates them)
    seconds: float = 0.0
    timed_out: bool = False
    format: int = FORMAT
    total: int = 0  # bytes on disk (names that share state share a file)
    ram: str | None = None  # the RAM directory holding the files marked ``ram``
    written: int = 0  # bytes the save wrote (files carried from an earlier keep were linked)
    restored: tuple[Kept, ...] = ()  # put back already (the files of those are gone)
    restored_at: float = 0.0

    @property
    def size(self) -> int:
        return self.total or sum(k.size for k in self.kept)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") not in READABLE:
            raise ValueError("not a keep manifest of this version")
        for item in data.get("kept", ()):
            if item.get("file") is not None and not _FILE_NAME.match(str(item["file"])):
                raise ValueError(f"unexpected file name {item['file']!r}")
        return cls(
            total=int(data.get("total", 0)),
            kernel=str(data["kernel"]),
            created=float(data["created"]),
            kept=tuple(Kept(**k) for k in data.get("kept", ())),
            skipped=tuple(Skipped(**s) for s in data.get("skipped", ())),
            ipython_names=int(data.get("ipython_names", 0)),
            seconds=float(data.get("seconds", 0.0)),
            timed_out=bool(data.get("timed_out", False)),
            ram=None if data.get("ram") is None else str(data["ram"]),
            written=int(data.get("written", 0)),
            restored=tuple(Kept(**k) for k in data.get("restored", ())),
            restored_at=float(data.get("restored_at", 0.0)),
        )


class NotKept(KeyError):
    """Names asked for that were not kept; says what was (``kept``) and what was restored
    already (``restored``)."""

    def __init__(self, unknown: list[str], kept: list[str], restored: list[str]) -> None:
        super().__init__(unknown)
        self.unknown, self.kept, self.restored = unknown, kept, restored


def write_manifest(directory: Path, manifest: Manifest) -> None:
    write_atomic(directory / MANIFEST, manifest.to_json())


# --- reading -------------------------------------------------------------------------------------


def read_manifest(
    profile_location: str | os.PathLike[str],
    connection: str,
    now: float | None = None,
    *,
    check_age: bool = True,
) -> Manifest | None:
    """What the previous process of this kernel kept; None if nothing. Raises ``StoreError`` (and
    removes the store where it is ours but expired) when it cannot be used. ``check_age=False``:
    the age is the caller's business (the watcher of one keep, which must not remove another)."""
    directory = keep_dir(profile_location, connection)
    if not directory.exists():
        return None
    check_private(directory, directory=True)
    try:
        text = read_private(directory / MANIFEST).decode("utf-8")
    except FileNotFoundError:
        return None  # a save that never finished
    except NotPrivate as error:
        raise StoreError(str(error)) from None
    try:
        manifest = Manifest.from_json(text)
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"the manifest is damaged ({error})") from None
    if manifest.kernel != kernel_path(connection):
        raise StoreError("kept by another kernel")
    now = time.time() if now is None else now
    if check_age and now - manifest.created > TTL_S:
        with contextlib.suppress(StoreError, OSError):
            ram = ram_of(manifest, profile_location, connection)
            if ram is not None:
                discard(ram)
        discard(directory)
        raise StoreError(f"expired (kept more than {TTL_S / 3600:.0f} hours ago); removed")
    return manifest


def ram_of(
    manifest: Manifest, profile_location: str | os.PathLike[str], connection: str
) -> Path | None:
    """The manifest's RAM directory, checked: this kernel's name for it, in a per-user base, both
    private to this user (a RAM root such as /dev/shm is writable by everyone). Raises
    ``StoreError``; None where nothing is in RAM."""
    if manifest.ram is None:
        return None
    ram = Path(manifest.ram)
    expected = ram_dir(Path("/"), profile_location, connection)
    if not ram.is_absolute() or (ram.parent.name, ram.name) != (
        expected.parent.name,
        expected.name,
    ):
        raise StoreError("the manifest names another kernel's RAM directory")
    with contextlib.suppress(FileNotFoundError):  # gone (a reboot): its values fail one by one
        check_private(ram.parent, directory=True)
        check_private(ram, directory=True)
    return ram
