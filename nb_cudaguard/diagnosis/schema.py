"""The machine-readable diagnosis: what every panel carries for programs that read notebooks.

AI assistants, agents and CI tools read a notebook's outputs, not its pixels. Next to the panel's
text and HTML, the display bundle carries ``MIME_TYPE``: ``Diagnosis.to_dict()`` plus the schema
version and the recommended action, so a reader learns from the output itself that re-running cells
in this kernel is pointless and the kernel must restart. The schema is documented in docs/panel.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .advice import (
    KERNEL,
    Setting,
    broken_blocking_message,
    broken_message,
    unsure_message,
    usable_message,
)
from .model import UNKNOWN_CODE, ContextState, Diagnosis

MIME_TYPE = "application/vnd.nb-cudaguard.diagnosis+json"
SCHEMA_VERSION = 1


def recommended_action(
    diagnosis: Diagnosis, setting: Setting = KERNEL, blocking_on: bool = False
) -> dict[str, Any]:
    """What to do next, as data: restart (required, recommended or not needed: for a script,
    a new process), whether with blocking launches, whether re-running in the failed process
    (cells of this kernel) can help, and the command, in the words of ``setting``.
    ``blocking_on``: the failed process ran in blocking mode, so its traceback is the true line
    and a blocking run again would show nothing new."""
    if not diagnosis.sticky:
        # cudaErrorUnknown: NVIDIA does not say whether the context survives it; a probe that
        # found it answering settles it, a text alone does not.
        unsure = (
            diagnosis.error is not None
            and diagnosis.error.code == UNKNOWN_CODE
            and diagnosis.context is not ContextState.HEALTHY
        )
        return {
            "setting": setting.kind,
            "restart_kernel": "recommended" if unsure else "not-needed",
            "blocking": False,
            "blocking_on": blocking_on,
            "rerun_cells": True,
            "command": None,
            "message": unsure_message(setting) if unsure else usable_message(setting),
        }
    probed_alive = diagnosis.context is ContextState.HEALTHY
    return {
        "setting": setting.kind,
        # A probe that found the context answering is the only reason to hedge.
        "restart_kernel": "recommended" if probed_alive else "required",
        # The error surfaced at a later call; blocking launches raise it at the true line.
        "blocking": not blocking_on,
        "blocking_on": blocking_on,
        "rerun_cells": probed_alive,
        "command": setting.plain_command if blocking_on else setting.command,
        "message": broken_blocking_message(setting) if blocking_on else broken_message(setting),
    }


VERDICT_PREFIX = "nb_cudaguard: CUDA context "


def verdict(diagnosis: Diagnosis, blocking: bool = False, setting: Setting = KERNEL) -> str:
    """One stable, greppable line for programs that read outputs (agents, CI logs): whether the
    context is poisoned, whether a restart is required, the cause id, the command. Its form is
    fixed (docs/agents.md): ``nb_cudaguard: CUDA context <STATE>, restart <NEED>; cause=<id>;
    run: <command>``, from the same recommended action as the JSON (schema.py)."""
    action = recommended_action(diagnosis, setting, blocking_on=blocking)
    return verdict_text(action["restart_kernel"], diagnosis.cause, action["command"])


def verdict_text(restart: str, cause: str, command: str | None) -> str:
    """The verdict line from its parts: ``restart`` is the action's ``restart_kernel``."""
    state = {"required": "POISONED", "recommended": "PROBABLY POISONED"}.get(restart, "USABLE")
    return (
        f"{VERDICT_PREFIX}{state}, restart {restart.replace('-', ' ')}; cause={cause}; "
        f"run: {command or 'fix the cause and re-run the cell'}"
    )


def to_json(
    diagnosis: Diagnosis, setting: Setting = KERNEL, blocking_on: bool = False
) -> dict[str, Any]:
    """The ``MIME_TYPE`` payload: ``schema_version``, every ``Diagnosis`` field, ``action`` (in
    the words of ``setting``: the live kernel by default; ``blocking_on``: it ran in blocking
    mode)."""
    payload: dict[str, Any] = {"schema_version": SCHEMA_VERSION, **diagnosis.to_dict()}
    payload.setdefault("device", None)  # the CUDA device, where the diagnosis knows it
    payload["action"] = recommended_action(diagnosis, setting, blocking_on)
    payload["verdict"] = verdict(diagnosis, blocking_on, setting)
    return payload


def ran_blocking(payload: Mapping[str, Any]) -> bool:
    """Whether the payload's process ran in blocking mode (its traceback is the true line)."""
    action = payload.get("action")
    return isinstance(action, Mapping) and action.get("blocking_on") is True


def from_json(payload: Mapping[str, Any]) -> Diagnosis:
    """The ``Diagnosis`` back from a payload (the extra keys are ignored)."""
    return Diagnosis.from_dict(payload)
