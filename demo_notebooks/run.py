"""Run every demo notebook in a real Jupyter kernel; say, one line each, what nb_cudaguard showed.

Usage::

    python demo_notebooks/run.py [NOTEBOOK ...]

Prints ``name: cause -> headline`` per notebook (for the ``%%cudacheck`` demo: the error it raised
instead, and what the recovery cell printed), then where the executed copies are: open them in
JupyterLab to see the panels as a user does. Where CUDA is present the asserts are real; where not,
each GPU failure is simulated with PyTorch's exact texts (``gpu_or_simulated.py``), and the first
line says so. Each notebook's metadata (``nb_cudaguard_demo``) names what it must show: ``panel``
with its ``cause``, or ``guard``. Exits non-zero where a notebook did not. The kernels' own stderr
(device lines, kernel warnings) is kept out of this output: the executed copies hold it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
OUT = HERE / "executed"
MIME = "application/vnd.nb-cudaguard.diagnosis+json"


def run(path: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Execute a copy of ``path`` in a fresh kernel that imports this checkout's nb_cudaguard."""
    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    client = NotebookClient(notebook, timeout=timeout, allow_errors=True, kernel_name="python3")
    client.execute(cwd=str(HERE), env=env, stderr=subprocess.DEVNULL)
    return notebook


def outputs(notebook: nbformat.NotebookNode, output_type: str) -> list[nbformat.NotebookNode]:
    return [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == output_type
    ]


def panels(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The display outputs that are nb_cudaguard panels (they carry the diagnosis payload)."""
    return [o for o in outputs(notebook, "display_data") if MIME in o.get("data", {})]


def headline(panel: nbformat.NotebookNode) -> str:
    return panel["data"]["text/plain"].strip().splitlines()[0].removeprefix("nb_cudaguard: ")


def guard_errors(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"{output['ename']}: {output['evalue']}"
        for output in outputs(notebook, "error")
        if output["ename"].startswith("Guard")
    ]


def expectation(notebook: nbformat.NotebookNode) -> dict[str, str | None]:
    return dict(notebook.metadata.get("nb_cudaguard_demo", {"expect": "panel"}))


def summary(notebook: nbformat.NotebookNode) -> tuple[bool, str]:
    """(it showed what it should, the line to print)."""
    expect = expectation(notebook)
    if expect["expect"] == "guard":
        errors = guard_errors(notebook)
        last = notebook.cells[-1].get("outputs", [])
        after = "".join(o.get("text", "") for o in last if o.get("output_type") == "stream")
        ok = bool(errors) and not panels(notebook) and bool(after.strip())
        caught = errors[0].splitlines()[0] if errors else "no guard error"
        return ok, f"%%cudacheck -> {caught}; then, fixed: {after.strip() or 'no output'}"
    shown = panels(notebook)
    if not shown:
        return False, "no panel"
    cause = shown[0]["data"][MIME]["cause"]
    ok = len(shown) == 1 and cause == expect.get("cause", cause)
    return ok, f"{cause} -> {headline(shown[0])}"


def _gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
    OUT.mkdir(exist_ok=True)
    shutil.copy(HERE / "gpu_or_simulated.py", OUT)  # so that the copies re-run where they lie
    gpu = _gpu()
    if gpu:
        print(f"CUDA device: {gpu}. The device-side asserts below are real.")
    else:
        print(
            "No CUDA device: each GPU failure is simulated with PyTorch's exact texts (the "
            "exception CUDA raises and the device line an H100 printed), see gpu_or_simulated.py."
        )
    width = max(len(p.stem) for p in paths)
    failed = []
    for path in paths:
        notebook = run(path)
        nbformat.write(notebook, OUT / path.name)
        ok, line = summary(notebook)
        print(f"{path.stem:<{width}}  {line}" + ("" if ok else "   [NOT AS EXPECTED]"), flush=True)
        if not ok:
            failed.append(path.name)
    print(f"\nExecuted copies: {OUT}\nOpen them: jupyter lab {os.path.relpath(OUT)}")
    if failed:
        print("not as expected:", ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
