"""What recording each cell's effects (``replay.record``) costs a notebook.

Usage::

    python benchmarks/bench_record.py [--names 1000] [--mb 2048] [--cells 2000] [--loop 300000]

Three measures, each side by side in one run, by the main thread's CPU time (the hooks run there;
a loaded machine's other processes do not count):

- per cell on a small namespace: a real InteractiveShell runs the same successful cell with the
  extension loaded, with and without its recorder, in alternating blocks (medians), and without
  the extension at all (the hook's whole cost);
- per cell on a large namespace: ``--names`` names holding ``--mb`` MiB of tensors and arrays
  in all (a third each tensors, arrays, and lists/dicts/modules), the recorder's start + finish
  timed on their own (the minimum and median of repeats);
- a training notebook's model and optimizer (a 12-layer transformer encoder and AdamW, after
  a step), the recorder's start + finish timed the same way;
- a cell whose own code is a top-level Python loop (``--loop`` iterations), with and without the
  recorder: its ratio.

``--against REV``: also the recorder of git revision ``REV`` (its ``replay/record.py``) and
today's, side by side in alternating blocks, on both namespaces and the model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _shell() -> Any:
    from IPython.testing.globalipapp import get_ipython

    return get_ipython()


def per_cell(cells: int, blocks: int = 10) -> dict[str, float]:
    """Median µs per successful cell: no extension, loaded without recorder, loaded."""
    from IPython.utils.capture import capture_output

    from nb_cudaguard.notebook.extension import current_state

    shell = _shell()
    shell.run_cell("import torch, numpy as np\nsmall = [torch.ones(3) for _ in range(5)]")
    code = "x = sum(range(10))"
    timings: dict[str, list[float]] = {"bare": [], "no recorder": [], "recorder": []}
    with capture_output():
        for block in range(blocks * 3):
            kind = list(timings)[block % 3]
            if kind != "bare":
                shell.run_line_magic("load_ext", "nb_cudaguard")
                state = current_state(shell)
                assert state is not None
                if kind == "no recorder":
                    state.recorder = None
                shell.run_cell(code, store_history=False)  # starts the fd 2 tee's child
            start = time.thread_time()
            for _ in range(cells // blocks):
                shell.run_cell(code, store_history=True)
            timings[kind].append((time.thread_time() - start) / (cells // blocks) * 1e6)
            if kind != "bare":
                shell.run_line_magic("unload_ext", "nb_cudaguard")
    return {k: statistics.median(v) for k, v in timings.items()}


def _large(names: int, mb: int) -> tuple[dict[str, Any], int]:
    """``names`` names holding ``mb`` MiB: a third tensors, a third arrays, a third models
    (``nn.Sequential``, every third) and dicts of lists; and the bytes held."""
    import numpy as np
    import torch

    per = max(1, mb * 2**20 // max(1, (2 * names) // 3))
    namespace: dict[str, Any] = {}
    held = 0
    for i in range(names):
        kind = i % 3
        if kind == 0:
            namespace[f"t{i}"] = torch.empty(per // 4, dtype=torch.float32)
            held += per
        elif kind == 1:
            namespace[f"a{i}"] = np.empty(per // 8, dtype=np.float64)
            held += per
        elif i % 9 == 2:
            namespace[f"m{i}"] = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        else:
            namespace[f"c{i}"] = {"lr": 0.1, "items": list(range(20))}
    return namespace, held


def _training() -> dict[str, Any]:
    """A training notebook's model and optimizer, after a step: a 12-layer transformer encoder
    (d 256, 4 heads, FFN 1024: 122 modules, 144 parameters with their grads) and AdamW (two
    moments and a step count per parameter)."""
    import torch

    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8, 256)).sum().backward()
    opt.step()
    return {"model": model, "opt": opt}


def large_namespace(
    namespace: dict[str, Any], recorders: tuple[Any, ...], repeat: int = 30
) -> list[tuple[float, float]]:
    """Each recorder's (min, median) ms of start + finish per cell, in alternating blocks."""
    made = [kind() for kind in recorders]
    for recorder in made:
        recorder.prime(namespace)
    times: list[list[float]] = [[] for _ in made]
    for cell in range(repeat):
        for recorder, timed in zip(made, times, strict=True):
            start = time.thread_time()
            recorder.start(namespace)
            recorder.finish(namespace, cell, failed=False)
            timed.append((time.thread_time() - start) * 1e3)
    return [(min(t), statistics.median(t)) for t in times]


