"""Where an asynchronous CUDA error surfaced, and where it was most likely launched.

A bad kernel launched in cell 5 is reported at the next call PyTorch checks, often an operation
that cannot assert itself (``.item()``, ``print(t)``, ``.to()``, ``.cpu()``), sometimes in a later
cell (FIELD_NOTES §1). Pure: the caller hands in which cells launched CUDA work.
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Mapping

# The calls where an earlier kernel's error typically surfaces, by name: copies and syncs only.
_COPY_OR_SYNC = frozenset(
    {"item", "cpu", "to", "tolist", "numpy", "detach", "copy_", "synchronize", "save"}
    | {"print", "repr", "str", "float", "int", "bool", "display"}
)


def last_launching_cell(launched: Mapping[int, bool], before: int | None = None) -> int | None:
    """The newest cell (before ``before``) that launched CUDA work."""
    cells = [c for c, did in launched.items() if did and (before is None or c < before)]
    return max(cells) if cells else None


def surfaced_at(error: BaseException) -> str | None:
    """The source line of the innermost user frame of the traceback (cell code, not libraries)."""
    tb = error.__traceback__
    line_text: str | None = None
    while tb is not None:
        code = tb.tb_frame.f_code
        filename = code.co_filename
        # Cells are compiled from "<ipython-input-..>" or ipykernel's temp files.
        if filename.startswith("<") or "ipykernel_" in filename or "/ipykernel" in filename:
            text = linecache.getline(filename, tb.tb_lineno).strip()
            line_text = text or line_text
        tb = tb.tb_next
    return line_text


def _only_copies_or_waits(line: str) -> bool:
    """Every call on the line copies or waits (``print(loss.item())``). One more call can launch
    the failing kernel itself (``criterion(out, y.to(device))``, ``x.gather(1, i.to(device))``),
    and a line that is part of a longer statement cannot be judged alone: neither is innocent."""
    try:
        tree = ast.parse(line)
    except SyntaxError:
        return False
    names = [
        call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
    ]
    return bool(names) and all(name in _COPY_OR_SYNC for name in names)


def where_sentence(
    error: BaseException,
    cell: int | None,
    launched: Mapping[int, bool],
    *,
    synced: bool = False,
) -> str | None:
    """Where the error surfaced and where it was most likely launched, or None if unclear.

    ``launched`` says, per execution count, whether that cell launched CUDA work; ``synced``, that
    the error was raised by the end-of-cell synchronise of ``cell``.
    """
    if synced:
        return (
            f"It surfaced at the end-of-cell synchronise of cell [{cell}] (%cudaguard sync on), "
            "so the failing kernel was launched by this cell."
        )
    line = surfaced_at(error)
    here = f"cell [{cell}]" if cell is not None else "this cell"
    own = launched.get(cell) if cell is not None else None
    earlier = last_launching_cell(launched, before=cell)
    innocent = line is not None and _only_copies_or_waits(line)
    if own is False and earlier is not None:
        return (
            f"It surfaced in {here} at `{line}`, in a cell that did no CUDA work of its own: "
            f"the failing kernel was most likely launched in cell [{earlier}], the last cell "
            "that launched CUDA work."
        )
    if innocent:
        tail = f" or in cell [{earlier}]" if earlier is not None else ""
        return (
            f"It surfaced in {here} at `{line}`, an operation that only copies or waits and "
            f"cannot assert: the failing kernel was launched earlier, in this cell{tail}."
        )
    return None
