"""``nb-cudaguard run NOTEBOOK -o OUT``: a headless run with nb_cudaguard, for CI and pipelines.

On a failure, OUT is written like papermill writes it: the failing cell keeps its traceback (and
nb_cudaguard's panel under it), and error cells tagged ``papermill-error-cell-tag`` at the top and
just before the failing cell say where it failed, so tools that know papermill's marker find it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import nbformat

from ..diagnosis.advice import Setting, notebook_run
from ..diagnosis.schema import to_json
from .exits import NOT_FOUND_OR_FAILED, OK, UsageFailure
from .headless import CellFailure, Execution, KernelFailure, SourceLine, execute

ERROR_TAGS = ["papermill-error-cell-tag", "nb-cudaguard-error-cell"]
ANCHOR = "nb-cudaguard-error-cell"


class Progress:
    """A one-line progress bar on a terminal, one line per cell elsewhere (CI logs)."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self.tty = enabled and stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(total, 1)
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} cells"
        if self.tty:
            self.stream.write(f"\rnb-cudaguard run {bar}")
        else:
            self.stream.write(f"nb-cudaguard run {bar}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _markdown(text: str) -> nbformat.NotebookNode:
    cell: nbformat.NotebookNode = nbformat.v4.new_markdown_cell(
        source=text, metadata={"tags": list(ERROR_TAGS)}
    )
    return cell


def mark_failure(execution: Execution, rerun: CellFailure | None, rerun_done: bool) -> None:
    """Insert the papermill-style error cells (in place)."""
    failure = execution.failure
    assert failure is not None
    diagnosis = execution.diagnosis
    count = failure.execution_count if failure.execution_count is not None else "?"
    lines = [
        f'<span style="color:red;font-size:1.5em">An exception was encountered at '
        f'<a href="#{ANCHOR}">In [{count}]</a>.</span>',
        "",
        f"`{failure.ename}: {failure.evalue.splitlines()[0] if failure.evalue else ''}`",
    ]
    if diagnosis is not None:
        lines += ["", f"**nb_cudaguard: {diagnosis.title}** (cause `{diagnosis.cause}`)."]
        if diagnosis.sticky:
            lines.append(
                "The kernel's CUDA context was broken: only a new kernel can run CUDA again."
            )
    if rerun_done:
        lines += ["", _rerun_sentence(failure.line, rerun)]
    execution.notebook.cells.insert(0, _markdown("\n".join(lines)))
    anchor = _markdown(
        f'<span id="{ANCHOR}" style="color:red;font-size:1.5em">Execution using '
        "nb-cudaguard run failed in the cell below.</span>"
    )
    execution.notebook.cells.insert(failure.index + 1, anchor)


def _rerun_sentence(first: SourceLine | None, rerun: CellFailure | None) -> str:
    if rerun is None:
        return (
            "Re-run with CUDA_LAUNCH_BLOCKING=1: the error did not recur up to that cell (it may "
            "depend on randomness or on something outside the notebook)."
        )
    where = str(rerun.line) if rerun.line is not None else f"cell {rerun.index}"
    if first is not None and rerun.line is not None and first == rerun.line:
        return f"Re-run with CUDA_LAUNCH_BLOCKING=1: the same line fails, {where}."
    return f"Re-run with CUDA_LAUNCH_BLOCKING=1: the error is raised at {where}."


def _failure_json(failure: CellFailure | None) -> dict[str, Any] | None:
    if failure is None:
        return None
    line = failure.line
    return {
        "cell_index": failure.index,
        "execution_count": failure.execution_count,
        "ename": failure.ename,
        "evalue": failure.evalue,
        "line": None
        if line is None
        else {"execution_count": line.execution_count, "line": line.line, "code": line.code},
    }


def setting_of(args: argparse.Namespace, execution: Execution) -> Setting:
    """The advice's words: a notebook run, re-run by this very command with --blocking-rerun."""
    return notebook_run(
        shlex.quote(args.notebook), shlex.quote(args.output), probed=execution.probed
    )


def summary(
    args: argparse.Namespace,
    execution: Execution,
    total: int,
    rerun: CellFailure | None,
    rerun_done: bool,
    seconds: float,
) -> dict[str, Any]:
    return {
        "notebook": args.notebook,
        "output": args.output,
        "status": "failed" if execution.failure else "ok",
        "code_cells": total,
        "executed": execution.executed,
        "failure": _failure_json(execution.failure),
        "diagnosis": (
            to_json(execution.diagnosis, setting_of(args, execution), execution.blocking_on)
            if execution.diagnosis is not None
            else None
        ),
        "blocking_rerun": {"failure": _failure_json(rerun)} if rerun_done else None,
        "seconds": round(seconds, 3),
    }


def _read(path: Path) -> nbformat.NotebookNode:
    try:
        notebook: nbformat.NotebookNode = nbformat.read(path, as_version=4)
        return notebook
    except FileNotFoundError:
        raise UsageFailure(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageFailure(f"{path}: is a directory") from None
    except (OSError, ValueError) as error:  # JSON and nbformat errors are ValueErrors
        raise UsageFailure(f"{path}: not a readable notebook ({error})") from None


def run(args: argparse.Namespace) -> int:
    path, out = Path(args.notebook), Path(args.output)
    notebook = _read(path)
    if not out.parent.is_dir():
        raise UsageFailure(f"{out}: the folder {out.parent} does not exist")
    if out.is_dir():
        raise UsageFailure(f"{out}: is a directory")
    kernel = args.kernel or notebook.metadata.get("kernelspec", {}).get("name") or "python3"
    total = sum(1 for cell in notebook.cells if cell.cell_type == "code")
    progress = Progress(sys.stderr, enabled=not args.no_progress)
    started = time.monotonic()
    options: dict[str, Any] = {
        "cwd": path.resolve().parent,
        "kernel_name": kernel,
        "cudacheck": args.cudacheck,
        "timeout": args.timeout,
    }
    try:
        execution = execute(notebook, on_cell=progress, **options)
        rerun: CellFailure | None = None
        rerun_done = False
        sticky = execution.diagnosis is not None and execution.diagnosis.sticky
        if args.blocking_rerun and execution.blocking_on:
            print(
                "nb-cudaguard run: no re-run with CUDA_LAUNCH_BLOCKING=1: the notebook ran in "
                "blocking mode already, so its traceback is the true line",
                file=sys.stderr,
            )
        elif execution.failure is not None and sticky and args.blocking_rerun:
            progress.close()
            print("nb-cudaguard run: re-running with CUDA_LAUNCH_BLOCKING=1", file=sys.stderr)
            again = execute(
                _read(path),
                env={"CUDA_LAUNCH_BLOCKING": "1"},
                stop_after=execution.failure.index,
                on_cell=progress,
                **options,
            )
            rerun, rerun_done = again.failure, True
    except KernelFailure as failure:
        raise UsageFailure(str(failure)) from None
    finally:
        progress.close()
    if execution.failure is not None:
        mark_failure(execution, rerun, rerun_done)
    nbformat.write(execution.notebook, out)
    result = summary(args, execution, total, rerun, rerun_done, time.monotonic() - started)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(execution, result, setting_of(args, execution))
    return NOT_FOUND_OR_FAILED if execution.failure is not None else OK


def _print_summary(execution: Execution, result: dict[str, Any], setting: Setting) -> None:
    failure = execution.failure
    if failure is None:
        print(f"nb-cudaguard run: {result['executed']} code cells ran; wrote {result['output']}")
        return
    print(
        f"nb-cudaguard run: cell In [{failure.execution_count}] failed: "
        f"{failure.ename}: {failure.evalue.splitlines()[0] if failure.evalue else ''}"
    )
    if failure.line is not None:
        print(f"  at {failure.line}")
    if execution.diagnosis is not None:
        from ..diagnosis.render import to_text

        print(to_text(execution.diagnosis, execution.blocking_on, setting))
    rerun = result["blocking_rerun"]
    if rerun is not None:
        line = (rerun["failure"] or {}).get("line")
        print(f"  with CUDA_LAUNCH_BLOCKING=1: {line if line else 'did not recur'}")
    print(f"wrote {result['output']}")
