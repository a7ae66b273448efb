"""A coroutine run to its end on the asyncio loop this thread is already running.

A replay runs the previous kernel's cells through ``shell.run_cell`` from inside a cell (or a
widget's click) that ipykernel's event loop is running. IPython runs a cell with a top-level
``await`` through its loop runner, ``run_until_complete`` (IPython/core/async_helpers.py), which
refuses a loop that is running ("This event loop is already running", Lib/asyncio/base_events.py).
Here the loop's own iteration (``BaseEventLoop._run_once``, what ``run_forever`` repeats) is
driven from that call until the coroutine is done. The cell's awaits are served by the same loop,
with the tasks, futures and timers that earlier cells started on it, and those go on while it
runs, as they did when the cell first ran.

Only while a replayed cell runs. Other shell messages wait meanwhile as they wait behind any
running cell: ipykernel takes them one at a time (kernelbase.py, ``shell_main``'s lock, or its
single dispatch queue in ipykernel 6).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

# How long a cancelled coroutine (an interrupt) may take to unwind before it is left behind.
_UNWIND_S = 5.0


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop this thread is running now, where it can be driven from inside (a selector or
    proactor loop of the standard library: ``_run_once``); None otherwise."""
    loop = asyncio._get_running_loop()
    if loop is None or not callable(getattr(loop, "_run_once", None)):
        return None
    if not callable(getattr(asyncio.tasks, "_enter_task", None)):
        return None  # (asyncio's bookkeeping of the running task, since Python 3.7)
    return loop


class NestedRunner:
    """A loop runner for IPython (``shell.loop_runner``): runs a cell's coroutine on ``loop``,
    which is running further up this thread's stack."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return run_nested(self.loop, coro)

    def __str__(self) -> str:  # what ``%autoawait`` prints for the runner in use
        return "asyncio (nested, for a replay)"


def run_nested(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """``coro``'s result, run as a task of ``loop`` (running further up this thread's stack)."""
    # The task that is running now (ipykernel's, which runs the replay) stays running beneath
    # us: asyncio refuses to step another task of the loop while one is marked current.
    outer = asyncio.current_task(loop)
    task = loop.create_task(coro)
    if outer is not None:
        asyncio.tasks._leave_task(loop, outer)
    try:
        try:
            while not task.done():
                loop._run_once()  # type: ignore[attr-defined]
        except BaseException:
            # Interrupted (KeyboardInterrupt) or the loop itself failed: the cell's coroutine
            # must not go on by itself after the replay stopped.
            _cancel(loop, task)
            raise
    finally:
        if outer is not None:
            asyncio.tasks._enter_task(loop, outer)
    return task.result()


def _cancel(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    task.cancel()
    deadline = time.monotonic() + _UNWIND_S
    while not task.done() and time.monotonic() < deadline:
        try:
            loop._run_once()  # type: ignore[attr-defined]
        except BaseException:  # a second interrupt: leave it
            break
    if task.done() and not task.cancelled():
        task.exception()  # (retrieved: asyncio would log "exception was never retrieved")
