"""The optimizer's global step pre-hook of a deferred guard: the verdicts are read before any
``optimizer.step()``, so weights are never updated from a bad batch.
"""

from __future__ import annotations

import threading
from typing import Any

from .deferral import flush
from .state import _STATE

_HOOK_LOCK = threading.Lock()
_HOOK: dict[str, Any] = {"users": 0, "handle": None}


def _step_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    __tracebackhide__ = True
    if _STATE.pending:
        flush()  # raises: the step never runs, the weights stay as they were


def hook_on() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    with _HOOK_LOCK:
        if _HOOK["users"] == 0:
            _HOOK["handle"] = register_optimizer_step_pre_hook(_step_pre_hook)
        _HOOK["users"] += 1


def hook_off() -> None:
    with _HOOK_LOCK:
        _HOOK["users"] -= 1
        if _HOOK["users"] == 0 and _HOOK["handle"] is not None:
            _HOOK["handle"].remove()
            _HOOK["handle"] = None
