"""Which cells launched CUDA work, and the opt-in end-of-cell synchronise.

CUDA kernels run asynchronously: a bad kernel launched in cell 5 is reported at the next call
PyTorch checks, sometimes in a later cell (PyTorch's own hint says so: "CUDA kernel errors might
be asynchronously reported at some other API call", c10/cuda/CUDAMiscFunctions.cpp);
``diagnosis.where`` turns what this
module records into a sentence. Two signals per cell: the caching allocator's cumulative
allocation count (a host-side read; almost every kernel that produces a tensor allocates) and,
only where nothing was allocated (in-place ops), whether the current stream still had work queued
when the cell ended. That one is a driver call, so it is never made in the cell's thread: it is
handed to the probe's worker thread and its answer collected later (``settle``), so a wedged driver
can cost an answer, never the notebook. After a sticky error either may fail: "unknown".

``SyncAfterCell`` is the opt-in setting that makes each cell wait for its own GPU work, so errors
surface in the cell that launched them. It rewrites the cell's last statement ``x`` into
``sync_after_cell(x)`` (the value, and so the cell's displayed result, is unchanged); a cell
ending in a statement gets ``if sync_after_cell(None): pass`` appended. The synchronise then raises
inside the cell itself, which is marked failed as it should be.
"""

from __future__ import annotations

import ast
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .probe import ask_work_queued

_Node = TypeVar("_Node", bound=ast.AST)
_Call = TypeVar("_Call", bound="CallAtCellEnd")


def _cuda_allocations() -> int | None:
    """The caching allocator's cumulative allocation count, or None when CUDA is not in use."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        # The nested form: memory_stats() flattens the same dict in Python, ~6x the cost (186 vs
        # 30 us per call on an H100 machine, benchmarks/bench_extension.py --cuda).
        return int(torch.cuda.memory_stats_as_nested_dict()["allocation"]["all"]["allocated"])
    except Exception:
        return None


def _ask_work_queued() -> tuple[list[bool], threading.Event] | None:
    torch = sys.modules.get("torch")
    try:
        return None if torch is None else ask_work_queued(torch)
    except Exception:
        return None


_KEEP_CELLS = 500  # a long session: the recent cells are the ones a later error can point at


@dataclass
class CellTracker:
    """Remember, per execution count, whether the cell launched CUDA work.

    One reading per cell, at its end: the count at the end of the last cell is where the next
    one starts (nothing launches between cells but other threads, which a per-cell reading would
    not tell apart either).
    """

    launched: dict[int, bool] = field(default_factory=dict)
    # Cells marked only because work was still queued at their end: it may be an earlier cell's
    # (on an H100, a kernel that hit an assert one cell before still held the stream).
    queued: set[int] = field(default_factory=set)
    _last: int | None = None  # allocations at the end of the last tracked cell
    _depth: int = 0
    # Cells that allocated nothing, waiting for the worker's "was work queued?" answer.
    _asked: dict[int, tuple[list[bool], threading.Event]] = field(default_factory=dict)

    def start(self) -> None:
        self._depth += 1

    def finish(self, cell: int | None) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth or cell is None:
            return
        allocations = _cuda_allocations()
        if allocations is None:
            return
        before, self._last = self._last or 0, allocations
        self.launched[cell] = allocations > before
        if allocations <= before:
            # In-place ops allocate nothing: ask whether the cell left work queued.
            asked = _ask_work_queued()
            if asked is not None:
                self._asked[cell] = asked
        if len(self.launched) > 2 * _KEEP_CELLS:
            for old in sorted(self.launched)[:-_KEEP_CELLS]:
                del self.launched[old]
            self.queued &= self.launched.keys()
        if len(self._asked) > _KEEP_CELLS:  # answers that never came (a stuck driver)
            for old in sorted(self._asked)[:-_KEEP_CELLS]:
                del self._asked[old]

    def settle(self, timeout: float = 0.0) -> dict[int, bool]:
        """``launched``, with the answers that came back (waiting up to ``timeout`` in all)."""
        deadline = time.monotonic() + timeout
        for cell, (answer, done) in list(self._asked.items()):
            if done.wait(max(0.0, deadline - time.monotonic())):
                del self._asked[cell]
                if answer and answer[0] and cell in self.launched:
                    self.launched[cell] = True
                    self.queued.add(cell)
        return self.launched


def sync_after_cell(value: Any = None) -> Any:
    """Wait for this cell's GPU work (so its errors surface here), then hand ``value`` back."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            initialized = torch.cuda.is_initialized()
        except Exception:
            initialized = False
        if initialized:
            torch.cuda.synchronize()
    return value


class CallAtCellEnd(ast.NodeTransformer):
    """IPython AST transformer: end every cell with a call of ``module.function``.

    The last statement ``x`` becomes ``function(x)`` (which hands ``x`` back, so the cell's
    displayed value is unchanged); a cell ending in a statement gets ``if function(None): pass``
    appended. The call runs inside the cell, so what it raises fails that cell.
    """

    def __init__(self, module: str, function: str) -> None:
        super().__init__()
        self.module, self.function = module, function

    def _call(self, value: ast.expr) -> ast.expr:
        # __import__(module, fromlist=[function]).function(value): no name enters the namespace.
        module = ast.Call(
            func=ast.Name(id="__import__", ctx=ast.Load()),
            args=[ast.Constant(self.module)],
            keywords=[
                ast.keyword(
                    arg="fromlist",
                    value=ast.List(elts=[ast.Constant(self.function)], ctx=ast.Load()),
                )
            ],
        )
        return ast.Call(
            func=ast.Attribute(value=module, attr=self.function, ctx=ast.Load()),
            args=[value],
            keywords=[],
        )

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not node.body:
            return node
        last = node.body[-1]
        if isinstance(last, ast.Expr):
            last.value = _located(self._call(last.value), last)
        else:
            # A statement, not an expression: an appended expression would make IPython run
            # it in 'single' mode through the display hook.
            test = self._call(ast.Constant(None))
            node.body.append(_located(ast.If(test=test, body=[ast.Pass()], orelse=[]), last))
        return node


def toggle_transformer(
    transformers: list[Any], current: _Call | None, on: bool, make: Callable[[], _Call]
) -> _Call | None:
    """Put a new ``make()`` into IPython's AST transformers, or take ``current`` out (only if
    still there: the user may have removed it); returns what is now in place."""
    if on and current is None:
        current = make()
        transformers.append(current)
    elif not on and current is not None:
        if current in transformers:
            transformers.remove(current)
        current = None
    return current


class SyncAfterCell(CallAtCellEnd):
    """Synchronise CUDA at the end of every cell (opt-in: ``%cudaguard sync on``)."""

    def __init__(self) -> None:
        super().__init__(__name__, "sync_after_cell")


def _located(new: _Node, like: ast.stmt) -> _Node:
    """Give our new nodes the last statement's position (cheaper than fix_missing_locations
    over the whole cell, which IPython runs once more anyway)."""
    for child in ast.walk(new):
        if "lineno" in child._attributes and not hasattr(child, "lineno"):
            ast.copy_location(child, like)
    return new


def is_sync_frame(error: BaseException) -> bool:
    """Whether the error was raised by our end-of-cell synchronise."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is sync_after_cell.__code__:
            return True
        tb = tb.tb_next
    return False
