"""``%cudaguard status`` in a real kernel, and the restart actions the panel shows."""

from __future__ import annotations

import pytest
from conftest import Kernel, kernel_env
from pytorch_texts import ASSERT_2_0 as ASSERT_TEXT

from nb_cudaguard.notebook.actions import BLOCKING_LABEL, WIDGET_MIME
from nb_cudaguard.restart.environment import Environment
from nb_cudaguard.restart.methods import RestartError, plan_restart


def _status(kernel) -> str:
    return kernel.execute("%cudaguard status").stream


def test_status_before_torch_is_imported_does_not_import_it(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    text = _status(kernel)
    assert "(not imported yet)" in text
    assert "CUDA_LAUNCH_BLOCKING: unset" in text
    leaked = kernel.execute("import sys; print('torch' in sys.modules)").stream
    assert leaked.strip() == "False"


def test_status_reports_versions_and_cuda_state_after_import(kernel):
    kernel.execute("%load_ext nb_cudaguard\nimport torch")
    text = _status(kernel)
    version = kernel.execute("print(torch.__version__)").stream.strip()
    assert f"torch: {version}\n" in text
    assert "CUDA initialised: no" in text
    # Plain words, never the payload's internal ids ("no-cuda").
    assert "CUDA context: none yet (this kernel has not used CUDA)" in text
    assert "no-cuda" not in text
    assert "device-side assertions (TORCH_USE_CUDA_DSA):" in text


def test_a_variable_in_the_start_environment_is_reported_effective():
    k = Kernel(kernel_env(CUDA_LAUNCH_BLOCKING="1"))
    try:
        k.execute("%load_ext nb_cudaguard\nimport torch")
        text = _status(k)
    finally:
        k.shutdown()
    assert "CUDA_LAUNCH_BLOCKING: '1', effective" in text
    assert "WARNING" not in text


def test_restart_is_refused_outside_a_kernel():
    with pytest.raises(RestartError):
        plan_restart(Environment.TERMINAL, None)
    with pytest.raises(RestartError):
        plan_restart()  # this test process: ipykernel is imported, but it is not a kernel


def test_the_panel_is_followed_by_buttons_with_the_command_as_text(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(f"import torch\nraise torch.AcceleratorError({ASSERT_TEXT!r})")
    actions = [d for d in out.displays if WIDGET_MIME in d]
    assert len(actions) == 1
    assert "%cudaguard restart" in actions[0]["text/plain"]
    labels = [m["content"]["data"]["state"].get("description") for m in out.of_type("comm_open")]
    assert BLOCKING_LABEL in labels and "Restart" in labels


def test_a_non_sticky_error_gets_no_buttons(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute("import torch\nraise torch.OutOfMemoryError('CUDA out of memory.')")
    assert not [d for d in out.displays if WIDGET_MIME in d]


def test_the_command_hint_stands_in_where_ipywidgets_is_missing():
    k = Kernel(kernel_env())
    try:
        k.execute("import sys; sys.modules['ipywidgets'] = None")  # import now fails
        k.execute("%load_ext nb_cudaguard")
        out = k.execute(f"import torch\nraise torch.AcceleratorError({ASSERT_TEXT!r})")
    finally:
        k.shutdown()
    hints = [d for d in out.displays if "nb-cudaguard-restart-hint" in d.get("text/html", "")]
    assert len(hints) == 1
    assert "%cudaguard restart" in hints[0]["text/plain"]


@pytest.mark.gpu
def test_a_variable_set_after_cuda_started_is_reported_too_late(kernel):
    kernel.execute("%load_ext nb_cudaguard\nimport torch, os\ntorch.zeros(1, device='cuda')")
    kernel.execute("os.environ['CUDA_LAUNCH_BLOCKING'] = '1'")
    text = _status(kernel)
    assert "not effective" in text and "WARNING" in text


@pytest.mark.gpu
def test_a_variable_set_before_the_first_cuda_call_is_reported_effective(kernel):
    kernel.execute("%load_ext nb_cudaguard\nimport torch, os")
    kernel.execute("%cudaguard status")  # starts watching torch's lazy CUDA init
    kernel.execute("os.environ['CUDA_LAUNCH_BLOCKING'] = '1'\ntorch.zeros(1, device='cuda')")
    text = _status(kernel)
    assert "'1', effective" in text and "WARNING" not in text
