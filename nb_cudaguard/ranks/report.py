"""A job's verdict as the user reads it: the one line, each rank's role, the re-run command, and
the culprit's diagnosis in the launcher's words; or as JSON (the diagnosis payload, plus
``distributed``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..diagnosis.advice import BLOCKING, Setting, script
from ..diagnosis.render import to_text
from ..diagnosis.schema import SCHEMA_VERSION, to_json
from .logs import JobLog
from .rerun import Rerun, rerun
from .verdict import Verdict

_ARGUMENTS = " <your script's arguments>"


def culprit_local_rank(verdict: Verdict) -> int | None:
    if not verdict.culprits:
        return None
    log = verdict.culprits[0].log
    return log.local_rank if log.local_rank is not None else None


def setting(job: JobLog, again: Rerun) -> Setting:
    """The diagnosis's advice in the words of the job's launcher, not of ``python train.py``."""
    if job.launcher == "notebook":
        how = f"`{again.command}` {again.note}"
        return replace(
            script(),
            owner="the failed process",
            blocking_rerun=f"Run the launcher again with {BLOCKING}: {how}",
            command=again.command,
            plain_command="the cell that starts the processes",
            restart_how=f"Run the launcher again with {BLOCKING} ({how})",
        )
    launcher = again.command.removeprefix(f"{BLOCKING} ").removesuffix(_ARGUMENTS)
    return script(launcher)


def to_payload(verdict: Verdict) -> dict[str, Any]:
    """The diagnosis payload (docs/panel.md) with ``distributed`` beside it; for a guard's
    refusal, which has no diagnosis, ``distributed`` alone."""
    job = verdict.job
    again = rerun(job, culprit_local_rank(verdict))
    distributed = {
        "launcher": job.launcher,
        "verdict": verdict.line or None,
        "culprit": verdict.culprits[0].log.rank if verdict.culprits else None,
        "unit": job.unit,
        "ranks": [
            {
                "rank": r.log.rank,
                "local_rank": r.log.local_rank,
                "host": r.log.host,
                "pid": r.log.pid,
                "exitcode": r.log.exitcode,
                "time": r.log.time,
                "role": r.role,
                "reason": r.reason,
                "cause": r.diagnosis.cause if r.diagnosis else None,
                "inferred": r.inferred,
            }
            for r in verdict.roles
        ],
        "launcher_root_cause": job.root_cause,
        "notes": list(verdict.notes),
        "rerun": {
            "command": again.command,
            "placeholders": again.placeholders,
            "note": again.note or None,
        }
        if verdict.diagnosis is not None
        else None,
    }
    if verdict.diagnosis is None:
        return {"schema_version": SCHEMA_VERSION, "distributed": distributed}
    return {**to_json(verdict.diagnosis, setting(job, again)), "distributed": distributed}


def to_report(verdict: Verdict) -> str:
    job = verdict.job
    local = culprit_local_rank(verdict)
    again = rerun(job, local)
    lines = [f"nb-cudaguard: {verdict.line}."]
    width = max(len(str(r.log.rank)) for r in verdict.roles) if verdict.roles else 1
    for role in verdict.roles:
        guess = " (by elimination)" if role.inferred else ""
        lines.append(
            f"  {job.unit} {role.log.rank:>{width}}  {role.role:<10}  {role.reason}{guess}"
        )
    lines += verdict.notes
    whose = (
        f", {job.unit} {verdict.culprits[0].log.rank}'s lines kept apart"
        if verdict.culprits and job.launcher == "torchrun" and local is not None
        else ""
    )
    if verdict.diagnosis is None:
        # A guard's refusal: the batch never reached the GPU, so no context broke and a
        # blocking run would show nothing more.
        lines += ["", "The guard refused the batch before the GPU saw it: fix that input."]
        return "\n".join(lines)
    lines += ["", f"Run it again in blocking mode{whose}:", f"  {again.command}"]
    if again.note:
        lines.append(f"  ({again.note})")
    if again.placeholders:
        lines.append("  (<...>: what the log does not show; fill in your own)")
    lines += ["", to_text(verdict.diagnosis, setting=setting(job, again)).strip("\n")]
    return "\n".join(lines)
