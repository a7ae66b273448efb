"""Which rank broke the job: each rank classed culprit, victim, collateral or unknown, one line.

Launchers pick the wrong rank. torchrun's "Root Cause (first observed failure)" is the earliest
timestamp (``ChildFailedError.get_first_failure``), and ``mp.spawn`` reports the first process it
finds dead: either can be a peer that timed out or lost its connection while the rank that hit the
device assert was still unwinding. Here evidence decides, never the clock: a rank whose own lines
hold a sticky CUDA error (or whose record says so) is a culprit whatever the timestamps; a rank
that only waited, lost its peer or was aborted by the watchdog is a victim; one the launcher
terminated is collateral. The clock only orders culprits among themselves.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..diagnosis.classify import classify_line
from ..diagnosis.engine import diagnose
from ..diagnosis.model import Diagnosis
from ..diagnosis.where import text_tracebacks
from .logs import JobLog, RankLog

Role = Literal["culprit", "victim", "collateral", "unknown"]

# What a peer of a failed rank prints (gloo: third_party/gloo/gloo/transport/tcp/{pair,
# unbound_buffer}.cc; NCCL: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp), most telling first.
_VICTIM_TEXTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "stopped by its peer",
        re.compile(r"stopped because rank \d+ failed", re.IGNORECASE),
    ),
    (
        "collective timed out",
        re.compile(
            r"Watchdog caught collective operation timeout|collective operation timeout"
            r"|ran for \d+ milliseconds before timing out|Timed out waiting \d+\s*ms"
            r"|Some NCCL operations have failed or timed out|Socket Timeout"
            r"|(?:wait|barrier|recv|send|store)\w*(?: operation)? timed out"
            r"|DistStoreError.*time|Timeout(?:Error)? waiting|timed out after \d+",
            re.IGNORECASE,
        ),
    ),
    (
        "connection closed by peer",
        re.compile(
            r"Connection closed by peer|Connection reset by peer|remote worker crashing"
            r"|ECONNRESET|peer closed|recvBytes failed|Socket closed|Broken pipe",
            re.IGNORECASE,
        ),
    ),
    (
        "remote error",
        re.compile(
            r"ncclRemoteError|remote process exit|communicator was aborted|NCCL communicator"
            r".*abort|DistNetworkError|DistBackendError|watchdog thread terminated"
            r"|NCCL error.*(?:remote|network)",
            re.IGNORECASE,
        ),
    ),
)
# The watchdog ends a timed-out NCCL rank by abort() (TORCH_NCCL_ASYNC_ERROR_HANDLING=1).
_ABORT = re.compile(
    r"Signal 6 \(SIGABRT\)|signal SIGABRT|return code = -6\b|Fatal Python error: Aborted"
    r"|Aborted \(core dumped\)",
    re.IGNORECASE,
)
_TERMINATED = re.compile(
    r"Signal (?:15|9) \(SIG(?:TERM|KILL)\)|signal SIG(?:TERM|KILL)|return code = -(?:15|9)\b",
    re.IGNORECASE,
)
ABORTED = "aborted (SIGABRT)"
_PEER_LINE = re.compile(r"^.*stopped because rank \d+ failed.*$", re.MULTILINE | re.IGNORECASE)


@dataclass(frozen=True)
class RankRole:
    log: RankLog
    role: Role
    reason: str  # the cause's title (a culprit), or how it was stopped
    diagnosis: Diagnosis | None = None
    inferred: bool = False  # named culprit by elimination, not by its own lines


@dataclass(frozen=True)
class Verdict:
    job: JobLog
    roles: tuple[RankRole, ...]  # by rank
    culprits: tuple[RankRole, ...]  # earliest detection first
    diagnosis: Diagnosis | None  # the first culprit's (or the unattributed device lines')
    line: str
    notes: tuple[str, ...]


def _victim_reason(text: str) -> str | None:
    for reason, pattern in _VICTIM_TEXTS:
        if pattern.search(text):
            return reason
    return None


def _record_diagnosis(log: RankLog) -> Diagnosis | None:
    payload = log.record.get("diagnosis") if log.record else None
    if isinstance(payload, dict):
        try:
            return Diagnosis.from_dict(payload)
        except (TypeError, ValueError, KeyError):
            return None
    return None


def classify_rank(log: RankLog, device_output: str = "") -> RankRole:
    """A rank's role, from its record where written, else from its own lines and exit."""
    kind = log.record.get("kind") if log.record else None
    if kind in ("cuda-error", "guard-refusal") and log.record is not None:
        found = _record_diagnosis(log) or diagnose(log.text)
        title = found.title if found else str(log.record.get("headline") or kind)
        return RankRole(log, "culprit", title, found)
    if kind == "stopped-by-peer":
        return RankRole(log, "victim", "stopped by its peer")
    # Our own "stopped because rank k failed: <cause>" quotes the culprit's cause: not this rank's.
    own = _PEER_LINE.sub("", log.text)
    found = diagnose(own, device_output=device_output) if own.strip() else None
    if found is not None and found.sticky:
        return RankRole(log, "culprit", found.title, found)
    reason = _victim_reason(log.text)
    if reason is not None:
        return RankRole(log, "victim", reason)
    if found is not None:  # out of memory and the like: its own failure, not a peer's
        return RankRole(log, "culprit", found.title, found)
    code = log.exitcode
    if code == -6 or _ABORT.search(log.text):
        return RankRole(log, "victim", ABORTED)
    if code in (-15, -9) or _TERMINATED.search(log.text):
        name = "SIGKILL" if code == -9 else "SIGTERM"
        return RankRole(log, "collateral", f"terminated by the launcher ({name})")
    return RankRole(log, "unknown", "no failure of its own in the log")


