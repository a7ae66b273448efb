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
T = lambda *a, **k: torch.tensor(*a, device=dev, **k)
R = lambda *shape: torch.randn(*shape, device=dev)
try:
{body}
    torch.cuda.synchronize()
except Exception as e:
    sys.stdout.write(str(e))
    sys.stdout.flush()
    sys.exit(3)
"""

LABEL = ("label-out-of-range",)
INDEX = ("index-out-of-range",)
# Newer releases check multinomial's input with _assert_async's message, older ones in the kernel.
SAMPLING = ("probability-out-of-range", "nan-detected")

CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cross-entropy-label-equals-classes": (
        "F.cross_entropy(R(8, 3), T([0, 1, 2, 3, 0, 1, 2, 0])).item()",
        LABEL,
    ),
    "nll-loss-negative-label": (
        "F.nll_loss(R(4, 5).log_softmax(1), T([0, -1, 2, 1])).item()",
        LABEL,
    ),
    "nll-loss2d-void-255": (
        "F.cross_entropy(R(2, 21, 4, 4), T(255).expand(2, 4, 4)).item()",
        LABEL,
    ),
    "embedding-id-too-large": (
        "torch.nn.Embedding(10, 4).to(dev)(T([[1, 10]])).sum().item()",
        INDEX,
    ),
    "bce-input-outside-0-1": (
        "F.binary_cross_entropy(T([0.5, 1.5]), T([0.0, 1.0])).item()",
        ("probability-out-of-range",),
    ),
    "multinomial-nan": ("torch.multinomial(T([[0.5, float('nan')]]), 1).item()", SAMPLING),
    "gather-index-too-large": ("torch.gather(R(2, 3), 1, T([[0, 3]])).sum().item()", INDEX),
    "advanced-indexing": ("torch.arange(3, device=dev)[T([5])].sum().item()", INDEX),
}


def _run_child(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE.format(body=textwrap.indent(body, "    "))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_assert_is_diagnosed_with_the_right_cause(name):
    body, causes = CASES[name]
    child = _run_child(body)
    # On a GPU every case must assert on the device: any other outcome is a failure, not a skip.
    assert child.returncode == 3 and "device-side assert" in child.stdout, (
        child.stdout[-300:],
        child.stderr[-300:],
    )
    diagnosis = diagnose(child.stdout, device_output=child.stderr)
    assert diagnosis is not None
    assert diagnosis.sticky
    assert diagnosis.cause in causes, (child.stderr[-2000:], diagnosis)
    assert diagnosis.assert_lines
