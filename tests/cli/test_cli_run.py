"""`nb-cudaguard run`: a notebook executed headless in a real kernel, with nb_cudaguard loaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import ROOT, kernel_env
from pytorch_texts import ASSERT_2_9, RAISE_ASSERT

from nb_cudaguard.diagnosis.schema import MIME_TYPE

DEMOS = ROOT / "demo_notebooks"


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nb_cudaguard", "run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=kernel_env(),
        timeout=timeout,
    )


def write_notebook(path: Path, *sources: str) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(notebook, path)
    return path


def tagged(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in notebook.cells if "papermill-error-cell-tag" in c.metadata.get("tags", [])]


def user_cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in notebook.cells if c not in tagged(notebook)]


def outputs_of(cell: nbformat.NotebookNode, kind: str) -> list[dict[str, Any]]:
    return [o for o in cell.get("outputs", []) if o["output_type"] == kind]


def not_ours(stderr: str) -> list[str]:
    """What stderr holds besides nb-cudaguard's own lines (the progress bar redraws with \\r)."""
    return [line for line in re.split(r"[\r\n]+", stderr) if line and "nb-cudaguard" not in line]


def test_a_notebook_that_succeeds_exits_0_and_keeps_its_cells(tmp_path: Path):
    source = write_notebook(
        tmp_path / "ok.ipynb", "%load_ext nb_cudaguard", "x = 6 * 7\nprint(x)", "x + 1"
    )
    out = tmp_path / "out.ipynb"
    result = run_cli(str(source), "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["status"], summary["executed"], summary["failure"]) == ("ok", 3, None)
    executed = nbformat.read(out, as_version=4)
    assert user_cells(executed) == user_cells(nbformat.read(source, as_version=4))
    assert tagged(executed) == []
    # Loaded before the first cell: the notebook's own %load_ext finds it loaded, silently.
    assert executed.cells[0].outputs == []
    assert executed.cells[1].outputs[0]["text"] == "42\n"
    assert executed.cells[2].outputs[0]["data"]["text/plain"] == "43"
    assert [c.execution_count for c in executed.cells] == [1, 2, 3]
    assert "3/3 cells" in result.stderr  # the progress
    # and nothing else: ipykernel >= 7.3's TCP warning was printed per kernel started
    assert not_ours(result.stderr) == []


def test_the_extension_is_loaded_even_when_the_notebook_does_not_load_it(tmp_path: Path):
    source = write_notebook(tmp_path / "plain.ipynb", "y = 1", RAISE_ASSERT, "never = 1")
    stale = nbformat.read(source, as_version=4)  # outputs of an earlier run, saved with it
    stale.cells[2].outputs = [nbformat.v4.new_output("stream", text="from an earlier run\n")]
    stale.cells[2].execution_count = 7
    nbformat.write(stale, source)
    out = tmp_path / "out.ipynb"
    result = run_cli(str(source), "-o", str(out), "--json", "--no-progress")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failure"]["cell_index"] == 1
    assert summary["executed"] == 2  # it stopped at the failing cell
    assert summary["diagnosis"]["sticky"] is True
    assert summary["diagnosis"]["action"]["restart_kernel"] == "required"
    # A notebook run's advice: this very run again, in blocking mode.
    assert summary["diagnosis"]["action"]["setting"] == "notebook"
    assert summary["diagnosis"]["action"]["command"] == (
        f"nb-cudaguard run --blocking-rerun {source} -o {out}"
    )
    assert "cells" not in result.stderr
    executed = nbformat.read(out, as_version=4)
    failing = next(c for c in executed.cells if c.source == RAISE_ASSERT)
    assert outputs_of(failing, "error")[0]["ename"] == "AcceleratorError"
    panels = [o for o in outputs_of(failing, "display_data") if MIME_TYPE in o["data"]]
    assert len(panels) == 1
    assert "nb-cudaguard-panel" in panels[0]["data"]["text/html"]
    never = executed.cells[-1]
    assert (never.source, never.outputs, never.execution_count) == ("never = 1", [], None)


def test_demo_01_fails_with_the_panel_at_the_failing_cell_and_papermill_markers(tmp_path: Path):
    source = DEMOS / "01_label_out_of_range.ipynb"
    out = tmp_path / "out.ipynb"
    result = run_cli(str(source), "-o", str(out))
    assert result.returncode == 1, result.stderr
    assert "A class label is outside 0..num_classes-1" in result.stdout
    assert f"`nb-cudaguard run --blocking-rerun {source} -o {out}`" in result.stdout
    assert "the button below" not in result.stdout
    executed = nbformat.read(out, as_version=4)
    original = nbformat.read(source, as_version=4)
    assert user_cells(executed) == user_cells(original)
    top, anchor = tagged(executed)
    assert executed.cells[0] is top and "An exception was encountered at" in top.source
    assert "label-out-of-range" in top.source
    failing = executed.cells[executed.cells.index(anchor) + 1]
    assert outputs_of(failing, "error"), "the anchor sits just before the failing cell"
    payload = next(o["data"][MIME_TYPE] for o in outputs_of(failing, "display_data"))
    assert payload["cause"] == "label-out-of-range"
    assert any("`labels` contains 3" in e for e in payload["evidence"])


def test_demo_09_reports_the_launching_line_it_marks(tmp_path: Path):
    """After the blocking restart the error is raised at the launching line: with CUDA, and in
    the demo's simulation without it (no frame of the simulation names the ``with`` line)."""
    source = DEMOS / "09_blocking_restart_workflow.ipynb"
    result = run_cli(str(source), "-o", str(tmp_path / "out.ipynb"), "--json", "--no-progress")
    assert result.returncode == 1, result.stderr
    line = json.loads(result.stdout)["failure"]["line"]
    assert "loss = F.cross_entropy(" in line["code"]
    assert "the traceback stops here" in line["code"]


def test_demo_09_ran_in_blocking_mode_so_no_blocking_rerun_is_advised(tmp_path: Path):
    """Its kernel set CUDA_LAUNCH_BLOCKING=1 before CUDA started: the traceback is the true line
    already, so neither the advice nor --blocking-rerun runs it again in blocking mode."""
    source = DEMOS / "09_blocking_restart_workflow.ipynb"
    out = str(tmp_path / "out.ipynb")
    result = run_cli(str(source), "-o", out, "--json", "--no-progress", "--blocking-rerun")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["blocking_rerun"] is None
    assert "ran in blocking mode already" in result.stderr
    action = summary["diagnosis"]["action"]
    assert (action["blocking"], action["blocking_on"]) == (False, True)
    assert "--blocking-rerun" not in action["command"] + action["message"]
    text = run_cli(str(source), "-o", out, "--no-progress").stdout
    assert "Blocking mode was on in the kernel" in text
    assert "--blocking-rerun" not in text


def test_demo_02_stops_at_the_guarded_cell_without_a_panel(tmp_path: Path):
    out = tmp_path / "out.ipynb"
    result = run_cli(
        str(DEMOS / "02_cudacheck_keeps_the_kernel_alive.ipynb"), "-o", str(out), "--json"
    )
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failure"]["ename"] == "GuardIndexError"
    assert summary["diagnosis"] is None  # no CUDA error happened: the guard stopped it


def test_cudacheck_runs_every_cell_under_the_guard(tmp_path: Path):
    step = (
        "import torch, torch.nn.functional as F\n"
        "F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]))"
    )
    source = write_notebook(tmp_path / "labels.ipynb", step)
    plain = run_cli(str(source), "-o", str(tmp_path / "a.ipynb"), "--json")
    guarded = run_cli(str(source), "-o", str(tmp_path / "b.ipynb"), "--json", "--cudacheck")
    assert (plain.returncode, guarded.returncode) == (1, 1)
    assert json.loads(plain.stdout)["failure"]["ename"] == "IndexError"  # torch's CPU check
    assert json.loads(guarded.stdout)["failure"]["ename"] == "GuardIndexError"


def test_blocking_rerun_reports_the_line_that_fails_with_blocking_launches(tmp_path: Path):
    # As on a GPU: without blocking launches the error surfaces at a later line.
    cell = (
        "import os, torch\n"
        "if os.environ.get('CUDA_LAUNCH_BLOCKING') == '1':\n"
        f"    raise torch.AcceleratorError({ASSERT_2_9!r})  # the launch that failed\n"
        "x = 1\n"
        f"raise torch.AcceleratorError({ASSERT_2_9!r})  # where it surfaced\n"
    )
    source = write_notebook(tmp_path / "late.ipynb", "a = 1", cell, "after = 1")
    out = tmp_path / "out.ipynb"
    result = run_cli(str(source), "-o", str(out), "--json", "--blocking-rerun")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["failure"]["line"]["line"] == 5
    rerun = summary["blocking_rerun"]["failure"]
    assert (rerun["cell_index"], rerun["line"]["line"]) == (1, 3)
    assert "the launch that failed" in rerun["line"]["code"]
    top = tagged(nbformat.read(out, as_version=4))[0]
    assert "CUDA_LAUNCH_BLOCKING=1: the error is raised at In [2], line 3" in top.source


def test_blocking_rerun_is_skipped_for_an_error_that_is_not_sticky(tmp_path: Path):
    source = write_notebook(tmp_path / "plain.ipynb", "1 / 0")
    result = run_cli(str(source), "-o", str(tmp_path / "o.ipynb"), "--json", "--blocking-rerun")
    assert result.returncode == 1
    assert json.loads(result.stdout)["blocking_rerun"] is None


def test_a_cell_that_runs_out_of_time_is_a_failure(tmp_path: Path):
    source = write_notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(60)", "after = 1")
    result = run_cli(str(source), "-o", str(tmp_path / "o.ipynb"), "--json", "--timeout", "2")
    assert result.returncode == 1, result.stderr
    failure = json.loads(result.stdout)["failure"]
    assert (failure["cell_index"], failure["ename"]) == (0, "CellTimeoutError")


@pytest.mark.parametrize(
    "problem",
    ["missing notebook", "not a notebook", "no output folder", "no -o", "a directory", "kernel"],
)
def test_bad_usage_is_status_2(tmp_path: Path, problem: str):
    good = write_notebook(tmp_path / "ok.ipynb", "x = 1")
    junk = tmp_path / "junk.ipynb"
    junk.write_text("{not json")
    args = {
        "missing notebook": [str(tmp_path / "nope.ipynb"), "-o", str(tmp_path / "o.ipynb")],
        "not a notebook": [str(junk), "-o", str(tmp_path / "o.ipynb")],
        "no output folder": [str(good), "-o", str(tmp_path / "nowhere" / "o.ipynb")],
        "no -o": [str(good)],
        "a directory": [str(tmp_path), "-o", str(tmp_path / "o.ipynb")],
        "kernel": [str(good), "-o", str(tmp_path / "o.ipynb"), "--kernel", "no-such-kernel"],
    }[problem]
    result = run_cli(*args, timeout=60)
    assert result.returncode == 2
    assert "nb-cudaguard" in result.stderr


@pytest.mark.gpu
def test_on_a_gpu_the_blocking_rerun_finds_the_launching_line(tmp_path: Path):
    source = write_notebook(
        tmp_path / "gpu.ipynb",
        "import torch\nimport torch.nn.functional as F",
        "logits = torch.randn(4, 3, device='cuda')\n"
        "labels = torch.tensor([0, 1, 2, 3], device='cuda')\n"
        "loss = F.cross_entropy(logits, labels)\n"
        "print(loss.item())",
    )
    result = run_cli(str(source), "-o", str(tmp_path / "o.ipynb"), "--json", "--blocking-rerun")
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["diagnosis"]["sticky"] is True
    rerun = summary["blocking_rerun"]["failure"]
    assert rerun["line"]["line"] == 3, "with blocking launches the loss line itself raises"
