"""On a real GPU: a real device-side assert in a fresh kernel, the probe, the panel, the fallout.

Each poisoning runs in its own kernel process: a poisoned context cannot be reused.
"""

from __future__ import annotations

import pytest
from conftest import kernel_env

pytestmark = pytest.mark.gpu

BAD_LABEL_STEP = """\
import torch, torch.nn.functional as F
logits = torch.randn(8, 3, device="cuda")
labels = torch.tensor([0, 1, 2, 3, 1, 0, 2, 1], device="cuda")  # 3 >= num_classes
loss = F.cross_entropy(logits, labels)
print(loss.item())
"""


def test_real_device_side_assert_poisons_the_context_and_shows_the_panel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(BAD_LABEL_STEP)
    assert out.reply["status"] == "error"
    panels = [d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", "")]
    assert len(panels) == 1, out.messages
    text = panels[0]["text/plain"]
    assert "The probe found this kernel's CUDA context broken (cuda:0)." in text
    # The cause comes from the device lines that the fd 2 capture read.
    assert "Cause id: `label-out-of-range`" in text
    assert "Loss.cu" in text and "Assertion `t >= 0 && t < n_classes` failed." in text

    probe = kernel.execute("import nb_cudaguard; print(nb_cudaguard.probe_context().value)")
    assert probe.stream.strip() == "poisoned"

    again = kernel.execute("torch.ones(1, device='cuda').sum().item()")
    assert again.reply["status"] == "error"
    notes = [d["text/plain"] for d in again.displays]
    assert len(notes) == 1 and "fallout of the CUDA error" in notes[0]


def test_healthy_cuda_context_probes_healthy(kernel):
    out = kernel.execute(
        "import torch, nb_cudaguard\ntorch.ones(1, device='cuda').sum().item()\n"
        "print(nb_cudaguard.probe_context().value)"
    )
    assert out.stream.strip().splitlines()[-1] == "healthy"


def test_cuda_out_of_memory_gets_no_panel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute("import torch\ntorch.empty(1 << 50, dtype=torch.uint8, device='cuda')")
    assert out.reply["status"] == "error"
    assert out.errors[0]["ename"] == "OutOfMemoryError"
    assert out.displays == []


def test_the_probe_asks_the_driver_in_the_callers_context_from_another_thread():
    # In-process: a healthy context only. A new thread has no current context and device 0; the
    # query carries the caller's, and releases the GIL while the driver answers.
    import threading

    import torch

    from nb_cudaguard import ContextState
    from nb_cudaguard.runtime.probe import _driver_query

    torch.ones(1, device="cuda").sum().item()
    query = _driver_query(torch)
    assert query is not None, "libcuda could not be loaded"
    answers: list[list[tuple[int, ContextState]]] = []
    worker = threading.Thread(target=lambda: answers.append(query()))
    worker.start()
    worker.join(10)
    assert answers == [[(0, ContextState.HEALTHY)]]


PRIMARY_CONTEXTS = """
import ctypes, torch
driver = ctypes.CDLL("libcuda.so.1")
def active():
    states = []
    for ordinal in range(torch.cuda.device_count()):
        flags, on = ctypes.c_uint(), ctypes.c_int()
        driver.cuDevicePrimaryCtxGetState(ordinal, ctypes.byref(flags), ctypes.byref(on))
        states.append(on.value)
    return states
"""


def test_the_probe_creates_no_context_on_any_device():
    import subprocess
    import sys

    code = PRIMARY_CONTEXTS + (
        "torch.cuda.init()\n"
        "from nb_cudaguard.runtime.probe import probe_devices\n"
        "before = active()\n"
        "found = probe_devices()\n"
        "had = tuple(i for i, on in enumerate(before) if on)\n"
        "print(before == active(), found.state.value, found.used == had)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=kernel_env(),
    )
    same, state, asked_those = out.stdout.split()
    assert same == "True", out.stdout  # nothing created
    assert asked_those == "True", out.stdout  # only devices that had a context were asked
    assert state in ("no-cuda", "healthy"), out.stdout


def test_status_names_the_device_it_probed(kernel):
    kernel.execute(
        "%load_ext nb_cudaguard\nimport torch\ntorch.ones(1, device='cuda').sum().item()"
    )
    text = kernel.execute("%cudaguard status").stream
    assert "CUDA context: healthy (cuda:0)" in text
