"""What the guard costs: a small transformer classifier's training step, strict and deferred
guard vs bare.

    python benchmarks/bench_guard.py            # CPU
    python benchmarks/bench_guard.py --cuda     # GPU: also CUDA_LAUNCH_BLOCKING=1 in a subprocess

Bare, strict and deferred blocks alternate within one run (so drift and thermal state hit all
alike); each ratio is median(mode) / median(bare). A benchmark, not a timed test.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

import nb_cudaguard
from nb_cudaguard.input_guard.scope import STATS

CLASSES = 10


@dataclass(frozen=True)
class Size:
    vocab: int
    dim: int
    heads: int
    seq: int
    batch: int


# "tiny": a toy step (~10 ms on 2 CPU cores) where the mode's fixed per-call cost shows most;
# "small": BERT-tiny's shape (2 layers, d=128, 2 heads) on 64-token sequences, batch 32.
# "base": BERT-base's width (d=768, 12 heads, vocab 30522) on 128-token sequences, batch 32: the
# realistic GPU step (2 layers keep it short); run with --cuda only.
SIZES = {
    "tiny": Size(1000, 64, 4, 32, 16),
    "small": Size(8000, 128, 2, 64, 32),
    "base": Size(30522, 768, 12, 128, 32),
}
GPU_ONLY = ("base",)


class Classifier(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.embed = nn.Embedding(size.vocab, size.dim, padding_idx=0)
        self.position = nn.Parameter(torch.zeros(size.seq, size.dim))
        layer = nn.TransformerEncoderLayer(
            size.dim, size.heads, 4 * size.dim, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(size.dim, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def make(
    device: str, size: Size = SIZES["tiny"]
) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Classifier(size).to(device)
    # foreach=True: the implementation PyTorch picks by default on a GPU.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    ids = torch.randint(1, size.vocab, (size.batch, size.seq), device=device)
    ids[:, -4:] = 0  # padding
    labels = torch.randint(0, CLASSES, (size.batch,), device=device)
    labels[0] = -100  # an ignored example, as in real data
    return model, optimizer, ids, labels


def step(
    model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, y: torch.Tensor
) -> None:
    loss = F.cross_entropy(model(ids), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


MODES = ("bare", "strict", "deferred")


def block(device: str, parts: tuple, steps: int, mode: str) -> float:
    """Seconds per step over `steps` steps."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    if mode == "bare":
        for _ in range(steps):
            step(*parts)
    else:
        with nb_cudaguard.guard(mode=mode):
            for _ in range(steps):
                step(*parts)
    sync()
    return (time.perf_counter() - start) / steps


def measure(
    device: str, size: Size, reps: int, steps: int, modes: tuple[str, ...]
) -> dict[str, float]:
    parts = make(device, size)
    for mode in modes:  # warm-up: allocator, autograd, lazy init
        block(device, parts, 3, mode)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(reps):
        for mode in modes:
            times[mode].append(block(device, parts, steps, mode))
    return {mode: statistics.median(values) for mode, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", choices=[*SIZES, "all"], default="all")
    parser.add_argument("--bare-only-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = "cuda" if args.cuda else "cpu"

    sizes = (
        [n for n in SIZES if args.cuda or n not in GPU_ONLY] if args.size == "all" else [args.size]
    )
    if args.bare_only_json:  # the CUDA_LAUNCH_BLOCKING=1 child
        print(
            json.dumps(
                {
                    n: measure(device, SIZES[n], args.reps, args.steps, ("bare",))["bare"]
                    for n in sizes
                }
            )
        )
        return

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, device {device}"
        + (f" ({torch.cuda.get_device_name()})" if args.cuda else "")
    )
    results = {}
    for name in sizes:
        results[name] = measure(device, SIZES[name], args.reps, args.steps, MODES)
        print(f"[{name}] {SIZES[name]}")
        for mode in MODES[1:]:
            STATS.clear()
            block(device, make(device, SIZES[name]), 1, mode)
            print(
                f"[{name}] {mode}: checked calls per step {STATS['calls']}, "
                f"host transfers per step {STATS['transfers']} (deferred: read at the step)"
            )
        bare = results[name]["bare"]
        print(f"[{name}] bare     {bare * 1e3:8.3f} ms/step")
        for mode in MODES[1:]:
            t = results[name][mode]
            print(
                f"[{name}] {mode:8} {t * 1e3:8.3f} ms/step   ratio {t / bare:.3f} "
                f"(+{(t - bare) * 1e3:.2f} ms/step)"
            )

    if args.cuda:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        command = [
            sys.executable,
            __file__,
            "--cuda",
            "--bare-only-json",
            "--reps",
            str(args.reps),
            "--steps",
            str(args.steps),
            "--size",
            args.size,
        ]
        child = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        blocking = json.loads(child.stdout.strip().splitlines()[-1])
        for name in sizes:
            bare = results[name]["bare"]
            print(
                f"[{name}] CUDA_LAUNCH_BLOCKING=1 {blocking[name] * 1e3:8.3f} ms/step   "
                f"ratio {blocking[name] / bare:.3f} (separate process)"
            )


if __name__ == "__main__":
    main()
