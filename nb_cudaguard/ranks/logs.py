"""Read a multi-rank job's output into one entry per rank: what each rank printed and how it ended.

Four inputs: a launcher's console log (torchrun's ``[rank3]:`` and ``--tee``'s ``[default3]:``
prefixes, its "Root Cause" summary; ``torch.multiprocessing.spawn``'s "-- Process N terminated";
DeepSpeed's launcher lines), torchrun's ``--log-dir`` (``<run_id>/attempt_<n>/<local_rank>/``
``{stdout,stderr}.log`` and ``error.json``), torchelastic error files, and nb_cudaguard's own
per-rank records (``rank-<N>.json``, or the same object under ``message.extraInfo.nb_cudaguard``
of an error file). Pure text work: no torch, no judgement (``verdict.py`` judges).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from ..diagnosis.classify import normalize

RECORD_KEY = "nb_cudaguard_rank_record"
Launcher = Literal[
    "torchrun",
    "accelerate",
    "deepspeed",
    "spawn",
    "notebook",
    "python",
    "lightning",
    "srun",
    "unknown",
]


@dataclass(frozen=True)
class RankLog:
    """One rank (or one process of ``mp.spawn``) as the input shows it."""

    rank: int  # the global rank (for mp.spawn: the process index)
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    time: float | None = None  # the rank's own clock at detection (a record), else its failure
    order: int = 1 << 30  # where its first failure line stands in the log (no clock: log order)
    text: str = ""  # its own lines, launcher prefixes removed
    exitcode: int | None = None  # negative: killed by that signal
    record: Mapping[str, Any] | None = None  # nb_cudaguard's per-rank record, where written


@dataclass(frozen=True)
class JobLog:
    launcher: Launcher
    ranks: tuple[RankLog, ...]
    stray: str = ""  # lines no rank claims: the CUDA runtime's device lines carry no prefix
    root_cause: int | None = None  # the rank torchrun's "Root Cause (first observed failure)" names
    command: str | None = None  # the launch command, where the log shows it
    script: str | None = None  # the entry point (the summary's "<name> FAILED", the spawn frame)
    script_command: str | None = None  # the script and its arguments, where a launcher logs them
    world_size: int | None = None
    unit: str = "rank"  # "process" where only mp.spawn's process index is known
    log_dir: str | None = None
    # Processes the launcher ended by a signal that no rank of the log matches (the elastic
    # agent's "Sending process 1424 closing signal SIGTERM" names a pid, not a rank): those
    # still running when a rank failed.
    signalled: int = 0


@dataclass
class _Rank:
    """A rank's facts while they are gathered from several places."""

    rank: int
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    time: float | None = None
    order: int = 1 << 30
    lines: list[str] = field(default_factory=list)
    exitcode: int | None = None
    record: Mapping[str, Any] | None = None

    def frozen(self) -> RankLog:
        return RankLog(
            self.rank, self.local_rank, self.host, self.pid, self.time, self.order,
            "\n".join(self.lines), self.exitcode, self.record,
        )  # fmt: skip


class _Ranks(dict[int, _Rank]):
    def of(self, rank: int) -> _Rank:
        if rank not in self:
            self[rank] = _Rank(rank)
        return self[rank]


# --- per-rank records and torchelastic error files -----------------------------------------------
def record_of(data: Any) -> Mapping[str, Any] | None:
    """nb_cudaguard's per-rank record in a JSON value: the record itself, or the one inside a
    torchelastic error file (``message.extraInfo.nb_cudaguard``)."""
    if isinstance(data, Mapping) and data.get(RECORD_KEY) is not None:
        return data
    message = data.get("message") if isinstance(data, Mapping) else None
    extra = message.get("extraInfo") if isinstance(message, Mapping) else None
    inner = extra.get("nb_cudaguard") if isinstance(extra, Mapping) else None
    if isinstance(inner, str):
        try:
            inner = json.loads(inner)
        except ValueError:
            return None
    return inner if isinstance(inner, Mapping) and inner.get(RECORD_KEY) is not None else None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _error_file_text(data: Mapping[str, Any]) -> tuple[str, float | None]:
    """The traceback (else the message) of a torchelastic error file, and its timestamp.
    torch/distributed/elastic/multiprocessing/errors/error_handler.py writes
    ``{"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}``;
    a plain string message comes with a top-level ``timestamp``."""
    message = data.get("message")
    if isinstance(message, Mapping):
        extra = message.get("extraInfo")
        extra = extra if isinstance(extra, Mapping) else {}
        text = extra.get("py_callstack") or message.get("message") or ""
        return str(text), _float(extra.get("timestamp"))
    if isinstance(message, str):
        return message, _float(data.get("timestamp"))
    return "", None


