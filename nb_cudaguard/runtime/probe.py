"""Is this process's CUDA context poisoned, and on which device? Ask without initialising CUDA,
hanging or reading tensors.

After a sticky error every CUDA call returns the same error (NVIDIA's error types, "the process
must be terminated and relaunched": https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html),
so one non-blocking call per device is enough: ``cuStreamQuery`` never waits for work. Three
traps shape how it is asked (docs/how-it-works.md#is-the-context-poisoned):

- a new thread's current device is 0: a query from there would create a context on GPU 0 and
  report a poisoned ``cuda:1`` healthy. So only devices whose primary context is already active
  (``cuDevicePrimaryCtxGetState``, which creates nothing) are asked, each in its own context: the
  caller's device on the caller's current stream (read in the caller's thread), every other device
  that the notebook used (a 2xT4 Kaggle machine, ``DataParallel``) on its default stream;
- ``Stream.query()`` holds the GIL, so a time limit on its thread cannot help if the driver blocks.
  The driver API called through ``ctypes`` releases the GIL for the call, so the time limit holds;
- a wedged driver never returns. A worker stuck in it is abandoned, and later questions answer
  "unknown" at once instead of stacking more stuck threads.

In the caller's thread only host-side bookkeeping is read (torch's current device and stream, the
thread's current context). Where the driver library cannot be loaded (ROCm, an unusual install),
torch's own query of the current device is the fallback; it holds the GIL, so there the time limit
is only as good as that query.
"""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from ..diagnosis.classify import classify_exception, error_for_code
from ..diagnosis.model import ContextState

PROBE_TIMEOUT_S = 2.0
_NOT_READY = 600  # CUDA_ERROR_NOT_READY: work still queued, the context answers
_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Probe:
    """What the probe found: overall, and per device that has a context."""

    state: ContextState
    devices: tuple[tuple[int, ContextState], ...] = ()

    @property
    def device(self) -> int | None:
        """The device the state is about: the first poisoned one, else the only one used."""
        for index, state in self.devices:
            if state is ContextState.POISONED:
                return index
        return self.devices[0][0] if len(self.devices) == 1 else None

    @property
    def used(self) -> tuple[int, ...]:
        return tuple(index for index, _ in self.devices)


_driver_cache: list[Any] = []


def _driver() -> Any | None:
    if not _driver_cache:
        found = None
        for name in _DRIVER_NAMES:
            try:
                found = ctypes.CDLL(name)
                break
            except OSError:
                continue
        _driver_cache.append(found)
    return _driver_cache[0]


def _state_for_code(code: int) -> ContextState:
    if code in (0, _NOT_READY):
        return ContextState.HEALTHY
    error = error_for_code(code)
    return ContextState.POISONED if error is not None and error.sticky else ContextState.UNKNOWN


def _caller_context(driver: Any) -> ctypes.c_void_p | None:
    context = ctypes.c_void_p()
    if driver.cuCtxGetCurrent(ctypes.byref(context)) != 0 or not context.value:
        return None
    return context


def _driver_query(torch: Any) -> Callable[[], list[tuple[int, ContextState]]] | None:
    """A query of every device that already has a primary context, each in its own context,
    through the driver API; None where the driver cannot be loaded."""
    driver = _driver()
    if driver is None:
        return None
    # Read in the caller's thread: its current context, device and stream.
    caller_context = _caller_context(driver)
    caller_device = int(torch.cuda.current_device())
    # torch's current stream only where this thread has a context: reading it initialises
    # torch's stream state, which creates a context (seen on an H100 after torch.cuda.init()).
    caller_stream = (
        None
        if caller_context is None
        else ctypes.c_void_p(int(torch.cuda.current_stream().cuda_stream))
    )
    release = getattr(driver, "cuDevicePrimaryCtxRelease_v2", None) or getattr(
        driver, "cuDevicePrimaryCtxRelease", None
    )

    def query() -> list[tuple[int, ContextState]]:
        found: list[tuple[int, ContextState]] = []
        count = ctypes.c_int()
        if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            count.value = 0
        for ordinal in range(count.value):
            device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            if driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
                continue
            code = driver.cuDevicePrimaryCtxGetState(
                device, ctypes.byref(flags), ctypes.byref(active)
            )
            if code != 0:
                found.append((ordinal, _state_for_code(code)))
                continue
            if not active.value:
                continue  # never asked: asking would create a context
            if (
                ordinal == caller_device
                and caller_context is not None
                and caller_stream is not None
            ):
                context, stream, retained = caller_context, caller_stream, False
            else:
                # Active already: retaining only counts a reference, it creates nothing.
                context, stream = ctypes.c_void_p(), ctypes.c_void_p(None)
                code = driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
                if code != 0:
                    found.append((ordinal, _state_for_code(code)))
                    continue
                retained = True
            try:
                code = driver.cuCtxSetCurrent(context)
                if code == 0:
                    code = int(driver.cuStreamQuery(stream))
                found.append((ordinal, _state_for_code(code)))
            finally:
                if retained and release is not None:
                    release(device)
        return found

    return query