def _raised_in_python(text: str) -> bool:
    """The text holds a Python traceback whose exception is a sticky CUDA error (not only a
    C++ abort's, as NCCL's watchdog prints)."""
    for _frames, after in text_tracebacks(text):
        error = classify_line(after) if after else None
        if error is not None and error.sticky:
            return True
    return False


def _by_elimination(
    job: JobLog, roles: list[RankRole], stray: Diagnosis
) -> tuple[list[RankRole], list[RankRole], list[str]]:
    """The culprit of assert lines and a traceback no rank prefix claims, where the others
    rule themselves out: (culprits, roles, notes)."""
    unit = job.unit
    # Only a rank that printed it was waiting on a peer is cleared: an abort alone is also
    # how NCCL's watchdog ends the rank whose own kernel failed.
    suspects = [r for r in roles if r.role != "victim" or r.reason == ABORTED]
    why = f"every other {unit} in the log printed that it was waiting on a peer"
    if len(suspects) > 1 and _raised_in_python(job.stray):
        # The unclaimed traceback was raised by a rank that exited with an exception's status;
        # where only one rank did (the others were signalled), it is that one.
        raised = [r for r in roles if r.log.exitcode is not None and r.log.exitcode > 0]
        if len(raised) == 1 and raised[0] in suspects:
            suspects = raised
            why = (
                f"it is the only {unit} that exited with an exception's status "
                f"({raised[0].log.exitcode}); the others were ended by signals"
            )
    if len(suspects) == 1 and len(roles) < 2 and job.signalled:
        # The launcher ended every other process of the job, still running, once this one
        # failed: the agent names only the failed one's local rank ("failed (exitcode: -6)
        # local_rank: 0") and the others by pid.
        why = (
            f"it is the only one that failed: the launcher stopped the {job.signalled} other "
            "processes, still running then, by a signal"
        )
    elif len(suspects) == 1 and len(roles) < 2:
        return [], roles, []
    if len(suspects) == 1:
        inferred = RankRole(suspects[0].log, "culprit", stray.title, stray, inferred=True)
        roles = [inferred if r is suspects[0] else r for r in roles]
        note = (
            f"The device's assert lines carry no {unit} prefix; {unit} {inferred.log.rank} "
            f"is named because {why}."
        )
        return [inferred], roles, [note]
    if len(suspects) > 1:
        plural = f"{unit}s {numbers([r.log.rank for r in suspects])}"
        return (
            [],
            roles,
            [
                f"The device's assert lines carry no {unit} prefix, and {plural} printed nothing "
                "that says they waited on a peer: it is one of them."
            ],
        )
    return [], roles, []


