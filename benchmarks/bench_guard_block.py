"""What entering and leaving a guard costs: an empty ``with guard():`` block next to a bare one,
and a small training step run bare and with each step in its own guard (as a training loop that
wraps every step does; issue 30).

    python benchmarks/bench_guard_block.py [--rounds 30] [--blocks 200] [--steps 50] [--cpu-time]

Each round times every case once, in turn (so drift and the shared machine's load hit all
alike): ``--blocks`` empty blocks, or ``--steps`` steps. Printed per case: the median and the
minimum of the rounds' means (the minimum: the least disturbed round on a loaded machine).
``--cpu-time`` times by the thread's CPU time (one torch thread), which other processes do not
inflate. To compare two versions of the code, run this script from each checkout in turn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's nb_cudaguard, not an installed copy

import nb_cudaguard  # noqa: E402  (this checkout's, found through the line above)


def empty_blocks(enter: Callable[[], contextlib.AbstractContextManager[object]], count: int):
    def run() -> None:
        for _ in range(count):
            with enter():
                pass

    return run


def training_steps(guarded: bool, count: int) -> Callable[[], None]:
    """A small classifier's step (two Linear layers, batch 32, cross_entropy, SGD): launch-bound,
    so a fixed cost per step shows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()

    def run() -> None:
        for _ in range(count):
            if guarded:
                with nb_cudaguard.guard():
                    step()
            else:
                step()

    return run


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=200, help="empty blocks a round")
    parser.add_argument("--steps", type=int, default=50, help="training steps a round")
    parser.add_argument("--cpu-time", action="store_true", help="the thread's CPU time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time if args.cpu_time else time.perf_counter

    blocks: dict[str, tuple[Callable[[], None], int]] = {
        "bare block (contextlib.nullcontext)": (
            empty_blocks(contextlib.nullcontext, args.blocks),
            args.blocks,
        ),
        "guard() block, strict": (empty_blocks(nb_cudaguard.guard, args.blocks), args.blocks),
        "guard(mode='deferred') block": (
            empty_blocks(lambda: nb_cudaguard.guard(mode="deferred"), args.blocks),
            args.blocks,
        ),
        "training step, bare": (training_steps(False, args.steps), args.steps),
        "training step, each in guard()": (training_steps(True, args.steps), args.steps),
    }
    times: dict[str, list[float]] = {name: [] for name in blocks}
    for run, _ in blocks.values():
        run()  # warm: the guard plans its wrappers once per process
    for _ in range(args.rounds):
        for name, (run, count) in blocks.items():
            start = clock()
            run()
            times[name].append((clock() - start) / count * 1e6)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, torch {torch.__version__} (1 thread), "
        f"commit {commit()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        + ("the thread's CPU time" if args.cpu_time else "wall time")
        + ", load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    )
    print(f"{args.rounds} rounds; us per block or step: median of the rounds' means (minimum)")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(f"  {name:38} {medians[name]:9.1f}  ({min(values):.1f})")
    bare = medians["bare block (contextlib.nullcontext)"]
    strict, deferred = medians["guard() block, strict"], medians["guard(mode='deferred') block"]
    step, guarded = medians["training step, bare"], medians["training step, each in guard()"]
    print(
        f"  a guard's entry + exit over a bare block: {strict - bare:+.1f} us strict, "
        f"{deferred - bare:+.1f} us deferred; the guarded step: {guarded / step:.3f}x bare "
        f"({guarded - step:+.1f} us)"
    )


if __name__ == "__main__":
    main()
