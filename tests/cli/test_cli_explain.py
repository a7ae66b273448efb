"""`nb-cudaguard explain`: a log or a traceback in, the diagnosis out, with documented statuses."""

from __future__ import annotations

import codecs
import json
import os
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
    "    running_loss += loss.item()\n"
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
    assert "only a new process fixes it" in result.stdout
    assert "x3 threads" in result.stdout


NOTEBOOK_WORDS = ("kernel restart", "the button below", "%cudaguard restart", "re-run the cell")


def test_a_scripts_log_gets_a_scripts_advice_in_text_and_json(log: Path):
    text = cli("explain", str(log)).stdout
    action = json.loads(cli("explain", "--json", str(log)).stdout)["action"]
    assert "`CUDA_LAUNCH_BLOCKING=1 python train.py ...`" in text
    assert action["setting"] == "script"
    assert action["command"] == "CUDA_LAUNCH_BLOCKING=1 python train.py ..."
    assert "CUDA_LAUNCH_BLOCKING=1 python train.py" in action["message"]
    for words in NOTEBOOK_WORDS:
        assert words not in text and words not in json.dumps(action)


def test_a_notebooks_traceback_gets_a_notebook_runs_advice(tmp_path: Path):
    # As IPython 8 prints it in a notebook (colours off).
    path = tmp_path / "cell.txt"
    path.write_text(
        DEVICE_LINE
        + "---------------------------------------------------------------------------\n"
        "AcceleratorError                          Traceback (most recent call last)\n"
        "Cell In[7], line 3\n"
        "      1 for x, y in loader:\n"
        "      2     loss = step(x, y)\n"
        "----> 3     running_loss += loss.item()\n"
        "\n"
        f"AcceleratorError: {ASSERT_2_9}\n"
    )
    text = cli("explain", str(path)).stdout
    action = json.loads(cli("explain", "--json", str(path)).stdout)["action"]
    assert "`nb-cudaguard run --blocking-rerun NOTEBOOK -o OUT.ipynb`" in text
    assert "the button below" not in text
    assert "only a new kernel fixes it" in text
    assert "It surfaced at `running_loss += loss.item()` (cell [7], line 3)" in text
    assert action["setting"] == "notebook"
    assert action["command"].startswith("nb-cudaguard run --blocking-rerun")
    # Back in Jupyter the kernel may not have loaded the extension: the magic's command is given
    # with the line that defines it, never alone.
    assert "`%load_ext nb_cudaguard`, then `%cudaguard restart`" in text
    assert text.count("%cudaguard restart") == text.count("%load_ext nb_cudaguard")


def test_where_is_the_last_frame_of_the_users_code_not_a_library_frame(tmp_path: Path):
    path = tmp_path / "deep.log"
    path.write_text(
        DEVICE_LINE + "Traceback (most recent call last):\n"
        '  File "/home/me/proj/train.py", line 88, in <module>\n'
        "    running_loss += loss.item()\n"
        "                    ^^^^^^^^^^^\n"
        '  File "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py", line 40, in item\n'
        "    return self._item()\n"
        f"torch.AcceleratorError: {ASSERT_2_9}\n"
    )
    data = json.loads(cli("explain", "--json", str(path)).stdout)
    assert data["where"] == (
        "It surfaced at `running_loss += loss.item()` (train.py, line 88), an operation that "
        "only copies or waits and cannot assert: the failing kernel was launched earlier."
    )
    assert data["action"]["command"] == "CUDA_LAUNCH_BLOCKING=1 python /home/me/proj/train.py ..."


def test_assert_lines_keep_the_raw_line_as_the_gpu_printed_it(log: Path):
    data = json.loads(cli("explain", "--json", str(log)).stdout)
    assert data["assert_lines"][0]["raw"] == DEVICE_LINE.strip()  # its path prefix included


def test_a_reader_that_goes_away_ends_the_output_quietly(log: Path):
    # `nb-cudaguard explain log | head -0`: the pipe is closed before a byte is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "nb_cudaguard", "explain", str(log)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""  # no BrokenPipeError traceback
    assert result.returncode == 141  # 128 + SIGPIPE, as a shell reports a closed pipe


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


# A bare call prints the help with status 0 (test_cli_console_script.py).
@pytest.mark.parametrize("args", [("explain",), ("explain", "--bogus", "x"), ("frobnicate",)])
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
