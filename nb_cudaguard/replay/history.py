"""The previous kernel's cells, handed across our restart to the next process of the same kernel.

Written by the old process just before it asks for the restart, to
``<profile>/nb_cudaguard/cells-<key>.json`` (0600 in a 0700 directory, atomically; ``key`` is
``files.keys.kernel_key`` of the connection file, which survives the restart). Read once by
the new process (then removed), and only if all of these hold:

- the file is a regular file owned by this user with no group/other bits, in a directory likewise;
- it names this kernel's connection file (another kernel's key never matches, and the path must);
- it was written before this Python process (image) began, and this process began right after it
  (within ``WINDOW_S``), or in place (``execve`` keeps the pid): a later restart from the Kernel
  menu, which we did not prepare, finds nothing; and it is younger than ``TTL_S``.

Cell sources are data: nothing here runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..files.keys import kernel_key, state_dir
from ..files.private import NotPrivate, check_dir, private_dir, read_private, write_atomic
from .record import CellRecord

FORMAT = 1
TTL_S = 24 * 3600.0  # a record nobody read within a day is a leftover
WINDOW_S = 120.0  # our restart's new process starts seconds after the save
MAX_CELLS = 2000
MAX_CHARS = 8_000_000  # the oldest cells go first beyond this

_IMAGE_STARTED = time.time()  # this module is imported anew in every process image


@dataclass(frozen=True)
class Cell:
    """One executed cell, as typed."""

    source: str
    count: int | None  # its execution count in the kernel that ran it; None: run by a replay
    failed: bool | None  # None: unknown (run before nb_cudaguard was loaded)
    seconds: float | None = None  # how long it ran, where nb_cudaguard timed it
    record: CellRecord | None = None  # what it did when it ran, where nb_cudaguard saw it
    # N: the lines before line N of a cell that raised there, run again on their own by a
    # replay (replay/prefix.py); 0: the cell as typed
    ran_before: int = 0


@dataclass(frozen=True)
class SavedCells:
    cells: tuple[Cell, ...]
    failing: int | None  # index into cells of the cell whose error was explained
    created: float
    pid: int

    @property
    def failing_cell(self) -> Cell | None:
        return None if self.failing is None else self.cells[self.failing]


def cells_path(profile_location: str | os.PathLike[str], key: str) -> Path:
    return state_dir(profile_location) / f"cells-{key}.json"


def save_cells(
    profile_location: str | os.PathLike[str],
    connection_path: str,
    cells: Sequence[Cell],
    failing: int | None,
    *,
    now: float | None = None,
) -> Path:
    """Write this kernel's cells for its next process. ``failing`` indexes ``cells``."""
    cells = list(cells)
    drop = max(0, len(cells) - MAX_CELLS)
    total = sum(len(c.source) for c in cells[drop:])
    while drop < len(cells) and total > MAX_CHARS:
        total -= len(cells[drop].source)
        drop += 1
    if failing is not None:
        failing = failing - drop if failing >= drop else None
    cells = cells[drop:]
    data = {
        "format": FORMAT,
        "kernel": os.path.realpath(os.path.abspath(connection_path)),
        "created": time.time() if now is None else now,
        "pid": os.getpid(),
        "failing": failing,
        "cells": [
            [c.source, c.count, c.failed, c.seconds, c.record and c.record.to_json()]
            + ([c.ran_before] if c.ran_before else [])
            for c in cells
        ],
    }
    path = cells_path(profile_location, kernel_key(connection_path))
    private_dir(path.parent)
    write_atomic(path, json.dumps(data))
    return path


def discard(profile_location: str | os.PathLike[str], connection_path: str) -> None:
    with contextlib.suppress(OSError):
        cells_path(profile_location, kernel_key(connection_path)).unlink()


def process_started() -> float | None:
    """When this process began (wall clock), from /proc; None where there is no /proc."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22, starttime, counted after "pid (comm)"
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def load_cells(
    profile_location: str | os.PathLike[str],
    connection_path: str,
    *,
    now: float | None = None,
    started: float | None = None,
    image_started: float | None = None,
    consume: bool = True,
) -> tuple[SavedCells | None, str]:
    """This kernel's previous cells, or (None, why not). ``started``: when this process began
    (default: from /proc); ``image_started``: when this Python image began (an ``execve``
    restart keeps the process). A record that is ours is removed once read (``consume``) or
    once found out of date."""
    path = cells_path(profile_location, kernel_key(connection_path))
    now = time.time() if now is None else now
    started = process_started() if started is None else started
    image_started = _IMAGE_STARTED if image_started is None else image_started
    try:
        check_dir(path.parent)
        raw = read_private(path).decode("utf-8")
    except FileNotFoundError:
        return None, "no cells were saved for this kernel"
    except NotPrivate as error:
        return None, f"{path} is not private to this user ({error}): not read"
    except (OSError, UnicodeDecodeError) as error:
        return None, f"cannot read the saved cells ({getattr(error, 'strerror', None) or error})"
    try:
        saved = _parse(json.loads(raw), connection_path)
    except (ValueError, TypeError, KeyError, IndexError) as error:
        _remove(path)
        return None, f"the saved cells were unreadable ({error})"
    why_not = _out_of_date(saved, now, started, image_started)
    if why_not:
        _remove(path)
        return None, why_not
    if consume:
        _remove(path)
    return saved, ""


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _parse(data: dict[str, object], connection_path: str) -> SavedCells:
    if data["format"] != FORMAT:
        raise ValueError(f"format {data['format']!r}")
    if data["kernel"] != os.path.realpath(os.path.abspath(connection_path)):
        raise ValueError("they belong to another kernel")
    raw_cells = data["cells"]
    if not isinstance(raw_cells, list):
        raise TypeError("cells is not a list")
    cells = []
    # an older record has no time, no record; only part of a cell says which part
    for source, count, failed, *more in raw_cells:
        seconds = more[0] if more else None
        seen = more[1] if len(more) > 1 else None
        part = more[2] if len(more) > 2 else 0
        if type(part) is not int or part < 0:
            raise TypeError("a cell's part is not a line number")
        if not isinstance(seen, (dict, type(None))):
            raise TypeError("a cell's record is not an object")
        if not isinstance(source, str) or not isinstance(count, (int, type(None))):
            raise TypeError("a cell is not (source, count, failed, seconds)")
        if not isinstance(seconds, (int, float, type(None))):
            raise TypeError("a cell's seconds is not a number")
        failed = None if failed is None else bool(failed)
        record = None if seen is None else CellRecord.from_json(seen)
        seconds = None if seconds is None else float(seconds)
        cells.append(Cell(source, count, failed, seconds, record, part))
    failing = data["failing"]
    if failing is not None and not (isinstance(failing, int) and 0 <= failing < len(cells)):
        raise ValueError(f"failing cell {failing!r}")
    created, pid = data["created"], data["pid"]
    if not isinstance(created, (int, float)) or not isinstance(pid, int):
        raise TypeError("created/pid")
    return SavedCells(tuple(cells), failing, float(created), pid)


def _out_of_date(saved: SavedCells, now: float, started: float | None, image: float) -> str:
    if now - saved.created > TTL_S:
        return "the saved cells expired"
    if saved.created >= image:
        return "the saved cells were written by this very process"
    if saved.pid == os.getpid() or started is None:
        return ""  # restarted in place (execve), or no /proc to ask
    if not saved.created - 2.0 <= started <= saved.created + WINDOW_S:
        return (
            "this kernel process was not started by nb_cudaguard's restart (the Kernel menu's "
            "restart, or a later one)"
        )
    return ""
