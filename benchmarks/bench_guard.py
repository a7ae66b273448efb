"""What the guard costs: strict and deferred guard vs bare, side by side in one run.

    python benchmarks/bench_guard.py                 # CPU: every workload below
    python benchmarks/bench_guard.py --only percall  # one workload
    python benchmarks/bench_guard.py --cpu-time      # CPU: by the thread's CPU time, one thread
    python benchmarks/bench_guard.py --cuda          # GPU: also CUDA_LAUNCH_BLOCKING=1 in a
                                                     # separate process (training workloads)
    python benchmarks/bench_guard.py --cpu-time --against main  # also main's guard, side by side
    python benchmarks/bench_guard.py --cuda --profile --only infer-b1,base  # what each mode adds

Workloads (models built from torch.nn only, random weights, no downloads):
- ``tiny``: the toy classifier step of the first measurements (vocab 1000, d 64, 4 heads,
  2 layers, seq 32, batch 16): launch-bound training, where a fixed per-call cost shows most.
- ``bert-small``: BERT-Small's shape (4 layers, d 512, 8 heads, FFN 2048, vocab 30522, 512
  positions, 2 token types, post-norm, GELU) fine-tuned as a 3-label classifier: seq 128,
  batch 2 on CPU (8 on a GPU), padding in the last 16 positions, AdamW. Checked calls per
  step: 3 embeddings, cross_entropy.
- ``gpt2-small``: GPT-2 small's shape (12 layers, d 768, 12 heads, FFN 3072, vocab 50257,
  pre-norm, causal, LM head tied to the token embedding), next-token loss over seq 64, batch 1
  on CPU (seq 128, batch 8 on a GPU), the last 8 labels -100, AdamW. Checked calls per step:
  2 embeddings, cross_entropy, and the label shift's slicing (wrapped, plain slices: no check).
- ``infer-b1``: launch-bound inference: the tiny classifier's forward at batch 1 under
  ``torch.inference_mode()``.
- ``percall``: the overhead of one call in microseconds: checked calls (cross_entropy,
  embedding, ``x[idx]``; embedding also at 32x64 and 512x512 ids, where the rules' cost must
  not grow beyond one pass over the ids), a wrapped call with nothing to check (``x[0]``),
  an unchecked call (``torch.add``), a checked op called from a thread outside the guard,
  and a guard's entry + exit.

The headline ``strict`` and ``deferred`` figures are the rules path: every checked call's
requirements are extracted and judged before the op runs, which is what a GPU tensor's call
pays on the host (on a GPU, strict adds one host read per checked call; deferred leaves its
summary on the device). On CPU tensors the guard's default is a shortcut instead (``cpu-op-first``:
the CPU op runs first, since it rejects the same values itself, and the rules run only when it
raises): reported apart, since a GPU user never gets it. One gap: on CPU tensors the deferred
mode judges at the call too (``deferral.HOST_VERDICTS_AT_ONCE``), so its figures are the host
verdict's, not what a GPU's deferred call pays on the host besides (its safe values, the pending
record and where the call was made).

Bare and every mode alternate within one run (so drift and the shared machine's load hit all
alike); each ratio is median(mode) / median(bare), and the fastest block's ratio is printed too
(on a loaded machine the least disturbed). Each block enters its guard once, as a guarded cell or
test does: a workload's figures are also printed split into the steps alone (a long loop in one
guard) and the guard's entry + exit once a block (what each cell or test adds).

``--cpu-time`` times every block and call by the thread's CPU time (``time.thread_time``) instead
of the wall clock: other processes on a shared machine do not inflate it, where they swing
wall-clock ratios by +-20%. It runs torch on the timed thread alone (``--threads 1``), since the
thread's clock does not see torch's worker threads; CPU only (a GPU's work is not the host
thread's time). A benchmark, not a timed test.

``--against REV``: also the guard of git revision ``REV`` (its ``nb_cudaguard`` package, loaded
apart as ``nb_cudaguard_then``), its rules modes in the same alternating blocks as today's, so a
change is measured side by side under the same load; the shortcut's modes are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn

import nb_cudaguard
from nb_cudaguard.input_guard.judge import STATS

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mode:
    name: str
    guard: str | None  # guard(mode=...); None: bare
    cpu_op_first: bool = False  # on CPU tensors, the shortcut (judge.TRUST_HOST_OPS)
    package: Any = None  # whose guard: None, today's; else an earlier revision's (--against)
    read_behind: bool = True  # deferral.READ_BEHIND: a GPU's verdicts read behind the queue


BARE = Mode("bare", None)
# the rules before every call: what a GPU tensor's call pays on the host (the headline)
RULES = (Mode("strict", "strict"), Mode("deferred", "deferred"))
# the guard's default for CPU tensors only: the CPU op first, the rules only when it raises
SHORTCUT = (
    Mode("strict cpu-op-first", "strict", cpu_op_first=True),
    Mode("deferred cpu-op-first", "deferred", cpu_op_first=True),
)


# on a GPU, deferred with its verdicts read on their own stream (after everything queued there)
PLAIN_READ = (Mode("deferred plain-read", "deferred", read_behind=False),)

# --against REV: REV's rules modes, alternating with today's (set by main)
THEN: tuple[Mode, ...] = ()


def modes_for(device: str) -> tuple[Mode, ...]:
    if THEN:
        return (BARE, *RULES, *THEN)
    return (BARE, *RULES, *PLAIN_READ) if device == "cuda" else (BARE, *RULES, *SHORTCUT)


def load_revision(revision: str) -> ModuleType:
    """``revision``'s ``nb_cudaguard``, imported apart as ``nb_cudaguard_then`` (its imports of
    itself are relative), so its guard and today's alternate in one process."""
    archive = subprocess.run(
        ["git", "archive", revision, "nb_cudaguard"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    where = Path(tempfile.mkdtemp(prefix="bench_guard_"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    (where / "nb_cudaguard").rename(where / "nb_cudaguard_then")
    sys.path.insert(0, str(where))
    return importlib.import_module("nb_cudaguard_then")


def then_modes(package: ModuleType, revision: str) -> tuple[Mode, ...]:
    return tuple(Mode(f"{m.guard}@{revision}", m.guard, package=package) for m in RULES)


@contextlib.contextmanager
def guarded(mode: Mode) -> Iterator[None]:
    """The guard of ``mode`` (nothing for bare), with the CPU shortcut on or off."""
    if mode.guard is None:
        yield
        return
    package = mode.package or nb_cudaguard
    judged = importlib.import_module(f"{package.__name__}.input_guard.judge")
    deferral = importlib.import_module(f"{package.__name__}.input_guard.deferral")
    trusted, judged.TRUST_HOST_OPS = judged.TRUST_HOST_OPS, mode.cpu_op_first
    behind = getattr(deferral, "READ_BEHIND", None)
    if behind is not None:
        deferral.READ_BEHIND = mode.read_behind
    try:
        with package.guard(mode=mode.guard):
            yield
    finally:
        judged.TRUST_HOST_OPS = trusted
        if behind is not None:
            deferral.READ_BEHIND = behind


# --- models ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    vocab: int
    dim: int
    heads: int
    seq: int
    batch: int
    layers: int = 2


CLASSES = 10
# "small" and "base" are the sizes of the lead's first GPU runs (BERT-tiny's shape; BERT-base's
# width on 2 layers); kept so those numbers can be compared.
SIZES = {
    "tiny": Size(1000, 64, 4, 32, 16),
    "small": Size(8000, 128, 2, 64, 32),
    "base": Size(30522, 768, 12, 128, 32),
}


class Classifier(nn.Module):
    def __init__(self, size: Size) -> None:
        super().__init__()
        self.embed = nn.Embedding(size.vocab, size.dim, padding_idx=0)
        self.position = nn.Parameter(torch.zeros(size.seq, size.dim))
        layer = nn.TransformerEncoderLayer(
            size.dim, size.heads, 4 * size.dim, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.head = nn.Linear(size.dim, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.position, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


class BertSmall(nn.Module):
    """BERT-Small (google/bert_uncased_L-4_H-512_A-8)'s shape, for sequence classification."""

    def __init__(self, labels: int = 3) -> None:
        super().__init__()
        dim = 512
        self.word_embeddings = nn.Embedding(30522, dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(512, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        layer = nn.TransformerEncoderLayer(
            dim, 8, 2048, dropout=0.1, activation="gelu", batch_first=True, layer_norm_eps=1e-12
        )
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, labels)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(types)
        )
        h = self.encoder(self.norm(h), src_key_padding_mask=pad)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


class Gpt2Small(nn.Module):
    """GPT-2 small's shape: pre-norm causal decoder, LM head tied to the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        dim = 768
        self.wte = nn.Embedding(50257, dim)
        self.wpe = nn.Embedding(1024, dim)
        layer = nn.TransformerEncoderLayer(
            dim, 12, 3072, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        positions = torch.arange(seq, device=ids.device)
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=ids.device)
        h = self.blocks(self.wte(ids) + self.wpe(positions), mask=mask, is_causal=True)
        return F.linear(self.ln_f(h), self.wte.weight)


# --- workloads: each returns one step as a closure -------------------------------------------
Step = Callable[[], None]


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # foreach=True: the implementation PyTorch picks by default on a GPU
    return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)


def classifier_step(device: str, size: Size) -> Step:
    torch.manual_seed(0)
    model = Classifier(size).to(device)
    optimizer = _optimizer(model)
    ids = torch.randint(1, size.vocab, (size.batch, size.seq), device=device)
    ids[:, -4:] = 0  # padding
    labels = torch.randint(0, CLASSES, (size.batch,), device=device)
    labels[0] = -100  # an ignored example, as in real data

    def step() -> None:
        loss = F.cross_entropy(model(ids), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def bert_small_step(device: str, seq: int = 128, batch: int = 2) -> Step:
    torch.manual_seed(0)
    model = BertSmall().to(device)
    optimizer = _optimizer(model)
    ids = torch.randint(1000, 30522, (batch, seq), device=device)
    ids[:, 0] = 101  # [CLS]
    ids[:, -16:] = 0  # [PAD]
    types = torch.zeros_like(ids)
    types[:, seq // 2 :] = 1
    pad = ids == 0
    labels = torch.randint(0, 3, (batch,), device=device)
    criterion = nn.CrossEntropyLoss()

    def step() -> None:
        loss = criterion(model(ids, types, pad), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def gpt2_small_step(device: str, seq: int = 64, batch: int = 1) -> Step:
    torch.manual_seed(0)
    model = Gpt2Small().to(device)
    optimizer = _optimizer(model)
    ids = torch.randint(0, 50257, (batch, seq), device=device)
    labels = ids.clone()
    labels[:, -8:] = -100  # padding, as a collator marks it

    def step() -> None:
        logits = model(ids)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, 50257), labels[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def inference_step(device: str) -> Step:
    torch.manual_seed(0)
    size = SIZES["tiny"]
    model = Classifier(size).to(device).eval()
    ids = torch.randint(1, size.vocab, (1, size.seq), device=device)

    def step() -> None:
        with torch.inference_mode():
            model(ids).argmax(-1)

    return step


@dataclass(frozen=True)
class Workload:
    make: Callable[[str], Step]
    steps: int  # per timed block
    reps: int  # interleaved blocks per mode
    training: bool = True


WORKLOADS = {
    "tiny": Workload(lambda d: classifier_step(d, SIZES["tiny"]), 10, 15),
    "infer-b1": Workload(inference_step, 50, 15, training=False),
    "bert-small": Workload(bert_small_step, 2, 7),
    "gpt2-small": Workload(gpt2_small_step, 1, 5),
}
# On a GPU the same models at a realistic batch (a CPU step at these sizes takes seconds).
GPU_MAKE = {
    "bert-small": lambda d: bert_small_step(d, 128, 8),
    "gpt2-small": lambda d: gpt2_small_step(d, 128, 8),
}
GPU_ONLY = {
    "small": Workload(lambda d: classifier_step(d, SIZES["small"]), 10, 15),
    "base": Workload(lambda d: classifier_step(d, SIZES["base"]), 10, 15),
}
GPU_STEPS = {"bert-small": 10, "gpt2-small": 10}  # a GPU step is short: longer blocks


Clock = Callable[[], float]


@dataclass(frozen=True)
class Block:
    step: float  # seconds per step, the block's one guard entry and exit shared among its steps
    inside: float  # seconds per step inside the guard: what a long loop in one guard pays
    steps: int


def block(
    device: str, step: Step, steps: int, mode: Mode, clock: Clock = time.perf_counter
) -> Block:
    """``steps`` steps in one guard (one entry and exit, as one cell or test has)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = clock()
    with guarded(mode):
        entered = clock()
        for _ in range(steps):
            step()
        sync()
        leaving = clock()
    sync()
    return Block((clock() - start) / steps, (leaving - entered) / steps, steps)


def measure(
    device: str,
    workload: Workload,
    modes: tuple[Mode, ...],
    scale: float,
    steps: int,
    clock: Clock = time.perf_counter,
) -> dict[str, list[Block]]:
    step = _make(device, workload)
    for mode in modes:  # warm-up: allocator, autograd, lazy init
        block(device, step, 2, mode)
    reps = max(3, math.ceil(workload.reps * scale))
    times: dict[str, list[Block]] = {mode.name: [] for mode in modes}
    for _ in range(reps):
        for mode in modes:
            times[mode.name].append(block(device, step, steps, mode, clock))
    return times


def median(blocks: list[Block], what: Callable[[Block], float]) -> float:
    return statistics.median(what(b) for b in blocks)


def _make(device: str, workload: Workload) -> Step:
    for name, w in WORKLOADS.items():
        if w is workload and device == "cuda" and name in GPU_MAKE:
            return GPU_MAKE[name](device)
    return workload.make(device)


def counts(device: str, workload: Workload) -> str:
    """Checked calls, verdict reads and calls through a wrapper per step (counted apart from
    the timing: the profile hook that counts them is slow)."""
    step = _make(device, workload)
    parts = []
    for mode in RULES:  # the shortcut's checked calls are none on CPU tensors
        block(device, step, 1, mode)  # warm-up
        STATS.clear()
        wrapped: Counter[str] = Counter()

        def count(
            frame: FrameType, event: str, arg: object, wrapped: Counter[str] = wrapped
        ) -> None:
            if event == "call" and frame.f_code.co_name in ("checked", "synchronising"):
                wrapped[frame.f_code.co_name] += 1

        sys.setprofile(count)
        try:
            block(device, step, 1, mode)
        finally:
            sys.setprofile(None)
        parts.append(
            f"{mode.name}: {STATS['calls']} checked, {STATS['transfers']} reads, "
            f"{sum(wrapped.values())} calls through a wrapper ({dict(wrapped)})"
        )
    return "per step: " + "; ".join(parts)


def _step(b: Block) -> float:
    return b.step


def _inside(b: Block) -> float:
    return b.inside


def _entry_exit(b: Block) -> float:
    return (b.step - b.inside) * b.steps


def profile(device: str, workload: Workload, steps: int) -> None:
    """What each mode adds to a step, by torch's profiler: the host time of each op and CUDA
    runtime call (synchronisations and copies among them), per step, over bare's. Its own
    overhead inflates every figure: read the differences, not the totals."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step = _make(device, workload)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    seen: dict[str, dict[str, tuple[int, float]]] = {}
    modes = modes_for(device)
    for mode in modes:
        block(device, step, 2, mode)
        with torch_profile(activities=activities) as prof:
            block(device, step, steps, mode)
        seen[mode.name] = {e.key: (e.count, e.self_cpu_time_total) for e in prof.key_averages()}
    bare = seen["bare"]
    for mode in modes[1:]:
        rows = []
        for key, (count, cpu) in seen[mode.name].items():
            was_count, was_cpu = bare.get(key, (0, 0.0))
            if count != was_count or abs(cpu - was_cpu) > 5 * steps:
                rows.append(((cpu - was_cpu) / steps, (count - was_count) / steps, key))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        print(f"[profile] {mode.name}: host time over bare, per step (sum of rows {total:+.0f} us)")
        # the ops and runtime calls the mode adds, then the largest shifts in bare's own
        added = [r for r in rows if r[1]]
        for extra, more, key in [*added, *[r for r in rows if not r[1]][:10]]:
            print(f"[profile]   {extra:+9.1f} us  {more:+6.2f} calls  {key}")


# --- per call -------------------------------------------------------------------------------
def percall(scale: float, clock: Clock) -> list[tuple[str, dict[str, float]]]:
    torch.manual_seed(0)
    logits = torch.randn(32, 10)
    labels = torch.randint(0, 10, (32,))
    labels[0] = -100
    weight = torch.randn(1000, 64)
    ids = torch.randint(0, 1000, (16, 32))
    x = torch.randn(64, 8)
    idx = torch.randint(0, 64, (16,))
    a, b = torch.randn(4), torch.randn(4)
    # issue 30's rows: the rules path must not grow with the ids beyond one fused pass
    table, narrow = torch.randn(8000, 128), torch.randn(8000, 8)
    mid_ids, big_ids = torch.randint(0, 8000, (32, 64)), torch.randint(0, 8000, (512, 512))
    logits3, labels3 = torch.randn(32, 3), torch.randint(0, 3, (32,))
    calls: dict[str, Callable[[], object]] = {
        "F.cross_entropy (32x10, one -100)": lambda: F.cross_entropy(logits, labels),
        "F.cross_entropy (32x3)": lambda: F.cross_entropy(logits3, labels3),
        "F.embedding (16x32 ids)": lambda: F.embedding(ids, weight),
        "F.embedding (32x64 ids, 8000x128)": lambda: F.embedding(mid_ids, table),
        "F.embedding (512x512 ids, 8000x8)": lambda: F.embedding(big_ids, narrow),
        "x[idx] (16 ids)": lambda: x[idx],
        "x[0] (wrapped, nothing to check)": lambda: x[0],
        "torch.add (not wrapped)": lambda: torch.add(a, b),
    }
    n = 2000
    fewer = {"F.embedding (512x512 ids, 8000x8)": 40}  # ~1 ms a call: as long a block
    reps = max(5, math.ceil(15 * scale))

    def timed(call: Callable[[], object], n: int = n) -> float:
        start = clock()
        for _ in range(n):
            call()
        return (clock() - start) / n * 1e6

    rows = []
    for name, call in calls.items():
        times: dict[str, list[float]] = {m.name: [] for m in modes_for("cpu")}
        for _ in range(reps):
            for mode in modes_for("cpu"):
                with guarded(mode):
                    times[mode.name].append(timed(call, fewer.get(name, n)))
        rows.append((name, {m: statistics.median(v) for m, v in times.items()}))

    # a thread outside any guard, while this one holds a (strict) guard
    def in_thread(out: list[float]) -> None:
        out.append(timed(calls["F.cross_entropy (32x10, one -100)"]))

    outside: dict[str, list[float]] = {"bare": [], "strict": []}
    for _ in range(reps):
        for mode in ("bare", "strict"):
            result: list[float] = []
            thread = threading.Thread(target=in_thread, args=(result,))
            if mode == "bare":
                thread.start()
                thread.join()
            else:
                with nb_cudaguard.guard():
                    thread.start()
                    thread.join()
            outside[mode].append(result[0])
    rows.append(
        (
            "F.cross_entropy in a thread outside the guard",
            {m: statistics.median(v) for m, v in outside.items()},
        )
    )

    enter: list[float] = []
    for _ in range(reps):
        start = clock()
        for _ in range(200):
            with nb_cudaguard.guard():
                pass
        enter.append((clock() - start) / 200 * 1e6)
    rows.append(
        ("guard() entry + exit (outermost)", {"bare": 0.0, "strict": statistics.median(enter)})
    )
    # ``%cudacheck on`` guards each cell with the notebook's namespace, where IPython adds
    # ``_i<N>`` (and ``_<N>``) at every cell: a long session's, 5,000 and 2,000 of them beside
    # 100 names of the user's, against those 100 alone (what the entry and exit read of it)
    user = {f"name{n}": n for n in range(100)}
    session = {**{f"_i{n}": "x = 1" for n in range(5000)}, **{f"_{n}": n for n in range(2000)}}
    session.update(user)
    for label, namespace in (("100 names", user), ("a long session's 7,100", session)):
        timings = []
        for _ in range(reps):
            start = clock()
            for _ in range(200):
                with nb_cudaguard.guard(namespace=namespace):
                    pass
            timings.append((clock() - start) / 200 * 1e6)
        row = f"guard() entry + exit, a namespace of {label}"
        rows.append((row, {"bare": 0.0, "strict": statistics.median(timings)}))
    return rows


# --- main -----------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--only", help="comma-separated workloads (default: all)")
    parser.add_argument("--scale", type=float, default=1.0, help="repetitions x this")
    parser.add_argument(
        "--threads", type=int, help="torch.set_num_threads (on a shared, oversubscribed VM: 1)"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time every workload and call by the thread's CPU time, which other processes on "
        "a shared machine do not inflate (default: wall time); runs torch on one thread; CPU only",
    )
    parser.add_argument(
        "--against", metavar="REV", help="also REV's guard (its rules modes), side by side"
    )
    parser.add_argument(
        "--profile", action="store_true", help="only profile each workload's modes, then stop"
    )
    parser.add_argument("--bare-only-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        if args.cuda:
            parser.error("--against compares on CPU only")
        global THEN
        THEN = then_modes(load_revision(args.against), args.against)
    device = "cuda" if args.cuda else "cpu"
    if args.cpu_time:
        if args.cuda:
            parser.error("--cpu-time times the host thread alone: not with --cuda")
        if args.threads not in (None, 1):
            parser.error("--cpu-time runs torch on the timed thread alone: --threads 1")
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    available = {**WORKLOADS, **(GPU_ONLY if args.cuda else {})}
    names = [*available, "percall"] if args.only is None else args.only.split(",")
    training = [n for n in names if n in available]

    if args.profile:
        for name in training:
            w = available[name]
            print(f"[profile] {name}", flush=True)
            profile(device, w, GPU_STEPS.get(name, w.steps) if args.cuda else w.steps)
        return

    if args.bare_only_json:  # the CUDA_LAUNCH_BLOCKING=1 child
        out = {}
        for name in training:
            w = available[name]
            steps = GPU_STEPS.get(name, w.steps)
            out[name] = median(measure(device, w, (BARE,), args.scale, steps)["bare"], _step)
        print(json.dumps(out))
        return

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), device {device}"
        + (f" ({torch.cuda.get_device_name()})" if args.cuda else "")
        + f", {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        + ("the thread's CPU time" if args.cpu_time else "wall time")
        + ", load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    for name in training:
        w = available[name]
        steps = GPU_STEPS.get(name, w.steps) if args.cuda else w.steps
        modes = modes_for(device)
        times = measure(device, w, modes, args.scale, steps, clock)
        medians = {mode: median(v, _step) for mode, v in times.items()}
        inside = {mode: median(v, _inside) for mode, v in times.items()}
        results[name] = medians
        bare = medians["bare"]
        # the fastest block of each mode: the least disturbed by other load on a shared machine
        fastest = {mode: min(b.step for b in v) for mode, v in times.items()}
        groups = (
            ("rules", RULES),
            ("cpu-op-first", SHORTCUT),
            ("rules, then", THEN),
            ("plain read", PLAIN_READ),
        )
        for label, group in groups:
            shown = [m.name for m in group if m in modes]
            if not shown:
                continue
            line = f"[{name}] {label:12} median: bare {bare * 1e3:9.3f} ms/step"
            for mode in shown:
                t = medians[mode]
                line += f" | {mode} {t * 1e3:9.3f} ms ({t / bare:.3f}x, {(t - bare) * 1e3:+.3f} ms)"
            line += " | fastest blocks: " + ", ".join(
                f"{m} {fastest[m] / fastest['bare']:.3f}x" for m in shown
            )
            print(line, flush=True)
        # the blocks' figures split: the steps alone (a long loop in one guard) and the one entry
        # and exit per block (what each guarded cell or test adds once)
        line = f"[{name}] {steps} steps a block; the steps alone: "
        line += ", ".join(f"{m} {inside[m] / inside['bare']:.3f}x" for m in medians if m != "bare")
        line += "; the guard's entry + exit, once a block: " + ", ".join(
            f"{m} {median(v, _entry_exit) * 1e6:+.0f} us"
            for m, v in times.items()
            if m in (r.name for r in (*RULES, *THEN, *PLAIN_READ))
        )
        print(line, flush=True)
        print(f"[{name}] {counts(device, w)}", flush=True)

    if "percall" in names and not args.cuda:
        print(
            "[percall] microseconds per call, medians; overhead = mode - bare; rules: judged "
            "before every call, as a GPU tensor's call is; cpu-op-first: CPU tensors only"
        )
        for name, m in percall(args.scale, clock):
            bare = m["bare"]
            extra = "  ".join(
                f"{k} {v - bare:+7.2f}" + (" |" if k in (RULES[-1].name, SHORTCUT[-1].name) else "")
                for k, v in m.items()
                if k != "bare"
            )
            print(f"[percall] {name:46} bare {bare:7.2f}  {extra}", flush=True)

    if args.cuda and training:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        command = [
            sys.executable,
            __file__,
            "--cuda",
            "--bare-only-json",
            "--scale",
            str(args.scale),
            *(["--threads", str(args.threads)] if args.threads else []),
            "--only",
            ",".join(training),
        ]
        child = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        blocking = json.loads(child.stdout.strip().splitlines()[-1])
        for name in training:
            bare = results[name]["bare"]
            print(
                f"[{name}] CUDA_LAUNCH_BLOCKING=1 {blocking[name] * 1e3:9.3f} ms/step "
                f"({blocking[name] / bare:.3f}x bare, separate process)"
            )


if __name__ == "__main__":
    main()
