"""Execute a notebook in a real kernel through nbclient, with nb_cudaguard loaded first.

The extension is loaded by a silent execution before the first cell: the user's cells stay exactly
as written (only their outputs change), no execution count is used, and a notebook's own
``%load_ext nb_cudaguard`` then finds it loaded and prints nothing (``load_ipython_extension``
is idempotent; IPython's ``%load_ext`` would say "already loaded").
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import zmq
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from ..diagnosis.engine import diagnose
from ..diagnosis.model import Diagnosis
from ..diagnosis.schema import MIME_TYPE, from_json, ran_blocking

_LOAD = (
    "import nb_cudaguard as _nb_cudaguard\n"
    "_nb_cudaguard.load_ipython_extension(get_ipython())\n"
    "del _nb_cudaguard\n"
)
_CUDACHECK_ON = 'get_ipython().run_line_magic("cudacheck", "on")\n'
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# IPython >= 8: "Cell In[5], line 4"; IPython 7: "<ipython-input-5-...>" then "----> 4 code".
_CELL_FRAME = re.compile(r"Cell In\s?\[(\d+)\], line (\d+)")
_OLD_FRAME = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>.*?\n-+> ?(\d+)", re.DOTALL)


class KernelFailure(Exception):
    """The kernel could not be started or nb_cudaguard could not be loaded in it."""


@dataclass(frozen=True)
class SourceLine:
    """A line of a notebook cell, as a traceback names it."""

    execution_count: int
    line: int
    code: str | None  # the line's text, where the cell was found

    def __str__(self) -> str:
        code = f": {self.code.strip()}" if self.code else ""
        return f"In [{self.execution_count}], line {self.line}{code}"


@dataclass(frozen=True)
class CellFailure:
    index: int  # the cell's position in the notebook
    execution_count: int | None
    ename: str
    evalue: str
    line: SourceLine | None  # the innermost frame in a notebook cell


@dataclass
class Execution:
    notebook: nbformat.NotebookNode
    executed: int  # code cells run
    failure: CellFailure | None
    diagnosis: Diagnosis | None  # the panel's (the extension's), else one read from the error
    probed: bool = False  # the diagnosis is the panel's, with what the kernel's probe found
    blocking_on: bool = False  # the panel's kernel ran in blocking mode: its traceback is true


def _cell_source(notebook: nbformat.NotebookNode, execution_count: int, line: int) -> str | None:
    for cell in notebook.cells:
        if cell.get("cell_type") == "code" and cell.get("execution_count") == execution_count:
            lines = str(cell.source).splitlines()
            return lines[line - 1] if 0 < line <= len(lines) else None
    return None


def failing_line(notebook: nbformat.NotebookNode, traceback: list[str]) -> SourceLine | None:
    """The innermost frame of the traceback that lies in a notebook cell."""
    text = _ANSI.sub("", "\n".join(traceback))
    frames = [(int(c), int(n)) for c, n in _CELL_FRAME.findall(text)]
    frames = frames or [(int(c), int(n)) for c, n in _OLD_FRAME.findall(text)]
    if not frames:
        return None
    count, line = frames[-1]
    return SourceLine(count, line, _cell_source(notebook, count, line))


def panel_payload(cell: nbformat.NotebookNode) -> tuple[Diagnosis, bool] | None:
    """The panel's diagnosis, and whether its kernel ran in blocking mode."""
    for output in cell.get("outputs", []):
        payload = output.get("data", {}).get(MIME_TYPE)
        if isinstance(payload, Mapping):
            try:
                return from_json(payload), ran_blocking(payload)
            except (TypeError, ValueError, KeyError):
                continue
    return None


def _failure(
    notebook: nbformat.NotebookNode, index: int, stopped_by: Exception
) -> tuple[CellFailure, tuple[Diagnosis, bool] | None, Diagnosis | None]:
    """The failure, the panel's diagnosis and blocking mode (if one was shown), and the
    diagnosis to report."""
    cell = notebook.cells[index]
    error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
    if error is None or isinstance(stopped_by, CellTimeoutError):
        # The kernel died, or the cell ran out of time (its output is then the interrupt's).
        ename, evalue = type(stopped_by).__name__, (str(stopped_by).strip().splitlines() or [""])[0]
    else:
        ename, evalue = str(error.get("ename", "")), str(error.get("evalue", ""))
    traceback = list(error.get("traceback", [])) if error else []
    failure = CellFailure(
        index, cell.get("execution_count"), ename, evalue, failing_line(notebook, traceback)
    )
    # The panel is the extension's full diagnosis; without one, the error text alone.
    panel = panel_payload(cell)
    return failure, panel, panel[0] if panel else diagnose(f"{ename}: {evalue}")


