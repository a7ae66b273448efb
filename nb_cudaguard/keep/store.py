"""The keep store: a notebook's CPU state, saved before a restart and read back after it.

Where: ``<profile>/nb_cudaguard/keep-<key>/`` with ``key = injection.kernel_key(connection
file)``: the connection file survives a restart, so the new process of the same kernel finds it,
and another kernel (another connection file) looks elsewhere; the manifest names the connection
file too, and a mismatch is refused. The directory is 0700 and every file 0600; on reading, the
directory and each file must be owned by this user with no group/other bits, or nothing is read
(unpickling runs code). Leftovers expire after ``TTL_S``; a full restore removes the directory.

Where RAM allows, the values' files go to a RAM-backed filesystem instead (``$XDG_RUNTIME_DIR``,
``/dev/shm``): ``<root>/nb_cudaguard-<uid>/keep-<key>/``, with the same rules (0700, 0600, checked
before reading). Writing a gigabyte there is a copy into memory, where on a disk filesystem it
can be held up by the writeback of earlier dirty pages (measured in BENCHMARKS.md). Only what fits
goes there: the filesystem's free space less ``RAM_MARGIN`` (a Docker ``/dev/shm`` has 64 MB) and
at most ``RAM_SHARE`` of the memory available, since nothing reclaims it until it is restored,
discarded or expired (the sweep of leftovers covers these directories too); the rest goes to
the profile. The manifest always stays in the profile, so the new process finds it there.

Each variable is written on its own, so a failure skips only that variable, with the reason.
Variables that share state (an optimizer and its model's parameters, two names for one array)
are then written together, so that they come back sharing it.

The save runs in a worker thread under a deadline: what was written by then is kept, the rest is
listed as not kept, and the caller (the restart) goes on. Nothing here blocks the cure.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..restart.injection import _private_dir, kernel_key, state_dir
from . import pickling
from .select import describe, importable_module, is_ipython_name, reason_not_to_try

FORMAT = 2  # 2: files may be in RAM (``Kept.ram``, ``Manifest.ram``)
READABLE = frozenset({1, 2})
TTL_S = 24 * 3600.0  # a day: a notebook left overnight still finds its state; older is a leftover
TIMEOUT_S = 30.0  # the restart waits no longer than this for the save
VARIABLE_CAP = 4 * 1024**3  # bytes per variable (or group)
TOTAL_CAP = 16 * 1024**3
FREE_SPACE_KEPT = 1024**3  # never fill the disk: this much stays free, and at most half of it used
RAM_MARGIN = 64 * 1024**2  # left free on a RAM filesystem
RAM_SHARE = 0.5  # of the memory available: the most a keep may hold in RAM
MANIFEST = "manifest.json"
_LOOKED_AT = 1000  # items of a list or dict looked at to guess its size
_FILE_NAME = re.compile(r"^[vgc]\d+\.bin$")


@dataclass(frozen=True)
class Kept:
    name: str
    type: str
    size: int
    file: str | None  # None for a module (re-imported by name)
    kind: str = "value"  # value | module | snapshot
    module: str | None = None
    note: str = ""
    ram: bool = False  # the file is in the manifest's RAM directory, not the profile's


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
        )


class StoreError(Exception):
    """The store cannot be read: not ours, another kernel's, expired or damaged."""


def keep_dir(profile_location: str | os.PathLike[str], connection: str) -> Path:
    return state_dir(profile_location) / f"keep-{kernel_key(connection)}"


def _kernel(connection: str) -> str:
    return os.path.realpath(os.path.abspath(connection))


# --- the RAM place -------------------------------------------------------------------------------


RAM_ENV = "NB_CUDAGUARD_KEEP_RAM"  # the roots to use instead (os.pathsep between); empty: none


