"""Arm the *next* process of *this* kernel, once: ``CUDA_LAUNCH_BLOCKING=1``, the extension loaded.

A server-managed restart relaunches the kernel with the environment saved at its first launch
(jupyter_client's ``KernelManager.restart_kernel`` reuses the first launch's arguments,
jupyter_client/manager.py), so the variable cannot travel through ``os.environ``. It travels as
data:

- a pending file ``<profile>/nb_cudaguard/pending-<key>.json`` (0600 in a 0700 directory, written
  atomically) that names the kernel by its connection file (the path survives restarts; ``key`` is
  its hash), when it was written, the variables, each checked against an allowlist (none for a
  plain restart), and whether to load the extension (the notebook glue's restarts ask for it, so
  that the commands their messages show work in the new kernel);
- a one-shot IPython startup file ``<profile>/startup/0-nb_cudaguard-once-<key>.py``, the fixed
  text of ``startup_once.py``: standard library only, it has IPython's extension manager load
  nb_cudaguard, after the variable is set (the next process may not be able to import it:
  another environment, an older version; the variable is set all the same). IPython runs
  startup files before the first cell, so the variable is in ``os.environ`` before torch can
  create a CUDA context. It only reads the data file; nothing read from a file is executed.

IPython runs every startup file in every process of the profile. Only the process whose
connection file hashes to the key acts: it removes both files, then sets the variable (once).
Every other process (another kernel, a terminal, another virtual environment) touches nothing, so
none can consume or cancel this kernel's pending restart; an error deletes nothing either. Files
older than ``TTL_S`` are leftovers of a restart that never came: the next ``write_pending``
removes them. The process that got the variable carries ``MARKER`` so that the extension can say
so (its banner) and a later in-place restart can drop it again. A startup file has no request to
answer, so the extension loaded there shows what it shows at load in the first cell run
(``notebook/extension.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..files.keys import kernel_key, state_dir
from ..files.private import make_dirs, private_dir, write_atomic
from ..runtime.blocking import BLOCKING

# Only these variables, with only these values, are ever set from a pending file.
ALLOWED: Mapping[str, frozenset[str]] = {"CUDA_LAUNCH_BLOCKING": frozenset({"1"})}
TTL_S = 300.0  # a restart takes seconds; anything older is a leftover
FORMAT = 2  # startup_once.py reads this format

STARTUP_PREFIX = "0-nb_cudaguard-once-"  # "0-" sorts before the usual "00-..." startup files


def startup_text() -> str:
    """The startup file's fixed text: ``startup_once.py`` as it is."""
    return (Path(__file__).with_name("startup_once.py")).read_text(encoding="utf-8")


def pending_path(profile_location: str | os.PathLike[str], key: str) -> Path:
    return state_dir(profile_location) / f"pending-{key}.json"


def startup_path(startup_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(startup_dir) / f"{STARTUP_PREFIX}{key}.py"


def validate_env(env: object) -> dict[str, str]:
    if not isinstance(env, dict) or not env:
        raise ValueError("env must be a non-empty mapping")
    for name, value in env.items():
        if name not in ALLOWED or value not in ALLOWED[name]:
            raise ValueError(f"{name!r}={value!r} is not an allowed variable")
    return dict(env)


def write_pending(
    profile_location: str | os.PathLike[str],
    startup_dir: str | os.PathLike[str],
    connection_path: str,
    *,
    after_cell: int | None = None,
    env: Mapping[str, str] = BLOCKING,
    load_extension: bool = False,
    now: float | None = None,
) -> tuple[Path, Path]:
    """Arm the next start of the kernel with this connection file: ``env`` (empty: no variable)
    and, with ``load_extension``, the extension loaded. Returns (data, startup) paths."""
    key = kernel_key(connection_path)
    created = time.time() if now is None else now
    data = {
        "format": FORMAT,
        "kernel": os.path.realpath(os.path.abspath(connection_path)),
        "created": created,
        "env": validate_env(dict(env)) if env else {},
        "after_cell": after_cell,
        "load_extension": load_extension,
    }
    data_path = pending_path(profile_location, key)
    private_dir(data_path.parent)
    remove_expired(profile_location, startup_dir, now=created)
    write_atomic(data_path, json.dumps(data))
    # Data first, then the startup file: a startup file never finds a half-armed state.
    script = startup_path(startup_dir, key)
    make_dirs(script.parent)  # IPython's own directory: created, never changed
    write_atomic(script, startup_text())
    return data_path, script


def cancel(
    profile_location: str | os.PathLike[str], startup_dir: str | os.PathLike[str], key: str
) -> None:
    """Disarm this kernel's pending restart: the startup file first, so that no process finds it
    without its data."""
    for path in (startup_path(startup_dir, key), pending_path(profile_location, key)):
        with contextlib.suppress(OSError):
            path.unlink()


def remove_expired(
    profile_location: str | os.PathLike[str],
    startup_dir: str | os.PathLike[str],
    now: float | None = None,
) -> None:
    """Remove leftovers: pending restarts older than ``TTL_S``, which no kernel will apply."""
    now = time.time() if now is None else now
    found = [
        *Path(startup_dir).glob(f"{STARTUP_PREFIX}*.py"),
        *state_dir(profile_location).glob("pending-*.json"),
    ]
    for path in found:
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > TTL_S:
                path.unlink()
