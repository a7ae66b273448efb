"""Put ``CUDA_LAUNCH_BLOCKING=1`` into the *next* process of *this* kernel, once.

A server-managed restart relaunches the kernel with the environment saved at its first launch
(FIELD_NOTES §6), so the variable cannot travel through ``os.environ``. It travels as data:

- a pending file ``<profile>/nb_cudaguard/pending-<key>.json`` (0600 in a 0700 directory, written
  atomically) that names the kernel by its connection file (the path survives restarts; ``key`` is
  its hash), when it was written, and the variables, each checked against an allowlist;
- a one-shot IPython startup file ``<profile>/startup/0-nb_cudaguard-once-<key>.py`` whose text is
  fixed by this module. IPython runs startup files before the first cell, so the variable is in
  ``os.environ`` before torch can create a CUDA context, even if the user never loads nb_cudaguard
  again. The code it runs only reads the data file; nothing read from a file is executed.

The new kernel consumes its pending file and deletes both files; other IPython processes of the
same profile find a different key and leave them alone; files older than ``TTL_S`` are deleted by
whoever finds them. The process that got the variable from us carries ``MARKER`` so that the
extension can say so (and a later in-place restart can drop it again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from ..runtime.blocking import BLOCKING, MARKER

# Only these variables, with only these values, are ever set from a pending file.
ALLOWED: Mapping[str, frozenset[str]] = {"CUDA_LAUNCH_BLOCKING": frozenset({"1"})}
TTL_S = 300.0  # a restart takes seconds; anything older is a leftover
FORMAT = 1
_MAX_BYTES = 4096

STARTUP_PREFIX = "0-nb_cudaguard-once-"  # "0-" sorts before the usual "00-..." startup files
STARTUP_TEXT = """\
# Written by nb_cudaguard (%cudaguard restart): sets CUDA_LAUNCH_BLOCKING=1 in the next start of
# ONE kernel, then deletes itself. It only reads a data file; safe to delete.
try:
    __import__("nb_cudaguard.notebook.kernel", fromlist=["run_startup"]).run_startup()
except Exception:
    try:
        __import__("os").remove(__file__)
    except Exception:
        pass
"""


@dataclass(frozen=True)
class Pending:
    """A validated pending injection."""

    kernel: str  # the connection file it is meant for (resolved path)
    created: float
    env: Mapping[str, str]
    after_cell: int | None


def kernel_key(connection_path: str) -> str:
    resolved = os.path.realpath(os.path.abspath(connection_path))
    return hashlib.sha256(resolved.encode()).hexdigest()[:24]


def state_dir(profile_location: str | os.PathLike[str]) -> Path:
    return Path(profile_location) / "nb_cudaguard"


def pending_path(profile_location: str | os.PathLike[str], key: str) -> Path:
    return state_dir(profile_location) / f"pending-{key}.json"


def startup_path(startup_dir: str | os.PathLike[str], key: str) -> Path:
    return Path(startup_dir) / f"{STARTUP_PREFIX}{key}.py"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _write_atomic(path: Path, text: str) -> None:
    """Write a 0600 file that readers see either whole or not at all."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
    now: float | None = None,
) -> tuple[Path, Path]:
    """Arm the next start of the kernel with this connection file. Returns (data, startup) paths."""
    key = kernel_key(connection_path)
    data = {
        "format": FORMAT,
        "kernel": os.path.realpath(os.path.abspath(connection_path)),
        "created": time.time() if now is None else now,
        "env": validate_env(dict(env)),
        "after_cell": after_cell,
    }
    data_path = pending_path(profile_location, key)
    _private_dir(data_path.parent)
    _write_atomic(data_path, json.dumps(data))
    # Data first, then the startup file: a startup file never finds a half-armed state.
    script = startup_path(startup_dir, key)
    script.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(script, STARTUP_TEXT)
    return data_path, script


def read_pending(path: Path) -> Pending:
    """Parse and validate a pending file; ValueError for anything unexpected."""
    if path.stat().st_size > _MAX_BYTES:
        raise ValueError("pending file too large")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("unknown pending-file format")
    kernel, created, after_cell = data.get("kernel"), data.get("created"), data.get("after_cell")
    if not isinstance(kernel, str) or not isinstance(created, (int, float)):
        raise ValueError("pending file lacks kernel or created")
    if after_cell is not None and (not isinstance(after_cell, int) or isinstance(after_cell, bool)):
        raise ValueError("after_cell must be an integer")
    return Pending(kernel, float(created), validate_env(data.get("env")), after_cell)


def cancel(
    profile_location: str | os.PathLike[str], startup_dir: str | os.PathLike[str], key: str
) -> None:
    """Disarm: remove the startup file first, so that no process finds it without its data."""
    for path in (startup_path(startup_dir, key), pending_path(profile_location, key)):
        with contextlib.suppress(OSError):
            path.unlink()


def apply_pending(
    profile_location: str | os.PathLike[str],
    startup_dir: str | os.PathLike[str],
    this_connection: str | None,
    environ: MutableMapping[str, str] | None = None,
    now: float | None = None,
) -> Pending | None:
    """Consume the injection meant for this kernel and expire leftovers; never raises OSError."""
    environ = os.environ if environ is None else environ
    now = time.time() if now is None else now
    this_key = kernel_key(this_connection) if this_connection else None
    applied: Pending | None = None
    directory = state_dir(profile_location)
    for path in sorted(directory.glob("pending-*.json")) if directory.is_dir() else []:
        key = path.name[len("pending-") : -len(".json")]
        try:
            pending = read_pending(path)
        except (OSError, ValueError):
            cancel(profile_location, startup_dir, key)  # unreadable or not ours to trust
            continue
        if now - pending.created > TTL_S or pending.created - now > TTL_S:
            cancel(profile_location, startup_dir, key)
            continue
        if key != this_key or kernel_key(pending.kernel) != key:
            continue  # another kernel's, still fresh
        cancel(profile_location, startup_dir, key)  # once: disarm before applying
        environ.update(pending.env)
        environ[MARKER] = "" if pending.after_cell is None else str(pending.after_cell)
        applied = pending
    _remove_orphan_startup_files(profile_location, startup_dir)
    return applied


def _remove_orphan_startup_files(
    profile_location: str | os.PathLike[str], startup_dir: str | os.PathLike[str]
) -> None:
    for script in Path(startup_dir).glob(f"{STARTUP_PREFIX}*.py"):
        key = script.name[len(STARTUP_PREFIX) : -len(".py")]
        if not pending_path(profile_location, key).exists():
            with contextlib.suppress(OSError):
                script.unlink()
