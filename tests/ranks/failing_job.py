"""A small gloo training job in which one rank hits a device-side assert between all-reduces.

The culprit prints the device line an H100 prints (to fd 2, as the CUDA runtime does) and raises
PyTorch's exact exception; the others block in the next all-reduce. Run under torchrun
(``python -m torch.distributed.run ... failing_job.py``) or alone (``--spawn N``: mp.spawn).
Every wait has a timeout, so nothing outlives a test.

    --culprit K       the global rank that fails (default 1)
    --late SECONDS    the culprit raises only this long after its device line, while its peers'
                      collective times out first (a victim then logs before the culprit)
    --timeout SECONDS the process group's timeout (gloo's collective timeout)
    --record          wrap the entry point in torchelastic's @record (writes error.json)
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

DEVICE_LINE = H100_TORCH_2_11["embedding-vectorized-gather"][0]


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    if "MASTER_ADDR" not in os.environ:  # mp.spawn: no launcher made the rendezvous
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    try:
        total = torch.zeros(4)
        for step in range(6):
            if step == 2 and rank == args.culprit:
                os.write(2, (DEVICE_LINE + "\n").encode())
                time.sleep(args.late)
                raise torch.AcceleratorError(ASSERT_2_9)
            grad = torch.ones(4) * (rank + 1)
            dist.all_reduce(grad)
            total += grad
            print(f"step {step} rank {rank} total {total.sum().item():.1f}", flush=True)
    finally:
        if rank != args.culprit:
            dist.destroy_process_group()


def elastic_main(args: argparse.Namespace) -> None:
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--culprit", type=int, default=1)
    parser.add_argument("--late", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--spawn", type=int, default=0, help="world size, under mp.spawn")
    parser.add_argument("--port", type=int, default=29511)
    args = parser.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(train, args=(args.spawn, args), nprocs=args.spawn, join=True)
    elif args.record:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(elastic_main)(args)
    else:
        elastic_main(args)


if __name__ == "__main__":
    main()
