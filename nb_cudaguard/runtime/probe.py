"""Is this process's CUDA context poisoned? Ask without initialising CUDA, hanging or reading
tensors.

After a sticky error every CUDA runtime call returns the same error (FIELD_NOTES §2), so one
non-blocking call is enough: ``cudaStreamQuery`` on the current stream (``Stream.query()``) never
waits for work. It still runs in a daemon thread with a time limit, because a wedged driver can
block any call.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

from ..diagnosis.classify import classify_exception
from ..diagnosis.model import ContextState

PROBE_TIMEOUT_S = 2.0


def _query(torch: Any) -> None:
    torch.cuda.current_stream().query()


def probe_context(
    torch: ModuleType | Any | None = None, timeout: float = PROBE_TIMEOUT_S
) -> ContextState:
    """Probe the CUDA context of this process.

    ``torch`` defaults to the already imported module: torch is never imported here, and CUDA is
    never initialised (an uninitialised process cannot be poisoned).
    """
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is None:
        return ContextState.NO_CUDA
    try:
        if not torch.cuda.is_initialized():
            return ContextState.NO_CUDA
    except Exception:
        return ContextState.UNKNOWN

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            _query(torch)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    worker = threading.Thread(target=run, name="nb_cudaguard-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return ContextState.UNKNOWN
    error = outcome[0]
    if error is None:
        return ContextState.HEALTHY
    found = classify_exception(error)
    if found is not None and found.sticky:
        return ContextState.POISONED
    return ContextState.UNKNOWN
