"""Run every demo notebook in a real Jupyter kernel and show what nb_cudaguard displayed.

Usage::

    python demo_notebooks/run.py [NOTEBOOK ...]

Executed copies are written to demo_notebooks/executed/ (open them in JupyterLab to see the panels
as a user does). Each notebook says in its metadata what it demonstrates
(``nb_cudaguard_demo.expect``): ``panel``, a CUDA error explained under its cell, or ``guard``, a
bad input stopped by ``%%cudacheck`` before it reached the GPU. Exits non-zero where a notebook did
not show what it should.
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


def outputs(notebook: nbformat.NotebookNode, output_type: str) -> list[nbformat.NotebookNode]:
    return [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == output_type
    ]


def panels(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        output["data"]["text/plain"]
        for output in outputs(notebook, "display_data")
        if "nb-cudaguard-panel" in output.get("data", {}).get("text/html", "")
    ]


def guard_errors(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"{output['ename']}: {output['evalue']}"
        for output in outputs(notebook, "error")
        if output["ename"].startswith("Guard")
    ]


def shown(notebook: nbformat.NotebookNode) -> list[str]:
    """What the notebook demonstrates, as text; empty if it failed to."""
    expect = notebook.metadata.get("nb_cudaguard_demo", {}).get("expect", "panel")
    return panels(notebook) if expect == "panel" else guard_errors(notebook)


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    out_dir = HERE / "executed"
    out_dir.mkdir(exist_ok=True)
    failed = []
    for path in paths:
        notebook = run(path)
        nbformat.write(notebook, out_dir / path.name)
        texts = shown(notebook)
        print(f"=== {path.name}: {len(texts)} nb_cudaguard output(s)")
        print(*texts, sep="\n\n")
        if not texts:
            failed.append(path.name)
    if failed:
        print("no nb_cudaguard output in:", ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
