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
    --plain           the culprit raises a plain ValueError instead (no CUDA error anywhere)
    --records DIR     each rank writes nb_cudaguard's per-rank record, as ranks-core's writer
                      does: rank-<N>.json in DIR, and inside TORCHELASTIC_ERROR_FILE where set
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

DEVICE_LINE = H100_TORCH_2_11["embedding-vectorized-gather"][0]


def write_record(args: argparse.Namespace, rank: int, world: int, kind: str, error: str) -> None:
    """nb_cudaguard's per-rank record (the format of issue 31), from the real exception."""
    from nb_cudaguard.diagnosis.engine import diagnose

    found = diagnose(error, device_output=DEVICE_LINE) if kind == "cuda-error" else None
    record = {
        "nb_cudaguard_rank_record": 1,
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
        "world_size": world,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "kind": kind,
        "cause_id": found.cause if found else None,
        "headline": found.title if found else error.splitlines()[-1],
        "exception": error.strip().splitlines()[-1] if kind != "cuda-error" else error,
        "device_lines": [DEVICE_LINE] if kind == "cuda-error" else [],
        "diagnosis": found.to_dict() if found else None,
    }
    with open(os.path.join(args.records, f"rank-{rank}.json"), "w") as out:
        json.dump(record, out)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # torchelastic's format (errors/error_handler.py), our record in extraInfo
        extra = {"py_callstack": error, "timestamp": str(int(time.time())), "nb_cudaguard": record}
        with open(error_file, "w") as out:
            json.dump({"message": {"message": error.splitlines()[-1], "extraInfo": extra}}, out)


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
                if args.plain:
                    raise ValueError("a batch without labels")
                os.write(2, (DEVICE_LINE + "\n").encode())
                time.sleep(args.late)
                try:
                    raise torch.AcceleratorError(ASSERT_2_9)
                except torch.AcceleratorError:
                    if args.records:
                        write_record(args, rank, world, "cuda-error", traceback.format_exc())
                    raise
            grad = torch.ones(4) * (rank + 1)
            try:
                dist.all_reduce(grad)
            except RuntimeError:
                if args.records:
                    write_record(args, rank, world, "stopped-by-peer", traceback.format_exc())
                raise
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
    parser.add_argument("--records", default="")
    parser.add_argument("--plain", action="store_true", help="raise a ValueError, no CUDA error")
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
