"""The keep store: a notebook's CPU state, saved before a restart and read back after it.

Where: ``<profile>/nb_cudaguard/keep-<key>/`` with ``key = injection.kernel_key(connection
file)``: the connection file survives a restart, so the new process of the same kernel finds it,
and another kernel (another connection file) looks elsewhere; the manifest names the connection
file too, and a mismatch is refused. Every file and directory is made, written and read through
``files.private`` (0700 directories, 0600 files, checked on the open descriptor: unpickling runs
code). Leftovers expire after ``TTL_S``.

Where RAM allows, the values' files go to a RAM-backed filesystem instead (``$XDG_RUNTIME_DIR``,
``/dev/shm``): ``<root>/nb_cudaguard-<uid>/keep-<key>/``, with the same rules. Writing a gigabyte
there is a copy into memory, where on a disk filesystem it can be held up by the writeback of
earlier dirty pages (measured in BENCHMARKS.md). Only what fits goes there: the filesystem's free
space less ``RAM_MARGIN`` (a Docker ``/dev/shm`` has 64 MB) and at most ``RAM_SHARE`` of the
memory available, since nothing reclaims it until it is restored, discarded, expired or the
kernel is shut down (``lifetime.py``); the rest goes to the profile. The manifest always stays
in the profile, so the new process finds it there.

**Saving.** Each variable is pickled on its own first (``pickling.KeepPickler.pickle``), so a
failure costs only that variable, with the reason. What the pickles hold says which variables
share state (the same objects, or overlapping memory: an optimizer and its model's parameters,
a tensor made by ``torch.from_numpy`` and its array, a view and its base): those are written
together into one file, one pickle graph, each piece of memory once; a variable that shares
nothing is written from the pickle already made. A variable that holds nothing mutable is
written at once. So every byte is written once, and what shared state comes back sharing it.

The save runs in a worker thread under a deadline: what was written by then is kept, the rest is
listed as not kept, and the caller (the restart) goes on. Nothing here blocks the cure.

The new keep is written into a directory of its own and takes the earlier keep's place (a crash
again before the restore: the earlier names not defined now are carried into it, linked, not
copied) only once its manifest is written: a save that fails, the disk full included, leaves
the earlier keep as it was.

**Restoring** brings back whole files: a name comes with every name it shares state with (they
are one pickle graph, and restoring them apart would give each its own copy). A name the
notebook has defined again is left as it is, unless ``force``, and so are the names that share
state with it: a file comes back whole or not at all.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import shutil
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..files.private import (
    NotPrivate,
    check_dir,
    check_file,
    create,
    open_private,
    private_dir,
    read_private,
    write_atomic,
)
from ..restart.injection import kernel_key, state_dir
from . import pickling
from .own_modules import bind_back, module_globals
from .select import describe, importable_module, is_ipython_name, reason_not_to_try

FORMAT = 3  # 3: one file per group of names that share state, memory written once
READABLE = frozenset({3})
TTL_S = 24 * 3600.0  # a day: a notebook left overnight still finds its state; older is a leftover
TIMEOUT_S = 30.0  # the restart waits no longer than this for the save
VARIABLE_CAP = 4 * 1024**3  # bytes per variable (a group of n variables: n times this)
TOTAL_CAP = 16 * 1024**3
FREE_SPACE_KEPT = 1024**3  # never fill the disk: this much stays free, and at most half of it used
RAM_MARGIN = 64 * 1024**2  # left free on a RAM filesystem
RAM_SHARE = 0.5  # of the memory available: the most a keep may hold in RAM
KEEP_PICKLE = 16 * 1024**2  # a variable's pickle up to this is kept in memory until written...
HELD_PICKLES = 256 * 1024**2  # ... while all those held stay under this
MANIFEST = "manifest.json"
_LOOKED_AT = 1000  # items of a list or dict looked at to guess its size
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


class StoreError(Exception):
    """The store cannot be read: not ours, another kernel's, expired or damaged."""


class NotKept(KeyError):
    """Names asked for that were not kept; says what was (``kept``) and what was restored
    already (``restored``)."""

    def __init__(self, unknown: list[str], kept: list[str], restored: list[str]) -> None:
        super().__init__(unknown)
        self.unknown, self.kept, self.restored = unknown, kept, restored


