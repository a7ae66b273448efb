"""What the replay adds: saving the cells at our restart, and planning in the new kernel.

    python benchmarks/bench_replay.py [--repeats 15]

A notebook-like history of N cells (imports, data loading, mutations, a training loop, display
cells, magics; about 300 characters each) is saved as the restart saves it, read back as the new
process reads it, and planned as ``%load_ext`` plans it (IPython's transform, ``ast``, the
planner) in a real InteractiveShell, for N = 50, 500 and 2000 (the cap; the oldest cell goes),
first with no cell analysed yet (at ``%load_ext``), then again (the command or the click: the
cells' facts are kept, the namespace is read anew). Medians over repeats, wall clock and this
process's CPU time (the VM is shared: CPU time is what the code costs).

Last, the worst case for the planner: a chain of 2000 cells, each building a list from the one
before and changing that one in place, so that every cell is chosen and every name is linked
to all the earlier ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N = (50, 500, 2000)
BLOCK = [
    "import torch\nimport numpy as np\n%matplotlib inline",
    "data_{i} = np.random.rand(100, 8)  # load\nlabels_{i} = (data_{i}[:, 0] * 4).astype(int)\n"
    "print(data_{i}.shape, labels_{i}.max())",
    "data_{i}[labels_{i} == 0] = 0.0\nlabels_{i}[labels_{i} > 3] = 3",
    "%%time\nmodel_{i} = torch.nn.Linear(8, 4)\n"
    "opt_{i} = torch.optim.SGD(model_{i}.parameters(), 0.1)",
    "def step_{i}(x, y):\n    opt_{i}.zero_grad()\n    loss = torch.nn.functional.cross_entropy("
    "model_{i}(x), y)\n    loss.backward()\n    opt_{i}.step()\n    return loss.item()",
    "for epoch in range(3):\n    l = step_{i}(torch.tensor(data_{i}, dtype=torch.float32), "
    "torch.tensor(labels_{i}))\n    print(epoch, l)",
    "model_{i}.eval()\nlabels_{i}[:5]",
    "df_{i} = {{'loss': [1.0, 0.5]}}\ndf_{i}",
    "!ls\nfiles_{i} = !ls",
    "%cudaguard status",
]


def history(n: int) -> list[str]:
    return [BLOCK[k % len(BLOCK)].format(i=k // len(BLOCK)) for k in range(n)]


def chain(n: int) -> list[str]:
    return ["x0 = [0]"] + [f"x{k} = x{k - 1} + [1]\nx{k - 1}.append(2)" for k in range(1, n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    from IPython.testing.globalipapp import get_ipython

    from nb_cudaguard.notebook.replay_glue import ReplayState, make_plan
    from nb_cudaguard.replay.history import Cell, SavedCells, load_cells, save_cells

    shell = get_ipython()
    print(
        f"{'cells':>6} {'kB':>6} {'save ms':>8} {'read ms':>8} {'plan ms':>8} {'cpu ms':>7} "
        f"{'again ms':>9} {'chosen':>7}"
    )
    with tempfile.TemporaryDirectory() as base:
        connection = os.path.join(base, "kernel-bench.json")
        Path(connection).write_text("{}")
        cases = [(n, history(n), "x = torch.tensor(data_0)\nmodel_0(x)[labels_0]") for n in N]
        cases.append((2000, chain(2000), "print(x1999[5])"))
        for n, sources, failing in cases:
            cells = [Cell(s, i + 1, False) for i, s in enumerate(sources)]
            cells.append(Cell(failing, n + 1, True))
            size = sum(len(c.source) for c in cells) / 1000
            saves, reads, plans, cpus, agains = [], [], [], [], []
            chosen = 0
            for _ in range(args.repeats):
                start = time.perf_counter()
                save_cells(base, connection, cells, len(cells) - 1)
                saves.append(time.perf_counter() - start)
                created = time.time()
                start = time.perf_counter()
                saved, why = load_cells(
                    base, connection, started=created, image_started=created + 1
                )
                reads.append(time.perf_counter() - start)
                assert saved is not None, why
                again = SavedCells(saved.cells, saved.failing, created, 0)
                replay = ReplayState()  # the first plan, at %load_ext: no cell analysed yet
                start, cpu = time.perf_counter(), time.process_time()
                plan = make_plan(shell, again, replay)
                plans.append(time.perf_counter() - start)
                cpus.append(time.process_time() - cpu)
                start = time.perf_counter()  # the command or the click, later
                make_plan(shell, again, replay)
                agains.append(time.perf_counter() - start)
                chosen = len(plan.steps)
            print(
                f"{n + 1:>6} {size:>6.0f} {statistics.median(saves) * 1e3:>8.2f} "
                f"{statistics.median(reads) * 1e3:>8.2f} {statistics.median(plans) * 1e3:>8.1f} "
                f"{statistics.median(cpus) * 1e3:>7.1f} "
                f"{statistics.median(agains) * 1e3:>9.1f} {chosen:>7}"
            )


if __name__ == "__main__":
    main()