def ram_roots() -> list[Path]:
    """RAM-backed filesystems to try, best first: the user's own runtime directory (private by
    design), then ``/dev/shm``; or those ``$NB_CUDAGUARD_KEEP_RAM`` names. None off Linux-like
    systems."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return []
    chosen = os.environ.get(RAM_ENV)
    if chosen is not None:
        return [Path(p) for p in chosen.split(os.pathsep) if os.path.isabs(p)]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    roots = [Path(runtime)] if runtime and os.path.isabs(runtime) else []
    return [*roots, Path("/dev/shm")]


def _ram_base(root: Path) -> Path:
    return root / f"nb_cudaguard-{os.geteuid()}"


def ram_dir(root: Path, profile_location: str | os.PathLike[str], connection: str) -> Path:
    """This kernel's RAM directory under ``root``: keyed by the profile as well as the kernel, as
    a RAM root is shared by every profile on the machine."""
    profile = os.path.realpath(os.path.abspath(profile_location))
    key = hashlib.sha256(f"{profile}\0{_kernel(connection)}".encode()).hexdigest()[:24]
    return _ram_base(root) / f"keep-{key}"


def memory_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo, in bytes; None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def ram_room(root: Path, available: int | None) -> int:
    """Bytes a keep may put under ``root``: its free space less ``RAM_MARGIN``, and at most
    ``RAM_SHARE`` of ``available`` memory (0 where either is unknown)."""
    if available is None:
        return 0
    try:
        info = os.statvfs(root)
    except OSError:
        return 0
    return max(0, min(info.f_bavail * info.f_frsize - RAM_MARGIN, int(available * RAM_SHARE)))


def _make_ram_dir(directory: Path) -> bool:
    """Create ``directory`` 0700 under a 0700 per-user base in a shared, world-writable root: the
    base must be a real directory of ours that nobody else can enter, or nothing goes there."""
    base = directory.parent
    try:
        with contextlib.suppress(FileExistsError):
            base.mkdir(mode=0o700)
        _check_private(base, directory=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        _check_private(directory, directory=True)
    except (OSError, StoreError):
        return False
    return True


# --- saving --------------------------------------------------------------------------------------


@dataclass
class _Budget:
    deadline: float
    total_left: int
    cancelled: threading.Event = field(default_factory=threading.Event)

    def checker(self, cap: int, room: int | None = None) -> Any:
        limit = min(cap, self.total_left, cap if room is None else room)

        def check(written: int) -> None:
            if written > limit:
                raise pickling.TooLarge(limit)
            if self.cancelled.is_set() or time.monotonic() > self.deadline:
                raise pickling.OutOfTime()

        return check


def _private_file(path: Path) -> Any:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o600), "wb")


class _Saver:
    def __init__(
        self,
        directory: Path,
        kernel: str,
        values: list[tuple[str, Any]],
        substitutes: dict[tuple[Any, ...], Any],
        namespace: dict[str, Any],
        budget: _Budget,
        variable_cap: int,
        notes: Mapping[str, str],
        created: float,
        fallbacks: Mapping[str, Callable[[], tuple[str, Any]]],
        why_not: Mapping[str, str],
        ram: Path | None = None,
        ram_left: int = 0,
        disk_left: int | None = None,
    ) -> None:
        self.ram = ram  # where values go while they fit in ``ram_left`` bytes
        self.ram_left = ram_left if ram is not None else 0
        self.disk_left = budget.total_left if disk_left is None else disk_left
        self.fallbacks = fallbacks
        self.extra_values: dict[str, Any] = {}
        self.why_not = why_not
        self.created = created
        self.directory = directory
        self.kernel = kernel
        self.values = values
        self.pickler = pickling.KeepPickler(namespace, substitutes)
        self.budget = budget
        self.variable_cap = variable_cap
        self.notes = notes
        self.lock = threading.Lock()
        self.kept: list[Kept] = []
        self.skipped: list[Skipped] = []
        self.done: set[str] = set()
        self.finished = False
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.ipython_names = 0

    def manifest(self, timed_out: bool) -> Manifest:
        skipped = list(self.skipped)
        if timed_out:
            skipped += [
                Skipped(n, describe(v), "not saved in time: the restart did not wait longer")
                for n, v in self.values
                if n not in self.done
            ]
        total = 0
        for file, ram in {(k.file, k.ram) for k in self.kept if k.file}:
            with contextlib.suppress(OSError):
                total += self._path(file, ram).stat().st_size
        return Manifest(
            self.kernel,
            self.created,
            tuple(self.kept),
            tuple(skipped),
            self.ipython_names,
            round(time.monotonic() - self.started, 3),
            timed_out,
            total=total,
            ram=None if self.ram is None else str(self.ram),
        )

    def _path(self, file: str, ram: bool) -> Path:
        return (self.ram if ram and self.ram is not None else self.directory) / file

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # handed to the caller, not printed by the thread
            self.error = error

    def _run(self) -> None:
        identities: dict[str, set[tuple[str, int]]] = {}
        alive: list[Any] = []  # ids are compared only while their objects live
        for index, (name, value) in enumerate(self.values):
            if self.budget.cancelled.is_set():
                return
            entry, ids, keep_alive = self._write_one(index, name, value)
            with self.lock:
                if self.budget.cancelled.is_set():
                    if isinstance(entry, Kept) and entry.file:
                        self._remove(entry.file, entry.ram)
                    return
                self.done.add(name)
                if isinstance(entry, Kept):
                    self.kept.append(entry)
                    self._spend(entry.size, entry.ram)
                    identities[name] = ids
                    alive.extend(keep_alive)
                elif entry is not None:
                    if name in self.why_not:
                        entry = Skipped(entry.name, entry.type, self.why_not[name])
                    self.skipped.append(entry)
                    fallback = self.fallbacks.get(name)
                    if fallback is not None:
                        self._fall_back(index, name, fallback, identities, alive)
        self._join_shared(identities)
        del alive
        with self.lock:
            if not self.budget.cancelled.is_set():
                write_manifest(self.directory, self.manifest(timed_out=False))
                self.finished = True  # only once the manifest is there: else an error, below

    def _write_one(
        self, index: int, name: str, value: Any
    ) -> tuple[Kept | Skipped | None, set[tuple[str, int]], list[Any]]:
        import types

        if isinstance(value, types.ModuleType):
            module = importable_module(value)
            if module is not None:
                return Kept(name, "module", 0, None, "module", module), set(), []
        why = reason_not_to_try(value)
        if why is not None:
            return Skipped(name, describe(value), why), set(), []
        file = f"v{index}.bin"
        try:
            (size, ids, keep_alive), ram = self._dump(file, {name: value}, self.variable_cap)
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            return Skipped(name, describe(value), _reason(error)), set(), []
        kind = "snapshot" if name in self.notes else "value"
        return (
            Kept(name, describe(value), size, file, kind, note=self.notes.get(name, ""), ram=ram),
            ids,
            [keep_alive],
        )

    def _dump(
        self, file: str, values: dict[str, Any], cap: int
    ) -> tuple[tuple[int, set[tuple[str, int]], list[Any]], bool]:
        """Write ``values`` to ``file``: in RAM if they look like they fit (arrays and tensors
        say their size), else, or if RAM runs out while writing, in the profile. Returns the
        pickler's answer and whether the file is in RAM; raises what the pickler raised."""
        if self.ram is not None and _estimate(values) <= self.ram_left:
            limit = min(cap, self.budget.total_left)
            try:
                return self._dump_to(self.ram / file, values, cap, self.ram_left), True
            except pickling.TooLarge:
                self._remove(file, True)
                if self.ram_left >= min(limit, self.disk_left):
                    raise  # over its cap, or over what the profile has room for as well
            except OSError:  # the RAM filesystem filled up after all (ENOSPC)
                self._remove(file, True)
        return self._dump_to(self.directory / file, values, cap, self.disk_left), False

    def _spend(self, size: int, ram: bool) -> None:
        self.budget.total_left -= size
        if ram:
            self.ram_left -= size
        else:
            self.disk_left -= size

    def _dump_to(
        self, path: Path, values: dict[str, Any], cap: int, room: int | None
    ) -> tuple[int, set[tuple[str, int]], list[Any]]:
        try:
            with _private_file(path) as out:
                return self.pickler.dump(values, out, check=self.budget.checker(cap, room))
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise

    def _fall_back(
        self,
        index: int,
        name: str,
        fallback: Callable[[], tuple[str, Any]],
        identities: dict[str, set[tuple[str, int]]],
        alive: list[Any],
    ) -> None:
        """A snapshotted object that cannot be written whole: its state dict, under its own
        name (called with the lock held: the worker is the only writer)."""
        try:
            other, value = fallback()
        except Exception:
            return
        entry, ids, keep_alive = self._write_one(index + 100000, other, value)
        if isinstance(entry, Kept):
            note = f"the state dict of `{name}`, from its {self.notes.get(name, 'snapshot')}"
            self.kept.append(
                Kept(
                    entry.name,
                    entry.type,
                    entry.size,
                    entry.file,
                    "snapshot",
                    note=note,
                    ram=entry.ram,
                )
            )
            self._spend(entry.size, entry.ram)
            identities[other] = ids
            alive.extend(keep_alive)
            self.extra_values[other] = value
            self.done.add(other)

    def _join_shared(self, identities: dict[str, set[tuple[str, int]]]) -> None:
        groups = _groups(identities)
        by_name = {k.name: k for k in self.kept}
        for index, names in enumerate(g for g in groups if len(g) > 1):
            if self.budget.cancelled.is_set():
                return
            values = {n: v for n, v in [*self.values, *self.extra_values.items()] if n in names}
            file = f"g{index}.bin"
            try:
                (size, _, _), ram = self._dump(file, values, self.variable_cap * len(names))
            except Exception:  # they stay apart: each comes back with its own copies
                continue
            with self.lock:
                if self.budget.cancelled.is_set():
                    self._remove(file, ram)
                    return
                self._spend(size, ram)
                for old_file, old_ram in {(by_name[n].file, by_name[n].ram) for n in names}:
                    if old_file:
                        with contextlib.suppress(OSError):
                            self._spend(-self._path(old_file, old_ram).stat().st_size, old_ram)
                        self._remove(old_file, old_ram)
                for name in names:
                    old = by_name[name]
                    self.kept[self.kept.index(old)] = Kept(
                        old.name, old.type, old.size, file, old.kind, old.module, old.note, ram
                    )

    def _remove(self, file: str, ram: bool = False) -> None:
        with contextlib.suppress(OSError):
            self._path(file, ram).unlink()


