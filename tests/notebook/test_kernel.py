"""The extension in a real Jupyter kernel: what the frontend receives over iopub."""

from __future__ import annotations

from pytorch_texts import RAISE_ASSERT


def test_accelerator_error_gets_the_standard_error_and_our_panel(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(RAISE_ASSERT)
    assert out.reply["status"] == "error"
    assert out.errors and out.errors[0]["ename"] == "AcceleratorError"
    panels = [d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", "")]
    assert len(panels) == 1
    assert "only a kernel restart fixes it" in panels[0]["text/plain"].splitlines()[1]


def test_zero_division_gets_no_display_from_us(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute("1/0")
    assert out.reply["status"] == "error"
    assert out.errors[0]["ename"] == "ZeroDivisionError"
    assert out.displays == []
    assert "nb_cudaguard" not in out.stream
