"""Device lines written to fd 2 while a cell runs are both shown to the user and captured."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import terminal_ipython
from pytorch_texts import ASSERT_2_9 as ASSERT_TEXT

from nb_cudaguard.runtime.capture import FdTee

DEVICE = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: "
    "block: [0,0,0], thread: [{i},0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
)


def _late_stream(kernel, seconds: float = 2.0) -> str:
    """Stream text iopub delivers after a cell went idle, whatever its parent."""
    import queue
    import time

    text, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
    return "".join(text)


INDEX_DEVICE = (
    "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1422: indexSelectLargeIndex: block: [0,0,0], "
    "thread: [{i},0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
)


def _device_lines(n: int, line: str = DEVICE) -> bytes:
    return "".join(line.format(i=i) for i in range(n)).encode()


@pytest.fixture
def private_fd() -> Iterator[tuple[int, int]]:
    """A pipe to tee instead of this process's own fd 2: (read end, write end)."""
    read_end, write_end = os.pipe()
    yield read_end, write_end
    for fd in (read_end, write_end):
        os.close(fd)


@pytest.fixture
def tee(private_fd) -> Iterator[FdTee]:
    """A tee of a private pipe, closed again (its child gone) whatever the test did."""
    t = FdTee(private_fd[1])
    yield t
    t.close()