def _estimate(values: dict[str, Any]) -> int:
    """The bytes of the arrays and tensors in ``values`` (one level into lists, tuples and dicts,
    their first ``_LOOKED_AT`` items), known without pickling: enough to choose where a value
    goes."""
    total = 0
    for value in values.values():
        members: Iterable[Any] = [value]
        if isinstance(value, dict):
            members = value.values()
        elif isinstance(value, list | tuple):
            members = value
        for member in itertools.islice(members, _LOOKED_AT):
            try:
                size = getattr(member, "nbytes", None)
            except Exception:  # a property that fails: say nothing
                continue
            if isinstance(size, int):
                total += size
    return total


def _groups(identities: dict[str, set[tuple[str, int]]]) -> list[set[str]]:
    """Names that share any identity, joined (union-find over the identities)."""
    parent: dict[str, str] = {n: n for n in identities}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    owner: dict[tuple[str, int], str] = {}
    for name, ids in identities.items():
        for key in ids:
            other = owner.setdefault(key, name)
            if other != name:
                parent[root(name)] = root(other)
    groups: dict[str, set[str]] = {}
    for name in identities:
        groups.setdefault(root(name), set()).add(name)
    return list(groups.values())


def _reason(error: BaseException) -> str:
    if isinstance(error, pickling.NotOnCpu):
        return (
            f"{error}: GPU memory is never read here (after a CUDA error it cannot be); "
            "`%cudaguard keep NAME` keeps a CPU snapshot of it after each cell"
        )
    if isinstance(error, pickling.TooLarge):
        return f"over the size cap ({error.args[0] / 1e9:.1f} GB left for it)"
    if isinstance(error, pickling.OutOfTime):
        return "not saved in time: the restart did not wait longer"
    if isinstance(error, RecursionError):
        return "cannot be saved: nested too deeply"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"cannot be saved ({type(error).__name__}: {text[:160]})"


