"""``nb-cudaguard explain`` over a multi-rank job: read it, judge it, print the verdict."""

from __future__ import annotations

import json
from pathlib import Path

from .logs import JobLog, read_directory, read_text
from .report import to_payload, to_report
from .verdict import judge


def explain_job(source: str | Path, as_json: bool) -> bool | None:
    """Print the verdict on a job's log (a text) or ``--log-dir``/records (a directory), and
    return True; print nothing and return None where it shows no multi-rank job, False where
    none of its ranks holds a CUDA error or a guard's refusal (a text is then read as one
    process's log)."""
    job: JobLog | None = read_directory(source) if isinstance(source, Path) else read_text(source)
    if job is None:
        return None
    verdict = judge(job)
    if verdict.diagnosis is None and not verdict.culprits:
        return False
    print(json.dumps(to_payload(verdict), indent=2) if as_json else to_report(verdict))
    return True
