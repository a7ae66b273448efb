"""Restart plus restore of 1 GB of CPU arrays and tensors, against a plain restart (issue 13).

Usage::

    python benchmarks/bench_keep.py [--repeat 5] [--gb 1.0]

One real Jupyter server (127.0.0.1, token auth), one kernel holding ``--gb`` of CPU data: half
numpy float32 arrays, half torch float32 tensors, in 8 variables (plus a small dict and a
notebook function). Each round runs the four cases below, in an order rotated every round; the
data is made again (untimed) before each. Every time runs from the ``restart_kernel()`` call in
the old process to the end of the first cell in the new one:

- ``plain``: ``restart_kernel(False, keep=False)``; the first cell is ``1``;
- ``plain + import``: the same, and the first cell imports numpy and torch, as the user's first
  cell would before making the data again (restoring tensors imports torch: the fair floor);
- ``keep in RAM``: ``restart_kernel(False)`` (saves first; the default place, /dev/shm here);
  the first cell is ``%load_ext nb_cudaguard`` and ``%cudaguard restore``, the data checked;
- ``keep in profile``: the same with ``NB_CUDAGUARD_KEEP_RAM=''`` in the old process: the files
  go to the IPython profile on the disk, as before RAM was used.

Restored arrays and tensors use the file's pages (mapped copy-on-write), read on first touch:
the first full read of the data after the restore is timed too, and again after it. Prints
medians (min-max), the parts the kernels measured themselves, and the added time (target: keep
+ restore adds <= 2 s to a plain restart).

First, bytes written against bytes kept (issue 22): a model of ``--written-mb`` MB of weights and
its Adam optimizer (twice that in moments) share the parameters; the kernel saves them as a
restart does (``keep_before_restart``) while ``/proc/self/io`` counts the bytes it passes to
``write(2)``; printed with the tensors' bytes and the files' size, then discarded.
``--written-only`` stops there.
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
    reply = server.execute(kid, code, timeout=timeout)
    if reply.status != "ok":
        raise RuntimeError(f"cell failed: {code[:60]!r}: {reply.messages[-3:]}")
    return reply.stream


RESTART = (
    "import os, time as _t\n{env}\n_s = _t.perf_counter()\n"
    "_p = nb_cudaguard.restart_kernel(False, keep={keep})\n"
    "print('call_s', _t.perf_counter() - _s, _p.kept)"
)
# Timed with a function's locals: names the cell would assign are kept names, and the restore
# would put the previous round's values back over them.
RESTORE = """
def _timed_restore():
    import time
    ip = get_ipython()
    start = time.perf_counter()
    ip.run_line_magic("load_ext", "nb_cudaguard")
    loaded = time.perf_counter()
    ip.run_line_magic("cudaguard", "restore")
    print("load_s", loaded - start, "restore_s", time.perf_counter() - loaded)
_timed_restore()
"""
# Where the kept files go, set in the old process just before its restart (read by the save).
IN_RAM = "os.environ.pop('NB_CUDAGUARD_KEEP_RAM', None)"  # the default: /dev/shm here
IN_PROFILE = "os.environ['NB_CUDAGUARD_KEEP_RAM'] = ''"  # no RAM root: the profile's disk


WRITTEN = """
import time, torch
from nb_cudaguard.notebook.keep_glue import discard, keep_before_restart, where_kept
from nb_cudaguard.keep import store
def _wchar():
    with open("/proc/self/io") as io:
        return int(dict(line.split(": ") for line in io.read().splitlines())["wchar"])
model = torch.nn.Linear(4096, int({mb} * 1e6 / 4 / 4096))
opt = torch.optim.Adam(model.parameters())
model(torch.ones(2, 4096)).sum().backward(); opt.step()
_tensors = sum(t.numel() * t.element_size() for t in
               [*model.parameters(), *(v for s in opt.state.values() for v in s.values())])
