"""`nb-cudaguard explain`: a log or a traceback in, the diagnosis out, with documented statuses."""

from __future__ import annotations

import codecs
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11, HEADLINE, HINT_1_10

DEVICE_LINE = H100_TORCH_2_11["cross-entropy-label"][0] + "\n"
TRAINING_LOG = (
    "epoch 1 step 120 loss 0.693\n" + DEVICE_LINE * 3 + "Traceback (most recent call last):\n"
    '  File "train.py", line 88, in <module>\n'
    "    print(loss.item())\n"
    f"torch.AcceleratorError: {ASSERT_2_9}"
)
PLAIN_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 3, in <module>\n'
    "    x = [][0]\n"
    "IndexError: list index out of range\n"
)


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "nb_cudaguard", *args],
        input=stdin.decode("utf-8", "replace") if stdin is not None else None,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    return result


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "train.log"
    path.write_text(TRAINING_LOG, encoding="utf-8")
    return path


def test_a_log_with_a_device_side_assert_is_explained_with_status_0(log: Path):
    result = cli("explain", str(log))
    assert result.returncode == 0, result.stderr
    assert "A class label is outside 0..num_classes-1" in result.stdout
    assert "only a kernel restart fixes it" in result.stdout
    assert "x3 threads" in result.stdout


def test_json_has_the_diagnosis_fields_and_the_restart_action(log: Path):
    result = cli("explain", "--json", str(log))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cause"] == "label-out-of-range"
    assert data["sticky"] is True
    assert data["title"] == "A class label is outside 0..num_classes-1"
    assert data["evidence"] == []  # a text has no objects to read
    assert data["error"]["code"] == 710
    assert data["assert_lines"][0]["count"] == 3
    assert data["action"]["restart_kernel"] == "required"


def test_a_text_without_a_cuda_error_gives_status_1(tmp_path: Path):
    path = tmp_path / "other.log"
    path.write_text(PLAIN_TRACEBACK, encoding="utf-8")
    result = cli("explain", str(path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "no CUDA error found" in result.stderr
    as_json = cli("explain", "--json", str(path))
    assert (as_json.returncode, json.loads(as_json.stdout)) == (1, None)


def test_an_older_pytorch_message_is_recognised_too(tmp_path: Path):
    path = tmp_path / "old.log"
    path.write_text(f"RuntimeError: {HEADLINE}{HINT_1_10}\n")
    result = cli("explain", "--json", str(path))
    assert result.returncode == 0
    assert json.loads(result.stdout)["cause"] == "unknown-assert"


def test_stdin_is_read_with_a_dash():
    result = cli("explain", "-", stdin=TRAINING_LOG.encode())
    assert result.returncode == 0, result.stderr
    assert "A class label is outside" in result.stdout
    assert cli("explain", "-", stdin=PLAIN_TRACEBACK.encode()).returncode == 1


def test_a_utf16_log_with_a_bom_is_read(tmp_path: Path):
    path = tmp_path / "powershell.log"  # what PowerShell's `>` writes
    path.write_bytes(codecs.BOM_UTF16_LE + TRAINING_LOG.encode("utf-16-le"))
    assert cli("explain", str(path)).returncode == 0


def test_a_missing_file_is_status_2(tmp_path: Path):
    result = cli("explain", str(tmp_path / "nope.log"))
    assert result.returncode == 2
    assert "no such file" in result.stderr


def test_a_directory_is_status_2(tmp_path: Path):
    result = cli("explain", str(tmp_path))
    assert result.returncode == 2
    assert "is a directory" in result.stderr


def test_a_binary_file_is_status_2(tmp_path: Path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04\x00\x00" + ASSERT_2_9.encode())  # a zip with the text inside
    result = cli("explain", str(path))
    assert result.returncode == 2
    assert "binary" in result.stderr


def test_undecodable_bytes_are_status_2(tmp_path: Path):
    path = tmp_path / "latin.log"
    path.write_bytes(b"caf\xe9 " + ASSERT_2_9.encode("latin-1"))  # Latin-1, not UTF-8
    result = cli("explain", str(path))
    assert result.returncode == 2
    assert "not UTF-8" in result.stderr


@pytest.mark.parametrize("args", [(), ("explain",), ("explain", "--bogus", "x"), ("frobnicate",)])
def test_bad_usage_is_status_2(args: tuple[str, ...]):
    result = cli(*args)
    assert result.returncode == 2
    assert "usage: nb-cudaguard" in result.stderr


def test_the_console_script_is_installed(log: Path):
    script = Path(sys.executable).parent / "nb-cudaguard"
    assert script.exists(), "pip install -e . installs the nb-cudaguard console script"
    result = subprocess.run(
        [str(script), "explain", str(log)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "A class label is outside" in result.stdout


def test_the_cli_imports_neither_torch_ipython_nor_pytest():
    code = (
        "import sys, nb_cudaguard.cli.run, nb_cudaguard.cli.explain\n"
        "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'pytest') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
