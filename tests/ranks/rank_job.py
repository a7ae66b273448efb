"""A small data-parallel job over gloo in which one rank fails mid-training, between collectives.

``python rank_job.py cuda|guard|device`` under torchrun; ``spawn_main(world, mode)`` under mp.spawn.
The culprit (rank ``CULPRIT``, default 1) prints the line an H100 prints to fd 2 and raises
PyTorch's exact device-assert exception (``cuda``), or feeds an out-of-range token id to an
embedding inside ``nb_cudaguard.guard()`` (``guard``), or, on a GPU, lets that id reach the
GPU (``device``: a real device-side assert). A GPU process that asserted often hangs in
its CUDA teardown; ``LINGER_S`` makes the culprit's exit wait that long, so the peers, blocked in
the next all-reduce, are stopped only by nb_cudaguard (or the collective's timeout).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

import nb_cudaguard

DEVICE_LINE = H100_TORCH_2_11["cross-entropy-label"][0]


def train(mode: str, rank: int | None = None, world: int | None = None) -> None:
    kwargs = {} if rank is None else {"rank": rank, "world_size": world}
    dist.init_process_group("gloo", timeout=timedelta(seconds=120), **kwargs)
    rank = dist.get_rank()
    culprit = int(os.environ.get("CULPRIT", "1"))
    model = torch.nn.Embedding(10, 4)
    gpu = mode == "device"
    if gpu:  # both ranks on the one GPU, gloo over it; the guard lets the bad lookup through
        model = model.cuda()
    for step in range(10_000):
        with nb_cudaguard.guard(skip="embedding" if gpu else None):
            ids = torch.tensor([1, 2, 3], device="cuda" if gpu else "cpu")
            if gpu and rank == culprit and step == 3:
                bad = torch.tensor([1, 12, 3], device="cuda")
                model(bad).sum().item()  # a real device-side assert, raised at the sync
            if rank == culprit and step == 3:
                # to fd 1 itself: under notebook_launcher (a fork of the kernel) sys.stdout is
                # ipykernel's stream, whose lock the fork may have left held (ranks/peers.py)
                os.write(1, f"rank_job: rank {rank} fails at {time.time()!r}\n".encode())
                atexit.register(time.sleep, float(os.environ.get("LINGER_S", "0")))
                if mode == "cuda":
                    os.write(2, (DEVICE_LINE + "\n").encode())
                    raise torch.AcceleratorError(ASSERT_2_9)
                ids = torch.tensor([1, 12, 3])  # id 12 >= the 10 rows
            loss = model(ids).sum()
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
        time.sleep(0.01)
    dist.destroy_process_group()


def spawn_main(index: int, world: int, mode: str) -> None:
    train(mode, index, world)


if __name__ == "__main__":
    train(sys.argv[1])