def old_recorder(revision: str) -> Any:
    """The ``Recorder`` class of ``revision``'s ``replay/record.py``, loaded apart."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(
        ["git", "show", f"{revision}:nb_cudaguard/replay/record.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "record_then.py"
    path.write_text(source)
    # Named inside the package, so its relative imports (``.rng``) find today's modules.
    name = "nb_cudaguard.replay.record_then"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Recorder


def per_cell_against(then: Any, cells: int, blocks: int = 30) -> dict[str, float]:
    """Median µs per successful cell in a real shell with the extension loaded: no recorder,
    ``then``'s and today's, in alternating blocks."""
    from IPython.utils.capture import capture_output

    from nb_cudaguard.notebook.extension import current_state
    from nb_cudaguard.replay.record import Recorder

    shell = _shell()
    shell.run_cell("import torch, numpy as np\nsmall = [torch.ones(3) for _ in range(5)]")
    code = "x = sum(range(10))"
    with capture_output():
        shell.run_line_magic("load_ext", "nb_cudaguard")
        state = current_state(shell)
        assert state is not None
        hidden = set(shell.user_ns_hidden)
        recorders = {"none": None, "then": then(hidden), "now": Recorder(hidden)}
        for recorder in recorders.values():
            if recorder is not None:
                recorder.prime(shell.user_ns)
        timings: dict[str, list[float]] = {k: [] for k in recorders}
        for block in range(blocks * 3):
            kind = list(recorders)[block % 3]
            state.recorder = recorders[kind]
            shell.run_cell(code, store_history=True)
            start = time.thread_time()
            for _ in range(cells // blocks):
                shell.run_cell(code, store_history=True)
            timings[kind].append((time.thread_time() - start) / (cells // blocks) * 1e6)
        shell.run_line_magic("unload_ext", "nb_cudaguard")
    return {k: statistics.median(v) for k, v in timings.items()}


def loop_cell(iterations: int, repeat: int = 7) -> tuple[float, float]:
    """Best seconds of a top-level loop cell, (without recorder, with)."""
    from IPython.utils.capture import capture_output

    from nb_cudaguard.notebook.extension import current_state

    shell = _shell()
    code = f"total = 0\nfor i in range({iterations}):\n    total += i * 2"
    best = {False: float("inf"), True: float("inf")}
    with capture_output():
        shell.run_line_magic("load_ext", "nb_cudaguard")
        state = current_state(shell)
        assert state is not None
        recorder = state.recorder
        for _ in range(repeat):
            for on in (False, True):
                state.recorder = recorder if on else None
                start = time.thread_time()
                shell.run_cell(code, store_history=True)
                best[on] = min(best[on], time.thread_time() - start)
        shell.run_line_magic("unload_ext", "nb_cudaguard")
    return best[False], best[True]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=2048)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--loop", type=int, default=300_000)
    parser.add_argument("--against", metavar="REV", help="also REV's recorder, side by side")
    args = parser.parse_args()

    from nb_cudaguard.replay.record import Recorder

    if args.against:
        then = old_recorder(args.against)
        namespace, _ = _large(args.names, args.mb)
        (then_min, then_med), (now_min, now_med) = large_namespace(namespace, (then, Recorder))
        del namespace
        print(
            f"{args.names} names, side by side: {args.against} {then_min:.2f} ms (min), "
            f"{then_med:.2f} (median); now {now_min:.2f}, {now_med:.2f}: "
            f"{now_min / then_min:.2f}x"
        )
        training = _training()
        (then_min, then_med), (now_min, now_med) = large_namespace(training, (then, Recorder))
        print(
            f"a model and its optimizer, side by side: {args.against} {then_min:.2f} ms (min), "
            f"{then_med:.2f} (median); now {now_min:.2f}, {now_med:.2f}: "
            f"{now_min / then_min:.2f}x"
        )
        cell = per_cell_against(then, args.cells)
        print(
            f"small namespace, side by side: {args.against}'s recorder "
            f"+{cell['then'] - cell['none']:.1f} us a cell, now +{cell['now'] - cell['none']:.1f}"
            f" us (loaded without a recorder {cell['none']:.1f} us)"
        )

    small = per_cell(args.cells)
    print(
        f"small namespace, per cell: bare {small['bare']:.1f} us, loaded without recorder "
        f"{small['no recorder']:.1f} us, loaded {small['recorder']:.1f} us; the hook's whole "
        f"cost +{small['recorder'] - small['bare']:.1f} us, the recorder's "
        f"+{small['recorder'] - small['no recorder']:.1f} us"
    )
    namespace, held = _large(args.names, args.mb)
    ((low, median),) = large_namespace(namespace, (Recorder,))
    del namespace
    print(
        f"{args.names} names holding {held / 2**30:.2f} GiB: recorder start + finish "
        f"{low:.2f} ms (min), {median:.2f} ms (median) per cell"
    )
    ((low, median),) = large_namespace(_training(), (Recorder,))
    print(
        f"a model and its optimizer (12 transformer layers, AdamW): recorder start + finish "
        f"{low:.2f} ms (min), {median:.2f} ms (median) per cell"
    )
    off, on = loop_cell(args.loop)
    print(
        f"top-level loop cell: {off * 1e3:.1f} ms without, {on * 1e3:.1f} ms with: {on / off:.3f}x"
    )


if __name__ == "__main__":
    main()
