"""Send what a button's click prints and shows to the real outputs of the cell that showed it.

Frontends route iopub output to a cell by its ``parent_header`` (Jupyter messaging docs); a
click's output has the comm message as parent, so it lands nowhere or in an ``Output`` widget,
which a saved, reopened or converted notebook does not hold. JupyterLab 4 / Notebook 7 keep a
cell's request open after it ran (``requestExecute(content, false)`` in
``@jupyterlab/outputarea``): output sent with it as parent is added to that cell's outputs.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


def showing_cell(shell: InteractiveShell) -> dict[str, Any] | None:
    """The request running now (the cell that shows a button), where the frontend is one that
    files later output under it (JupyterLab, Notebook 7, Kaggle's); None in VS Code and Colab,
    whose routing after a cell ran is not that, and outside a kernel."""
    from ..restart.environment import Environment, detect

    get_parent = getattr(shell, "get_parent", None)  # ipykernel's ZMQInteractiveShell
    if get_parent is None or detect() not in (Environment.JUPYTER, Environment.KAGGLE):
        return None
    try:
        parent = get_parent()
    except Exception:
        return None
    header = parent.get("header") if isinstance(parent, dict) else None
    if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
        return None
    return dict(parent)


@contextlib.contextmanager
def into_cell(
    shell: InteractiveShell, cell: dict[str, Any] | None, fallback: Any = None
) -> Iterator[None]:
    """Within: what is printed, displayed, or raised goes to ``cell``'s outputs (``showing_cell``
    at the button's display); where there is no such cell, into ``fallback`` (an ``Output``
    widget) if given. The click's own parent comes back after, the streams flushed first so
    that nothing printed within leaves under it."""
    set_parent = getattr(shell, "set_parent", None)
    get_parent = getattr(shell, "get_parent", None)
    if cell is None or set_parent is None or get_parent is None:
        with fallback if fallback is not None else contextlib.nullcontext():
            yield
        return
    previous = get_parent()
    set_parent(cell)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        set_parent(previous)
