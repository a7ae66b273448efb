"""The keep store: a notebook's CPU state, saved before a restart and read back after it.

Where: ``<profile>/nb_cudaguard/keep-<key>/`` with ``key = injection.kernel_key(connection
file)``: the connection file survives a restart, so the new process of the same kernel finds it,
and another kernel (another connection file) looks elsewhere; the manifest names the connection
file too, and a mismatch is refused. The directory is 0700 and every file 0600; on reading, the
directory and each file must be owned by this user with no group/other bits, or nothing is read
(unpickling runs code). Leftovers expire after ``TTL_S``; a full restore removes the directory.

Each variable is written on its own, so a failure skips only that variable, with the reason.
Variables that share state (an optimizer and its model's parameters, two names for one array)
are then written together, so that they come back sharing it.

The save runs in a worker thread under a deadline: what was written by then is kept, the rest is
listed as not kept, and the caller (the restart) goes on. Nothing here blocks the cure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..restart.injection import _private_dir, kernel_key, state_dir
from . import pickling
from .select import describe, importable_module, is_ipython_name, reason_not_to_try

FORMAT = 1
TTL_S = 24 * 3600.0  # a day: a notebook left overnight still finds its state; older is a leftover
TIMEOUT_S = 30.0  # the restart waits no longer than this for the save
VARIABLE_CAP = 4 * 1024**3  # bytes per variable (or group)
TOTAL_CAP = 16 * 1024**3
FREE_SPACE_KEPT = 1024**3  # never fill the disk: this much stays free, and at most half of it used
MANIFEST = "manifest.json"
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

    @property
    def size(self) -> int:
        return self.total or sum(k.size for k in self.kept)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
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
        )


class StoreError(Exception):
    """The store cannot be read: not ours, another kernel's, expired or damaged."""


def keep_dir(profile_location: str | os.PathLike[str], connection: str) -> Path:
    return state_dir(profile_location) / f"keep-{kernel_key(connection)}"


def _kernel(connection: str) -> str:
    return os.path.realpath(os.path.abspath(connection))


# --- saving --------------------------------------------------------------------------------------


