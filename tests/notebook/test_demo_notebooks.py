"""CI executes every demo notebook in a real kernel (nbclient) and checks what nb_cudaguard showed.

Each notebook runs once per session (a kernel start and torch import cost seconds on 2 cores).
Without a GPU the failures are simulated with PyTorch's exact texts; the texts the demos use are
held here to tests/pytorch_texts.py, which keeps what a real H100 printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, kernel_env
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

sys.path.insert(0, str(ROOT / "demo_notebooks"))
import gpu_or_simulated
import run as demo

NOTEBOOKS = sorted((ROOT / "demo_notebooks").glob("*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The line a frame points at: "----> 3     loss = ..." (IPython 7 to 9).
ARROW = re.compile(r"^-+> ?\s*\d+ (.*)$", re.MULTILINE)
# A frame in a notebook cell: IPython >= 8 "Cell In[4], line 3"; IPython 7 names the file
# ipykernel compiled the cell to, or "<ipython-input-4-...>".
CELL_FRAME = re.compile(r"Cell In ?\[\d+\]|\S*ipykernel_\d+\S*\.py|<ipython-input-")


def expectation(path: Path) -> dict[str, str | None]:
    return dict(nbformat.read(path, as_version=4).metadata["nb_cudaguard_demo"])


PANEL_DEMOS = [p for p in NOTEBOOKS if expectation(p)["expect"] == "panel"]
GUARD_DEMOS = [p for p in NOTEBOOKS if expectation(p)["expect"] == "guard"]
_executed: dict[Path, nbformat.NotebookNode] = {}


def executed(path: Path) -> nbformat.NotebookNode:
    if path not in _executed:
        _executed[path] = demo.run(path)
    return _executed[path]


def error_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [
        cell
        for cell in notebook.cells
        if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    ]


def frames(cell: nbformat.NotebookNode) -> list[str]:
    """The frames of the cell's traceback, as IPython rendered them: one entry per frame."""
    (error,) = [o for o in cell.outputs if o.get("output_type") == "error"]
    entries = [ANSI.sub("", entry) for entry in error["traceback"]]
    return [entry for entry in entries if ARROW.search(entry)]


def pointed_at(frame: str) -> str:
    return ARROW.findall(frame)[-1].strip()


def test_one_demo_per_cause_family():
    causes = [expectation(p)["cause"] for p in PANEL_DEMOS]
    assert len(PANEL_DEMOS) >= 8 and len(GUARD_DEMOS) == 1
    assert {"label-out-of-range", "index-out-of-range", "probability-out-of-range"} <= set(causes)


def test_the_simulation_uses_pytorchs_exact_texts():
    real_lines = {line for line, _ in H100_TORCH_2_11.values()}
    for case, (line, _) in gpu_or_simulated.CASES.items():
        assert line in real_lines, case
    assert gpu_or_simulated.CUDA_ASSERT == ASSERT_2_9


@pytest.mark.parametrize("path", PANEL_DEMOS, ids=[p.stem for p in PANEL_DEMOS])
def test_cuda_error_demo_shows_its_panel_under_the_failing_cell(path: Path):
    notebook = executed(path)
    failing = error_cells(notebook)
    assert len(failing) == 1, "the demo ends in one CUDA error"
    kinds = [o.get("output_type") for o in failing[0].outputs]
    # The standard traceback first, then our static panel, then the buttons.
    assert kinds.index("error") < kinds.index("display_data")
    panel, actions = [o for o in failing[0].outputs if o.get("output_type") == "display_data"]
    assert panel["data"][demo.MIME]["cause"] == expectation(path)["cause"]
    assert panel["data"]["text/plain"].strip().startswith("nb_cudaguard:")
    assert "<details" in panel["data"]["text/html"]
    assert WIDGET_MIME in actions["data"]
    assert "%cudaguard restart" in actions["data"]["text/plain"]


@pytest.mark.parametrize("path", PANEL_DEMOS, ids=[p.stem for p in PANEL_DEMOS])
def test_a_demo_says_when_its_gpu_failure_is_simulated(path: Path):
    notebook = executed(path)
    assert "simulates the GPU failure" in notebook.cells[0].source
    printed = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    if gpu_or_simulated.SIMULATED:
        assert "the GPU failure is simulated with PyTorch's exact texts" in printed


@pytest.mark.parametrize("path", PANEL_DEMOS, ids=[p.stem for p in PANEL_DEMOS])
def test_the_cuda_error_is_raised_from_the_users_line_without_helper_frames(path: Path):
    """A simulated failure reads as a GPU's: no frame of the simulation (contextlib's, ours)
    above the user's, nor at the ``with`` line (tests/pytorch_texts.py texts; issue 23)."""
    shown = frames(error_cells(executed(path))[0])
    assert not [f for f in shown if "gpu_or_simulated" in f or "contextlib" in f]
    cells = [f for f in shown if CELL_FRAME.match(f)]
    assert cells and cells[0] == shown[0], "the traceback starts in the failing cell"
    assert not pointed_at(cells[-1]).startswith("with gpu_failure(")
    if gpu_or_simulated.SIMULATED:
        assert shown == cells, "the simulated error shows the user's own frames only"