def _record_lines(record: Mapping[str, Any]) -> list[str]:
    lines = [str(line) for line in record.get("device_lines") or [] if line]
    exception = record.get("exception")
    if exception:
        lines.append(str(exception))
    return lines


def _add_record(ranks: _Ranks, record: Mapping[str, Any]) -> _Rank | None:
    number = _int(record.get("rank"))
    if number is None:
        return None
    entry = ranks.of(number)
    entry.record = record
    entry.local_rank = _int(record.get("local_rank"))
    entry.host = str(record["host"]) if record.get("host") else entry.host
    entry.pid = _int(record.get("pid")) or entry.pid
    entry.time = _float(record.get("time"))
    entry.lines = [*_record_lines(record), *entry.lines]
    return entry


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


# --- reading a console log -----------------------------------------------------------------------
# torchrun 2.x prefixes a worker's traceback "[rank3]:" (global rank); --tee prefixes every line
# "[default3]:" (the role and the LOCAL rank; torch/distributed/elastic/multiprocessing/api.py).
_PREFIX = re.compile(r"^\[(?P<kind>rank|[A-Za-z_]+?)(?P<n>\d+)\]:")
# Ray's worker prefix ("(RayTrainWorker pid=4009, ip=10.0.0.1) "), in front of torch's own.
_RAY = re.compile(r"^\(\w+ pid=\d+(?:, ip=[\d.]+)?\) ")
# pdsh (DeepSpeed's multi-node runner) puts the host in front: "worker-1: [rank5]: ...".
_PDSH = re.compile(r"^([\w.-]+): (?=\[(?:rank|default)\d+\]:)")
# Slurm's `srun --label`: "3: Traceback ...", the task number being the global rank.
_SRUN_LABEL = re.compile(r"^\s*(\d+): ")
_SRUN_TRACEBACK = re.compile(r"(?m)^\s*\d+: (?:\[rank\d+\]: ?)?Traceback \(most recent call")
# The elastic agent logs through glog-style prefixes: "E1126 18:42:33.780000 17716 torch/...:836] ".
_GLOG = re.compile(r"^[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
# A notebook's traceback: IPython's cell frames, ipykernel's compiled cells.
_NOTEBOOK = re.compile(r"Cell In ?\[\d+\]|<ipython-input-\d+|[/\\]ipykernel_\d+[/\\]")
# NCCL's watchdog names its rank inside the line: "[PG ID 0 PG GUID 0(default_pg) Rank 1]".
# Older releases print "[PG 1 Rank 1]" or "[Rank 1]" alone.
_INNER_RANK = re.compile(r"\[(?:PG [^\]]*? )?Rank (\d+)\]")
# ChildFailedError's summary (torch/distributed/elastic/multiprocessing/errors/__init__.py);
# 1.9-1.10 wrote "msg:" where 1.11+ write "traceback :".
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s{1,4}(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s?(.*)$")
_RANK_FIELD = re.compile(r"(\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_EXIT_FIELD = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_TITLE = re.compile(r"^\s*(\S+) FAILED\s*$")
_RULE = re.compile(r"^\s*(?:={8,}|-{8,}|\*{8,})\s*$")
# The agent: "failed (exitcode: 1) local_rank: 1 (pid: 8822) of binary: /usr/bin/python".
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_AGENT_SIGNAL = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
# mp.spawn (torch/multiprocessing/spawn.py): ProcessRaisedException, ProcessExitedException.
_SPAWN_RAISED = re.compile(r"^-- Process (\d+) terminated with the following error:")
_SPAWN_EXITED = re.compile(r"process (\d+) terminated with (?:signal (SIG\w+)|exit code (-?\d+))")
_SPAWN_TERMINATING = re.compile(r"Terminating process (\d+) via signal (SIG\w+)")
# DeepSpeed's launcher: "[launch.py:...] ['/usr/bin/python', '-u', 'train.py', '--local_rank=1']
# exits with return code = -6"; its runner logs "cmd = ... deepspeed.launcher.launch ...".
_DS_EXIT = re.compile(r"--local_rank=(\d+).*exits with return code = (-?\d+)")
_DS_CMD = re.compile(r"cmd = .*?-m deepspeed\.launcher\.launch (?P<rest>.*)$")
_DS_WORLD = re.compile(r"WORLD INFO DICT: \{'([^']+)': \[([\d, ]+)\]")
# Lightning: "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/4".
_LIGHTNING = re.compile(r"Initializing distributed: GLOBAL_RANK: (\d+), MEMBER: \d+/(\d+)")
# A shell's echo of the launch command ("$ torchrun ...", bash -x's "+ torchrun ...").
_COMMAND = re.compile(
    r"^(?:.*?[$#] |\+ )?(?P<cmd>(?:[A-Z_][A-Z0-9_]*=\S* )*"
    r"(?:torchrun|\S*python[\d.]* (?:-u )?-m torch\.distributed\.(?:run|launch)"
    r"|accelerate launch|deepspeed)\s.*)$"
)
_SIGNALS = {"SIGTERM": 15, "SIGKILL": 9, "SIGABRT": 6, "SIGSEGV": 11, "SIGINT": 2, "SIGBUS": 7}


def _signal_number(name: str) -> int | None:
    return _SIGNALS.get(name.upper())


def _summary(lines: list[str], ranks: _Ranks, facts: dict[str, Any]) -> None:
    """The ChildFailedError summary's entries: rank, local rank, host, exit code, pid, time and
    the error file's traceback; which one it calls the root cause; the entry point's name."""
    entry: _Rank | None = None
    pending: dict[str, str] | None = None  # an entry's fields seen before its "rank" field
    root_section = is_root = in_traceback = False
    for line in lines:
        title = _TITLE.match(line)
        if title:
            facts.setdefault("script", title.group(1))
            continue
        if "Root Cause" in line or "Failures:" in line or _RULE.match(line):
            root_section = "Root Cause" in line or (root_section and "Failures:" not in line)
            entry, pending, in_traceback = None, None, False
            continue
        if _ENTRY.match(line):
            entry, pending, in_traceback, is_root = None, {}, False, root_section
            continue
        found = _FIELD.match(line)
        if found and pending is not None and not in_traceback:
            key, value = found.group(1), found.group(2).strip()
            if key == "rank" and (number := _RANK_FIELD.match(value)):
                entry = ranks.of(int(number.group(1)))
                if number.group(2):
                    entry.local_rank = int(number.group(2))
                if is_root:
                    facts["root_cause"] = entry.rank
                for earlier, text in pending.items():
                    _summary_field(entry, earlier, text)
            elif entry is None:
                pending[key] = value
            else:
                _summary_field(entry, key, value)
            if key in ("traceback", "msg") and entry is not None:
                in_traceback = True
                if not value.startswith(("To enable traceback", "<N/A>", '"Process failed')):
                    entry.lines.append(value.strip('"'))
            continue
        if in_traceback and entry is not None and line.startswith("  "):
            entry.lines.append(line[2:])
        else:
            in_traceback = False


def _summary_field(entry: _Rank, key: str, value: str) -> None:
    if key == "host":
        entry.host = value
    elif key == "exitcode":
        code = _EXIT_FIELD.match(value)
        if code:
            entry.exitcode = int(code.group(1))
            entry.pid = int(code.group(2)) if code.group(2) else entry.pid
    elif key == "time" and entry.time is None:
        entry.time = _summary_time(value)


def _summary_time(value: str) -> float | None:
    try:  # the agent's local time, to the second: "2026-11-26_18:28:26"
        return datetime.fromisoformat(value.replace("_", "T")).timestamp()
    except ValueError:
        return None


def _peel(line: str, labelled: bool = False) -> tuple[int | None, int | None, str | None, str]:
    """(global rank, local rank, host, the line) from a launcher's prefixes; ``labelled``: the
    log is ``srun --label``'s, each line led by its task number (the global rank)."""
    rank = local = None
    host = None
    line = _GLOG.sub("", _RAY.sub("", line))
    if labelled and (task := _SRUN_LABEL.match(line)):
        rank, line = int(task.group(1)), line[task.end() :]
    elif pdsh := _PDSH.match(line):
        host, line = pdsh.group(1), line[pdsh.end() :]
    while True:
        prefix = _PREFIX.match(line)
        if not prefix:
            return rank, local, host, line
        number = int(prefix.group("n"))
        if prefix.group("kind") == "rank":
            rank = number
        else:
            local = number
        line = line[prefix.end() :]
        line = line[1:] if line.startswith(" [") else line


def _is_multi_rank(text: str) -> bool:
    marks = (
        "[rank", "[default", "ChildFailedError", "terminated with the following error",
        "ProcessExitedException", "ProcessRaisedException", "[launch.py:", "GLOBAL_RANK:",
        "Watchdog caught collective", "notebook_launcher", "elastic_launch",
        # the elastic agent's own lines, where the paste stops before its ChildFailedError
        ") local_rank: ", "closing signal SIG",
    )  # fmt: skip
    return any(mark in text for mark in marks) or _srun_labelled(text)


def _srun_labelled(text: str) -> bool:
    """Lines led by at least two task numbers, and a traceback among them."""
    if _SRUN_TRACEBACK.search(text) is None:
        return False
    return len(set(re.findall(r"(?m)^\s*(\d+): ", text))) >= 2


def read_text(text: str) -> JobLog | None:
    """The job a console log, a traceback or a JSON record/error file shows; None where the
    text shows no multi-rank job (a single process's log is read as before)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if data is not None:
            return _from_json_files([data])
    if not _is_multi_rank(text):
        return None
    return _from_console(normalize(text))


def _from_console(text: str) -> JobLog | None:
    ranks = _Ranks()
    stray: list[str] = []
    facts: dict[str, Any] = {}
    by_local: dict[int, int] = {}  # --tee's local rank -> the global rank its lines name
    spawn_index: int | None = None
    raised = False  # the quoted traceback's exception line was seen
    pids: dict[int, str] = {}  # pid -> the signal the launcher sent it
    launcher: Launcher = "unknown"
    labelled = _srun_labelled(text)
    for number, raw in enumerate(text.splitlines()):
        rank, local, host, line = _peel(raw, labelled)
        if rank is not None and local is not None:
            by_local[local] = rank
        if rank is None and local is not None:
            rank = by_local.get(local)
            if rank is None:
                # --tee without a rank prefix on this line: its local rank stands in, mapped
                # back to the global rank once a "[rankN]:" line or the summary says which.
                rank = -1 - local
        if rank is not None:
            launcher = "srun" if labelled and launcher in ("unknown", "srun") else "torchrun"
            entry = ranks.of(rank)
            if local is not None and rank >= 0:
                entry.local_rank = local
            entry.host = entry.host or host
            entry.lines.append(line)
            entry.order = min(entry.order, number) if _failure_line(line) else entry.order
            continue
        inner = _INNER_RANK.search(line)
        # NCCL's failure lines name their rank; DeepSpeed's info lines ("[Rank 0] DeepSpeed
        # info: ...") do too, but say nothing of a failure.
        if inner and spawn_index is None and _failure_line(line):
            entry = ranks.of(int(inner.group(1)))
            entry.lines.append(line)
            entry.order = min(entry.order, number)
            continue
        if match := _SPAWN_RAISED.match(line.strip()):
            spawn_index, launcher = int(match.group(1)), "spawn"
            ranks.of(spawn_index).order = min(ranks.of(spawn_index).order, number)
            raised = False
            continue
        if spawn_index is not None:
            # The quoted traceback ends at the first empty line after its exception line.
            if not line.strip() and raised:
                spawn_index = None
            else:
                raised = raised or bool(line[:1].strip() and not line.startswith("Traceback"))
                ranks.of(spawn_index).lines.append(line)
                continue
        stray.append(line)
        if match := _SPAWN_EXITED.search(line):
            entry = ranks.of(int(match.group(1)))
            launcher = "spawn"
            sig = match.group(2)
            code = -(_signal_number(sig) or 0) if sig else int(match.group(3))
            entry.exitcode, entry.order = code, min(entry.order, number)
        elif match := _SPAWN_TERMINATING.search(line):
            pids[int(match.group(1))] = match.group(2)
            launcher = "spawn" if launcher == "unknown" else launcher
        elif match := _AGENT_FAILED.search(line):
            launcher = "torchrun"
            facts.setdefault("agent_failed", []).append(
                (int(match.group(2)), int(match.group(1)), int(match.group(3)))
            )
        elif match := _AGENT_SIGNAL.search(line):
            launcher = "torchrun"
            pids[int(match.group(1))] = match.group(2)
        elif match := _DS_EXIT.search(line):
            launcher = "deepspeed"
            entry = ranks.of(int(match.group(1)))
            entry.local_rank, entry.exitcode = int(match.group(1)), int(match.group(2))
        elif match := _DS_CMD.search(line):
            launcher = "deepspeed"
            # The launcher's own options ("--world_info=..."), then the user's script and its
            # arguments: what `deepspeed` was given after its options.
            words = match.group("rest").split()
            while words and words[0].startswith("--"):
                words.pop(0)
            facts["script_command"] = " ".join(words)
        elif match := _DS_WORLD.search(line):
            launcher = "deepspeed"
            if line.count("': [") == 1:  # one host: its local ranks are the world
                facts["world_size"] = len(match.group(2).split(","))
        elif match := _LIGHTNING.search(line):
            launcher = "lightning" if launcher == "unknown" else launcher
            facts["world_size"] = int(match.group(2))
        if (command := _COMMAND.match(line.strip())) and "command" not in facts:
            facts["command"] = command.group("cmd").strip()
    _summary(stray, ranks, facts)
    _settle_local_ranks(ranks, by_local)
    for local, code, pid in facts.get("agent_failed", []):
        failed = next((r for r in ranks.values() if r.local_rank == local), None)
        entry = failed or ranks.of(local)
        entry.exitcode = code if entry.exitcode is None else entry.exitcode
        entry.pid = entry.pid or pid
    for entry in ranks.values():
        if entry.exitcode is None and entry.pid in pids:
            entry.exitcode = -(_signal_number(pids[entry.pid]) or 15)
    signalled = len(pids.keys() - {entry.pid for entry in ranks.values()})
    stray_text = "\n".join(stray)
    if not ranks and launcher == "unknown":
        return None
    if "ChildFailedError" in text and launcher == "unknown":
        launcher = "torchrun"
    # mp.spawn numbers its processes; the elastic agent (which runs them the same way when it
    # forks) numbers them by rank in its own lines and summary.
    elastic = "agent_failed" in facts or "ChildFailedError" in text
    unit = "process" if launcher == "spawn" and not elastic else "rank"
    launcher = _launcher_named(text, facts.get("command"), launcher)
    return JobLog(
        launcher=launcher,
        ranks=tuple(ranks[r].frozen() for r in sorted(ranks)),
        stray=stray_text,
        root_cause=facts.get("root_cause"),
        command=facts.get("command"),
        script=facts.get("script") or _entry_script(text),
        script_command=facts.get("script_command"),
        world_size=facts.get("world_size"),
        unit=unit,
        signalled=signalled,
    )


def _settle_local_ranks(ranks: _Ranks, by_local: dict[int, int]) -> None:
    """Lines kept under a local rank (``-1 - local``) join the global rank it maps to."""
    for key in [k for k in ranks if k < 0]:
        local = -1 - key
        target = by_local.get(local)
        if target is None:
            target = next((r.rank for r in ranks.values() if r.local_rank == local), None)
        holder = ranks.pop(key)
        if target is None:
            target = local  # one node: the local rank is the global rank
        entry = ranks.of(target)
        entry.local_rank = local
        entry.lines = [*holder.lines, *entry.lines]
        entry.order = min(entry.order, holder.order)


_FAILURE_WORDS = re.compile(
    r"Traceback|[Ee]rror|Exception|Assertion|Signal|[Tt]ime(?:d)? ?out|timing out|[Ww]atchdog"
    r"|[Aa]bort|failed|what\(\)"
)


def _failure_line(line: str) -> bool:
    return _FAILURE_WORDS.search(line) is not None


def _launcher_named(text: str, command: str | None, found: Launcher) -> Launcher:
    head = (command or "").split()
    if "accelerate" in head or "accelerate/commands/launch.py" in text:
        return "accelerate"
    if any(word.endswith("deepspeed") for word in head[:3]):
        return "deepspeed"
    if command and found == "unknown":
        return "torchrun"
    # Started from Python, not from a command: notebook_launcher and elastic_launch name a
    # function as the entry point ("of fn: train"); mp.spawn and start_processes are called.
    from_python = found == "spawn" or " of fn: " in text or "notebook_launcher" in text
    if from_python and _NOTEBOOK.search(text):
        return "notebook"
    if found == "torchrun" and " of fn: " in text:
        return "python"
    return found


_MODULE_FRAME = re.compile(r'File "(?P<file>[^"]+\.py)", line \d+, in <module>')


def _entry_script(text: str) -> str | None:
    """The script a traceback started from: its outermost ``<module>`` frame."""
    found = _MODULE_FRAME.search(text)
    if found is None or "site-packages" in found.group("file") or "<frozen" in found.group(0):
        return None
    return found.group("file")


# --- reading a directory -------------------------------------------------------------------------
def _from_json_files(items: Iterable[Any], ranks: _Ranks | None = None) -> JobLog | None:
    ranks = ranks if ranks is not None else _Ranks()
    elastic = False
    for data in items:
        record = record_of(data)
        if record is not None:
            _add_record(ranks, record)
        if isinstance(data, Mapping) and "message" in data:
            elastic = True
    if not ranks:
        return None
    return JobLog(
        launcher="torchrun" if elastic else "unknown",
        ranks=tuple(ranks[r].frozen() for r in sorted(ranks)),
        world_size=_world(ranks),
    )


def _world(ranks: _Ranks) -> int | None:
    sizes = [_int(r.record.get("world_size")) for r in ranks.values() if r.record]
    known = [size for size in sizes if size is not None]
    return max(known) if known else None


_RECORD_FILE = re.compile(r"^rank-(\d+)\.json$")
_MAX_FILE = 16 * 1024 * 1024


def _read(path: Path) -> str:
    try:
        with path.open("rb") as stream:
            return stream.read(_MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return ""


def read_directory(path: Path) -> JobLog | None:
    """A ``--log-dir`` (the newest attempt of each run found under it) or a directory of
    per-rank records; None where it holds neither."""
    ranks = _Ranks()
    records = sorted(p for p in path.rglob("rank-*.json") if _RECORD_FILE.match(p.name))
    for file in records:
        record = record_of(_json(file))
        if record is not None:
            _add_record(ranks, record)
    attempts = sorted(path.rglob("attempt_*"), key=lambda p: (str(p.parent), _int(p.name[8:]) or 0))
    newest: dict[Path, Path] = {}
    for attempt in attempts:
        if attempt.is_dir():
            newest[attempt.parent] = attempt
    elastic = bool(newest)
    for attempt in newest.values():
        _read_attempt(attempt, ranks)
    if not ranks:
        return None
    job = JobLog(
        launcher="torchrun" if elastic else "unknown",
        ranks=tuple(ranks[r].frozen() for r in sorted(ranks)),
        world_size=_world(ranks),
        script=next(
            filter(None, (_entry_script("\n".join(r.lines)) for r in ranks.values())), None
        ),
        log_dir=str(path),
    )
    return job


def _read_attempt(attempt: Path, ranks: _Ranks) -> None:
    """``attempt_<n>/<local_rank>/``: stderr.log and stdout.log (``--redirects``) and error.json
    (``@record``). Their lines carry no rank: the rank is the error file's record, a
    ``[rankN]:`` prefix in stderr (2.x), else the local rank (one node)."""
    for folder in sorted(p for p in attempt.iterdir() if p.is_dir() and p.name.isdigit()):
        local = int(folder.name)
        text = (
            normalize(_read(folder / "stderr.log")) + "\n" + normalize(_read(folder / "stdout.log"))
        )
        data = _json(folder / "error.json") if (folder / "error.json").is_file() else None
        record = record_of(data) if data is not None else None
        lines: list[str] = []
        rank: int | None = _int(record.get("rank")) if record else None
        for raw in text.splitlines():
            named, _local, _host, line = _peel(raw)
            rank = named if rank is None and named is not None else rank
            if line.strip():
                lines.append(line)
        entry = ranks.of(rank if rank is not None else local)
        entry.local_rank = local
        if record is not None and entry.record is None:
            _add_record(ranks, record)
        elif isinstance(data, Mapping):
            error_text, stamp = _error_file_text(data)
            entry.time = entry.time if entry.time is not None else stamp
            if error_text and error_text not in text:
                lines.append(error_text)
        entry.lines.extend(lines)
        if any(_failure_line(line) for line in lines):
            entry.order = min(entry.order, local)
