"""How long diagnose() takes on a long pasted log, next to the bare exception text.

    python benchmarks/bench_diagnose.py

Cases, measured in alternating blocks (medians): the exception text alone; a 10,000-line
training log with the device line and the exception at its end; 10,000 device lines (every GPU
thread printed one); a 640 kB paste flattened into one line.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

from nb_cudaguard import diagnose

LINE = H100_TORCH_2_11["cross-entropy-label"][0]
ERROR = "torch.AcceleratorError: " + ASSERT_2_9
CASES = {
    "exception text alone": f"{LINE}\n{ERROR}",
    "10k-line training log": (
        "2024-05-02 10:11:12 INFO step 1200 loss=0.4312 lr=3e-05 grad_norm=1.2\n" * 10_000
        + f"{LINE}\n{ERROR}"
    ),
    "10k device lines": "".join(
        LINE.replace("thread: [1,0,0]", f"thread: [{i % 1024},0,0]") + "\n" for i in range(10_000)
    )
    + ERROR,
    "640 kB on one line": "step failed on device cuda " * 24_000 + f" {LINE} {ERROR}",
}


def main() -> None:
    timings: dict[str, list[float]] = {name: [] for name in CASES}
    for _round in range(7):
        for name, text in CASES.items():
            started = time.perf_counter()
            diagnosis = diagnose(text)
            timings[name].append(time.perf_counter() - started)
            assert diagnosis is not None and diagnosis.cause == "label-out-of-range", name
    base = statistics.median(timings["exception text alone"])
    for name, values in timings.items():
        median = statistics.median(values)
        lines = CASES[name].count("\n") + 1
        print(f"{name:24s} {lines:6d} lines  {median * 1000:8.2f} ms  x{median / base:8.1f}")


if __name__ == "__main__":
    main()