def test_after_the_blocking_restart_the_traceback_points_at_the_launching_line():
    """Demo 09 is the run after the blocking restart: the innermost frame of the notebook's
    is the line that launched the failing kernel, marked so in the notebook itself."""
    (path,) = [p for p in PANEL_DEMOS if "blocking" in p.stem]
    notebook = executed(path)
    (launching,) = [
        line.strip()
        for cell in notebook.cells
        for line in cell.source.splitlines()
        if "the traceback stops here" in line
    ]
    cells = [f for f in frames(error_cells(notebook)[0]) if CELL_FRAME.match(f)]
    assert pointed_at(cells[-1]) == launching


def test_the_demo_extra_brings_numpy_and_notebook():
    """The README's demo command installs ``.[demo]`` only: without numpy every torch import
    warns "Failed to initialize NumPy", and the executed copies open in JupyterLab or
    Notebook 7. Asked of pip: the package's metadata as it builds it, for the extra."""
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    result = subprocess.run(
        [*pip, "--no-deps", "--quiet", "--report", "-", f"{ROOT}[demo]"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (ours,) = json.loads(result.stdout)["install"]
    demo_requires = {
        canonicalize_name(r.name)
        for r in map(Requirement, ours["metadata"]["requires_dist"])
        if r.marker is not None and r.marker.evaluate({"extra": "demo"})
    }
    assert {"numpy", "notebook", "jupyterlab", "ipykernel", "nbclient"} <= demo_requires


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_demo_warns_of_nothing(path: Path):
    """What its cells print to stderr is the device lines only: no warning from nb_cudaguard's
    reading of the user's tensors, nor torch's at import (demo extra without numpy)."""
    notebook = executed(path)
    printed = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    assert "Warning" not in "".join(o.get("text", "") for o in printed if o.get("name") == "stderr")


def test_the_blocking_workflow_demo_gets_the_blocking_aware_panel():
    (path,) = [p for p in PANEL_DEMOS if "blocking" in p.stem]
    failing = error_cells(executed(path))[0]
    panel, actions = [o for o in failing.outputs if o.get("output_type") == "display_data"]
    assert "data-blocking='true'" in panel["data"]["text/html"]
    assert "--no-blocking" in actions["data"]["text/plain"]


@pytest.mark.parametrize("path", GUARD_DEMOS, ids=[p.stem for p in GUARD_DEMOS])
def test_guard_demo_stops_the_bad_input_and_the_kernel_carries_on(path: Path):
    notebook = executed(path)
    assert demo.guard_errors(notebook), "the guard must stop the bad input"
    assert demo.panels(notebook) == [], "nothing reached the GPU, so nothing to explain"
    last = notebook.cells[-1]
    assert [o["output_type"] for o in last.outputs] == ["stream"]
    assert "still alive" in last.outputs[0]["text"]


def test_the_runner_prints_one_clean_line_per_notebook_and_where_the_copies_are():
    chosen = [NOTEBOOKS[0], *GUARD_DEMOS]
    result = subprocess.run(
        [sys.executable, str(ROOT / "demo_notebooks" / "run.py"), *map(str, chosen)],
        capture_output=True,
        text=True,
        env=kernel_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    if gpu_or_simulated.SIMULATED:
        assert "simulated with PyTorch's exact texts" in lines[0]
    assert lines[1].split() == [
        NOTEBOOKS[0].stem,
        expectation(NOTEBOOKS[0])["cause"],
        "->",
        *lines[1].split()[3:],
    ]
    assert "->" in lines[2] and "still alive" in lines[2]
    assert "Assertion" not in result.stdout, "device lines stay in the executed copies"
    assert "WARNING" not in result.stdout + result.stderr, "kernel warnings stay out"
    assert "Warning" not in result.stderr, "nor any of the runner's own (torch's NumPy one)"
    assert any(line.startswith("Executed copies: ") for line in lines)
    assert (ROOT / "demo_notebooks" / "executed" / NOTEBOOKS[0].name).exists()


def test_nbconvert_html_keeps_the_panel_with_its_details_folded():
    nbconvert = pytest.importorskip("nbconvert")
    body, _ = nbconvert.HTMLExporter().from_notebook_node(executed(PANEL_DEMOS[0]))
    # nbconvert re-serialises the HTML (double quotes): match either quoting.
    assert len(re.findall(r"class=[\"']nb-cudaguard-panel[\"']", body)) == 1
    assert re.search(r"<details class=[\"']nb-cudaguard-details[\"'][^>]*>", body)
    assert "<details open" not in body
