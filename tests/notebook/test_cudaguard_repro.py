"""`%cudaguard repro [PATH]` in a real shell: the written script replays the failure on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from pytorch_texts import RAISE_ASSERT


def test_repro_writes_a_script_that_raises_the_readable_cpu_error(shell, tmp_path: Path):
    shell.extension_manager.load_extension("nb_cudaguard")
    shell.run_cell(
        "import torch\nfrom torch import nn\n"
        "labels = torch.randint(1, 4, (32,))\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))\n"
    )
    with capture_output():
        shell.run_cell(RAISE_ASSERT)
    target = tmp_path / "replay.py"
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", f"repro {target}")
    assert f"wrote {target}" in captured.stdout
    script = target.read_text()
    assert "python replay.py" in script
    result = subprocess.run(
        [sys.executable, str(target)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert "IndexError: Target 3 is out of bounds." in result.stderr


def test_repro_before_any_cuda_error_is_a_usage_error(shell):
    shell.extension_manager.load_extension("nb_cudaguard")
    with pytest.raises(UsageError, match="no CUDA error has been diagnosed"):
        shell.run_line_magic("cudaguard", "repro")


def test_sync_rejects_a_value_other_than_on_or_off(shell):
    shell.extension_manager.load_extension("nb_cudaguard")
    with pytest.raises(UsageError, match="on or off"):
        shell.run_line_magic("cudaguard", "sync maybe")
