"""On a real GPU, under a real Jupyter server: a real device-side assert, the panel's blocking
button, and the new kernel in which CUDA_LAUNCH_BLOCKING really takes effect.

"Takes effect" is measured, not read from the environment: ``torch.cuda._sleep`` keeps the GPU
busy for a known time, and its launch returns at once when launches are asynchronous but only
after the work is done when they block. The same failing function is run before and after the
restart; with blocking launches its traceback moves from ``.item()`` to the launching line.
"""

from __future__ import annotations

import re

import pytest
from jupyter_harness import wait_for_new_process

from nb_cudaguard.notebook.actions import BLOCKING_LABEL

pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")
pytestmark = pytest.mark.gpu

STEP = """\
import time, torch, torch.nn.functional as F

def step():
    logits = torch.randn(4, 3, device="cuda")
    labels = torch.tensor([0, 1, 2, 3], device="cuda")
    loss = F.cross_entropy(logits, labels)
    return loss.item()

def launch_blocks():
    \"\"\"Whether a kernel launch waits for the kernel: (blocks, launch s, kernel s).\"\"\"
    cycles = 200_000_000
    torch.cuda.synchronize()
    t0 = time.perf_counter(); torch.cuda._sleep(cycles); t1 = time.perf_counter()
    torch.cuda.synchronize(); t2 = time.perf_counter()
    return (t1 - t0) > 0.5 * (t2 - t0), t1 - t0, t2 - t0

def launch_loop_us(launches=5000):
    # µs per launch of a loop of tiny kernels, as a training loop's many small ops
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / launches * 1e6

torch.ones(1, device="cuda").sum().item()
launch_loop_us()
print("BLOCKS", launch_blocks())
print("LOOP_US", min(launch_loop_us() for _ in range(3)))
"""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _marked_line_in(frame_name: str, error: dict) -> str:
    """The line IPython marks with an arrow in the traceback entry of ``frame_name``."""
    for entry in error["traceback"]:
        text = ANSI.sub("", entry)
        if f"in {frame_name}" in text:
            marked = [line for line in text.splitlines() if re.match(r"\s*-+>\s*\d+", line)]
            return re.sub(r"^\s*-+>\s*\d+\s*", "", marked[-1])
    raise AssertionError(f"no frame {frame_name!r} in {error['traceback']}")


def _loop_us(stream: str) -> float:
    return float(re.search(r"LOOP_US ([0-9.]+)", stream).group(1))


def test_the_blocking_button_gives_a_kernel_where_blocking_is_real(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        before = sock.execute(STEP, timeout=120)
        assert "BLOCKS (False" in before.stream, before.stream
        failed = sock.execute("step()", timeout=60)
        assert failed.status == "error"
        assert _marked_line_in("step", failed.errors[0]) == "return loss.item()"
        sock.click(failed.button(BLOCKING_LABEL))

    new_pid, value = wait_for_new_process(server, kid, pid, timeout=60)
    assert new_pid != pid and value == "1"
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        assert any("blocking mode is on" in d.get("text/plain", "") for d in loaded.displays)
        after = sock.execute(STEP, timeout=120)
        assert "BLOCKS (True" in after.stream, after.stream
        # A launch-heavy loop slows down: each launch now waits for its kernel.
        loops = _loop_us(before.stream), _loop_us(after.stream)
        print(f"launch loop, µs per launch: before {loops[0]:.2f}, after {loops[1]:.2f}")
        assert loops[1] > 1.2 * loops[0]
        status = sock.execute("%cudaguard status").stream
        assert "'1', effective" in status, status
        failed = sock.execute("step()", timeout=60)
        assert failed.status == "error"
        # With blocking launches the assert is raised by the launch itself.
        assert _marked_line_in("step", failed.errors[0]) == "loss = F.cross_entropy(logits, labels)"


SETUP = (
    "print('RAN:setup')\nimport torch, torch.nn.functional as F\n"
    "logits = torch.randn(4, 3, device='cuda')\n"
    "labels = torch.tensor([0, 1, 2, 3], device='cuda')"
)
# Launches the bad kernel at line 2; asynchronously, the error surfaces at line 3's `.item()`.
FAIL = "print('RAN:fail')\nloss = F.cross_entropy(logits, labels)\nvalue = loss.item()"


def _cell_frame(error: dict) -> str:
    return next(
        ANSI.sub("", entry) for entry in error["traceback"] if "Cell In[" in ANSI.sub("", entry)
    )


def test_replay_in_the_blocking_kernel_stops_at_the_launching_line(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        assert sock.execute(SETUP, timeout=60).status == "ok"
        failed = sock.execute(FAIL, timeout=60)
        assert failed.status == "error"
        assert re.search(r"----> 3 value = loss\.item\(\)", _cell_frame(failed.errors[0]))
        sock.execute("%cudaguard restart")  # blocking launches in the new process
    new_pid, value = wait_for_new_process(server, kid, pid, timeout=60)
    assert new_pid != pid and value == "1"
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        replay = sock.execute("%cudaguard replay --yes", timeout=120)
    assert re.findall(r"RAN:(\w+)", replay.stream) == ["setup", "fail"]
    (error,) = replay.errors
    frame = _cell_frame(error)
    # The replayed cell now fails where it launched the kernel, under its own cell label.
    assert re.search(r"----> 2 loss = F\.cross_entropy\(logits, labels\)", frame), frame
    assert f"Cell In[{failed.execution_count}], line 2" in frame, frame