def _kernel_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    # A checkout that is not installed: let the kernel import this very nb_cudaguard.
    root = Path(__file__).resolve().parents[2]
    if root.name not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


def _encryption(client: NotebookClient) -> dict[str, str]:
    """ipykernel >= 7.3 warns at every start over plain TCP; jupyter_client >= 8.9 gives the
    kernel CurveZMQ keys where its kernelspec says it takes them (Jupyter Server's
    ``KernelManager.transport_encryption``): the supported way, which also quiets the warning.
    Older pairs neither warn nor know the setting; 'auto' asks libzmq for curve, so it must
    have it."""
    manager: Any = client.kernel_manager_class
    if "transport_encryption" in manager.class_trait_names() and zmq.has("curve"):
        return {"transport_encryption": "auto"}
    return {}


async def _execute(
    notebook: nbformat.NotebookNode,
    *,
    cwd: Path,
    kernel_name: str,
    env: Mapping[str, str],
    cudacheck: bool,
    timeout: float | None,
    stop_after: int | None,
    on_cell: Callable[[int, int], None],
) -> Execution:
    client = NotebookClient(notebook, timeout=timeout, kernel_name=kernel_name, allow_errors=False)
    failed_at: int | None = None
    stopped_by: Exception | None = None
    started = False
    code_cells = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code"]
    try:
        async with client.async_setup_kernel(
            cwd=str(cwd), env=_kernel_env(env), **_encryption(client)
        ):
            kernel_client: Any = client.kc  # an AsyncKernelClient: its methods are coroutines
            reply = await kernel_client.execute_interactive(
                _LOAD + (_CUDACHECK_ON if cudacheck else ""),
                silent=True,
                store_history=False,
                timeout=120,
                output_hook=lambda _msg: None,
            )
            if reply["content"]["status"] != "ok":
                content = reply["content"]
                raise KernelFailure(
                    f"could not load nb_cudaguard in the kernel: "
                    f"{content.get('ename')}: {content.get('evalue')}"
                )
            started = True
            for index, cell in enumerate(notebook.cells):
                if stop_after is not None and index > stop_after:
                    break
                try:
                    await client.async_execute_cell(
                        cell, index, execution_count=client.code_cells_executed + 1
                    )
                except (CellExecutionError, CellTimeoutError, DeadKernelError) as stop:
                    failed_at, stopped_by = index, stop
                    break
                finally:
                    if cell.cell_type == "code":
                        on_cell(code_cells.index(index) + 1, len(code_cells))
            client.set_widgets_metadata()
    except KernelFailure:
        raise
    except Exception as error:  # no such kernel, a kernel that dies or hangs while starting
        if not started:
            raise KernelFailure(f"could not start the kernel {kernel_name!r}: {error}") from None
        raise
    if failed_at is None or stopped_by is None:
        return Execution(notebook, client.code_cells_executed, None, None)
    failure, panel, diagnosis = _failure(notebook, failed_at, stopped_by)
    return Execution(
        notebook,
        client.code_cells_executed,
        failure,
        diagnosis,
        probed=panel is not None,
        blocking_on=panel is not None and panel[1],
    )


def execute(
    notebook: nbformat.NotebookNode,
    *,
    cwd: Path,
    kernel_name: str,
    env: Mapping[str, str] | None = None,
    cudacheck: bool = False,
    timeout: float | None = None,
    stop_after: int | None = None,
    on_cell: Callable[[int, int], None] = lambda done, total: None,
) -> Execution:
    """Run ``notebook`` (in place) up to its first failing cell, or up to cell ``stop_after``.
    Every code cell's old outputs are cleared first: cells after a failure must not show the
    outputs of an earlier run as if they had run now."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return asyncio.run(
        _execute(
            notebook,
            cwd=cwd,
            kernel_name=kernel_name,
            env=env or {},
            cudacheck=cudacheck,
            timeout=timeout,
            stop_after=stop_after,
            on_cell=on_cell,
        )
    )
