"""Stop the peers fast: the failed rank says so in the job's own c10d store, the others watch it.

A rank whose GPU asserted cannot take part in the next collective; its peers would block there
until the collective's timeout (NCCL's watchdog: 10 minutes by default) and die by SIGABRT,
their own errors drowning the culprit's. So the failed rank sets ``KEY`` in torch.distributed's
default store (the TCPStore that torchrun or ``init_process_group`` already made: no server of
ours) to its record, and every rank runs one daemon thread that checks the key every
``POLL_S`` seconds (``Store.check``: one round trip, no wait). A peer that finds it writes its
"stopped-by-peer" record, prints one line, aborts its process groups where torch can and ends
the process: the main thread may be blocked inside a collective that nothing else ends.

The first peer to exit makes the launcher end all the others (torchrun's agent checks its
workers every 0.1 s and SIGTERMs the rest; ``mp.spawn``'s parent does the same), so a peer
holds its exit for ``HOLD_S``, longer than one poll: every other live watcher finds the key in
that time and writes its own record before anything is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from . import record as rank_record

KEY = "nb_cudaguard/failed"
POLL_S = 0.25
HOLD_S = 3 * POLL_S  # a loaded machine may run a watcher a little late
EXIT_CODE = 1

_lock = threading.Lock()
_watcher: threading.Thread | None = None
_announced = False


def _store() -> Any | None:
    """torch.distributed's default store, where a process group exists (None otherwise)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def announce(record: Mapping[str, Any]) -> bool:
    """Tell the peers this rank failed (once per process). False where there is no store."""
    global _announced
    store = _store()
    if store is None or _announced:
        return False
    _announced = True
    # the first failure wins: compare_set leaves a peer's earlier announcement in place
    store.compare_set(KEY, "", json.dumps(dict(record)))
    return True


def watch() -> bool:
    """Start this rank's watcher (once per process). False where there is no store yet."""
    global _watcher
    with _lock:
        if _watcher is not None and _watcher.is_alive():
            return True
        store = _store()
        if store is None:
            return False
        rank = rank_record.rank()
        _watcher = threading.Thread(
            target=_watch, args=(store, rank), name="nb_cudaguard-peer-watch", daemon=True
        )
        _watcher.start()
        return True


def _watch(store: Any, rank: int) -> None:
    stop = threading.Event()
    while not stop.wait(POLL_S):
        try:
            if not store.check([KEY]):
                continue
            data = json.loads(store.get(KEY).decode())
        except Exception:  # the store is gone: the job is ending; nothing to watch
            return
        if not rank_record.is_record(data) or data.get("rank") == rank or _announced:
            return  # our own failure, or not ours to read
        _stop_for(data)
        return


def _stop_for(culprit: Mapping[str, Any]) -> None:
    record = rank_record.stopped_record(culprit)
    rank_record.write(record)
    # Straight to fd 2, as the CUDA runtime writes its assert lines: a rank that a notebook's
    # launcher forked (accelerate's ``notebook_launcher``, ``start_method="fork"``) has
    # ipykernel's streams as sys.stdout and sys.stderr, whose buffer lock the kernel's IOPub
    # thread may have held at the fork (it flushes the launcher's own "Launching training"
    # line then): in the child nothing ever releases it, and a write through it waits forever.
    with contextlib.suppress(OSError):
        os.write(2, f"nb_cudaguard: {record['headline']}\n".encode())
    _flush_streams(timeout=HOLD_S)  # what the rank printed before: shown, if it can be
    _abort_groups()
    time.sleep(HOLD_S)
    os._exit(EXIT_CODE)


def _flush_streams(timeout: float) -> None:
    """Flush sys.stdout and sys.stderr (``os._exit`` does not), in a thread given at most
    ``timeout`` seconds: a stream whose lock the fork left held never returns."""

    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()

    flusher = threading.Thread(target=flush, name="nb_cudaguard-flush", daemon=True)
    flusher.start()
    flusher.join(timeout)


def _abort_groups() -> None:
    """Abort the process groups where torch can (NCCL: frees the communicators at once); the
    blocked main thread cannot run ``destroy_process_group``, and the exit ends the rest."""
    with contextlib.suppress(Exception):
        from torch.distributed import distributed_c10d

        abort = getattr(distributed_c10d, "_abort_process_group", None)
        if abort is not None and distributed_c10d.get_backend() == "nccl":
            abort()
