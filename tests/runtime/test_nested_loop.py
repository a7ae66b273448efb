"""A coroutine run to its end from sync code that a running asyncio loop called (a magic inside
a cell that ipykernel's loop runs): runtime/nested_loop.py, and the replay's use of it with a
real IPython shell."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nb_cudaguard.runtime.nested_loop import NestedRunner, run_nested, running_loop


def _in_loop(body: Any) -> Any:
    """``body()`` called synchronously from inside a task of a running loop, as a magic is."""

    async def outer() -> Any:
        return body()

    return asyncio.run(outer())


def test_no_loop_running_here():
    assert running_loop() is None


def test_a_coroutine_awaiting_a_task_started_earlier_on_the_same_loop():
    def magic() -> tuple[Any, ...]:
        loop = running_loop()
        assert loop is not None
        outer = asyncio.current_task()
        ticks: list[int] = []

        async def ticker() -> int:
            for i in range(3):
                await asyncio.sleep(0.01)
                ticks.append(i)
            return len(ticks)

        task = loop.create_task(ticker())  # an earlier cell's ``ensure_future``

        async def cell() -> tuple[int, int]:
            await asyncio.sleep(0)
            return await task, asyncio.get_running_loop() is loop

        result = run_nested(loop, cell())
        return result, ticks, asyncio.current_task() is outer

    (done, same_loop), ticks, outer_current = _in_loop(magic)
    assert (done, same_loop) == (3, True)
    assert ticks == [0, 1, 2]
    assert outer_current  # the task that ran the magic is the running one again


def test_what_the_coroutine_raises_comes_back():
    def magic() -> None:
        async def cell() -> None:
            await asyncio.sleep(0)
            raise ValueError("from the cell")

        run_nested(running_loop(), cell())  # type: ignore[arg-type]

    with pytest.raises(ValueError, match="from the cell"):
        _in_loop(magic)


def test_an_interrupt_cancels_the_coroutine_and_goes_up():
    state: dict[str, Any] = {}

    def magic() -> None:
        loop = running_loop()
        assert loop is not None

        async def cell() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                state["cancelled"] = True
                raise

        def interrupt() -> None:
            raise KeyboardInterrupt

        loop.call_later(0.02, interrupt)
        try:
            run_nested(loop, cell())
        except KeyboardInterrupt:
            state["raised"] = True
        state["outer"] = asyncio.current_task() is not None

    _in_loop(magic)
    assert state == {"cancelled": True, "raised": True, "outer": True}


def test_ipython_runs_a_top_level_await_cell_from_inside_a_running_loop():
    """IPython's own runner refuses the running loop; the nested runner serves the cell."""
    from IPython.core.interactiveshell import InteractiveShell

    from nb_cudaguard.notebook.replay_glue import awaits_served

    shell = InteractiveShell.instance()
    shell.run_cell("import asyncio\nticks = []\n", store_history=False)

    def magic() -> tuple[bool, bool, bool, Any]:
        # (jupyter_client 7's ``run_sync`` applies nest_asyncio to the process's loops, which
        # lets IPython's runner start a running loop again: not a refusal to count on there)
        reentrant = bool(getattr(type(asyncio.get_running_loop()), "_nest_patched", False))
        shell.run_cell(
            "async def tick():\n    await asyncio.sleep(0.01)\n    ticks.append(1)\n"
            "t = asyncio.ensure_future(tick())",
            store_history=False,
        )
        plain = shell.run_cell("await asyncio.sleep(0)", store_history=False)
        runner = shell.loop_runner
        with awaits_served(shell):
            served = shell.run_cell("got = await t\nn = len(ticks)", store_history=False)
        return reentrant, plain.success, served.success, shell.loop_runner is runner

    reentrant, plain_ok, served_ok, runner_back = _in_loop(magic)
    assert reentrant or not plain_ok  # IPython's runner: "This event loop is already running"
    # The task an earlier cell started on the running loop is awaited there.
    assert served_ok and shell.user_ns["n"] == 1
    assert runner_back


def test_no_loop_running_leaves_ipythons_runner():
    from IPython.core.interactiveshell import InteractiveShell

    from nb_cudaguard.notebook.replay_glue import awaits_served

    shell = InteractiveShell.instance()
    runner = shell.loop_runner
    with awaits_served(shell):
        assert shell.loop_runner is runner
        assert shell.run_cell("import asyncio\nawait asyncio.sleep(0)").success


def test_the_runner_names_itself_for_autoawait():
    loop = asyncio.new_event_loop()
    try:
        assert "nested" in str(NestedRunner(loop))
    finally:
        loop.close()
