"""What the loaded extension costs when nothing fails, and what `import nb_cudaguard` costs.

Usage::

    python benchmarks/bench_extension.py [--cells 4000] [--imports 15] [--cuda]

``--cuda``: CUDA is initialised in the shell first, so the per-cell hooks also read the caching
allocator and the stream (what every cell of a GPU notebook pays), and the cell tracker's reading
is timed on its own.

Per-cell cost: a real InteractiveShell runs the same successful cell with the extension unloaded
and loaded, in alternating blocks within one run, and the medians are compared. Import cost: fresh
interpreters import nb_cudaguard, alone and after importing IPython (as every kernel has); the
import itself is timed inside each interpreter.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_cell(cells: int, blocks: int = 10, cuda: bool = False) -> tuple[float, float]:
    """Median µs per successful cell, (unloaded, loaded)."""
    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    shell = get_ipython()
    code = "x = sum(range(10))"
    if cuda:
        shell.run_cell("import torch\n_t = torch.ones(1, device='cuda')", store_history=False)
    timings: dict[bool, list[float]] = {False: [], True: []}
    with capture_output():
        for block in range(blocks * 2):
            loaded = block % 2 == 1
            if loaded:
                shell.run_line_magic("load_ext", "nb_cudaguard")
                # Once per session, not per cell: the first cell starts the fd 2 tee's child
                # process (timed on its own by first_cell_ms).
                shell.run_cell(code, store_history=False)
            start = time.perf_counter()
            for _ in range(cells // blocks):
                shell.run_cell(code, store_history=False)
            timings[loaded].append((time.perf_counter() - start) / (cells // blocks) * 1e6)
            if loaded:
                shell.run_line_magic("unload_ext", "nb_cudaguard")
    return statistics.median(timings[False]), statistics.median(timings[True])


def first_cell_ms(repeat: int = 5) -> float:
    """ms of the first cell after %load_ext, which starts the fd 2 tee's child process (once per
    session), minus an ordinary cell's time."""
    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    shell = get_ipython()
    code = "x = sum(range(10))"
    first: list[float] = []
    with capture_output():
        for _ in range(repeat):
            shell.run_line_magic("load_ext", "nb_cudaguard")
            start = time.perf_counter()
            shell.run_cell(code, store_history=False)
            middle = time.perf_counter()
            shell.run_cell(code, store_history=False)
            end = time.perf_counter()
            first.append((middle - start) - (end - middle))
            shell.run_line_magic("unload_ext", "nb_cudaguard")
    return statistics.median(first) * 1e3


def hook_only(calls: int = 200_000) -> float:
    """µs per post_run_cell call on a successful cell: the extension's own share of a cell."""
    from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult
    from IPython.testing.globalipapp import get_ipython

    from nb_cudaguard.notebook.extension import CudaGuardExtension

    state = CudaGuardExtension(get_ipython())
    result = ExecutionResult(ExecutionInfo("x = 1", False, False, True, None))
    start = time.perf_counter()
    for _ in range(calls):
        state.post_run_cell(result)
    return (time.perf_counter() - start) / calls * 1e6


def profile_hooks(cells: int, cuda: bool) -> None:
    """Where a loaded cell's time goes: cProfile over ``cells`` successful cells, each hook's
    parts per cell (cumulative, so a part includes what it calls), then the top functions by
    their own time. cProfile slows every call, so read the shares, not the sums."""
    import cProfile
    import pstats

    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    shell = get_ipython()
    if cuda:
        shell.run_cell("import torch\n_t = torch.ones(1, device='cuda')", store_history=False)
    parts = (
        "pre_run_cell", "post_run_cell", "start", "finish", "stop", "settle", "read",
        "_read_cuda", "_cuda_allocations", "_ask_work_queued", "received", "clear",
    )  # fmt: skip
    with capture_output():
        shell.run_line_magic("load_ext", "nb_cudaguard")
        shell.run_cell("x = sum(range(10))", store_history=False)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(cells):
            shell.run_cell("x = sum(range(10))", store_history=False)
        profiler.disable()
        shell.run_line_magic("unload_ext", "nb_cudaguard")
    stats = pstats.Stats(profiler)
    print(f"profile of {cells} loaded cells (cumulative µs per cell, under cProfile):")
    for (path, line, name), (_, calls, _, cumulative, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: -item[1][3],
    ):
        if "nb_cudaguard" in path and name in parts:
            where = path.split("nb_cudaguard/")[-1]
            print(f"  {cumulative / cells * 1e6:8.1f}  {where}:{line} {name} ({calls} calls)")
    stats.sort_stats("tottime").print_stats(15)


