"""Is this process's CUDA context poisoned? Ask without initialising CUDA, hanging or reading
tensors.

After a sticky error every CUDA call returns the same error (FIELD_NOTES §2), so one non-blocking
call is enough: ``cuStreamQuery`` on the caller's current stream never waits for work. Two traps
shape how it is asked (FIELD_NOTES §7):

- a new thread's current device is 0: the query must name the caller's context, or a user on
  ``cuda:1`` gets a context created on GPU 0 and a poisoned device 1 reported healthy. So the
  caller's context and stream are read in the caller's thread and handed to the worker;
- ``Stream.query()`` holds the GIL, so a time limit on its thread cannot help if the driver blocks.
  The driver API called through ``ctypes`` releases the GIL for the call, so the time limit holds.

Where the driver library cannot be loaded (ROCm, an unusual install), torch's own query is used.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..diagnosis.classify import classify_exception, error_for_code
from ..diagnosis.model import ContextState

PROBE_TIMEOUT_S = 2.0
_NOT_READY = 600  # CUDA_ERROR_NOT_READY: work still queued, the context answers
_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def _driver() -> Any | None:
    for name in _DRIVER_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _driver_query(torch: Any) -> Callable[[], ContextState] | None:
    """A query of the caller's current stream in the caller's context, through the driver API;
    None where the driver or the caller's context cannot be had."""
    driver = _driver()
    if driver is None:
        return None
    context = ctypes.c_void_p()
    if driver.cuCtxGetCurrent(ctypes.byref(context)) != 0 or not context.value:
        return None
    stream = ctypes.c_void_p(int(torch.cuda.current_stream().cuda_stream))

    def query() -> ContextState:
        if driver.cuCtxSetCurrent(context) != 0:
            return ContextState.UNKNOWN
        code = int(driver.cuStreamQuery(stream))
        if code in (0, _NOT_READY):
            return ContextState.HEALTHY
        error = error_for_code(code)
        return ContextState.POISONED if error is not None and error.sticky else ContextState.UNKNOWN

    return query


def _torch_query(torch: Any) -> Callable[[], ContextState]:
    stream = torch.cuda.current_stream()  # the caller's device, read in the caller's thread

    def query() -> ContextState:
        try:
            stream.query()
        except Exception as error:
            found = classify_exception(error)
            return (
                ContextState.POISONED
                if found is not None and found.sticky
                else ContextState.UNKNOWN
            )
        return ContextState.HEALTHY

    return query


def probe_context(
    torch: ModuleType | Any | None = None, timeout: float = PROBE_TIMEOUT_S
) -> ContextState:
    """Probe the CUDA context of this process (the calling thread's current device).

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
        query = _driver_query(torch) or _torch_query(torch)
    except Exception as error:  # reading the current stream can meet the sticky error itself
        found = classify_exception(error)
        return ContextState.POISONED if found is not None and found.sticky else ContextState.UNKNOWN

    outcome: list[ContextState] = []

    def run() -> None:
        try:
            outcome.append(query())
        except BaseException:
            outcome.append(ContextState.UNKNOWN)

    worker = threading.Thread(target=run, name="nb_cudaguard-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else ContextState.UNKNOWN
