"""The keep store: a notebook's CPU state, saved before a restart and read back after it.

Where: ``<profile>/nb_cudaguard/keep-<key>/`` with ``key = files.keys.kernel_key(connection
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

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files.keys import state_dir
from ..files.private import private_dir
from .expiry import discard_keep, remove_expired, remove_unlisted
from .manifest import (
    MANIFEST,
    TTL_S,
    Kept,
    Manifest,
    NotKept,
    Skipped,
    ram_of,
    read_manifest,
    write_manifest,
)
from .places import (
    RAM_ENV,
    RAM_MARGIN,
    StoreError,
    discard,
    keep_dir,
    kernel_path,
    make_ram_dir,
    memory_available,
    ram_dir,
    ram_place,
    ram_room,
    ram_roots,
    staging_of,
)
from .restoring import Restored, restore
from .saver import TOTAL_CAP, VARIABLE_CAP, Budget, Saver, estimate
from .select import is_ipython_name
from .swap import put_in_place, remove_unfinished

__all__ = [
    "FREE_SPACE_KEPT",
    "MANIFEST",
    "RAM_ENV",
    "RAM_MARGIN",
    "TIMEOUT_S",
    "TTL_S",
    "Kept",
    "Manifest",
    "NotKept",
    "Restored",
    "SaveOptions",
    "Skipped",
    "StoreError",
    "discard",
    "discard_keep",
    "keep_dir",
    "memory_available",
    "ram_dir",
    "ram_of",
    "ram_room",
    "ram_roots",
    "read_manifest",
    "remove_expired",
    "remove_unlisted",
    "restore",
    "save",
    "state_dir",
    "write_manifest",
]

TIMEOUT_S = 30.0  # the restart waits no longer than this for the save
FREE_SPACE_KEPT = 1024**3  # never fill the disk: this much stays free, and at most half of it used


@dataclass(frozen=True)
class SaveOptions:
    """How ``save`` saves. ``hidden``: IPython's hidden names, not kept; ``substitutes`` stand
    CPU copies in for CUDA tensors (snapshots); ``extra`` adds (name, value) pairs; ``notes``
    says what a kept name is (``snapshot after cell [3]``); ``fallbacks`` give, for a name that
    cannot be written, another (name, value) to write instead (a snapshot's state dict);
    ``why_not`` replaces the reason a name was not kept; ``timeout``, ``variable_cap`` and
    ``total_cap`` bound the save; ``now`` is its time; ``ram``: the RAM filesystems to try
    (default ``ram_roots()``; empty: the profile only)."""

    hidden: Iterable[str] = ()
    substitutes: Mapping[tuple[Any, ...], Any] = field(default_factory=dict)
    extra: Iterable[tuple[str, Any]] = ()
    notes: Mapping[str, str] = field(default_factory=dict)
    fallbacks: Mapping[str, Callable[[], tuple[str, Any]]] = field(default_factory=dict)
    why_not: Mapping[str, str] = field(default_factory=dict)
    timeout: float = TIMEOUT_S
    variable_cap: int = VARIABLE_CAP
    total_cap: int = TOTAL_CAP
    now: float | None = None
    ram: Iterable[Path] | None = None


def save(
    namespace: dict[str, Any],
    profile_location: str | os.PathLike[str],
    connection: str,
    options: SaveOptions | None = None,
) -> Manifest:
    """Save the CPU state of ``namespace`` for the next process of this kernel, as ``options``
    say; returns what was kept and what not. Raises where nothing could be kept; an earlier
    keep is then left as it was."""
    options = SaveOptions() if options is None else options
    now = time.time() if options.now is None else options.now
    ram = ram_roots() if options.ram is None else list(options.ram)
    remove_expired(profile_location, now=now, ram=ram)
    remove_unfinished(profile_location, connection, ram)
    staging = staging_of(keep_dir(profile_location, connection))
    private_dir(staging)
    hidden_names = frozenset(options.hidden)
    values: list[tuple[str, Any]] = []
    ipython_names = 0
    for name, value in list(namespace.items()):
        if is_ipython_name(name, hidden_names):
            ipython_names += 1
        else:
            values.append((name, value))
    values.extend(options.extra)
    free = shutil.disk_usage(staging).free
    disk_room = max(0, (free - FREE_SPACE_KEPT) // 2)
    final_ram, ram_left = ram_place(profile_location, connection, ram, estimate(dict(values)))
    places = None
    if final_ram is not None:
        staging_ram = staging_of(final_ram)
        places = (staging_ram, final_ram) if make_ram_dir(staging_ram) else None
    budget = Budget(
        deadline=time.monotonic() + options.timeout,
        total_left=min(options.total_cap, disk_room + (ram_left if places else 0)),
    )
    saver = Saver(
        staging,
        kernel_path(connection),
        values,
        dict(options.substitutes),
        namespace,
        budget,
        options.variable_cap,
        options.notes,
        now,
        options.fallbacks,
        options.why_not,
        places,
        ram_left,
        disk_room,
    )
    saver.ipython_names = ipython_names
    worker = threading.Thread(target=saver.run, name="nb_cudaguard-keep", daemon=True)
    worker.start()
    worker.join(options.timeout)
    try:
        with saver.lock:
            if not saver.finished:
                if saver.error is not None:
                    raise saver.error
                budget.cancelled.set()  # the worker writes no more, removes what it was writing
            manifest = saver.manifest(timed_out=not saver.finished)
        return put_in_place(
            profile_location, connection, manifest, staging, places, {n for n, _ in values}, ram
        )
    except BaseException:
        discard(staging)
        if places is not None:
            discard(places[0])
        raise