def keep_dir(profile_location: str | os.PathLike[str], connection: str) -> Path:
    return state_dir(profile_location) / f"keep-{kernel_key(connection)}"


def _kernel(connection: str) -> str:
    return os.path.realpath(os.path.abspath(connection))


def _staging(directory: Path) -> Path:
    """Where a save writes before its keep takes ``directory``'s place."""
    return directory.with_name(f".{directory.name}-new-{os.getpid()}")


def _private(path: Path, directory: bool) -> None:
    """``files.private``'s check, as the store's error."""
    try:
        (check_dir if directory else check_file)(path)
    except NotPrivate as error:
        raise StoreError(str(error)) from None


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
    try:
        private_dir(directory.parent, tighten=False)
        private_dir(directory, tighten=False)
    except (OSError, NotPrivate):
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


@dataclass
class _Entry:
    """A variable pickled on its own, waiting to be written (alone or with those it shares
    state with)."""

    index: int
    name: str
    value: Any
    pickled: pickling.Pickled
    kind: str = "value"
    note: str = ""


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
        ram: tuple[Path, Path] | None = None,
        ram_left: int = 0,
        disk_left: int | None = None,
    ) -> None:
        # ``ram``: (where values go while they fit in ``ram_left`` bytes, what it is called once
        # the keep is in place)
        self.ram = None if ram is None else ram[0]
        self.ram_final = None if ram is None else ram[1]
        self.ram_left = ram_left if ram is not None else 0
        self.disk_left = budget.total_left if disk_left is None else disk_left
        self.fallbacks = fallbacks
        self.why_not = why_not
        self.created = created
        self.directory = directory
        self.kernel = kernel
        self.values = values
        self.order = {name: index for index, (name, _) in enumerate(values)}
        self.pickler = pickling.KeepPickler(namespace, substitutes)
        self.module_globals = module_globals(dict(values))
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
        self.written = 0
        self.held = 0  # bytes of pickles kept in memory until their variable is written

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
        order = self.order
        return Manifest(
            self.kernel,
            self.created,
            tuple(sorted(self.kept, key=lambda k: order.get(k.name, len(order)))),
            tuple(skipped),
            self.ipython_names,
            round(time.monotonic() - self.started, 3),
            timed_out,
            total=total,
            ram=None if self.ram_final is None else str(self.ram_final),
            written=self.written,
        )

    def _path(self, file: str, ram: bool) -> Path:
        return (self.ram if ram and self.ram is not None else self.directory) / file

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # handed to the caller, not printed by the thread
            self.error = error

    def _run(self) -> None:
        waiting: list[_Entry] = []
        for index, (name, value) in enumerate(self.values):
            if self.budget.cancelled.is_set():
                return
            entry = self._survey(index, name, value)
            if entry is None:
                continue
            if entry.pickled.identities or entry.pickled.regions:
                waiting.append(entry)
            else:  # holds nothing another variable could share: written at once
                self._write([entry])
        for group in _groups(waiting):
            if self.budget.cancelled.is_set():
                return
            self._write(group)
        with self.lock:
            self.finished = not self.budget.cancelled.is_set()

    def _survey(self, index: int, name: str, value: Any) -> _Entry | None:
        """Pickle one variable; a module, or one that cannot be kept, is settled here."""
        outcome = self._pickle_one(index, name, value)
        fallback = None
        with self.lock:
            if self.budget.cancelled.is_set():
                return None
            if isinstance(outcome, _Entry):
                self.held += len(outcome.pickled.stream or b"")
                return outcome
            self.done.add(name)
            if isinstance(outcome, Kept):
                self.kept.append(outcome)
                return None
            if name in self.why_not:
                outcome = Skipped(outcome.name, outcome.type, self.why_not[name])
            self.skipped.append(outcome)
            fallback = self.fallbacks.get(name)
        return None if fallback is None else self._fall_back(index, name, fallback)

    def _pickle_one(self, index: int, name: str, value: Any) -> Kept | Skipped | _Entry:
        if isinstance(value, types.ModuleType):
            module = importable_module(value)
            if module is not None:
                return Kept(name, "module", 0, None, "module", module)
        why = reason_not_to_try(value)
        if why is not None:
            return Skipped(name, describe(value), why)
        wrapper = {name: value}
        keep = max(0, min(KEEP_PICKLE, HELD_PICKLES - self.held))
        try:
            pickled = self.pickler.pickle(
                wrapper, keep=keep, check=self.budget.checker(self.variable_cap)
            )
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            return Skipped(name, describe(value), _reason(error))
        pickled.identities.discard(("obj", id(wrapper)))  # the file's own dict: shared by none
        kind = "snapshot" if name in self.notes else "value"
        return _Entry(index, name, value, pickled, kind, self.notes.get(name, ""))

    def _fall_back(
        self, index: int, name: str, fallback: Callable[[], tuple[str, Any]]
    ) -> _Entry | None:
        """A snapshotted object that cannot be written whole: its state dict, under its own
        name."""
        try:
            other, value = fallback()
        except Exception:
            return None
        self.order.setdefault(other, index + 100000)
        outcome = self._pickle_one(index + 100000, other, value)
        if not isinstance(outcome, _Entry):
            return None
        note = f"the state dict of `{name}`, from its {self.notes.get(name, 'snapshot')}"
        with self.lock:
            self.held += len(outcome.pickled.stream or b"")
        return replace(outcome, kind="snapshot", note=note)

    def _write(self, group: list[_Entry]) -> None:
        """Write ``group`` into one file: the pickle already made for a variable alone, else
        one pickle of them all (what they share, once)."""
        file = f"v{group[0].index}.bin"
        alone = group[0].pickled if len(group) == 1 else None
        source: pickling.Pickled | dict[str, Any]
        if alone is not None and alone.stream is not None:
            source, size = alone, alone.size
        else:
            source = {e.name: e.value for e in group}
            size = sum(e.pickled.size for e in group)  # at most: what they share counts once
        try:
            written, ram = self._dump(file, source, size, self.variable_cap * len(group))
        except BaseException as error:
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            reason = _reason(error)
            if len(group) > 1:
                names = ", ".join(f"`{e.name}`" for e in group)
                reason += f" (with {names}: they share state, so they are kept together or not)"
            with self.lock:
                if not self.budget.cancelled.is_set():
                    self.skipped.extend(Skipped(e.name, describe(e.value), reason) for e in group)
                    self.done.update(e.name for e in group)
            return
        finally:
            with self.lock:
                self.held -= sum(len(e.pickled.stream or b"") for e in group)
        with self.lock:
            if self.budget.cancelled.is_set():
                self._remove(file, ram)
                return
            self._spend(written, ram)
            for e in group:
                self.kept.append(
                    Kept(
                        e.name,
                        describe(e.value),
                        e.pickled.size,
                        file,
                        e.kind,
                        None,
                        e.note,
                        ram,
                        self.module_globals.get(e.name),
                    )
                )
                self.done.add(e.name)

    def _dump(
        self, file: str, source: pickling.Pickled | dict[str, Any], size: int, cap: int
    ) -> tuple[int, bool]:
        """Write ``source`` to ``file``: in RAM if it fits there (``size`` bytes), else, or if
        RAM runs out while writing, in the profile. Returns the bytes written and whether the
        file is in RAM; raises what writing raised."""
        if self.ram is not None and size <= self.ram_left:
            limit = min(cap, self.budget.total_left)
            try:
                return self._dump_to(self.ram / file, source, cap, self.ram_left), True
            except pickling.TooLarge:
                self._remove(file, True)
                if self.ram_left >= min(limit, self.disk_left):
                    raise  # over its cap, or over what the profile has room for as well
            except OSError:  # the RAM filesystem filled up after all (ENOSPC)
                self._remove(file, True)
        return self._dump_to(self.directory / file, source, cap, self.disk_left), False

    def _spend(self, size: int, ram: bool) -> None:
        self.budget.total_left -= size
        if ram:
            self.ram_left -= size
        else:
            self.disk_left -= size

    def _dump_to(
        self, path: Path, source: pickling.Pickled | dict[str, Any], cap: int, room: int | None
    ) -> int:
        check = self.budget.checker(cap, room)
        reached = [0]

        def counted(written: int) -> None:
            reached[0] = written
            check(written)

        try:
            with create(path) as out:
                if not isinstance(source, pickling.Pickled):
                    source = self.pickler.pickle(source, check=check)
                return self.pickler.write(source, out, check=counted)
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        finally:
            self.written += reached[0]

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