def ablate(
    cells: int, blocks: int = 10, cuda: bool = False, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """Median µs per successful cell: unloaded, loaded, and loaded with one part switched off in
    turn (all in alternating blocks), so each part's share is measured, not inferred from a
    profile. The parts: the stream question handed to the probe's worker (every cell that
    allocated nothing asks it), the cell tracker's readings altogether, replay's recorder, the
    fd 2 tee."""
    from IPython.testing.globalipapp import get_ipython
    from IPython.utils.capture import capture_output

    from nb_cudaguard.notebook.extension import current_state
    from nb_cudaguard.runtime import cells as tracker

    shell = get_ipython()
    code = "x = sum(range(10))"
    if cuda:
        shell.run_cell("import torch\n_t = torch.ones(1, device='cuda')", store_history=False)
    asks, reads = tracker._ask_work_queued, tracker._cuda_allocations

    def without_question() -> None:
        tracker._ask_work_queued = lambda: None

    def without_tracker() -> None:
        tracker._cuda_allocations = lambda: None

    def without_recorder() -> None:
        state = current_state(shell)
        assert state is not None
        state.recorder = None

    def without_tee() -> None:  # as after a failed start: the tee is never started again
        state = current_state(shell)
        assert state is not None
        state._tee_failed = True

    variants: dict[str, Callable[[], None] | None] = {
        "unloaded": None,
        "loaded": lambda: None,
        "loaded, no stream question": without_question,
        "loaded, no cell tracker": without_tracker,
        "loaded, no recorder": without_recorder,
        "loaded, no fd 2 tee": without_tee,
    }
    timings: dict[str, list[float]] = {name: [] for name in variants}
    with capture_output():
        for _ in range(blocks):
            for name, switch_off in variants.items():
                if switch_off is not None:
                    shell.run_line_magic("load_ext", "nb_cudaguard")
                    switch_off()
                    shell.run_cell(code, store_history=False)  # the tee's child starts here
                start = clock()
                for _ in range(cells // blocks):
                    shell.run_cell(code, store_history=False)
                timings[name].append((clock() - start) / (cells // blocks) * 1e6)
                tracker._ask_work_queued, tracker._cuda_allocations = asks, reads
                if switch_off is not None:
                    shell.run_line_magic("unload_ext", "nb_cudaguard")
    return {name: statistics.median(values) for name, values in timings.items()}


def cell_tracker_us(calls: int = 20_000) -> dict[str, float]:
    """µs per cell of the cell tracker's CUDA reading, and per call of the readings it could use:
    the allocator's statistics, flattened or nested, and the stream query."""
    import torch

    from nb_cudaguard.runtime.cells import CellTracker
    from nb_cudaguard.runtime.probe import ask_work_queued

    assert torch.cuda.is_initialized(), "CUDA is not initialised"
    tracker = CellTracker()
    x = torch.zeros(1, device="cuda")

    def cell_without_cuda() -> None:
        tracker.start()
        tracker.finish(1)

    def cell_with_cuda() -> None:
        tracker.start()
        torch.empty(1, device="cuda")  # the allocation is timed too: compare with "allocate"
        tracker.finish(1)

    candidates = {
        "tracker, a cell without CUDA work": cell_without_cuda,
        "tracker, a cell that allocated": cell_with_cuda,
        "allocate (the cell's own work above)": lambda: torch.empty(1, device="cuda"),
        "memory_stats()": torch.cuda.memory_stats,
        "memory_stats_as_nested_dict()": torch.cuda.memory_stats_as_nested_dict,
        "current_stream().query()": lambda: torch.cuda.current_stream().query(),
        "ask_work_queued() (handed to the worker)": lambda: ask_work_queued(torch),
        "in-place add (no allocation)": lambda: x.add_(1),
    }
    timings = {}
    for name, call in candidates.items():
        start = time.perf_counter()
        for _ in range(calls):
            call()
        timings[name] = (time.perf_counter() - start) / calls * 1e6
    return timings


def import_ms(before: str, runs: int) -> float:
    """Median ms that `import nb_cudaguard` takes in a fresh interpreter that first ran `before`."""
    statement = (
        f"{before}\nimport time\nstart = time.perf_counter()\nimport nb_cudaguard\n"
        "print((time.perf_counter() - start) * 1e3)"
    )
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", statement],
                check=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout
        )
        for _ in range(runs)
    ]
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--imports", type=int, default=15)
    parser.add_argument("--cuda", action="store_true", help="initialise CUDA in the shell first")
    parser.add_argument(
        "--profile", type=int, metavar="CELLS", help="only profile CELLS loaded cells, then stop"
    )
    parser.add_argument(
        "--ablate",
        type=int,
        metavar="CELLS",
        help="only time CELLS cells per variant, each part of the hooks switched off in turn",
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="with --ablate: by the thread's CPU time"
    )
    args = parser.parse_args()
    if args.profile:
        profile_hooks(args.profile, args.cuda)
        return
    if args.ablate:
        # The thread's CPU time where asked: a loaded machine's other processes do not count.
        clock = time.thread_time if args.cpu_time else time.perf_counter
        medians = ablate(args.ablate, cuda=args.cuda, clock=clock)
        for name, value in medians.items():
            print(f"  {name:30} {value:8.1f} µs per cell ({value - medians['unloaded']:+.1f})")
        return

    bare, loaded = per_cell(args.cells, cuda=args.cuda)
    if args.cuda:
        import torch

        print(f"CUDA initialised: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        for name, us in cell_tracker_us().items():
            print(f"  {name}: {us:.2f} µs per call")
    print(
        f"per cell, nothing fails: unloaded {bare:.1f} µs, loaded {loaded:.1f} µs, "
        f"added {loaded - bare:+.1f} µs (ratio {loaded / bare:.3f}; target <= +50 µs)"
    )
    print(f"post_run_cell hook alone on a successful cell: {hook_only():.3f} µs")
    print(
        f"first cell after %load_ext (starts the fd 2 tee child, once): +{first_cell_ms():.1f} ms"
    )

    cold = import_ms("", args.imports)
    warm = import_ms("import IPython", args.imports)
    print(f"import nb_cudaguard, fresh interpreter: {cold:.2f} ms (target <= 30 ms)")
    print(f"import nb_cudaguard after IPython (as in a kernel): {warm:.2f} ms")
    leaked = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, nb_cudaguard; "
            "print([m for m in ('torch', 'IPython', 'ipywidgets') if m in sys.modules])",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.strip()
    print(f"heavy modules imported by `import nb_cudaguard`: {leaked}")


if __name__ == "__main__":
    main()
