"""The context probe on a CPU machine: what it reports, and that a wedged query costs one thread
and a time limit, never the notebook. (The driver itself: tests/notebook/test_gpu_foundation.py.)"""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from nb_cudaguard.diagnosis.model import ContextState  # noqa: E402
from nb_cudaguard.runtime.probe import Probe, probe_devices  # noqa: E402


@pytest.fixture
def hanging_stream(monkeypatch):
    """torch.cuda as if initialised, with a stream query that blocks until released."""
    release = threading.Event()

    class HangingStream:
        def query(self) -> bool:
            release.wait(30)
            return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: HangingStream())
    yield release
    release.set()
    deadline = time.monotonic() + 5
    while _probe_threads_busy() and time.monotonic() < deadline:
        time.sleep(0.01)


def _probe_threads_busy() -> bool:
    from nb_cudaguard.runtime import probe

    busy = probe._probe_worker._busy
    return busy is not None and not busy.is_set()


def _probe_threads() -> int:
    return sum(t.name == "nb_cudaguard-probe" for t in threading.enumerate())


def test_a_stuck_query_answers_unknown_within_the_time_limit(hanging_stream):
    started = time.monotonic()
    assert probe_devices(timeout=0.2).state is ContextState.UNKNOWN
    assert time.monotonic() - started < 1.0


def test_while_a_query_is_stuck_later_probes_answer_at_once_without_a_new_thread(hanging_stream):
    probe_devices(timeout=0.2)
    started = time.monotonic()
    for _ in range(5):
        assert probe_devices(timeout=0.2).state is ContextState.UNKNOWN
    assert time.monotonic() - started < 0.5
    assert _probe_threads() == 1


def test_once_the_driver_answers_again_the_probe_works_again(hanging_stream):
    probe_devices(timeout=0.2)
    hanging_stream.set()
    time.sleep(0.2)
    found = probe_devices(timeout=2)
    assert found.state is ContextState.HEALTHY
    assert found.devices == ((0, ContextState.HEALTHY),)


def test_without_cuda_initialised_nothing_is_asked():
    assert not torch.cuda.is_initialized()
    assert probe_devices() == Probe(ContextState.NO_CUDA)


def test_the_device_named_is_the_poisoned_one_else_the_only_one():
    two = Probe(ContextState.POISONED, ((0, ContextState.HEALTHY), (1, ContextState.POISONED)))
    assert two.device == 1 and two.used == (0, 1)
    assert Probe(ContextState.HEALTHY, ((1, ContextState.HEALTHY),)).device == 1
    both = Probe(ContextState.HEALTHY, ((0, ContextState.HEALTHY), (1, ContextState.HEALTHY)))
    assert both.device is None