def _torch_query(torch: Any) -> Callable[[], list[tuple[int, ContextState]]]:
    device = int(torch.cuda.current_device())
    stream = torch.cuda.current_stream()  # the caller's device, read in the caller's thread

    def query() -> list[tuple[int, ContextState]]:
        try:
            stream.query()
        except Exception as error:
            found = classify_exception(error)
            sticky = found is not None and found.sticky
            return [(device, ContextState.POISONED if sticky else ContextState.UNKNOWN)]
        return [(device, ContextState.HEALTHY)]

    return query


class _Worker:
    """One daemon thread that runs driver calls for a caller who waits at most a time limit.

    A call that overruns leaves the thread stuck in the driver: it is abandoned, and until it
    comes back every call answers None at once (one stuck thread, never one per question).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy: threading.Event | None = None  # the request still running, if any
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            function, box, done = self._requests.get()
            try:
                box.append(function())
            except BaseException:
                pass
            finally:
                done.set()

    def submit(self, function: Callable[[], _T]) -> tuple[list[_T], threading.Event] | None:
        """Queue ``function``; None while an earlier call is stuck."""
        with self._lock:
            if self._busy is not None and not self._busy.is_set():
                return None
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            box: list[_T] = []
            done = threading.Event()
            self._busy = done
            self._requests.put((function, box, done))
            return box, done

    def call(self, function: Callable[[], _T], timeout: float) -> _T | None:
        """``function()``, or None if it raised, overran ``timeout`` or a call is stuck."""
        submitted = self.submit(function)
        if submitted is None:
            return None
        box, done = submitted
        done.wait(timeout)
        return box[0] if box else None


_probe_worker = _Worker("nb_cudaguard-probe")


def _initialised(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def probe_devices(torch: ModuleType | Any | None = None, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """Probe every CUDA context of this process: only devices that already have one.

    ``torch`` defaults to the already imported module: torch is never imported here, and CUDA is
    never initialised (an uninitialised process cannot be poisoned).
    """
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is None or not _initialised(torch):
        return Probe(ContextState.NO_CUDA)
    try:
        query = _driver_query(torch) or _torch_query(torch)
    except Exception as error:  # reading the current stream can meet the sticky error itself
        found = classify_exception(error)
        sticky = found is not None and found.sticky
        return Probe(ContextState.POISONED if sticky else ContextState.UNKNOWN)
    devices = _probe_worker.call(query, timeout)
    if devices is None:
        return Probe(ContextState.UNKNOWN)
    states = [state for _, state in devices]
    if not states:
        overall = ContextState.NO_CUDA  # initialised, but no context created yet
    elif ContextState.POISONED in states:
        overall = ContextState.POISONED
    elif all(state is ContextState.HEALTHY for state in states):
        overall = ContextState.HEALTHY
    else:
        overall = ContextState.UNKNOWN
    return Probe(overall, tuple(devices))


def probe_context(
    torch: ModuleType | Any | None = None, timeout: float = PROBE_TIMEOUT_S
) -> ContextState:
    """Probe the CUDA contexts of this process: ``poisoned`` if any device's is."""
    return probe_devices(torch, timeout).state


# --- the cell tracker's question: did the cell leave work queued? -------------------------------

_queue_worker = _Worker("nb_cudaguard-cells")


def ask_work_queued(torch: Any) -> tuple[list[bool], threading.Event] | None:
    """Ask, without waiting, whether the caller's current stream still has work queued.

    The answer lands in the returned list once the event is set; None where it cannot be asked
    (no driver library, no context in this thread, an earlier question stuck in the driver).
    The caller's context and stream are read here, in the caller's thread.
    """
    driver = _driver()
    if driver is None:
        return None
    context = _caller_context(driver)
    if context is None:
        return None
    stream = ctypes.c_void_p(int(torch.cuda.current_stream().cuda_stream))

    def queued() -> bool:
        if driver.cuCtxSetCurrent(context) != 0:
            return False
        return int(driver.cuStreamQuery(stream)) == _NOT_READY

    return _queue_worker.submit(queued)
