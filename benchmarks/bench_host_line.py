"""Where host memory's shortcut stops: the CPU op first (its check only when it raises) against the
rules first, for a valid and for a bad call, at growing sizes.

    python benchmarks/bench_host_line.py [--threads 1]

On a valid call the shortcut saves the rules (a few microseconds); on a bad one it costs the op's
work up to the point where it raises (``F.cross_entropy`` computes the whole log_softmax before
``nll_loss`` meets the targets). Past ``judge.HOST_FIRST_LINE`` elements in one tensor the guard
runs the rules first. Each row alternates the two ways within one run and prints medians and the
ratio; a benchmark, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard import judge

CLASSES = 32000  # a tokenizer-sized vocabulary: the LM loss the issue measured (8192 x 32000)
ROWS = (2, 8, 32, 128, 512, 2048)


def timed(call: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            with guard():
                call()
        except GuardError:
            pass
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def both(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(CPU op first, rules first), alternated so the machine's load hits both alike."""
    first: list[float] = []
    rules: list[float] = []
    for _ in range(5):
        judge.HOST_FIRST_LINE = 1 << 62
        first.append(timed(call, repeats))
        judge.HOST_FIRST_LINE = 0
        rules.append(timed(call, repeats))
    return statistics.median(first), statistics.median(rules)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--threads",
        type=int,
        help="torch.set_num_threads (on a shared, oversubscribed VM: 1; else parallel ops wait)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    line = judge.HOST_FIRST_LINE
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, load {load:.2f}"
    )
    print(
        f"{'logits':>14} {'elements':>10}  {'valid: first':>12} {'rules':>9} {'ratio':>6}"
        f"  {'bad: first':>10} {'rules':>9} {'ratio':>7}"
    )
    for rows in ROWS:
        logits = torch.randn(rows, CLASSES)
        good = torch.randint(0, CLASSES, (rows,))
        bad = good.clone()
        bad[-1] = CLASSES
        repeats = max(3, 2000 // rows)
        # F.cross_entropy looked up at each call, as user code does (a partial would hold the
        # bare function and meet the guard only at the op it calls inside)
        valid = both(lambda x=logits, y=good: F.cross_entropy(x, y), repeats)
        wrong = both(lambda x=logits, y=bad: F.cross_entropy(x, y), repeats)
        print(
            f"{rows:>6} x {CLASSES} {logits.numel():>10}  {valid[0] * 1e3:>10.3f}ms "
            f"{valid[1] * 1e3:>7.3f}ms {valid[1] / valid[0]:>6.3f}  {wrong[0] * 1e3:>8.3f}ms "
            f"{wrong[1] * 1e3:>7.3f}ms {wrong[1] / wrong[0]:>7.4f}"
        )
    judge.HOST_FIRST_LINE = line


if __name__ == "__main__":
    main()