def _when(role: RankRole) -> tuple[float, int, int]:
    time = role.log.time if role.log.time is not None else float("inf")
    return (time, role.log.order, role.log.rank)


def judge(job: JobLog) -> Verdict:
    """Class every rank and name the culprit (see the module's docstring)."""
    roles = [classify_rank(log) for log in job.ranks]
    # Ranks of a known world that printed nothing at all are suspects too.
    present = {log.rank for log in job.ranks}
    roles += [
        RankRole(RankLog(rank), "unknown", "nothing of it in the log")
        for rank in range(job.world_size or 0)
        if rank not in present
    ]
    roles.sort(key=lambda role: role.log.rank)
    culprits = [r for r in roles if r.role == "culprit"]
    stray = diagnose(job.stray) if job.stray.strip() else None
    stray = stray if stray is not None and stray.sticky else None
    notes: list[str] = []
    only = culprits[0].diagnosis if len(culprits) == 1 else None
    if stray is not None and only is not None and only.sticky and not only.assert_lines:
        # The CUDA runtime prints its assert lines without the launcher's rank prefix: they
        # are the one culprit's, and decide its cause.
        again = classify_rank(culprits[0].log, device_output=job.stray)
        roles = [again if r is culprits[0] else r for r in roles]
        culprits = [again]
    if not culprits and stray is not None:
        culprits, roles, note = _by_elimination(job, roles, stray)
        notes.extend(note)
    culprits.sort(key=_when)
    first = culprits[0] if culprits else None
    diagnosis = first.diagnosis if first is not None else stray
    notes.extend(
        f"{job.unit.capitalize()} {c.log.rank} failed too, later: {c.reason}."
        for c in culprits[1:]
        if first is not None and c.reason != first.reason
    )
    if job.root_cause is not None and first is not None and job.root_cause != first.log.rank:
        named = next((r for r in roles if r.log.rank == job.root_cause), None)
        what = f"a {named.role} ({named.reason})" if named else "not the culprit"
        notes.append(
            f'The launcher\'s "Root Cause (first observed failure)" names rank {job.root_cause}, '
            f"{what}: it picks the earliest timestamp, not the rank that failed first."
        )
    line = _line(job, roles, culprits, diagnosis)
    return Verdict(job, tuple(roles), tuple(culprits), diagnosis, line, tuple(notes))


def numbers(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2 and 5"; [0, 2] -> "0 and 2"."""
    runs: list[list[int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    parts: list[str] = []
    for low, high in runs:
        parts += [f"{low}-{high}"] if high - low >= 2 else sorted({str(low), str(high)}, key=int)
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _place(log: RankLog, diagnosis: Diagnosis | None) -> str:
    parts = [log.host] if log.host else []
    if diagnosis is not None and diagnosis.device is not None:
        parts.append(f"GPU {diagnosis.device}")
    elif log.local_rank is not None:
        parts.append(f"local rank {log.local_rank}")
    return f" ({', '.join(parts)})" if parts else ""


def _line(
    job: JobLog,
    roles: Sequence[RankRole],
    culprits: Sequence[RankRole],
    diagnosis: Diagnosis | None,
) -> str:
    unit = job.unit
    # Without a named culprit, an abort alone may be the culprit's own (see judge()).
    stopped = [
        r.log.rank
        for r in roles
        if r.role in ("victim", "collateral") and (culprits or r.reason != ABORTED)
    ]
    if culprits:
        first = culprits[0]
        title = first.reason
        who = f"{unit} {first.log.rank}{_place(first.log, first.diagnosis)}"
        # Later culprits with the same cause (one bad batch split over ranks) join the line;
        # judge() notes those with another cause.
        others = [c.log.rank for c in culprits[1:] if c.reason == title]
        if others:
            more = "s" if len(others) > 1 else ""
            who += f", then {unit}{more} {numbers(others)}"
    elif diagnosis is not None:
        title = diagnosis.title
        who = f"a {unit} the log does not name"
    else:
        return ""
    line = f"{who}: {title}"
    if stopped:
        plural = len(stopped) > 1
        line += (
            f"; {unit}{'s' if plural else ''} {numbers(stopped)} "
            f"{'were' if plural else 'was'} stopped because of it"
        )
    return line
