"""Run every demo notebook in a real Jupyter kernel and show what nb_cudaguard displayed.

Usage::

    python demo_notebooks/run.py [NOTEBOOK ...]

Executed copies are written to demo_notebooks/executed/ (open them in JupyterLab to see the panels
as a user does). Exits non-zero if a notebook that fails a CUDA cell got no panel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def run(path: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    env_path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    os.environ["PYTHONPATH"] = env_path  # the kernel imports this checkout's nb_cudaguard
    NotebookClient(notebook, timeout=300, allow_errors=True, kernel_name="python3").execute(
        cwd=str(HERE)
    )
    return notebook


def panels(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        output["data"]["text/plain"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "display_data"
        and "nb-cudaguard" in output.get("data", {}).get("text/html", "")
    ]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    out_dir = HERE / "executed"
    out_dir.mkdir(exist_ok=True)
    missing = []
    for path in paths:
        notebook = run(path)
        nbformat.write(notebook, out_dir / path.name)
        shown = panels(notebook)
        print(f"=== {path.name}: {len(shown)} nb_cudaguard display(s)")
        for text in shown:
            print(text)
        if not shown:
            missing.append(path.name)
    if missing:
        print("no nb_cudaguard output in:", ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
