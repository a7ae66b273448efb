"""Restart plus restore of 1 GB of CPU arrays and tensors, against a plain restart (issue 13).

Usage::

    python benchmarks/bench_keep.py [--repeat 5] [--gb 1.0]

One real Jupyter server (127.0.0.1, token auth), one kernel holding ``--gb`` of CPU data: half
numpy float32 arrays, half torch float32 tensors, in 8 variables (plus a small dict and a
notebook function). Alternating, ``--repeat`` times each:

- ``plain``: ``restart_kernel(blocking=False, keep=False)`` until a fresh websocket runs a cell
  in the new process (the data is then made again, untimed, for the next round);
- ``plain + import``: the same, and that first cell imports numpy and torch, as the user's first
  cell would before making the data again (the fair floor for the comparison: restoring tensors
  imports torch);
- ``keep + restore``: ``restart_kernel(blocking=False)`` (saves first) until the new process has
  run ``%load_ext nb_cudaguard`` and ``%cudaguard restore`` and the data is back, checked.
  Restored arrays and tensors use the file's pages (mapped copy-on-write), read on first
  touch: the first full read of the data after the restore is timed too, and again after it.

Prints the medians, the added time (target: keep + restore adds <= 2 s to a plain restart), and
the save and restore times the kernel measured itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from jupyter_harness import JupyterServer, probe, wait_for_new_process  # noqa: E402

MAKE = """
import numpy as np, torch
_n = int({gb} * 1e9 / 4 / 8)
arrays = [np.full(_n, i, dtype=np.float32) for i in range(4)]
a0, a1, a2, a3 = arrays; del arrays
t0, t1, t2, t3 = (torch.full((_n,), float(i)) for i in range(4))
config = {{"lr": 1e-3, "layers": [64, 64], "name": "bench"}}
def total():
    arrays = float(a0.sum() + a1.sum() + a2.sum() + a3.sum())
    return arrays + float(t0.sum() + t1.sum() + t2.sum() + t3.sum())
"""
CHECK = "print(total(), config['name'])"
TIMED_CHECK = (
    "import time as _t\n_s = _t.perf_counter(); _v = total()\n"
    "print('check_s', _t.perf_counter() - _s, _v)"
)


def _run(server: JupyterServer, kid: str, code: str, timeout: float = 300) -> str:
    sock = server.connect(kid)
    try:
        reply = sock.execute(code, timeout=timeout)
    finally:
        sock.close()
    if reply.status != "ok":
        raise RuntimeError(f"cell failed: {code[:60]!r}: {reply.messages[-3:]}")
    return reply.stream


def _restart_then(server: JupyterServer, kid: str, call: str, first_cell: str) -> float:
    pid, _ = probe(server, kid)
    sock = server.connect(kid)
    sock.execute("import nb_cudaguard")
    t0 = time.perf_counter()
    reply = sock.execute(call, timeout=120)
    sock.close()
    if reply.status != "ok":
        raise RuntimeError(f"restart failed: {reply.messages[-3:]}")
    wait_for_new_process(server, kid, pid, timeout=120)
    _run(server, kid, first_cell)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gb", type=float, default=1.0)
    args = parser.parse_args()
    make = MAKE.format(gb=args.gb)
    plain: list[float] = []
    plain_import: list[float] = []
    kept: list[float] = []
    saves: list[float] = []
    restores: list[float] = []
    first_touch: list[float] = []
    hot_touch: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = JupyterServer(Path(tmp))
        try:
            kid = server.start_kernel()
            wait_for_new_process(server, kid, -1)
            _run(server, kid, make)
            expected = _run(server, kid, CHECK)
            for _ in range(args.repeat):
                plain.append(
                    _restart_then(
                        server, kid, "nb_cudaguard.restart_kernel(False, keep=False)", "1"
                    )
                )
                _run(server, kid, make)
                plain_import.append(
                    _restart_then(
                        server,
                        kid,
                        "nb_cudaguard.restart_kernel(False, keep=False)",
                        "import numpy, torch",
                    )
                )
                _run(server, kid, make)
                restore = (
                    "%load_ext nb_cudaguard\nimport time as _t; _s = _t.perf_counter()\n"
                    "%cudaguard restore\nprint('restore_s', _t.perf_counter() - _s)"
                )
                pid, _ = probe(server, kid)
                sock = server.connect(kid)
                sock.execute("import nb_cudaguard")
                t0 = time.perf_counter()
                reply = sock.execute(
                    "_p = nb_cudaguard.restart_kernel(False)\nprint(_p.kept)", timeout=120
                )
                sock.close()
                wait_for_new_process(server, kid, pid, timeout=120)
                out = _run(server, kid, restore)
                kept.append(time.perf_counter() - t0)
                touch = _run(server, kid, TIMED_CHECK).split("check_s")[-1].split()
                first_touch.append(float(touch[0]))
                if _run(server, kid, CHECK) != expected:
                    raise RuntimeError("the restored data differs")
                hot = _run(server, kid, TIMED_CHECK).split("check_s")[-1].split()
                hot_touch.append(float(hot[0]))
                said = reply.stream
                if "Kept" not in said:
                    raise RuntimeError(f"nothing kept: {said}")
                restores.append(float(out.split("restore_s")[-1].split()[0]))
                saves.append(_save_seconds(server, kid))
        finally:
            server.stop()
    median = statistics.median
    print(f"data: {args.gb:.2f} GB in 8 arrays/tensors, {args.repeat} rounds, medians (min-max)")
    for name, samples in (
        ("plain restart -> first cell", plain),
        ("plain restart -> `import numpy, torch`", plain_import),
        ("keep + restart -> `%load_ext` + `%cudaguard restore` done", kept),
        ("  of which: restore in the new kernel", restores),
        ("first full read of the restored data (pages mapped in)", first_touch),
        ("the same read again (pages in memory)", hot_touch),
    ):
        print(f"| {name} | {median(samples):.2f} s ({min(samples):.2f}-{max(samples):.2f}) |")
    print(f"| save before the restart (kernel's own measure) | {median(saves):.2f} s |")
    print(
        f"\nadded by keep + restore: {median(kept) - median(plain):+.2f} s over a plain restart, "
        f"{median(kept) - median(plain_import):+.2f} s over a plain restart + imports "
        "(target <= +2 s)"
    )


def _save_seconds(server: JupyterServer, kid: str) -> float:
    """The save time is not in the manifest any more once restored; re-save to read it (the
    kernel holds the data again): the same work as before the restart."""
    code = (
        "from nb_cudaguard.keep import store\n"
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "_ip = get_ipython()\n"
        "_m = store.save(_ip.user_ns, _ip.profile_dir.location, running_kernel_connection(), "
        "hidden=_ip.user_ns_hidden)\n"
        "print('save_s', _m.seconds)\n"
        "store.discard(store.keep_dir(_ip.profile_dir.location, running_kernel_connection()))"
    )
    return float(_run(server, kid, code).split("save_s")[-1].split()[0])


if __name__ == "__main__":
    main()