@dataclass
class _Budget:
    deadline: float
    total_left: int
    cancelled: threading.Event = field(default_factory=threading.Event)

    def checker(self, cap: int) -> Any:
        limit = min(cap, self.total_left)

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
    ) -> None:
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
        for file in {k.file for k in self.kept if k.file}:
            with contextlib.suppress(OSError):
                total += (self.directory / file).stat().st_size
        return Manifest(
            self.kernel,
            self.created,
            tuple(self.kept),
            tuple(skipped),
            self.ipython_names,
            round(time.monotonic() - self.started, 3),
            timed_out,
            total=total,
        )

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
                        self._remove(entry.file)
                    return
                self.done.add(name)
                if isinstance(entry, Kept):
                    self.kept.append(entry)
                    self.budget.total_left -= entry.size
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
                self.finished = True
                write_manifest(self.directory, self.manifest(timed_out=False))

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
        path = self.directory / file
        try:
            with _private_file(path) as out:
                size, ids, keep_alive = self.pickler.dump(
                    {name: value}, out, check=self.budget.checker(self.variable_cap)
                )
        except BaseException as error:
            self._remove(file)
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            return Skipped(name, describe(value), _reason(error)), set(), []
        kind = "snapshot" if name in self.notes else "value"
        return (
            Kept(name, describe(value), size, file, kind, note=self.notes.get(name, "")),
            ids,
            [keep_alive],
        )

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
                Kept(entry.name, entry.type, entry.size, entry.file, "snapshot", note=note)
            )
            self.budget.total_left -= entry.size
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
                with _private_file(self.directory / file) as out:
                    self.pickler.dump(
                        values, out, check=self.budget.checker(self.variable_cap * len(names))
                    )
            except Exception:
                self._remove(file)  # they stay apart: each comes back with its own copies
                continue
            with self.lock:
                if self.budget.cancelled.is_set():
                    self._remove(file)
                    return
                for name in names:
                    old = by_name[name]
                    if old.file:
                        self._remove(old.file)
                    self.kept[self.kept.index(old)] = Kept(
                        old.name, old.type, old.size, file, old.kind, old.module, old.note
                    )

    def _remove(self, file: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / file).unlink()


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
) -> Manifest:
    """Save the CPU state of ``namespace`` for the next process of this kernel; returns what was
    kept and what not. ``substitutes`` stand CPU copies in for CUDA tensors (snapshots); ``extra``
    adds (name, value) pairs (a snapshot's state dict where its object could not be written);
    ``notes`` says what a kept name is (``snapshot after cell [3]``); ``fallbacks`` give, for a
    name that cannot be written, another (name, value) to write instead (a snapshot's state
    dict); ``why_not`` replaces the reason a name was not kept."""
    now = time.time() if now is None else now
    remove_expired(profile_location, now=now)
    directory = keep_dir(profile_location, connection)
    earlier = _set_aside(profile_location, connection, now)
    discard(directory)
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
    budget = _Budget(
        deadline=time.monotonic() + timeout,
        total_left=max(0, min(total_cap, (free - FREE_SPACE_KEPT) // 2)),
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
    )
    saver.ipython_names = ipython_names
    worker = threading.Thread(target=saver.run, name="nb_cudaguard-keep", daemon=True)
    worker.start()
    worker.join(timeout)
    with saver.lock:
        if not saver.finished:
            if saver.error is not None:
                _drop_aside(earlier)
                raise saver.error
            budget.cancelled.set()  # the worker writes nothing more, removes what it was writing
        manifest = saver.manifest(timed_out=not saver.finished)
        if earlier is not None:
            manifest = _carry_over(earlier, manifest, directory, {n for n, _ in values})
        if earlier is not None or not saver.finished:
            write_manifest(directory, manifest)
        return manifest


def _set_aside(
    profile_location: str | os.PathLike[str], connection: str, now: float
) -> tuple[Path, Manifest] | None:
    """What an earlier restart kept and nobody restored yet (a crash again before the restore):
    moved aside, so that the names not defined now can be carried into the new keep."""
    try:
        manifest = read_manifest(profile_location, connection, now=now)
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
    return aside, manifest


def _carry_over(
    earlier: tuple[Path, Manifest], manifest: Manifest, directory: Path, names_now: set[str]
) -> Manifest:
    """Add the earlier keep's names that are not defined now (their files moved, not copied)."""
    aside, old = earlier
    carried: list[Kept] = []
    moved: dict[str, str] = {}
    for item in old.kept:
        if item.name in names_now:
            continue  # the notebook has a newer value, kept (or not) just now
        file = item.file
        if file is not None:
            if file not in moved:
                new_name = f"c{len(moved)}.bin"
                try:
                    _check_private(aside / file, directory=False)
                    (aside / file).rename(directory / new_name)
                except (OSError, StoreError):
                    continue
                moved[file] = new_name
            file = moved[file]
        note = item.note or "kept at an earlier restart"
        carried.append(Kept(item.name, item.type, item.size, file, item.kind, item.module, note))
    _drop_aside(earlier)
    if not carried:
        return manifest
    total = manifest.total
    for file in moved.values():
        with contextlib.suppress(OSError):
            total += (directory / file).stat().st_size
    return Manifest(
        manifest.kernel,
        manifest.created,
        (*manifest.kept, *carried),
        manifest.skipped,
        manifest.ipython_names,
        manifest.seconds,
        manifest.timed_out,
        total=total,
    )


def _drop_aside(earlier: tuple[Path, Manifest] | None) -> None:
    if earlier is not None:
        discard(earlier[0])


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
        discard(directory)
        raise StoreError(f"expired (kept more than {TTL_S / 3600:.0f} hours ago); removed")
    return manifest


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
    wanted = list(names) if names is not None else [k.name for k in manifest.kept]
    known = {k.name for k in manifest.kept}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise KeyError(unknown)
    chosen = [k for k in manifest.kept if k.name in wanted]
    restored: list[Kept] = []
    failed: list[tuple[str, str]] = []
    by_file: dict[str, list[Kept]] = {}
    for item in chosen:
        if item.file is None:
            try:
                namespace[item.name] = importlib.import_module(item.module or item.name)
                restored.append(item)
            except Exception as error:
                failed.append((item.name, f"import {item.module} failed: {error}"))
        else:
            by_file.setdefault(item.file, []).append(item)
    for file, items in by_file.items():
        path = directory / file
        try:
            _check_private(path, directory=False)
            values = pickling.load(path, namespace)
            for item in items:
                namespace[item.name] = values[item.name]
                restored.append(item)
        except Exception as error:  # a class that no longer imports, a damaged file, ...
            text = str(error).splitlines()[0][:160] if str(error) else ""
            failed.extend((item.name, f"{type(error).__name__}: {text}") for item in items)
    done = {k.name for k in restored}
    remaining = tuple(k for k in manifest.kept if k.name not in done)
    if remaining:
        still = {k.file for k in remaining}
        for gone in {k.file for k in restored} - still:
            if gone:
                with contextlib.suppress(OSError):
                    (directory / gone).unlink()
        write_manifest(
            directory,
            Manifest(
                manifest.kernel,
                manifest.created,
                remaining,
                manifest.skipped,
                manifest.ipython_names,
                manifest.seconds,
                manifest.timed_out,
                total=sum(k.size for k in remaining),
            ),
        )
    else:
        discard(directory)
    return Restored(tuple(restored), tuple(failed), remaining)


def discard(directory: Path) -> None:
    """Remove a keep directory (ours: it is only ever called with one), or whatever is in its
    place."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory, ignore_errors=True)


def remove_expired(profile_location: str | os.PathLike[str], now: float | None = None) -> None:
    """Remove every kernel's keep directories older than ``TTL_S``: leftovers of kernels that
    never came back."""
    now = time.time() if now is None else now
    place = state_dir(profile_location)
    for directory in [*place.glob("keep-*"), *place.glob(".keep-*-earlier-*")]:
        with contextlib.suppress(OSError):
            info = directory.lstat()
            mine = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
            if mine and now - info.st_mtime > TTL_S:
                discard(directory)