def _ram_place(
    profile_location: str | os.PathLike[str], connection: str, roots: list[Path], needed: int
) -> tuple[Path | None, int]:
    """The RAM directory for this save and the bytes it may take there: the first root with room
    for ``needed`` (the arrays' and tensors' bytes), else the one with the most room."""
    available = memory_available()
    rooms = [(ram_room(root, available), root) for root in roots]
    rooms = [(room, root) for room, root in rooms if room > 0]
    if not rooms:
        return None, 0
    fits = [(room, root) for room, root in rooms if room >= needed]
    room, root = fits[0] if fits else max(rooms, key=lambda pair: pair[0])
    directory = ram_dir(root, profile_location, connection)
    return (directory, room) if _make_ram_dir(directory) else (None, 0)


def save(
    namespace: dict[str, Any],
    profile_location: str | os.PathLike[str],
    connection: str,
    *,
    hidden: Iterable[str] = (),
    substitutes: dict[tuple[Any, ...], Any] | None = None,
    extra: Iterable[tuple[str, Any]] = (),
    notes: Mapping[str, str] | None = None,
    fallbacks: Mapping[str, Callable[[], tuple[str, Any]]] | None = None,
    why_not: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT_S,
    variable_cap: int = VARIABLE_CAP,
    total_cap: int = TOTAL_CAP,
    now: float | None = None,
    ram: Iterable[Path] | None = None,
) -> Manifest:
    """Save the CPU state of ``namespace`` for the next process of this kernel; returns what was
    kept and what not. ``substitutes`` stand CPU copies in for CUDA tensors (snapshots); ``extra``
    adds (name, value) pairs (a snapshot's state dict where its object could not be written);
    ``notes`` says what a kept name is (``snapshot after cell [3]``); ``fallbacks`` give, for a
    name that cannot be written, another (name, value) to write instead (a snapshot's state
    dict); ``why_not`` replaces the reason a name was not kept. ``ram``: the RAM filesystems to
    try (default ``ram_roots()``; empty: the profile only)."""
    now = time.time() if now is None else now
    ram = ram_roots() if ram is None else list(ram)
    remove_expired(profile_location, now=now, ram=ram)
    directory = keep_dir(profile_location, connection)
    earlier = _set_aside(profile_location, connection, now)
    discard_keep(profile_location, connection, ram=ram)
    _private_dir(directory)
    hidden_names = frozenset(hidden)
    values: list[tuple[str, Any]] = []
    ipython_names = 0
    for name, value in list(namespace.items()):
        if is_ipython_name(name, hidden_names):
            ipython_names += 1
        else:
            values.append((name, value))
    values.extend(extra)
    free = shutil.disk_usage(directory).free
    disk_room = max(0, (free - FREE_SPACE_KEPT) // 2)
    place, ram_left = _ram_place(profile_location, connection, ram, _estimate(dict(values)))
    budget = _Budget(
        deadline=time.monotonic() + timeout,
        total_left=min(total_cap, disk_room + ram_left),
    )
    saver = _Saver(
        directory,
        _kernel(connection),
        values,
        substitutes or {},
        namespace,
        budget,
        variable_cap,
        notes or {},
        now,
        fallbacks or {},
        why_not or {},
        place,
        ram_left,
        disk_room,
    )
    saver.ipython_names = ipython_names
    worker = threading.Thread(target=saver.run, name="nb_cudaguard-keep", daemon=True)
    worker.start()
    worker.join(timeout)
    with saver.lock:
        if not saver.finished:
            if saver.error is not None:
                _drop_aside(earlier)
                discard_keep(profile_location, connection, ram=ram)  # nothing held in RAM
                raise saver.error
            budget.cancelled.set()  # the worker writes nothing more, removes what it was writing
        manifest = saver.manifest(timed_out=not saver.finished)
        if earlier is not None:
            manifest = _carry_over(earlier, manifest, directory, {n for n, _ in values})
        if earlier is not None or not saver.finished:
            write_manifest(directory, manifest)
        return manifest


@dataclass(frozen=True)
class _Earlier:
    """An earlier keep, moved aside: its profile directory and RAM directory (if any)."""

    aside: Path
    ram_aside: Path | None
    manifest: Manifest


def _set_aside(
    profile_location: str | os.PathLike[str], connection: str, now: float
) -> _Earlier | None:
    """What an earlier restart kept and nobody restored yet (a crash again before the restore):
    moved aside, so that the names not defined now can be carried into the new keep."""
    try:
        manifest = read_manifest(profile_location, connection, now=now)
        ram = ram_of(manifest, profile_location, connection) if manifest is not None else None
    except (StoreError, OSError):
        return None
    if manifest is None or not manifest.kept:
        return None
    directory = keep_dir(profile_location, connection)
    aside = directory.with_name(f".{directory.name}-earlier-{os.getpid()}")
    discard(aside)
    try:
        directory.rename(aside)
    except OSError:
        return None
    ram_aside = None
    if ram is not None:
        ram_aside = ram.with_name(f".{ram.name}-earlier-{os.getpid()}")
        discard(ram_aside)
        try:
            ram.rename(ram_aside)
        except OSError:
            ram_aside = None
    return _Earlier(aside, ram_aside, manifest)


def _carry_over(
    earlier: _Earlier, manifest: Manifest, directory: Path, names_now: set[str]
) -> Manifest:
    """Add the earlier keep's names that are not defined now (their files moved, not copied;
    a file in RAM stays in RAM where this keep has a RAM directory on the same filesystem)."""
    ram = None if manifest.ram is None else Path(manifest.ram)
    carried: list[Kept] = []
    moved: dict[tuple[str, bool], tuple[str, bool]] = {}
    for item in earlier.manifest.kept:
        if item.name in names_now:
            continue  # the notebook has a newer value, kept (or not) just now
        file, in_ram = item.file, item.ram
        if file is not None:
            if (file, in_ram) not in moved:
                new_name = f"c{len(moved)}.bin"
                source = (earlier.ram_aside if in_ram else earlier.aside) or earlier.aside
                try:
                    _check_private(source / file, directory=False)
                    moved[(file, in_ram)] = _move(source / file, new_name, directory, ram)
                except (OSError, StoreError):
                    continue
            file, in_ram = moved[(file, in_ram)]
        note = item.note or "kept at an earlier restart"
        carried.append(
            Kept(item.name, item.type, item.size, file, item.kind, item.module, note, in_ram)
        )
    _drop_aside(earlier)
    if not carried:
        return manifest
    total = manifest.total
    for file, in_ram in moved.values():
        with contextlib.suppress(OSError):
            total += ((ram if in_ram and ram else directory) / file).stat().st_size
    return replace(manifest, kept=(*manifest.kept, *carried), total=total)


def _move(source: Path, name: str, directory: Path, ram: Path | None) -> tuple[str, bool]:
    """Move a kept file into this keep: renamed into RAM or the profile, whichever is on its
    filesystem; else copied into the profile."""
    for target, in_ram in ((ram, True), (directory, False)):
        if target is not None:
            with contextlib.suppress(OSError):
                source.rename(target / name)
                return name, in_ram
    with source.open("rb") as data, _private_file(directory / name) as out:
        shutil.copyfileobj(data, out, 16 * 1024**2)
    source.unlink()
    return name, False


def _drop_aside(earlier: _Earlier | None) -> None:
    if earlier is not None:
        discard(earlier.aside)
        if earlier.ram_aside is not None:
            discard(earlier.ram_aside)


def write_manifest(directory: Path, manifest: Manifest) -> None:
    path = directory / MANIFEST
    tmp = directory / f".{MANIFEST}.{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.unlink()
    with _private_file(tmp) as out:
        out.write(manifest.to_json().encode())
    os.replace(tmp, path)


# --- reading -------------------------------------------------------------------------------------


def _check_private(path: Path, directory: bool) -> None:
    info = path.lstat()
    if directory and not stat.S_ISDIR(info.st_mode):
        raise StoreError(f"{path} is not a directory")
    if not directory and not stat.S_ISREG(info.st_mode):
        raise StoreError(f"{path} is not a regular file")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise StoreError(f"{path} belongs to another user")
    if os.name == "posix" and info.st_mode & 0o077:
        raise StoreError(f"{path} can be read or written by other users")


def read_manifest(
    profile_location: str | os.PathLike[str], connection: str, now: float | None = None
) -> Manifest | None:
    """What the previous process of this kernel kept; None if nothing. Raises ``StoreError`` (and
    removes the store where it is ours but expired) when it cannot be used."""
    directory = keep_dir(profile_location, connection)
    if not directory.exists():
        return None
    _check_private(directory, directory=True)
    path = directory / MANIFEST
    if not path.exists():
        return None  # a save still under way, or one that never finished
    _check_private(path, directory=False)
    try:
        manifest = Manifest.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"the manifest is damaged ({error})") from None
    if manifest.kernel != _kernel(connection):
        raise StoreError("kept by another kernel")
    now = time.time() if now is None else now
    if now - manifest.created > TTL_S:
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
        _check_private(ram.parent, directory=True)
        _check_private(ram, directory=True)
    return ram


