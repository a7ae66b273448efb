"""A rank's record of its failure: what one process of a job writes the moment it fails.

One JSON object per rank (``RECORD_KEY`` marks it, its value is the schema version)::

    {"nb_cudaguard_rank_record": 1,
     "rank": int, "local_rank": int, "world_size": int, "host": str, "pid": int,
     "time": float,            # the rank's own time.time() at detection
     "kind": "cuda-error" | "guard-refusal" | "stopped-by-peer",
     "cause_id": str | None,   # Diagnosis.cause; for stopped-by-peer the culprit's
     "headline": str,          # the one-line verdict
     "exception": "Type: message",
     "device_lines": [str, ...],   # device assert lines the rank's error carried
     "diagnosis": <Diagnosis JSON (diagnosis/schema.py to_json)> | None}

It is written in two places, each atomically (readers see it whole or not at all):

- ``$NB_CUDAGUARD_RANK_DIR/rank-<RANK>.json`` where that variable is set (the notebook extension
  sets it to a private folder, so the children of a launcher started from a cell inherit it);
- ``$TORCHELASTIC_ERROR_FILE`` where torchrun set it, in the format torch's own ``ErrorHandler``
  writes (torch/distributed/elastic/multiprocessing/errors/error_handler.py)::

      {"message": {"message": "<verdict>",
                   "extraInfo": {"py_callstack": "...", "timestamp": "<int seconds>",
                                 "nb_cudaguard": <the record>}}}

  so torchrun's "Root Cause" summary shows the verdict for the rank that wrote it. torchrun picks
  the failure with the smallest timestamp; a rank stopped by a peer rounds its time *up*, the
  culprit (like torch) down, so a victim never ties the culprit's second and is never named first.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..diagnosis.engine import diagnose
from ..diagnosis.model import Diagnosis
from ..diagnosis.schema import to_json
from ..files.private import write_atomic

RECORD_KEY = "nb_cudaguard_rank_record"
SCHEMA_VERSION = 1
KINDS = ("cuda-error", "guard-refusal", "stopped-by-peer")
RANK_DIR_ENV = "NB_CUDAGUARD_RANK_DIR"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _group() -> tuple[int, int] | None:
    """(rank, world size) from torch.distributed, where this process joined a group already
    (``mp.spawn`` hands the rank to the function, not to the environment)."""
    # Asked at every guard's start: the default group is read where c10d keeps it
    # (distributed_c10d.py, ``_world._default_pg``, what ``is_initialized()`` reads through two
    # properties), the public calls made only where one exists.
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    if world is not None and getattr(world, "_default_pg", True) is None:
        return None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        return None
    return None


def _in_environ(name: str) -> bool:
    """``name in os.environ`` as one lookup in its dict of encoded keys (os.py's ``_Environ``
    keeps them in ``_data``), where ``in`` runs three Python frames and raises a KeyError
    inside for a missing name: a guard's start asks for ``RANK`` every time."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        return name in os.environ
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.environ.encodekey(name)
    return key in data


_ENCODED: dict[str, object] = {}  # a variable's name -> its key in os.environ's own dict


def rank() -> int | None:
    """This process's rank: its group's, else ``RANK``; None outside a multi-process job."""
    group = _group()
    if group is not None:
        return group[0]
    return _env_int("RANK", 0) if _in_environ("RANK") else None