def test_tee_keeps_a_copy_and_forwards_every_byte_to_the_previous_fd2():
    # In a child process, so this test's own fd 2 stays untouched.
    code = textwrap.dedent(
        """
        import os, sys
        from nb_cudaguard.runtime.capture import FdTee
        tee = FdTee(2)
        tee.start()
        os.write(2, b"line one\\n" * 1000)
        tee.stop()
        sys.stdout.write(str(len(tee.text())))
        tee.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=os.getcwd()
    )
    assert out.stdout == str(len("line one\n") * 1000)
    assert out.stderr == "line one\n" * 1000


def test_stop_restores_fd2_to_where_it_pointed_before():
    code = textwrap.dedent(
        """
        import os
        from nb_cudaguard.runtime.capture import FdTee
        before = os.fstat(2).st_ino
        tee = FdTee(2)
        tee.start()
        during = os.fstat(2).st_ino
        tee.stop()
        print(before == os.fstat(2).st_ino, before != during)
        tee.close()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_nested_start_stop_keeps_one_tee_until_the_outer_stop(tee):
    tee.start()
    tee.start()
    tee.stop()
    assert tee.active
    tee.stop()
    assert not tee.active


def test_captured_text_is_bounded(private_fd):
    tee = FdTee(private_fd[1], keep=100)
    try:
        tee.start()
        os.write(private_fd[1], b"x" * 1000)
        tee.stop()
        assert tee.text() == "x" * 100
    finally:
        tee.close()


def test_clear_forgets_what_came_before_and_keeps_what_comes_after(tee, private_fd):
    tee.start()
    os.write(private_fd[1], b"old\n")
    tee.stop()
    tee.clear()
    tee.start()
    os.write(private_fd[1], b"new\n")
    tee.stop()
    assert tee.text() == "new\n"
    # Both still reached the user, in order.
    assert os.read(private_fd[0], 100) == b"old\nnew\n"


def test_every_clear_that_follows_output_takes_effect(tee, private_fd):
    # A clear is skipped only where nothing was written since the last one.
    for round_ in range(20):
        tee.clear()  # nothing new: skipped
        tee.start()
        os.write(private_fd[1], b"round %d\n" % round_)
        tee.stop()
        assert tee.text() == f"round {round_}\n"
        tee.clear()
        assert tee.text() == ""
    assert os.read(private_fd[0], 1000).count(b"round") == 20


def test_a_report_waits_for_no_longer_than_its_time_limit(private_fd):
    # The user's stream is stuck (nobody reads it): the child blocks forwarding, the pipe fills.
    tee = FdTee(private_fd[1])
    tee.start()
    writer = threading.Thread(target=os.write, args=(private_fd[1], b"y" * 400_000), daemon=True)
    writer.start()
    time.sleep(0.3)
    try:
        started = time.monotonic()
        assert tee.text(timeout=0.5) == ""
        assert time.monotonic() - started < 1.5
    finally:
        # Unblock everyone: drain the user's stream until the writer is done.
        os.set_blocking(private_fd[0], False)
        deadline = time.monotonic() + 10
        while writer.is_alive() and time.monotonic() < deadline:
            try:
                os.read(private_fd[0], 1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
        tee.stop()
        tee.close()


def _panel_cause(out) -> str:
    panels = [d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", "")]
    assert len(panels) == 1
    return panels[0]["text/html"].split("data-cause='", 1)[1].split("'", 1)[0]


def test_device_lines_on_fd2_reach_the_panel_when_the_kernel_forwards_nothing(kernel):
    # Under pytest ipykernel does not watch fd 2 (it checks PYTEST_CURRENT_TEST), exactly like
    # kernels older than ipykernel 6: the lines reach only the terminal, and our capture.
    kernel.execute("%load_ext nb_cudaguard")
    lines = _device_lines(200)
    out = kernel.execute(
        f"import os, torch\nos.write(2, {lines!r})\nraise torch.AcceleratorError({ASSERT_TEXT!r})"
    )
    assert out.errors and out.errors[0]["ename"] == "AcceleratorError"
    assert _panel_cause(out) == "label-out-of-range"
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    assert "(x200 threads)" in panel["text/plain"]


def test_device_lines_are_still_shown_by_a_kernel_that_forwards_fd2():
    from conftest import Kernel, kernel_env

    env = {k: v for k, v in kernel_env().items() if k != "PYTEST_CURRENT_TEST"}
    kernel = Kernel(env)
    try:
        kernel.execute("%load_ext nb_cudaguard")
        out = kernel.execute(
            f"import os, torch\nos.write(2, {_device_lines(200)!r})\n"
            f"raise torch.AcceleratorError({ASSERT_TEXT!r})"
        )
        assert _panel_cause(out) == "label-out-of-range"
        # Not hidden from the user: ipykernel forwards the lines, possibly after the cell's
        # idle status (ipykernel's OutStream forwards fd 2 from a watcher thread), so read what
        # iopub sends a moment longer. The 199 other threads' copies of the same site are folded
        # into one line with their count; the verdict comes first.
        shown = out.stream + _late_stream(kernel, 1.0)
        assert shown.count("Assertion `t >= 0 && t < n_classes` failed.") == 1
        assert shown.startswith(
            "nb_cudaguard: CUDA context POISONED, restart required; cause=label-out-of-range; "
            "run: %cudaguard restart\n"
        )
        assert "nb_cudaguard: 199 more lines of the same assert" in shown[:1000]
        # the panel still counts every thread's line
        panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
        assert "(x200 threads)" in panel["text/plain"]
        # every raw line, one per thread, in the panel's details
        assert "Every line the GPU printed (200)" in panel["text/html"]
        assert panel["text/html"].count("Assertion `t &gt;= 0 &amp;&amp; t &lt; n_classes`") == 201
    finally:
        kernel.shutdown()


def test_other_output_on_fd2_passes_unfolded_and_in_order():
    from conftest import Kernel, kernel_env

    kernel = Kernel({k: v for k, v in kernel_env().items() if k != "PYTEST_CURRENT_TEST"})
    try:
        kernel.execute("%load_ext nb_cudaguard")
        out = kernel.execute(
            "import os\nfor i in range(3):\n    os.write(2, b'same line\\n')\n"
            "os.write(2, b'partial')"
        )
        shown = out.stream + _late_stream(kernel, 1.0)
        assert "same line\nsame line\nsame line\npartial" in shown
        assert "nb_cudaguard" not in shown
    finally:
        kernel.shutdown()


def test_device_lines_printed_in_an_earlier_successful_cell_still_reach_the_panel(kernel):
    # As on an H100: the GPU prints the lines at the next launch or sync, often in the cell that
    # launched the kernel (which succeeds), and the error surfaces cells later at `.item()`.
    kernel.execute("%load_ext nb_cudaguard")
    kernel.execute(f"import os, torch\nos.write(2, {_device_lines(3)!r})")
    kernel.execute("x = 1")
    out = kernel.execute(f"raise torch.AcceleratorError({ASSERT_TEXT!r})")
    assert _panel_cause(out) == "label-out-of-range"


def test_device_lines_printed_between_cells_by_another_thread_reach_the_panel(kernel):
    # As on an H100: the driver prints the lines at whichever call first meets the error, in
    # whatever thread makes it; there it was the cell tracker's stream query, made by its worker
    # after a cell that did no CUDA work, so between cells. A thread writes them here once the
    # cell that started it has ended; the error surfaces in the next cell.
    kernel.execute("%load_ext nb_cudaguard")
    kernel.execute(
        "import os, threading, time, torch\n"
        "between = threading.Event()\n"
        "def driver():\n"
        "    time.sleep(0.3)\n"
        f"    os.write(2, {_device_lines(3)!r})\n"
        "    between.set()\n"
        "threading.Thread(target=driver).start()"
    )
    time.sleep(1.0)  # no cell runs while the thread writes
    out = kernel.execute(f"assert between.is_set()\nraise torch.AcceleratorError({ASSERT_TEXT!r})")
    assert out.errors[0]["ename"] == "AcceleratorError"
    assert _panel_cause(out) == "label-out-of-range"


def test_device_lines_an_earlier_diagnosis_read_never_decide_a_later_one(kernel):
    kernel.execute("%load_ext nb_cudaguard\nimport os, torch")
    index_lines = _device_lines(3, INDEX_DEVICE)
    first = kernel.execute(
        f"os.write(2, {index_lines!r})\nraise torch.AcceleratorError({ASSERT_TEXT!r})"
    )
    assert _panel_cause(first) == "index-out-of-range"
    kernel.execute(f"os.write(2, {_device_lines(3)!r})")  # a later failure's lines
    out = kernel.execute(f"raise torch.AcceleratorError({ASSERT_TEXT!r})")
    assert _panel_cause(out) == "label-out-of-range"


HOLDS_THE_GIL = (
    "import ctypes\n"
    "payload = b'x' * 300_000 + b'\\n'\n"
    "# PyDLL keeps the GIL during the call, as C code writing to fd 2 may.\n"
    "ctypes.PyDLL(None).write(2, payload, len(payload))\n"
    "print('wrote', len(payload))"
)


def test_a_large_c_write_to_fd2_holding_the_gil_does_not_hang_terminal_ipython():
    proc = terminal_ipython(
        f"%load_ext nb_cudaguard\nexec({HOLDS_THE_GIL!r})\nexit\n",
        timeout=60,  # the hang this guards against
    )
    assert "wrote 300001" in proc.stdout
    assert proc.stderr.count("x") == 300_000  # and every byte still reached the terminal


def test_a_large_c_write_to_fd2_holding_the_gil_does_not_hang_a_kernel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(HOLDS_THE_GIL, timeout=30)
    assert "wrote 300001" in out.stream


def test_unload_gives_fd2_back(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(
        "import os\nbefore = os.fstat(2).st_ino\n%unload_ext nb_cudaguard\n"
        "print(before != os.fstat(2).st_ino)"
    )
    # The cell that unloads started with our tee on fd 2 and ends with ipykernel's pipe again.
    assert "True" in out.stream


def _in_child(body: str) -> str:
    code = "import os\nfrom nb_cudaguard.runtime.capture import FdTee\n" + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout


def test_a_redirector_that_stops_before_us_keeps_its_restore():
    # wurlitzer-style: starts before our pre_run_cell and restores fd 2 before our post_run_cell.
    out = _in_child(
        """
        original = os.fstat(2).st_ino
        theirs_saved = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        tee = FdTee(2)
        tee.start()
        os.dup2(theirs_saved, 2)
        tee.stop()
        print(os.fstat(2).st_ino == original)
        """
    )
    assert out.strip() == "True"


def test_a_held_tee_stays_on_between_cells_and_yields_to_a_redirector_that_moves_fd2():
    out = _in_child(
        """
        ino = lambda fd: os.fstat(fd).st_ino
        original = os.dup(2)
        tee = FdTee(2, hold=True)
        tee.start(); tee.stop()
        ours, child = ino(2), tee.child_pid
        print(ours != ino(original))  # held between cells: fd 2 stays on our pipe
        tee.start(); os.write(2, b'in a cell\\n'); tee.stop()
        print(ino(2) == ours and tee.child_pid == child)  # no swap, no new child
        # a redirector whose hooks run before ours: it saves our pipe and points fd 2 elsewhere
        theirs_saved = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        tee.start()
        print(ino(2) == ino(w))  # left to it for this cell
        os.dup2(theirs_saved, 2)  # its end of cell, before ours: back to our pipe
        tee.stop()
        print(ino(2) == ino(original))  # then given back, as every cell from now on
        tee.start(); tee.stop()
        print(ino(2) == ino(original) and tee.child_pid == child)
        tee.close()
        """
    )
    assert out.split() == ["True"] * 5


def test_fd2_left_on_our_pipe_by_another_redirector_does_not_loop():
    out = _in_child(
        """
        import time
        tee = FdTee(2)
        tee.start()
        theirs_saved = os.dup(2)  # another redirector starts inside our cell ...
        tee.stop()
        os.dup2(theirs_saved, 2)  # ... and restores fd 2 to our pipe after our stop
        tee.start()
        os.write(2, b"once\\n")
        tee.stop()
        time.sleep(0.2)
        print(tee.text().count("once"))
        """
    )
    assert out.strip() == "1"


def test_evidence_from_the_notebook_variables_reaches_the_panel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    kernel.execute(
        "import torch\nfrom torch import nn\n"
        "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())\nmodel.classifier = nn.Linear(8, 3)\n"
        "labels = torch.tensor([1, 2, 3, 3])"
    )
    # `item` raises as `.item()` does where an earlier kernel failed; compiled as a library's
    # file, not a cell's, so the error surfaces at the cell's line that calls it
    library = f"import torch\ndef item(t):\n    raise torch.AcceleratorError({ASSERT_TEXT!r})\n"
    kernel.execute(f"item = {{}}\nexec(compile({library!r}, 'lib.py', 'exec'), item)\n")
    out = kernel.execute(
        f"import os\nos.write(2, {_device_lines(4)!r})\n"
        "item, loss = item['item'], 0.0\nprint(float(item(loss)))"
    )
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    text = panel["text/plain"]
    assert "`labels` contains 3 but the classifier `model.classifier` has 3 outputs" in text
    assert "\nMost likely: labels are numbered 1..C" in text  # the evidence ranked it first
    assert "cannot assert" in text  # surfaced at print(float(...)): it says so


def test_wurlitzer_inside_a_cell_gets_its_output_and_fd2_comes_back_after():
    pytest.importorskip("wurlitzer")
    cells = textwrap.dedent(
        """\
        import os
        original = os.fstat(2).st_ino
        %load_ext nb_cudaguard
        after, ip = [], get_ipython()
        ip.events.register('post_run_cell', lambda r: after.append(os.fstat(2).st_ino))
        from wurlitzer import pipes
        with pipes() as (out, err):
            os.write(2, b'inside wurlitzer\\n')

        print('wurlitzer got:', err.read().strip())
        os.write(2, b"after wurlitzer\\n")
        print('held:', len(set(after[-3:])) == 1 and original not in after)
        %unload_ext nb_cudaguard
        print('given back:', os.fstat(2).st_ino == original)
        exit
        """
    )
    proc = terminal_ipython(cells, timeout=60)
    assert "wurlitzer got: inside wurlitzer" in proc.stdout
    # Between cells fd 2 stays on our one pipe (wurlitzer restored it there); unloading gives
    # the original back.
    assert "held: True" in proc.stdout
    assert "given back: True" in proc.stdout
    assert "after wurlitzer" in proc.stderr  # through our tee, to the terminal
    assert "inside wurlitzer" not in proc.stderr  # wurlitzer's, not shown twice


# The tee's child killed inside a cell, then what the cell does next: a subprocess that writes
# to stderr (a C program dies of SIGPIPE without a reader, Python gets EPIPE) and a C-level write
# of a device line. ``delay``: 0 kills and writes at once; 0.3 lets the death settle first.
def _after_the_tee_child_is_killed(delay: float) -> str:
    device = DEVICE.format(i=7).encode()
    return (
        "import ctypes, os, signal, subprocess, time\n"
        "from nb_cudaguard.notebook.extension import current_state\n"
        "tee = current_state().tee\n"
        "os.kill(tee.child_pid, signal.SIGKILL)\n"
        f"time.sleep({delay})\n"
        "sub = subprocess.run(['sh', '-c', 'echo from the subprocess >&2'])\n"
        f"line = {device!r}\n"
        "wrote = ctypes.CDLL(None).write(2, line, len(line))\n"
        "print('rc', sub.returncode, 'wrote', wrote == len(line))\n"
        f"raise torch.AcceleratorError({ASSERT_TEXT!r})"
    )


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_killed_tee_child_breaks_neither_a_subprocess_nor_a_c_write_in_a_kernel(kernel, delay):
    kernel.execute("%load_ext nb_cudaguard\nimport torch")
    out = kernel.execute(_after_the_tee_child_is_killed(delay))
    assert "rc 0 wrote True" in out.stream
    # The device line written after the death still reached the diagnosis.
    assert _panel_cause(out) == "label-out-of-range"
    # And the next cells keep capturing.
    again = kernel.execute(
        f"os.write(2, {_device_lines(2, INDEX_DEVICE)!r})\n"
        f"raise torch.AcceleratorError({ASSERT_TEXT!r})"
    )
    assert _panel_cause(again) == "index-out-of-range"


def test_a_killed_tee_child_loses_no_text_on_the_terminal():
    cells = (
        "%load_ext nb_cudaguard\nimport torch\n"
        f"exec({_after_the_tee_child_is_killed(0.3)!r})\n"
        "os.write(2, b'the next cell\\n')\nexit\n"
    )
    proc = terminal_ipython(cells, timeout=60)
    assert "rc 0 wrote True" in proc.stdout
    assert "label-out-of-range" in proc.stdout or "A class label is outside" in proc.stdout
    assert "from the subprocess" in proc.stderr
    assert "thread: [7,0,0] Assertion" in proc.stderr
    assert "the next cell" in proc.stderr


def test_where_no_new_child_can_start_fd2_goes_back_at_once():
    # The interpreter for a new child is gone: fd 2 is given back to the terminal within the cell.
    cells = (
        "import os\noriginal = os.fstat(2).st_ino\n%load_ext nb_cudaguard\n"
        "import signal, subprocess, time\n"
        "from nb_cudaguard.notebook.extension import current_state\n"
        "tee = current_state().tee\ntee.python = '/nonexistent/python'\n"
        "os.kill(tee.child_pid, signal.SIGKILL); time.sleep(0.3); "
        "sub = subprocess.run(['sh', '-c', 'echo from the subprocess >&2']); "
        "print('rc', sub.returncode, 'given back', os.fstat(2).st_ino == original)\n"
        "os.write(2, b'the next cell\\n')\nexit\n"
    )
    proc = terminal_ipython(cells, timeout=60)
    assert "rc 0 given back True" in proc.stdout
    assert "from the subprocess" in proc.stderr
    assert "the next cell" in proc.stderr


def test_a_child_that_exits_as_soon_as_it_starts_is_retried_a_few_times_then_given_up(
    tmp_path, private_fd
):
    # A real interpreter that cannot run: it counts its starts and exits at once.
    starts = tmp_path / "starts"
    broken = tmp_path / "python"
    broken.write_text(f"#!/bin/sh\necho started >> {starts}\nexit 3\n")
    broken.chmod(0o755)
    read_end, write_end = private_fd
    os.set_blocking(read_end, False)
    shown = b""
    tee = FdTee(write_end)
    tee.python = str(broken)
    try:
        began = time.monotonic()
        tee.start()
        os.write(write_end, b"written while the child fails\n")  # the cell goes on at once
        assert time.monotonic() - began < 1.0
        deadline = time.monotonic() + 15
        while b"nb_cudaguard:" not in shown:
            assert time.monotonic() < deadline, "the tee never gave up"
            time.sleep(0.05)
            with contextlib.suppress(BlockingIOError):
                shown += os.read(read_end, 1 << 16)
        tee.stop()
        time.sleep(1.0)  # nothing starts any more
        count = len(starts.read_text().splitlines())
        assert 2 <= count <= 6
        tee.start()  # the next cell: no new child, no new line
        os.write(write_end, b"the next cell\n")
        tee.stop()
        time.sleep(0.5)
        assert len(starts.read_text().splitlines()) == count
    finally:
        tee.close()
    with contextlib.suppress(BlockingIOError):
        shown += os.read(read_end, 1 << 16)
    text = shown.decode()
    assert "written while the child fails" in text and "the next cell" in text
    notes = [line for line in text.splitlines() if line.startswith("nb_cudaguard:")]
    assert len(notes) == 1 and "exited at once" in notes[0] and "exit status 3" in notes[0]
