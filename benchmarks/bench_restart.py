"""Click -> new kernel ready with CUDA_LAUNCH_BLOCKING=1, under a real Jupyter server.

Usage::

    python benchmarks/bench_restart.py [--repeat 5]

Measures, on one server (127.0.0.1, token auth), each repeated ``--repeat`` times:

- ``kernel start``: POST /api/kernels until the kernel answers (the floor of any restart);
- ``server restart``: the user's own restart (POST /api/kernels/<id>/restart) until it answers;
- ``restart_kernel(blocking=True)``: sending the cell until the new process answers with the
  variable set;
- ``button click``: the widget click message (what JupyterLab sends) until the new process
  answers with the variable set.

"Answers" means a fresh websocket ran a probe cell in a new process; polling adds up to ~50 ms.
The restart from inside waits ``DELAY_S`` (0.3 s) on purpose so that the reply and the widget
update reach the frontend before the kernel goes away.
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

from nb_cudaguard.notebook.actions import BLOCKING_LABEL  # noqa: E402

ASSERT = "import torch\nraise torch.AcceleratorError('CUDA error: device-side assert triggered\\n')"


def _kernel_start(server: JupyterServer) -> tuple[float, str]:
    t0 = time.perf_counter()
    kid = server.start_kernel()
    wait_for_new_process(server, kid, -1)
    return time.perf_counter() - t0, kid


def _server_restart(server: JupyterServer, kid: str) -> float:
    pid, _ = probe(server, kid)
    t0 = time.perf_counter()
    server.restart_kernel(kid)
    _, value = wait_for_new_process(server, kid, pid)
    assert value is None
    return time.perf_counter() - t0


def _restart_kernel_call(server: JupyterServer, kid: str) -> float:
    pid, _ = probe(server, kid)
    sock = server.connect(kid)
    sock.execute("import nb_cudaguard")
    t0 = time.perf_counter()
    sock.execute("nb_cudaguard.restart_kernel(blocking=True)")
    sock.close()
    _, value = wait_for_new_process(server, kid, pid)
    elapsed = time.perf_counter() - t0
    assert value == "1", value
    return elapsed


def _button_click(server: JupyterServer, kid: str) -> float:
    pid, _ = probe(server, kid)
    sock = server.connect(kid)
    sock.execute("%load_ext nb_cudaguard")
    failed = sock.execute(ASSERT)
    button = next(
        c["comm_id"]
        for c in failed.comm_opens()
        if c["data"]["state"].get("description") == BLOCKING_LABEL
    )
    t0 = time.perf_counter()
    sock.click(button)
    sock.close()
    _, value = wait_for_new_process(server, kid, pid)
    elapsed = time.perf_counter() - t0
    assert value == "1", value
    return elapsed


def _row(name: str, samples: list[float]) -> str:
    return (
        f"| {name} | {statistics.median(samples):.2f} | {min(samples):.2f} | "
        f"{max(samples):.2f} | {len(samples)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = JupyterServer(Path(tmp))
        try:
            starts: list[float] = []
            kid = ""
            for _ in range(args.repeat):
                elapsed, new = _kernel_start(server)
                starts.append(elapsed)
                if kid:
                    server.request("DELETE", f"/api/kernels/{new}")
                else:
                    kid = new
            plain = [_server_restart(server, kid) for _ in range(args.repeat)]
            calls = [_restart_kernel_call(server, kid) for _ in range(args.repeat)]
            clicks = [_button_click(server, kid) for _ in range(args.repeat)]
        finally:
            server.stop()
    print("| measurement (s) | median | min | max | n |")
    print("|---|---|---|---|---|")
    print(_row("kernel start (baseline)", starts))
    print(_row("server restart, plain (baseline)", plain))
    print(_row("restart_kernel(blocking=True) -> ready, variable set", calls))
    print(_row("button click -> ready, variable set", clicks))
    ratio = statistics.median(clicks) / statistics.median(starts)
    print(f"\nclick / kernel start (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