def _groups(entries: list[_Entry]) -> list[list[_Entry]]:
    """The entries that share state, joined (union-find): the same object in two pickles, or
    memory ranges that overlap. In the order of their first variable."""
    parent = list(range(len(entries)))

    def root(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def join(a: int, b: int) -> None:
        parent[root(a)] = root(b)

    owner: dict[tuple[str, int], int] = {}
    for index, entry in enumerate(entries):
        for key in entry.pickled.identities:
            join(index, owner.setdefault(key, index))
    spans = sorted(
        (start, end, index)
        for index, entry in enumerate(entries)
        for start, end in entry.pickled.regions.items()
    )
    reach, reacher = -1, -1
    for start, end, index in spans:
        if start < reach:
            join(index, reacher)
        if end > reach:
            reach, reacher = end, index
    groups: dict[int, list[_Entry]] = {}
    for index, entry in enumerate(entries):
        groups.setdefault(root(index), []).append(entry)
    return sorted(groups.values(), key=lambda g: g[0].index)


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
    return ram_dir(root, profile_location, connection), room


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
    adds (name, value) pairs; ``notes`` says what a kept name is (``snapshot after cell [3]``);
    ``fallbacks`` give, for a name that cannot be written, another (name, value) to write
    instead (a snapshot's state dict); ``why_not`` replaces the reason a name was not kept.
    ``ram``: the RAM filesystems to try (default ``ram_roots()``; empty: the profile only).
    Raises where nothing could be kept; an earlier keep is then left as it was."""
    now = time.time() if now is None else now
    ram = ram_roots() if ram is None else list(ram)
    remove_expired(profile_location, now=now, ram=ram)
    _remove_unfinished(profile_location, connection, ram)
    staging = _staging(keep_dir(profile_location, connection))
    private_dir(staging)
    hidden_names = frozenset(hidden)
    values: list[tuple[str, Any]] = []
    ipython_names = 0
    for name, value in list(namespace.items()):
        if is_ipython_name(name, hidden_names):
            ipython_names += 1
        else:
            values.append((name, value))
    values.extend(extra)
    free = shutil.disk_usage(staging).free
    disk_room = max(0, (free - FREE_SPACE_KEPT) // 2)
    final_ram, ram_left = _ram_place(profile_location, connection, ram, _estimate(dict(values)))
    places = None
    if final_ram is not None:
        staging_ram = _staging(final_ram)
        places = (staging_ram, final_ram) if _make_ram_dir(staging_ram) else None
    budget = _Budget(
        deadline=time.monotonic() + timeout,
        total_left=min(total_cap, disk_room + (ram_left if places else 0)),
    )
    saver = _Saver(
        staging,
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
        places,
        ram_left,
        disk_room,
    )
    saver.ipython_names = ipython_names
    worker = threading.Thread(target=saver.run, name="nb_cudaguard-keep", daemon=True)
    worker.start()
    worker.join(timeout)
    try:
        with saver.lock:
            if not saver.finished:
                if saver.error is not None:
                    raise saver.error
                budget.cancelled.set()  # the worker writes no more, removes what it was writing
            manifest = saver.manifest(timed_out=not saver.finished)
        return _put_in_place(
            profile_location, connection, manifest, staging, places, {n for n, _ in values}, ram
        )
    except BaseException:
        discard(staging)
        if places is not None:
            discard(places[0])
        raise


def _remove_unfinished(
    profile_location: str | os.PathLike[str], connection: str, roots: list[Path]
) -> None:
    """What an earlier save of this kernel left half done (its process ended while it wrote,
    or while it swapped): one kernel saves one at a time, so nothing of it is in use."""
    directory = keep_dir(profile_location, connection)
    places = [directory.parent]
    for root in roots:
        base = _ram_base(root)
        with contextlib.suppress(StoreError, OSError):
            _private(base, directory=True)
            places.append(base)
    names = (directory.name, ram_dir(Path("/"), profile_location, connection).name)
    for place in places:
        for name in names:
            for pattern in (f".{name}-new-*", f".{name}-earlier-*"):
                for leftover in place.glob(pattern):
                    discard(leftover)


def _put_in_place(
    profile_location: str | os.PathLike[str],
    connection: str,
    manifest: Manifest,
    staging: Path,
    places: tuple[Path, Path] | None,
    names_now: set[str],
    roots: list[Path],
) -> Manifest:
    """Carry the earlier keep's names not defined now into the new one, write its manifest, and
    only then put it in the earlier one's place. Raises, leaving the earlier keep as it was,
    where any of that fails."""
    directory = keep_dir(profile_location, connection)
    earlier, earlier_ram = None, None
    with contextlib.suppress(StoreError, OSError):
        earlier = read_manifest(profile_location, connection, now=manifest.created)
        earlier_ram = None if earlier is None else ram_of(earlier, profile_location, connection)
    if earlier is not None and earlier.kept:
        manifest = _carry_over(
            earlier, directory, earlier_ram, manifest, staging, places, names_now
        )
    write_manifest(staging, manifest)
    undo_ram = None
    if places is not None:
        undo_ram = _swap(places[1], places[0])
    try:
        done = _swap(directory, staging)
    except BaseException:
        if undo_ram is not None:
            undo_ram()
        raise
    done.commit()
    if undo_ram is not None:
        undo_ram.commit()
    # This kernel's RAM directories elsewhere (the earlier keep's, under another root, or a
    # save that never finished): nothing names them now.
    others = {ram_dir(root, profile_location, connection) for root in roots}
    others |= {earlier_ram} if earlier_ram is not None else set()
    for other in others - {None if places is None else places[1]}:
        if other is not None:
            with contextlib.suppress(StoreError, OSError):
                _private(other.parent, directory=True)
                discard(other)
    return manifest


@dataclass
class _Swap:
    """``staging`` renamed into ``final``'s place, the earlier ``final`` set aside: undone by a
    call, made final by ``commit`` (the earlier one removed)."""

    final: Path
    staging: Path
    aside: Path | None

    def __call__(self) -> None:
        with contextlib.suppress(OSError):
            self.final.rename(self.staging)
            if self.aside is not None:
                self.aside.rename(self.final)

    def commit(self) -> None:
        if self.aside is not None:
            discard(self.aside)


def _swap(final: Path, staging: Path) -> _Swap:
    aside = None
    if final.exists() or final.is_symlink():
        aside = final.with_name(f".{final.name}-earlier-{os.getpid()}")
        discard(aside)
        final.rename(aside)
    try:
        staging.rename(final)
    except BaseException:
        if aside is not None:
            aside.rename(final)
        raise
    return _Swap(final, staging, aside)


def _carry_over(
    earlier: Manifest,
    directory: Path,
    earlier_ram: Path | None,
    manifest: Manifest,
    staging: Path,
    places: tuple[Path, Path] | None,
    names_now: set[str],
) -> Manifest:
    """Add the earlier keep's names that are not defined now: their files linked into the new
    keep (in RAM where they were in RAM and this keep's RAM directory is on the same
    filesystem), else copied into the profile. Raises where a file cannot be carried."""
    carried: list[Kept] = []
    linked: dict[tuple[str, bool], tuple[str, bool]] = {}
    written = 0
    for item in earlier.kept:
        if item.name in names_now:
            continue  # the notebook has a newer value, kept (or not) just now
        file, in_ram = item.file, item.ram
        if file is not None:
            if (file, in_ram) not in linked:
                source = ((earlier_ram if in_ram else None) or directory) / file
                try:
                    _private(source, directory=False)
                except (StoreError, FileNotFoundError):
                    continue  # lost (a reboot emptied RAM) or not ours: nothing to carry
                new_name = f"c{len(linked)}.bin"
                linked[(file, in_ram)], copied = _link(source, new_name, staging, places)
                written += copied
            file, in_ram = linked[(file, in_ram)]
        note = item.note or "kept at an earlier restart"
        mates = [
            k.name for k in earlier.kept if k.file == item.file and k.file and k.name in names_now
        ]
        if mates:
            names = ", ".join(f"`{m}`" for m in mates)
            note += f"; it shares state with the {names} of then, not with the one kept now"
        carried.append(replace(item, file=file, note=note, ram=in_ram))
    if not carried:
        return manifest
    total = manifest.total
    for file, in_ram in linked.values():
        place = places[0] if in_ram and places is not None else staging
        with contextlib.suppress(OSError):
            total += (place / file).stat().st_size
    return replace(
        manifest, kept=(*manifest.kept, *carried), total=total, written=manifest.written + written
    )


def _link(
    source: Path, name: str, staging: Path, places: tuple[Path, Path] | None
) -> tuple[tuple[str, bool], int]:
    """Link ``source`` into the new keep under ``name``: into RAM or the profile, whichever is
    on its filesystem; else copied into the profile. Returns (name, in RAM) and the bytes
    copied."""
    for target, in_ram in ((None if places is None else places[0], True), (staging, False)):
        if target is not None:
            try:
                os.link(source, target / name)
                return (name, in_ram), 0
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
    with open_private(source) as data, create(staging / name) as out:
        shutil.copyfileobj(data, out, 16 * 1024**2)
        return (name, False), out.tell()


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
    _private(directory, directory=True)
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
    if manifest.kernel != _kernel(connection):
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
        _private(ram.parent, directory=True)
        _private(ram, directory=True)
    return ram


@dataclass(frozen=True)
class Restored:
    """What a restore did. ``restored``: put into the namespace (the names asked for and those
    that came along); ``along``: restored without being asked for, because they share state
    with a name that was; ``skipped``: defined in the namespace already, left as they are (still
    kept); ``held``: (a name not restored, the names in ``skipped`` it shares state with: names
    that share state come back all together or not at all); ``already``: asked for, restored
    before."""

    restored: tuple[Kept, ...]
    failed: tuple[tuple[str, str], ...]  # (name, why)
    remaining: tuple[Kept, ...]
    along: tuple[Kept, ...] = ()
    skipped: tuple[Kept, ...] = ()
    held: tuple[tuple[str, tuple[str, ...]], ...] = ()
    already: tuple[Kept, ...] = ()
    restored_at: float = 0.0  # when ``already`` were last restored
    read: int = 0  # bytes of the files read (what names share counted once)
    unbound: tuple[tuple[str, str], ...] = ()  # (name, why): restored, not its module's again


def _defined(namespace: dict[str, Any], item: Kept) -> bool:
    """The notebook has ``item.name`` already (the same module, imported again, does not
    count: putting it back changes nothing)."""
    if item.name not in namespace:
        return False
    if item.kind == "module":
        value = namespace[item.name]
        return getattr(value, "__name__", None) != (item.module or item.name)
    return True


def restore(
    namespace: dict[str, Any],
    profile_location: str | os.PathLike[str],
    connection: str,
    names: Iterable[str] | None = None,
    *,
    force: bool = False,
) -> Restored:
    """Put the kept values (all, or ``names`` and the names they share state with) into
    ``namespace``; a name ``namespace`` has already is left as it is unless ``force``. Files of
    restored values are removed; the manifest stays, saying what was restored. Raises
    ``StoreError``, or ``NotKept`` naming the names that were not kept."""
    import importlib

    manifest = read_manifest(profile_location, connection)
    if manifest is None:
        raise StoreError("nothing was kept")
    directory = keep_dir(profile_location, connection)
    ram = ram_of(manifest, profile_location, connection)

    def path_of(file: str, in_ram: bool) -> Path:
        return (ram if in_ram and ram is not None else directory) / file

    known = {k.name: k for k in manifest.kept}
    before = {k.name: k for k in manifest.restored}
    wanted = list(dict.fromkeys(names)) if names is not None else list(known)
    unknown = [n for n in wanted if n not in known and n not in before]
    if unknown:
        raise NotKept(unknown, list(known), list(before))
    already = tuple(before[n] for n in wanted if n not in known)
    if names is None and not known:
        already = manifest.restored  # everything was
    files = {(known[n].file, known[n].ram) for n in wanted if n in known and known[n].file}
    chosen = [k for k in manifest.kept if k.name in wanted or (k.file and (k.file, k.ram) in files)]
    restored: list[Kept] = []
    skipped: list[Kept] = []
    held: list[tuple[str, tuple[str, ...]]] = []
    failed: list[tuple[str, str]] = []
    unbound: list[tuple[str, str]] = []  # restored, but not bound back to their module
    groups: dict[tuple[str, bool], list[Kept]] = {}  # one file: one pickle graph
    for item in chosen:
        groups.setdefault((item.file or f"module {item.name}", item.ram), []).append(item)
    read = 0
    for (file, in_ram), items in groups.items():
        remade = [k for k in items if not force and _defined(namespace, k)]
        if remade:  # the others would share state with what the notebook no longer has
            skipped.extend(remade)
            mates = tuple(k.name for k in remade)
            held.extend((k.name, mates) for k in items if k not in remade)
            continue
        if items[0].file is None:
            item = items[0]
            try:
                namespace[item.name] = importlib.import_module(item.module or item.name)
                restored.append(item)
            except Exception as error:
                failed.append((item.name, f"import {item.module} failed: {error}"))
            continue
        path = path_of(file, in_ram)
        try:
            with open_private(path) as handle:
                read += os.fstat(handle.fileno()).st_size
                values = pickling.load(handle, namespace)
            for item in items:
                namespace[item.name] = values[item.name]
                restored.append(item)
                if item.global_of is not None:
                    why = bind_back(item.global_of, values[item.name])
                    if why is not None:
                        unbound.append((item.name, why))
        except FileNotFoundError:
            where = "in RAM (the machine restarted since?)" if in_ram else "in the profile"
            failed.extend((item.name, f"its file {where} is gone") for item in items)
        except Exception as error:  # a class that no longer imports, a damaged file, ...
            text = str(error).splitlines()[0][:160] if str(error) else ""
            failed.extend((item.name, f"{type(error).__name__}: {text}") for item in items)
    done = {k.name for k in restored}
    remaining = tuple(k for k in manifest.kept if k.name not in done)
    along = tuple(k for k in restored if k.name not in wanted)
    now = time.time()
    if restored:
        still = {(k.file, k.ram) for k in remaining}
        for gone, in_ram in {(k.file, k.ram) for k in restored} - still:
            if gone:
                with contextlib.suppress(OSError):
                    path_of(gone, in_ram).unlink()
        total = 0
        for left, in_ram in still:
            if left:
                with contextlib.suppress(OSError):
                    total += path_of(left, in_ram).stat().st_size
        record = replace(
            manifest,
            kept=remaining,
            total=total,
            restored=(*manifest.restored, *restored),
            restored_at=now,
            ram=manifest.ram if any(k.ram for k in remaining) else None,
        )
        write_manifest(directory, record)  # what was restored, for a second restore to say so
        if ram is not None and record.ram is None:
            discard(ram)
    return Restored(
        tuple(restored),
        tuple(failed),
        remaining,
        along,
        tuple(skipped),
        tuple(held),
        already,
        manifest.restored_at,
        read,
        tuple(unbound),
    )


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
    with contextlib.suppress(StoreError, OSError, ValueError, NotPrivate):
        named = ram_of(
            Manifest.from_json(read_private(directory / MANIFEST).decode("utf-8")),
            profile_location,
            connection,
        )
        places += [named] if named is not None else []
    for place in places:
        with contextlib.suppress(StoreError, OSError):
            _private(place.parent, directory=True)  # never follow a base someone else made
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
        base = _ram_base(root)
        with contextlib.suppress(StoreError, OSError):
            _private(base, directory=True)
            directories += [d for p in patterns for d in base.glob(p)]
    for directory in directories:
        with contextlib.suppress(OSError):
            info = directory.lstat()
            mine = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
            if mine and now - info.st_mtime > TTL_S:
                discard(directory)
