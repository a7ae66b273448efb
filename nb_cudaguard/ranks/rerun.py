"""The command that runs a failed job again in blocking mode, in the words of its launcher.

Built only from what the log shows: the launch command where it was echoed, else the launcher's
form with ``<placeholders>`` for what the log does not say. For torchrun, the culprit's lines are
kept apart: ``--local-ranks-filter`` shows only its local rank on the console, ``--redirects 3
--log-dir`` keeps every rank's stdout and stderr in its own file (torch/distributed/run.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..diagnosis.advice import BLOCKING
from .logs import JobLog

# torchrun's options that take no value (torch/distributed/run.py: store_true / check_env).
_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
     "--use-env", "--use_env", "--virtual-local-rank", "--virtual_local_rank"}
)  # fmt: skip
_OURS = frozenset(
    {"--local-ranks-filter", "--local_ranks_filter", "--redirects", "-r", "--log-dir",
     "--log_dir", "--tee", "-t"}
)  # fmt: skip


@dataclass(frozen=True)
class Rerun:
    command: str  # for a notebook: the line to run in a cell before the launcher's
    placeholders: bool  # holds <...> parts the log does not show
    note: str = ""


def _split(command: str) -> list[str] | None:
    try:
        return shlex.split(command)
    except ValueError:
        return None


def _option_value(words: list[str], names: frozenset[str]) -> str | None:
    for index, word in enumerate(words):
        name, _eq, value = word.partition("=")
        if name in names:
            return value or (words[index + 1] if index + 1 < len(words) else None)
    return None


def _torchrun(job: JobLog, local_rank: int | None) -> Rerun:
    words = _split(job.command) if job.command else None
    log_dir = job.log_dir or (
        _option_value(words, frozenset({"--log-dir", "--log_dir"})) if words else None
    )
    ours = ["--local-ranks-filter", str(local_rank)] if local_rank is not None else []
    ours += ["--redirects", "3", "--log-dir", shlex.quote(log_dir) if log_dir else "<dir>"]
    if words is None:
        script = shlex.quote(job.script) if job.script else "<your_script.py>"
        return Rerun(
            f"{BLOCKING} torchrun <your torchrun options> {' '.join(ours)} {script} "
            "<your script's arguments>",
            placeholders=True,
        )
    # Everything up to the launcher itself ("torchrun", "python -m torch.distributed.run"),
    # without an old CUDA_LAUNCH_BLOCKING.
    at = next(
        (i for i, w in enumerate(words) if w.endswith("torchrun") or w.startswith("torch.dist")),
        0,
    )
    head = [w for w in words[: at + 1] if not w.startswith("CUDA_LAUNCH_BLOCKING=")]
    index = at + 1
    options: list[str] = []
    while index < len(words) and words[index].startswith("-"):
        word = words[index]
        name = word.partition("=")[0]
        takes_value = "=" not in word and word not in _TORCHRUN_FLAGS
        if name not in _OURS:
            options.append(word)
            if takes_value and index + 1 < len(words):
                options.append(words[index + 1])
        index += 2 if takes_value else 1
    rest = words[index:]
    command = " ".join(
        [BLOCKING, *map(shlex.quote, head), *map(shlex.quote, options), *ours]
        + [shlex.quote(w) for w in rest]
    )
    return Rerun(command, placeholders=log_dir is None)


def _prefixed(job: JobLog, template: str) -> Rerun:
    """The echoed command with the variable in front, else the launcher's template."""
    if job.command:
        words = [w for w in _split(job.command) or [] if not w.startswith("CUDA_LAUNCH_BLOCKING=")]
        if words:
            return Rerun(" ".join([BLOCKING, *map(shlex.quote, words)]), placeholders=False)
    return Rerun(f"{BLOCKING} {template}", placeholders=True)


def rerun(job: JobLog, local_rank: int | None) -> Rerun:
    """How to run ``job`` again with blocking launches; ``local_rank``: the culprit's."""
    script = shlex.quote(job.script) if job.script else "<your_script.py>"
    if job.launcher == "torchrun":
        return _torchrun(job, local_rank)
    if job.launcher == "accelerate":
        return _prefixed(job, f"accelerate launch <your accelerate options> {script} <args>")
    if job.launcher == "deepspeed":
        target = job.script_command or f"{script} <args>"
        return _prefixed(
            job, f"deepspeed <your deepspeed options> --enable_each_rank_log <dir> {target}"
        )
    if job.launcher == "notebook":
        return Rerun(
            'import os; os.environ["CUDA_LAUNCH_BLOCKING"] = "1"',
            placeholders=False,
            note="in a cell run before the one that starts the processes (notebook_launcher, "
            "start_processes, mp.spawn): they take the kernel's environment when they start",
        )
    if job.launcher in ("spawn", "python", "lightning"):
        started = {"spawn": "mp.spawn", "python": "elastic_launch"}.get(job.launcher, "Lightning")
        return Rerun(
            f"{BLOCKING} python {script} <your script's arguments>",
            placeholders=True,
            note=f"the processes {started} starts inherit the variable",
        )
    if job.launcher == "srun":
        return Rerun(
            f"{BLOCKING} srun --label <your srun options> <your command>",
            placeholders=True,
            note="srun passes the environment on to every task (--export=ALL, its default)",
        )
    return Rerun(f"{BLOCKING} <your launch command>", placeholders=True)