@dataclass(frozen=True)
class Restored:
    restored: tuple[Kept, ...]
    failed: tuple[tuple[str, str], ...]  # (name, why)
    remaining: tuple[Kept, ...]


def restore(
    namespace: dict[str, Any],
    profile_location: str | os.PathLike[str],
    connection: str,
    names: Iterable[str] | None = None,
) -> Restored:
    """Put the kept values (all, or ``names``) into ``namespace``; files of restored values are
    removed, and the store with the last of them. Raises ``StoreError``, or ``KeyError`` naming
    the names that were not kept."""
    import importlib

    manifest = read_manifest(profile_location, connection)
    if manifest is None:
        raise StoreError("nothing was kept")
    directory = keep_dir(profile_location, connection)
    ram = ram_of(manifest, profile_location, connection)

    def path_of(file: str, in_ram: bool) -> Path:
        return (ram if in_ram and ram is not None else directory) / file

    wanted = list(names) if names is not None else [k.name for k in manifest.kept]
    known = {k.name for k in manifest.kept}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise KeyError(unknown)
    chosen = [k for k in manifest.kept if k.name in wanted]
    restored: list[Kept] = []
    failed: list[tuple[str, str]] = []
    by_file: dict[tuple[str, bool], list[Kept]] = {}
    for item in chosen:
        if item.file is None:
            try:
                namespace[item.name] = importlib.import_module(item.module or item.name)
                restored.append(item)
            except Exception as error:
                failed.append((item.name, f"import {item.module} failed: {error}"))
        else:
            by_file.setdefault((item.file, item.ram), []).append(item)
    for (file, in_ram), items in by_file.items():
        path = path_of(file, in_ram)
        try:
            _check_private(path, directory=False)
            values = pickling.load(path, namespace)
            for item in items:
                namespace[item.name] = values[item.name]
                restored.append(item)
        except FileNotFoundError:
            where = "in RAM (the machine restarted since?)" if in_ram else "in the profile"
            failed.extend((item.name, f"its file {where} is gone") for item in items)
        except Exception as error:  # a class that no longer imports, a damaged file, ...
            text = str(error).splitlines()[0][:160] if str(error) else ""
            failed.extend((item.name, f"{type(error).__name__}: {text}") for item in items)
    done = {k.name for k in restored}
    remaining = tuple(k for k in manifest.kept if k.name not in done)
    if remaining:
        still = {(k.file, k.ram) for k in remaining}
        for gone, in_ram in {(k.file, k.ram) for k in restored} - still:
            if gone:
                with contextlib.suppress(OSError):
                    path_of(gone, in_ram).unlink()
        total = sum(k.size for k in remaining)
        write_manifest(directory, replace(manifest, kept=remaining, total=total))
    else:
        discard(directory)
        if ram is not None:
            discard(ram)
    return Restored(tuple(restored), tuple(failed), remaining)


def discard(directory: Path) -> None:
    """Remove a keep directory (ours: it is only ever called with one), or whatever is in its
    place."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory, ignore_errors=True)


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
    with contextlib.suppress(StoreError, OSError, ValueError):
        path = directory / MANIFEST
        _check_private(path, directory=False)
        named = ram_of(
            Manifest.from_json(path.read_text(encoding="utf-8")), profile_location, connection
        )
        places += [named] if named is not None else []
    for place in places:
        with contextlib.suppress(StoreError, OSError):
            _check_private(place.parent, directory=True)  # never follow a base someone else made
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
    (under each of ``ram``, default ``ram_roots()``): leftovers of kernels that never came back."""
    now = time.time() if now is None else now
    place = state_dir(profile_location)
    directories = [*place.glob("keep-*"), *place.glob(".keep-*-earlier-*")]
    for root in _roots(ram):
        base = _ram_base(root)
        with contextlib.suppress(StoreError, OSError):
            _check_private(base, directory=True)
            directories += [*base.glob("keep-*"), *base.glob(".keep-*-earlier-*")]
    for directory in directories:
        with contextlib.suppress(OSError):
            info = directory.lstat()
            mine = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
            if mine and now - info.st_mtime > TTL_S:
                discard(directory)