def identity() -> dict[str, Any]:
    """This process's place in the job: its group's rank where it joined one, else the
    variables every launcher sets (torchrun, accelerate, ``init_process_group``'s env://)."""
    group = _group()
    return {
        "rank": group[0] if group else _env_int("RANK", 0),
        "local_rank": _env_int("LOCAL_RANK", group[0] if group else 0),
        "world_size": group[1] if group else _env_int("WORLD_SIZE", 1),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _exception_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


def _is_guard_refusal(error: BaseException) -> bool:
    # by name, not import: the guard's module imports torch, a record must not need it
    return any(c.__name__ == "GuardError" for c in type(error).__mro__)


def failure_record(
    error: BaseException, now: float | None = None, device_output: str = ""
) -> dict[str, Any] | None:
    """The record for ``error`` raised in this rank, or None when it is neither a CUDA error
    nor a guard refusal (a Python error is not this job's business). ``device_output``: what
    the rank wrote to fd 2 meanwhile, where the GPU prints its assert lines."""
    stamp = time.time() if now is None else now
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    if _is_guard_refusal(error):
        return {
            **_head(stamp, "guard-refusal"),
            "cause_id": "guard-refusal",
            "headline": f"rank {rank()}: the guard refused a bad input: {first}",
            "exception": _exception_text(error),
            "device_lines": [],
            "diagnosis": None,
        }
    diagnosis = diagnose(error, device_output=device_output)
    if diagnosis is None:
        return None
    return {
        **_head(stamp, "cuda-error"),
        "cause_id": diagnosis.cause,
        "headline": f"rank {rank()}: {diagnosis.title}",
        "exception": _exception_text(error),
        "device_lines": [line.raw for line in diagnosis.assert_lines],
        "diagnosis": to_json(diagnosis),
    }


def stopped_record(culprit: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """The record of a rank stopped because ``culprit`` (a peer's record) failed."""
    stamp = time.time() if now is None else now
    return {
        **_head(stamp, "stopped-by-peer"),
        "cause_id": culprit.get("cause_id"),
        "headline": stop_line(culprit),
        "exception": "",
        "device_lines": [],
        "diagnosis": None,
    }


def stop_line(culprit: Mapping[str, Any]) -> str:
    """The one line a stopped peer prints."""
    return f"stopped because rank {culprit.get('rank')} failed: {cause_text(culprit)}"


def cause_text(record: Mapping[str, Any]) -> str:
    """The cause in words: the diagnosis's title, else the exception's first line."""
    diagnosis = record.get("diagnosis")
    if isinstance(diagnosis, Mapping) and diagnosis.get("title"):
        return str(diagnosis["title"])
    text = str(record.get("exception") or record.get("headline") or "unknown error")
    return text.splitlines()[0]


def _head(stamp: float, kind: str) -> dict[str, Any]:
    return {RECORD_KEY: SCHEMA_VERSION, **identity(), "time": stamp, "kind": kind}


def is_record(data: object) -> bool:
    return isinstance(data, Mapping) and data.get(RECORD_KEY) == SCHEMA_VERSION


def error_file_payload(record: Mapping[str, Any], callstack: str = "") -> dict[str, Any]:
    """``record`` in torchelastic's error-file format, the verdict as its message."""
    stamp = float(record["time"])
    # torchrun names the smallest second: a victim's is rounded up so it never ties its culprit
    second = math.ceil(stamp) if record["kind"] == "stopped-by-peer" else int(stamp)
    if record["kind"] == "stopped-by-peer":
        message = str(record["headline"])
    else:
        message = f"nb_cudaguard: {record['headline']} ({record['exception'].splitlines()[0]})"
    return {
        "message": {
            "message": message,
            "extraInfo": {
                # torchrun's summary prints the callstack: the verdict ends it
                "py_callstack": f"{callstack}{message}\n",
                "timestamp": str(second),
                "nb_cudaguard": dict(record),
            },
        }
    }


def write(record: Mapping[str, Any], error: BaseException | None = None) -> list[Path]:
    """Write ``record`` where this job's launcher looks (see the module docstring); the paths
    written. A write that fails is left out: the rank's own error must still surface."""
    written: list[Path] = []
    folder = os.environ.get(RANK_DIR_ENV)
    if folder:
        path = Path(folder) / f"rank-{record['rank']}.json"
        try:
            write_atomic(path, json.dumps(record))
            written.append(path)
        except OSError:
            pass
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file:
        stack = "".join(traceback.format_exception(error)) if error is not None else ""
        path = Path(error_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(error_file_payload(record, stack)))
            written.append(path)
        except OSError:
            pass
    return written


def read_dir(folder: Path) -> list[dict[str, Any]]:
    """Every rank record in ``folder`` (torchelastic error files too), by rank."""
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, Mapping) and isinstance(data.get("message"), Mapping):
            data = data["message"].get("extraInfo", {}).get("nb_cudaguard")
        if is_record(data):
            records.append(dict(data))
    return sorted(records, key=lambda r: int(r.get("rank", 0)))


def culprit(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rank that broke the job: a cuda-error or guard-refusal record, the earliest by its
    own clock; never a rank that was stopped by a peer."""
    failed = [r for r in records if r.get("kind") in ("cuda-error", "guard-refusal")]
    return min(failed, key=lambda r: float(r.get("time", math.inf)), default=None)


def diagnosis_of(record: Mapping[str, Any]) -> Diagnosis | None:
    payload = record.get("diagnosis")
    return Diagnosis.from_dict(payload) if isinstance(payload, Mapping) else None
