"""The saver thread: each variable pickled on its own, what shares state written together,
under a deadline and the size caps."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..files.private import create
from . import pickling
from .manifest import Kept, Manifest, Skipped
from .own_modules import module_globals
from .select import describe, importable_module, reason_not_to_try

VARIABLE_CAP = 4 * 1024**3  # bytes per variable (a group of n variables: n times this)
TOTAL_CAP = 16 * 1024**3
KEEP_PICKLE = 16 * 1024**2  # a variable's pickle up to this is kept in memory until written...
HELD_PICKLES = 256 * 1024**2  # ... while all those held stay under this
_LOOKED_AT = 1000  # items of a list or dict looked at to guess its size


@dataclass
class Budget:
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


class Saver:
    def __init__(
        self,
        directory: Path,
        kernel: str,
        values: list[tuple[str, Any]],
        substitutes: dict[tuple[Any, ...], Any],
        namespace: dict[str, Any],
        budget: Budget,
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
                        e.pickled.graph,
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


def estimate(values: dict[str, Any]) -> int:
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
    if isinstance(error, pickling.HeldByItsClass):
        return (
            f"{error}: a restored copy would not be the class's; a replay builds it again from "
            "its cells"
        )
    if isinstance(error, pickling.TooLarge):
        return f"over the size cap ({error.args[0] / 1e9:.1f} GB left for it)"
    if isinstance(error, pickling.OutOfTime):
        return "not saved in time: the restart did not wait longer"
    if isinstance(error, RecursionError):
        return "cannot be saved: nested too deeply"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"cannot be saved ({type(error).__name__}: {text[:160]})"
