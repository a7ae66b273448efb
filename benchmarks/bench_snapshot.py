"""What ``%cudaguard keep model optimizer`` costs a training loop (issue 13, item 2).

Usage::

    python benchmarks/bench_snapshot.py [--cuda] [--blocks 8] [--steps 10]

A transformer encoder language model (token embedding, ``nn.TransformerEncoder``, tied output
head, AdamW) trains on random tokens. In the worst case every step is its own cell, so the
snapshot (``keep.snapshot.Snapshots.after_cell``) runs after every step. Blocks of ``--steps``
steps without and with snapshots alternate; each block ends with a synchronize, and the median
per-step time of each kind is compared. Target (issue 13): the snapshot costs <= 5% of a
training step for a 100M-parameter model on a GPU (``--cuda``: d 768, 12 layers, vocab 30522,
batch 16 x 256 tokens, about 110M parameters). Without ``--cuda`` a small model on the CPU runs
the same code path (there every copy is synchronous: the CPU figure is an upper bound).

Also printed: the first snapshot (pinned buffers allocated: once), the host time of one
``after_cell``, and the bytes copied per snapshot (all parameters and optimizer state change at
every step, so everything is copied).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402

from nb_cudaguard.keep.snapshot import Snapshots  # noqa: E402


def build(cuda: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, int]]:
    shape = (
        {"vocab": 30522, "d": 768, "heads": 12, "layers": 12, "batch": 16, "seq": 256}
        if cuda
        else {"vocab": 8000, "d": 256, "heads": 4, "layers": 4, "batch": 8, "seq": 64}
    )
    d = shape["d"]

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(shape["vocab"], d)
            layer = torch.nn.TransformerEncoderLayer(d, shape["heads"], 4 * d, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, shape["layers"])
            self.head = torch.nn.Linear(d, shape["vocab"], bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(ids)))

    device = "cuda" if cuda else "cpu"
    model = LM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer, shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    model, optimizer, shape = build(args.cuda)
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if args.cuda else (lambda: None)
    ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), device=device)

    def step() -> None:
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    namespace = {"model": model, "optimizer": optimizer}
    snapshots = Snapshots()
    snapshots.add("model", model)
    snapshots.add("optimizer", optimizer)
    for _ in range(3):
        step()
    sync()
    started = time.perf_counter()
    snapshots.after_cell(namespace, 0)  # allocates the buffers (pinned on CUDA)
    sync()
    first = time.perf_counter() - started
    snapshots.after_cell(namespace, 0)  # and the other set
    sync()

    bare: list[float] = []
    kept: list[float] = []
    host: list[float] = []
    copied: list[int] = []
    cell = 1
    for _ in range(args.blocks):
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        bare.append((time.perf_counter() - t0) / args.steps)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
            h0 = time.perf_counter()
            snapshots.after_cell(namespace, cell)
            host.append(time.perf_counter() - h0)
            copied.append(snapshots.last_bytes)
            cell += 1
        sync()
        kept.append((time.perf_counter() - t0) / args.steps)
    params = sum(p.numel() for p in model.parameters())
    median = statistics.median
    ratio = median(kept) / median(bare)
    where = torch.cuda.get_device_name() if args.cuda else "CPU"
    print(f"{where}, torch {torch.__version__}, {params / 1e6:.0f}M parameters, {shape}")
    print("| per training step | median (ms) | min | max |")
    print("|---|---|---|---|")
    for name, samples in (("bare", bare), ("snapshot after every step", kept)):
        print(
            f"| {name} | {median(samples) * 1e3:.2f} | {min(samples) * 1e3:.2f} | "
            f"{max(samples) * 1e3:.2f} |"
        )
    print(f"\nsnapshot / bare: {ratio:.3f} (target <= 1.05 on a GPU for 100M parameters)")
    print(f"host time of after_cell: {median(host) * 1e3:.2f} ms median")
    skipped = sum(1 for c in copied if c == 0)
    print(
        f"copied per snapshot: {max(copied) / 1e6:.0f} MB; snapshots skipped because the "
        f"previous copy was still in flight: {skipped} of {len(copied)}"
    )
    print(f"first snapshot (buffers allocated): {first:.2f} s")


if __name__ == "__main__":
    main()
