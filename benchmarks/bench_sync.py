"""Cost of `%cudaguard sync on` (synchronise CUDA at the end of every cell), per cell.

Runs the same cells in a real IPython shell with the extension loaded, sync off and sync on, and
prints the times side by side in one run. On a machine without CUDA (or with torch not yet using
it) this measures the extension's own per-cell overhead: the AST rewrite and the call. On a GPU,
the extra cost is the wait for work the cell queued, which the next CUDA call would have waited
for anyway; the cell then ends later by the time its queued work takes.

    python benchmarks/bench_sync.py [--rounds 200] [--gpu]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

# Measure this checkout's nb_cudaguard, not an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cell_code(gpu: bool) -> list[str]:
    device = "cuda" if gpu else "cpu"
    return [
        "x = 1 + 1",
        "y = [i * i for i in range(100)]\nsum(y)",
        f"t = torch.randn(64, 64, device={device!r})",
        "u = (t @ t).relu()\nu.shape",
        "def f(a):\n    return a * 2\nf(3)",
    ]


def _round(shell, cells: list[str]) -> float:
    # silent=False: a silent run_cell skips the pre/post_run_cell events the extension hooks.
    with contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        for code in cells:
            result = shell.run_cell(code, store_history=False)
            assert result.success, result.error_in_exec
        elapsed = time.perf_counter() - start
    return elapsed / len(cells)


def _set(shell, setting: str) -> None:
    loaded = "nb_cudaguard" in shell.extension_manager.loaded
    if setting == "not loaded":
        if loaded:
            shell.extension_manager.unload_extension("nb_cudaguard")
        return
    if not loaded:
        shell.extension_manager.load_extension("nb_cudaguard")
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_line_magic("cudaguard", "sync on" if setting == "sync on" else "sync off")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the cells per setting")
    parser.add_argument("--gpu", action="store_true", help="put the tensors on CUDA")
    args = parser.parse_args()

    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.run_cell("import torch\ntorch.set_num_threads(1)", store_history=False)
    cells = _cell_code(args.gpu)
    settings = ("not loaded", "sync off", "sync on")
    times: dict[str, list[float]] = {name: [] for name in settings}
    for name in settings:  # warm up
        _set(shell, name)
        _round(shell, cells)
    # Interleaved in blocks, so drift and noise spread over every setting alike; the first round
    # after a switch is not timed (loading the extension is not a per-cell cost).
    block = 10
    for _ in range(max(1, args.rounds // block)):
        for name in settings:
            _set(shell, name)
            _round(shell, cells)
            times[name].extend(_round(shell, cells) for _ in range(block))
    _set(shell, "not loaded")

    base = statistics.median(times["not loaded"])
    print(
        f"{len(cells)} cells x {args.rounds} rounds per setting, device: "
        f"{'cuda' if args.gpu else 'cpu'}; median time per cell"
    )
    print("".join(f"{name:>16}" for name in settings))
    print("".join(f"{statistics.median(times[n]) * 1e6:>14.1f}us" for n in settings))
    print("".join(f"{statistics.median(times[n]) / base:>15.3f}x" for n in settings))
    off, on = statistics.median(times["sync off"]), statistics.median(times["sync on"])
    print(f"sync on vs sync off: {on / off:.3f}x ({(on - off) * 1e6:+.1f}us per cell)")


if __name__ == "__main__":
    main()
