"""What the guard costs: a small transformer classifier's training step, guarded vs bare.

    python benchmarks/bench_guard.py            # CPU
    python benchmarks/bench_guard.py --cuda     # GPU: also CUDA_LAUNCH_BLOCKING=1 in a subprocess

Guarded and bare blocks alternate within one run (so drift and thermal state hit both alike);
the ratio is median(guarded) / median(bare). A benchmark, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

import nb_cudaguard
from nb_cudaguard._guard import STATS

VOCAB, CLASSES, DIM, SEQ, BATCH = 1000, 10, 64, 32, 16


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.position = nn.Parameter(torch.zeros(SEQ, DIM))
        layer = nn.TransformerEncoderLayer(DIM, 4, 2 * DIM, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def make(device: str) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Classifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), device=device)
    ids[:, -4:] = 0  # padding
    labels = torch.randint(0, CLASSES, (BATCH,), device=device)
    labels[0] = -100  # an ignored example, as in real data
    return model, optimizer, ids, labels


def step(
    model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, y: torch.Tensor
) -> None:
    loss = F.cross_entropy(model(ids), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def block(device: str, parts: tuple, steps: int, guarded: bool) -> float:
    """Seconds per step over `steps` steps."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    if guarded:
        with nb_cudaguard.guard():
            for _ in range(steps):
                step(*parts)
    else:
        for _ in range(steps):
            step(*parts)
    sync()
    return (time.perf_counter() - start) / steps


def measure(device: str, reps: int, steps: int, modes: tuple[str, ...]) -> dict[str, float]:
    parts = make(device)
    for mode in modes:  # warm-up: allocator, autograd, lazy init
        block(device, parts, 3, mode == "guarded")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(reps):
        for mode in modes:
            times[mode].append(block(device, parts, steps, mode == "guarded"))
    return {mode: statistics.median(values) for mode, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bare-only-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = "cuda" if args.cuda else "cpu"

    if args.bare_only_json:  # the CUDA_LAUNCH_BLOCKING=1 child
        print(json.dumps(measure(device, args.reps, args.steps, ("bare",))))
        return

    result = measure(device, args.reps, args.steps, ("bare", "guarded"))
    STATS.clear()
    block(device, make(device), 1, guarded=True)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name()})" if args.cuda else "")
    )
    print(
        f"checked calls per step: {STATS['calls']}, host transfers per step: {STATS['transfers']}"
    )
    bare, guarded = result["bare"], result["guarded"]
    print(f"bare    {bare * 1e3:8.3f} ms/step")
    print(f"guarded {guarded * 1e3:8.3f} ms/step   ratio {guarded / bare:.3f}")

    if args.cuda:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--cuda",
                "--bare-only-json",
                "--reps",
                str(args.reps),
                "--steps",
                str(args.steps),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        blocking = json.loads(child.stdout.strip().splitlines()[-1])["bare"]
        print(
            f"CUDA_LAUNCH_BLOCKING=1 {blocking * 1e3:8.3f} ms/step   ratio {blocking / bare:.3f}"
            " (separate process)"
        )


if __name__ == "__main__":
    main()
