"""Real device-side asserts on a GPU, one per fresh process, diagnosed from what it printed.

Each case runs in its own Python process: a device-side assert poisons the CUDA context of the
process for good. The child prints the exception's text on stdout; the CUDA runtime prints the
device lines on its fd 2. diagnose() gets both, as the extension does in a notebook.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nb_cudaguard import diagnose

pytestmark = pytest.mark.gpu

PRELUDE = """
import sys, torch
import torch.nn.functional as F
dev = "cuda"
try:
{body}
    torch.cuda.synchronize()
except Exception as e:
    sys.stdout.write(str(e))
    sys.stdout.flush()
    sys.exit(3)
"""

CASES = {
    "cross-entropy-label-equals-classes": (
        "F.cross_entropy(torch.randn(8, 3, device=dev), torch.tensor([0,1,2,3,0,1,2,0], device=dev))",
        "label-out-of-range",
    ),
    "nll-loss-negative-label": (
        "F.nll_loss(torch.randn(4, 5, device=dev).log_softmax(1), torch.tensor([0,-1,2,1], device=dev))",
        "label-out-of-range",
    ),
    "nll-loss2d-void-255": (
        "F.cross_entropy(torch.randn(2, 21, 4, 4, device=dev), torch.full((2,4,4), 255, device=dev))",
        "label-out-of-range",
    ),
    "embedding-id-too-large": (
        "torch.nn.Embedding(10, 4).to(dev)(torch.tensor([[1, 10]], device=dev)).sum().item()",
        "index-out-of-range",
    ),
    "bce-input-outside-0-1": (
        "F.binary_cross_entropy(torch.tensor([0.5, 1.5], device=dev), torch.tensor([0., 1.], device=dev)).item()",
        "probability-out-of-range",
    ),
    "multinomial-nan": (
        "torch.multinomial(torch.tensor([[0.5, float('nan')]], device=dev), 1).item()",
        "probability-out-of-range",
    ),
    "gather-index-too-large": (
        "torch.gather(torch.randn(2, 3, device=dev), 1, torch.tensor([[0, 3]], device=dev)).sum().item()",
        "index-out-of-range",
    ),
    "advanced-indexing": (
        "torch.arange(3, device=dev)[torch.tensor([5], device=dev)].item()",
        "index-out-of-range",
    ),
}


def _run_child(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE.format(body=textwrap.indent(body, "    "))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_assert_is_diagnosed_with_the_right_cause(name):
    body, cause = CASES[name]
    child = _run_child(body)
    # Some inputs are rejected by a host-side check on newer releases: that is not our case.
    if child.returncode != 3 or "device-side assert" not in child.stdout:
        pytest.skip(f"no device-side assert on this build: {child.stdout[-300:]}")
    diagnosis = diagnose(child.stdout, device_output=child.stderr)
    assert diagnosis is not None
    assert diagnosis.sticky
    assert diagnosis.cause == cause, (child.stderr[-2000:], diagnosis)
    assert diagnosis.assert_lines
