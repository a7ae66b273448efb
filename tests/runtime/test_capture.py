"""Device lines written to fd 2 while a cell runs are both shown to the user and captured."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


def _device_lines(n: int) -> bytes:
    return "".join(DEVICE.format(i=i) for i in range(n)).encode()


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
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_nested_start_stop_keeps_one_tee_until_the_outer_stop():
    tee = FdTee(2)
    tee.start()
    try:
        tee.start()
        tee.stop()
        assert tee.active
    finally:
        tee.stop()
    assert not tee.active


def test_captured_text_is_bounded():
    tee = FdTee(2, keep=100)
    read_end, write_end = os.pipe()
    tee.fd = write_end  # tee a private pipe rather than this process's stderr
    tee.start()
    os.write(write_end, b"x" * 1000)
    tee.stop()
    os.close(write_end)
    os.close(read_end)
    assert len(tee.text()) == 100


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
        # idle status (FIELD_NOTES §1), so read what iopub sends a moment longer.
        shown = out.stream + _late_stream(kernel, 1.0)
        assert shown.count("Assertion `t >= 0 && t < n_classes` failed.") == 200
    finally:
        kernel.shutdown()


def test_device_lines_printed_in_an_earlier_cell_still_reach_the_panel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    kernel.execute(f"import os, torch\nos.write(2, {_device_lines(3)!r})")
    out = kernel.execute(f"raise torch.AcceleratorError({ASSERT_TEXT!r})")
    assert _panel_cause(out) == "label-out-of-range"


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
    out = kernel.execute(
        f"import os\nos.write(2, {_device_lines(4)!r})\n"
        f"loss_value = 0.0\nprint(float(loss_value)) or (_ for _ in ()).throw("
        f"torch.AcceleratorError({ASSERT_TEXT!r}))"
    )
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    text = panel["text/plain"]
    assert "`labels` contains 3 but the classifier `model.classifier` has 3 outputs" in text
    assert "\nMost likely: labels are numbered 1..C" in text  # the evidence ranked it first
    assert "cannot assert" in text  # surfaced at print(float(...)): it says so
