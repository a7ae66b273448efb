"""A rank fails: how long until the whole job has stopped, bare vs with nb_cudaguard; and what the
rank-side machinery costs a small DDP step.

Part 1 runs tests/ranks/rank_job.py (gloo on CPU; rank 1 raises PyTorch's exact device-assert
exception between all-reduces) under torchrun and mp.spawn, with ``NB_CUDAGUARD_RANKS=0`` (bare)
and without (nb_cudaguard), and reports the seconds from the culprit's failure (it prints its own
``time.time()``) to the launcher's exit. ``--linger S``: the culprit's exit waits S seconds, as a
GPU process stuck in its CUDA teardown can; the peers sit in an all-reduce whose timeout is 120 s.

Part 2 times a small DDP step (world 1, gloo, a 64x64 linear layer) inside ``guard()``: the plain
guard, and the guard in a rank (the peer watch polling the store, fd 2 teed per block), in
alternating blocks, as process CPU time (the watcher's thread included; the machine is
shared), minimum of the per-block means.

    python benchmarks/bench_ranks.py [--world 3] [--linger 15] [--steps 300] [--blocks 7]
        [--cost-only]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's nb_cudaguard, not an installed copy
JOB = ROOT / "tests" / "ranks" / "rank_job.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_time(launcher: str, world: int, linger: float, on: bool) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(JOB.parent), env.get("PYTHONPATH", "")])
    env["LINGER_S"] = str(linger)
    env["NB_CUDAGUARD_RANKS"] = "1" if on else "0"
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
                f"--master-port={_port()}", str(JOB), "cuda"]  # fmt: skip
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
        code = (
            "import torch.multiprocessing as mp, rank_job\n"
            f"mp.spawn(rank_job.spawn_main, args=({world}, 'cuda'), nprocs={world})"
        )
        argv = [sys.executable, "-c", code]
    with tempfile.TemporaryDirectory() as rank_dir:
        env["NB_CUDAGUARD_RANK_DIR"] = rank_dir if on else ""
        out = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=200, start_new_session=True
        )
    ended = time.time()
    found = re.search(r"rank_job: rank \d+ fails at ([0-9.]+)", out.stdout + out.stderr)
    if found is None:
        raise RuntimeError(f"the culprit never failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return ended - float(found.group(1))


def _ddp_cost(steps: int, blocks: int) -> tuple[float, float]:
    import torch
    import torch.distributed as dist

    import nb_cudaguard
    from nb_cudaguard.ranks import in_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def run(on: bool) -> float:
        os.environ["NB_CUDAGUARD_RANKS"] = "1" if on else "0"
        assert in_rank.enabled() is on
        start = time.process_time()
        for _ in range(steps):
            with nb_cudaguard.guard():
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
        return (time.process_time() - start) / steps

    run(True), run(False)  # warm up
    bare, ranked = [], []
    for _ in range(blocks):
        bare.append(run(False))
        ranked.append(run(True))
    dist.destroy_process_group()
    return min(bare), min(ranked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--linger", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--cost-only", action="store_true", help="part 2 only")
    args = parser.parse_args()
    print(f"world {args.world}, culprit lingers {args.linger:g} s; seconds from failure to exit")
    for launcher in () if args.cost_only else ("torchrun", "mp.spawn"):
        for linger in (0.0, args.linger):
            bare = _stop_time(launcher, args.world, linger, on=False)
            ours = _stop_time(launcher, args.world, linger, on=True)
            print(
                f"  {launcher:9s} linger {linger:4g} s: bare {bare:6.2f}   nb_cudaguard {ours:6.2f}"
            )
    bare, ranked = _ddp_cost(args.steps, args.blocks)
    print(
        f"DDP step (process CPU): plain guard {bare * 1e6:.0f} us, guard in a rank "
        f"{ranked * 1e6:.0f} us: {100 * (ranked / bare - 1):+.1f}%"
    )


if __name__ == "__main__":
    main()
