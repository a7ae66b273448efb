"""CI executes every demo notebook in a real kernel (nbclient) and checks nb_cudaguard's output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "demo_notebooks"))
import run as demo  # noqa: E402

NOTEBOOKS = sorted((ROOT / "demo_notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_demo_notebook_shows_a_panel_under_the_failing_cell(path: Path):
    notebook = demo.run(path)
    failing = [
        cell
        for cell in notebook.cells
        if any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    ]
    assert failing, "the demo must end in a CUDA error"
    cell = failing[0]
    kinds = [o.get("output_type") for o in cell.outputs]
    # The standard traceback first, then our static panel with both representations.
    assert "error" in kinds and "display_data" in kinds
    assert kinds.index("error") < kinds.index("display_data")
    (panel,) = [o for o in cell.outputs if o.get("output_type") == "display_data"]
    assert "nb-cudaguard-panel" in panel["data"]["text/html"]
    assert panel["data"]["text/plain"].strip().startswith("nb_cudaguard:")
