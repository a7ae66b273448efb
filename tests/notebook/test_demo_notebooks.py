"""CI executes every demo notebook in a real kernel (nbclient) and checks nb_cudaguard's output."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "demo_notebooks"))
import run as demo

NOTEBOOKS = sorted((ROOT / "demo_notebooks").glob("*.ipynb"))


def expectation(path: Path) -> str:
    return nbformat.read(path, as_version=4).metadata["nb_cudaguard_demo"]["expect"]


def error_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [
        cell
        for cell in notebook.cells
        if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    ]


PANEL_DEMOS = [p for p in NOTEBOOKS if expectation(p) == "panel"]
GUARD_DEMOS = [p for p in NOTEBOOKS if expectation(p) == "guard"]


@pytest.mark.parametrize("path", PANEL_DEMOS, ids=[p.name for p in PANEL_DEMOS])
def test_cuda_error_demo_shows_a_panel_under_the_failing_cell(path: Path):
    notebook = demo.run(path)
    failing = error_cells(notebook)
    assert len(failing) == 1, "the demo ends in one CUDA error"
    kinds = [o.get("output_type") for o in failing[0].outputs]
    # The standard traceback first, then our static panel with both representations.
    assert kinds.index("error") < kinds.index("display_data")
    panel, actions = [o for o in failing[0].outputs if o.get("output_type") == "display_data"]
    assert "nb-cudaguard-panel" in panel["data"]["text/html"]
    assert panel["data"]["text/plain"].strip().startswith("nb_cudaguard:")
    # The restart buttons are a widget; a saved notebook or a frontend without widgets shows
    # the equivalent command instead.
    assert "application/vnd.jupyter.widget-view+json" in actions["data"]
    assert "%cudaguard restart" in actions["data"]["text/plain"]


@pytest.mark.parametrize("path", GUARD_DEMOS, ids=[p.name for p in GUARD_DEMOS])
def test_guard_demo_stops_the_bad_input_and_the_kernel_carries_on(path: Path):
    notebook = demo.run(path)
    assert demo.guard_errors(notebook), "the guard must stop the bad input"
    assert demo.panels(notebook) == [], "nothing reached the GPU, so nothing to explain"
    last = notebook.cells[-1]
    assert [o["output_type"] for o in last.outputs] == ["stream"]
    assert "still alive" in last.outputs[0]["text"]