_conn, _prof = where_kept(get_ipython())
_before, _start = _wchar(), time.perf_counter()
keep_before_restart(get_ipython(), _conn, _prof)
_seconds, _written = time.perf_counter() - _start, _wchar() - _before
_m = store.read_manifest(_prof[0], _conn)
print("tensors", _tensors, "written", _written, "on_disk", _m.total, "save_s", _seconds)
discard(_conn, _prof)
del model, opt
"""


def _written_vs_kept(server: JupyterServer, kid: str, mb: float, repeat: int) -> None:
    rows = []
    for _ in range(repeat):
        out = _run(server, kid, WRITTEN.format(mb=mb))
        rows.append({key: _number(out, key) for key in ("tensors", "written", "on_disk", "save_s")})
    tensors = rows[0]["tensors"]
    written = statistics.median(r["written"] for r in rows)
    print(
        f"model + Adam: {tensors / 1e9:.2f} GB of tensors; files {rows[0]['on_disk'] / 1e9:.2f} GB;"
        f" written {written / 1e9:.2f} GB ({written / tensors:.2f}x), save "
        f"{statistics.median(r['save_s'] for r in rows):.2f} s (median of {repeat})"
    )


def _number(text: str, key: str) -> float:
    return float(text.split(key)[-1].split()[0])


def _restart_then(
    server: JupyterServer, kid: str, keep: bool, env: str, first_cell: str
) -> tuple[float, str, str]:
    """Seconds from the restart call to ``first_cell`` done in the new process; what the old
    process printed, and the first cell's output."""
    pid, _ = probe(server, kid)
    sock = server.connect(kid)
    sock.execute("import nb_cudaguard")
    t0 = time.perf_counter()
    reply = sock.execute(RESTART.format(env=env, keep=keep), timeout=120)
    sock.close()
    if reply.status != "ok":
        raise RuntimeError(f"restart failed: {reply.messages[-3:]}")
    wait_for_new_process(server, kid, pid, timeout=120)
    out = _run(server, kid, first_cell)
    return time.perf_counter() - t0, reply.stream, out


CASES = {
    "plain": (False, IN_RAM, "1"),
    "plain + import": (False, IN_RAM, "import numpy, torch"),
    "keep in RAM": (True, IN_RAM, RESTORE),
    "keep in profile": (True, IN_PROFILE, RESTORE),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--written-mb", type=float, default=400.0)
    parser.add_argument("--written-only", action="store_true")
    args = parser.parse_args()
    make = MAKE.format(gb=args.gb)
    total: dict[str, list[float]] = {name: [] for name in CASES}
    call: dict[str, list[float]] = {name: [] for name in CASES}
    load: dict[str, list[float]] = {name: [] for name in CASES}
    restore: dict[str, list[float]] = {name: [] for name in CASES}
    first_touch: list[float] = []
    hot_touch: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = JupyterServer(Path(tmp))
        try:
            kid = server.start_kernel()
            wait_for_new_process(server, kid, -1)
            _written_vs_kept(server, kid, args.written_mb, min(args.repeat, 3))
            if args.written_only:
                return
            _run(server, kid, make)
            expected = _run(server, kid, CHECK)
            for round_ in range(args.repeat):
                # Rotated each round: no case always follows the same one.
                names = list(CASES)
                names = names[round_ % len(names) :] + names[: round_ % len(names)]
                for name in names:
                    keep, env, first = CASES[name]
                    seconds, said, out = _restart_then(server, kid, keep, env, first)
                    total[name].append(seconds)
                    call[name].append(_number(said, "call_s"))
                    if keep:
                        if "Kept" not in said:
                            raise RuntimeError(f"nothing kept: {said}")
                        load[name].append(_number(out, "load_s"))
                        restore[name].append(_number(out, "restore_s"))
                        touch = _run(server, kid, TIMED_CHECK)
                        first_touch.append(_number(touch, "check_s"))
                        if _run(server, kid, CHECK) != expected:
                            raise RuntimeError("the restored data differs")
                        hot_touch.append(_number(_run(server, kid, TIMED_CHECK), "check_s"))
                        _run(server, kid, "del a0, a1, a2, a3, t0, t1, t2, t3")
                    _run(server, kid, make)  # untimed: the data for the next case
        finally:
            server.stop()
    median = statistics.median

    def row(label: str, samples: list[float]) -> None:
        print(f"| {label} | {median(samples):.2f} s ({min(samples):.2f}-{max(samples):.2f}) |")

    print(f"data: {args.gb:.2f} GB in 8 arrays/tensors, {args.repeat} rounds, medians (min-max)")
    print("| measurement | time |\n|---|---|")
    row("plain restart -> first cell", total["plain"])
    row("plain restart -> `import numpy, torch`", total["plain + import"])
    for name in ("keep in RAM", "keep in profile"):
        row(f"{name}: restart -> `%load_ext` + `%cudaguard restore` done", total[name])
        row("  of which: `restart_kernel()` call (the save)", call[name])
        row("  of which: `%load_ext nb_cudaguard`", load[name])
        row("  of which: `%cudaguard restore` (imports numpy, torch)", restore[name])
    row("`restart_kernel(keep=False)` call (plain, for comparison)", call["plain"])
    row("first full read of the restored data (pages mapped in)", first_touch)
    row("the same read again (pages in memory)", hot_touch)
    plain, imports = median(total["plain"]), median(total["plain + import"])
    for name in ("keep in RAM", "keep in profile"):
        kept = median(total[name])
        print(
            f"\n{name}: added {kept - plain:+.2f} s over a plain restart, "
            f"{kept - imports:+.2f} s over a plain restart + `import numpy, torch` "
            "(target <= +2 s)"
        )


if __name__ == "__main__":
    main()
