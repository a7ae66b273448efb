"""A whole notebook session with the guard on: a Hugging Face fine-tuning notebook, bare vs with
``%load_ext nb_cudaguard`` + ``%cudacheck on`` (deferred) in its first cell.

Usage::

    python benchmarks/bench_session.py [--runs 3] [--steps 300] [--tag-steps 100] [--threads 1]
        [--save DIR]

Needs ``pip install -e .[bench]`` (transformers). The notebook, benchmarks/notebooks/
hf_finetune.ipynb, is written by this script (the same bytes every time) and can be opened as is:
a tiny BERT built from a config (no download), a seeded synthetic dataset of token ids padded to
a fixed length (``attention_mask``), trained with the real ``transformers.Trainer`` on CPU, a
sequence-classification head for ``--steps`` steps (the training cell) and a token-classification
head whose padding and first position are labelled -100 for ``--tag-steps`` steps. Each training
cell prints its losses (``trainer.state.log_history``) and a hash of the trained weights as JSON.

Each run executes the whole notebook headless (nbclient, a fresh ipykernel running this
checkout's nb_cudaguard), bare and guarded alternately (the bare run's first cell is a comment).
Per training cell: the wall time (execute request to reply, seen by this script) and the kernel's
CPU time (its process and children, by psutil, before and after the cell): the minimum over the
runs of each side, and the ratio guarded / bare. torch runs ``--threads`` threads in the kernel
(1 by default: on this project's loaded 2-core VM, torch's two threads waiting for one another
made one bare run 25 times slower than the next). Then: whether every run logged the same losses
and trained the same weights, and whether nb_cudaguard said anything in a guarded run after its
first cell (an error output, a diagnosis, a line naming it): a false alarm, since every input is
valid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's nb_cudaguard, not an installed copy
NOTEBOOK = ROOT / "benchmarks" / "notebooks" / "hf_finetune.ipynb"

from nb_cudaguard.diagnosis.schema import MIME_TYPE  # noqa: E402

GUARD_CELL = "%load_ext nb_cudaguard\n%cudacheck on"
BARE_CELL = "# bare run: nb_cudaguard not loaded"
TRAIN_TAGS = ("train-sequence", "train-tokens")
RESULT = "RESULT "
STEPS, TAG_STEPS = 300, 100
# what nb_cudaguard's refusals, diagnoses and notes contain
MENTIONS = re.compile(r"nb_cudaguard|nb-cudaguard|cudaguard|cudacheck|Guard[A-Za-z]*Error")

SETUP = """\
import hashlib
import json
import sys

import torch
import transformers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    Trainer,
    TrainingArguments,
)

print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{torch.get_num_threads()} threads")"""

DATA = """\
VOCAB, SEQ_LEN, N_CLASSES, N_TAGS, PAD = 1000, 32, 3, 5, 0


def synthetic(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    \"\"\"Token ids padded to SEQ_LEN (pad id 0, attention_mask 0), a class per sequence and a
    tag per token; -100 (ignored by the loss) on padding and on the first position.\"\"\"
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, SEQ_LEN + 1, (n,), generator=g)
    mask = (torch.arange(SEQ_LEN) < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (n, SEQ_LEN), generator=g) * mask
    classes = (ids.sum(1) // lengths) % N_CLASSES
    tags = torch.where(mask.bool(), ids % N_TAGS, -100)
    tags[:, 0] = -100
    return [
        {"input_ids": ids[i], "attention_mask": mask[i], "labels": classes[i], "tags": tags[i]}
        for i in range(n)
    ]


rows = synthetic(2400, seed=0)
sequence_rows = [{k: r[k] for k in ("input_ids", "attention_mask", "labels")} for r in rows]
token_rows = [{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"],
               "labels": r["tags"]} for r in rows]
padding = 1 - torch.stack([r["attention_mask"] for r in rows]).float().mean()
print(f"{len(rows)} rows, {padding:.0%} of the tokens padding")"""

TRAIN = """\
def config(**labels: int) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128, max_position_embeddings=SEQ_LEN, pad_token_id=PAD,
                      **labels)


def train(model: torch.nn.Module, data: list[dict[str, torch.Tensor]], steps: int) -> dict:
    args = TrainingArguments(
        output_dir="hf_finetune_out", max_steps=steps, per_device_train_batch_size=8,
        logging_steps=10, report_to=[], use_cpu=True, save_strategy="no", seed=0,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    weights = hashlib.sha256()
    for p in model.parameters():
        weights.update(p.detach().numpy().tobytes())
    return {
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "weights": weights.hexdigest()[:16],
    }"""

TRAIN_SEQUENCE = """\
transformers.set_seed(0)
model = BertForSequenceClassification(config(num_labels=N_CLASSES))
result = train(model, sequence_rows, steps={steps})
# the guard's wrappers stand in for torch's ops while a cell runs under `%cudacheck on`
result["guarded"] = hasattr(torch.nn.functional.cross_entropy, "__wrapped__")
result["nb_cudaguard"] = getattr(sys.modules.get("nb_cudaguard"), "__file__", None)
result["threads"] = torch.get_num_threads()
print("RESULT", json.dumps(result))"""

TRAIN_TOKENS = """\
transformers.set_seed(0)
tagger = BertForTokenClassification(config(num_labels=N_TAGS))
result = train(tagger, token_rows, steps={steps})
result["guarded"] = hasattr(torch.nn.functional.cross_entropy, "__wrapped__")
print("RESULT", json.dumps(result))"""


def build_notebook(steps: int, tag_steps: int) -> nbformat.NotebookNode:
    """The guarded notebook; ``bare()`` swaps its first cell for a comment."""
    sources: list[tuple[str, str | None]] = [
        (GUARD_CELL, "guard"),
        (SETUP, None),
        (DATA, None),
        (TRAIN, None),
        (TRAIN_SEQUENCE.format(steps=steps), TRAIN_TAGS[0]),
        (TRAIN_TOKENS.format(steps=tag_steps), TRAIN_TAGS[1]),
    ]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    for i, (source, tag) in enumerate(sources):
        cell = nbformat.v4.new_code_cell(source)
        cell.id = f"cell-{i}"  # fixed ids: the file is the same bytes on every run
        if tag:
            cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    return nb


def bare(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    copy = nbformat.from_dict(json.loads(json.dumps(nb)))
    copy.cells[0].source = BARE_CELL
    return copy


def _kernel_cpu(process: psutil.Process) -> float:
    """CPU seconds of the kernel process and its live children (the fd 2 tee's)."""
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


@dataclass
class Run:
    guarded: bool
    wall: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[list[dict[str, Any]]] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None


async def _execute(nb: nbformat.NotebookNode, guarded: bool, cwd: str, threads: int) -> Run:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    client = NotebookClient(nb, kernel_name="python3", timeout=1800, allow_errors=True)
    run = Run(guarded)
    async with client.async_setup_kernel(env=env, cwd=cwd):
        assert client.km is not None and client.kc is not None
        await client.async_wait_for_reply(client.kc.kernel_info())
        kernel = psutil.Process(client.km.provisioner.pid)  # type: ignore[union-attr]
        for index, cell in enumerate(nb.cells):
            tags = cell.metadata.get("tags", [])
            wall, cpu = time.perf_counter(), _kernel_cpu(kernel)
            await client.async_execute_cell(cell, index, execution_count=index + 1)
            wall, cpu = time.perf_counter() - wall, _kernel_cpu(kernel) - cpu
            for tag in tags:
                if tag in TRAIN_TAGS:
                    run.wall[tag], run.cpu[tag] = wall, cpu
                    run.results[tag] = _result(cell.outputs)
            run.outputs.append(cell.outputs)
    run.notebook = nb
    return run


def _result(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cell's RESULT line; empty where the cell failed before it (reported as an alarm)."""
    for line in _lines(outputs, "stdout"):
        if line.startswith(RESULT):
            return dict(json.loads(line[len(RESULT) :]))
    return {}


def _lines(outputs: list[dict[str, Any]], name: str | None = None) -> list[str]:
    return [
        line
        for out in outputs
        if out["output_type"] == "stream" and name in (None, out["name"])
        for line in out["text"].splitlines()
    ]


def alarms(run: Run) -> list[str]:
    """What a guarded run showed from nb_cudaguard after its first cell: none is expected."""
    found = []
    for index, outputs in enumerate(run.outputs[1:], start=1):
        for out in outputs:
            if out["output_type"] == "error":
                found.append(f"cell {index}: {out['ename']}: {out['evalue'].splitlines()[:3]}")
            elif MIME_TYPE in out.get("data", {}):
                found.append(f"cell {index}: a diagnosis ({MIME_TYPE})")
        found += [
            f"cell {index}: {line}"
            for line in _lines(outputs)
            if MENTIONS.search(line) and not line.startswith(RESULT)
        ]
    return found


def _masked(run: Run) -> set[str]:
    """Stream lines after the first cell, numbers masked (timings and throughputs vary)."""
    return {
        re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", line)
        for outputs in run.outputs[1:]
        for line in _lines(outputs)
        if not line.startswith(RESULT)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--steps", type=int, default=STEPS, help="sequence-classification steps")
    parser.add_argument(
        "--tag-steps", type=int, default=TAG_STEPS, help="token-classification steps"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch's threads in the kernel (0: torch's default)"
    )
    parser.add_argument("--save", type=Path, help="write each executed notebook to this folder")
    args = parser.parse_args()

    guarded_nb = build_notebook(args.steps, args.tag_steps)
    NOTEBOOK.parent.mkdir(parents=True, exist_ok=True)  # the shipped file: the default steps
    nbformat.write(build_notebook(STEPS, TAG_STEPS), NOTEBOOK)
    threads = args.threads or "torch's default"
    print(f"notebook: {NOTEBOOK.relative_to(ROOT)}; {os.cpu_count()} CPUs, kernel threads: "
          f"{threads}, load average {os.getloadavg()[0]:.2f} at the start")  # fmt: skip

    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as cwd:
        for i in range(2 * args.runs):
            guarded = i % 2 == 1
            nb = nbformat.from_dict(json.loads(json.dumps(guarded_nb)))
            run = asyncio.run(_execute(nb if guarded else bare(nb), guarded, cwd, args.threads))
            runs.append(run)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                name = f"run{i + 1}_{'guarded' if guarded else 'bare'}.ipynb"
                nbformat.write(run.notebook, args.save / name)
            side = "guarded" if guarded else "bare   "
            cells = "  ".join(
                f"{tag}: wall {run.wall[tag]:6.2f} s, kernel CPU {run.cpu[tag]:6.2f} s"
                for tag in TRAIN_TAGS
            )
            threads = run.results[TRAIN_TAGS[0]].get("threads")
            print(f"run {i + 1} {side}  {cells}  ({threads} threads)", flush=True)
            if i == 1:
                print("  its first cell printed:", _lines(run.outputs[0]) or "nothing")

    bare_runs = [r for r in runs if not r.guarded]
    guarded_runs = [r for r in runs if r.guarded]
    print(f"\nmin over {args.runs} runs each (load average {os.getloadavg()[0]:.2f} at the end):")
    print("| cell | steps | bare wall | guarded wall | ratio | bare CPU | guarded CPU | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    medians: dict[str, tuple[float, ...]] = {}
    for tag, steps in zip(TRAIN_TAGS, (args.steps, args.tag_steps), strict=True):
        bw = min(r.wall[tag] for r in bare_runs)
        gw = min(r.wall[tag] for r in guarded_runs)
        bc = min(r.cpu[tag] for r in bare_runs)
        gc = min(r.cpu[tag] for r in guarded_runs)
        print(f"| {tag} | {steps} | {bw:.2f} s | {gw:.2f} s | {gw / bw:.3f} "
              f"| {bc:.2f} s | {gc:.2f} s | {gc / bc:.3f} |")  # fmt: skip
        medians[tag] = tuple(
            statistics.median(getattr(r, what)[tag] for r in guarded_runs)
            / statistics.median(getattr(r, what)[tag] for r in bare_runs)
            for what in ("wall", "cpu")
        )
    print("ratios of the medians (wall, CPU):", ", ".join(
        f"{tag} {wall:.3f}, {cpu:.3f}" for tag, (wall, cpu) in medians.items()))  # fmt: skip

    ok = True
    for tag in TRAIN_TAGS:
        missing = [i for i, r in enumerate(runs, start=1) if not r.results[tag]]
        if missing:
            ok = False
            print(f"{tag}: no result from run(s) {missing} (the cell failed: see below)")
            continue
        seen = {json.dumps([r.results[tag]["losses"], r.results[tag]["weights"]]) for r in runs}
        ok &= len(seen) == 1
        losses, weights = runs[0].results[tag]["losses"], runs[0].results[tag]["weights"]
        verdict = "identical in every run" if len(seen) == 1 else "DIFFERENT"
        print(f"{tag}: {len(losses)} logged losses ({losses[0]} ... {losses[-1]}), "
              f"weights {weights}: {verdict}")  # fmt: skip
        if len(seen) > 1:
            for i, r in enumerate(runs, start=1):
                print(f"  run {i} ({'guarded' if r.guarded else 'bare'}): {r.results[tag]}")
        wrapped = [r.results[tag].get("guarded") for r in runs]
        if wrapped != [r.guarded for r in runs]:
            ok = False
            print(f"  {tag}: the guard's wrappers were in place as {wrapped}: not as expected")
    where = {r.results[TRAIN_TAGS[0]].get("nb_cudaguard") for r in guarded_runs}
    if where != {str(ROOT / "nb_cudaguard" / "__init__.py")}:
        ok = False
        print(f"  the guarded kernels imported nb_cudaguard from {where}, not this checkout")

    found = [f"run {runs.index(r) + 1}: {a}" for r in guarded_runs for a in alarms(r)]
    for r in runs:  # a cell that failed bare is the notebook's fault, not the guard's
        errors = [
            f"cell {index}: {out['ename']}: {out['evalue'].splitlines()[:3]}"
            for index, outputs in enumerate(r.outputs)
            for out in outputs
            if out["output_type"] == "error"
        ]
        if errors and not r.guarded:
            ok = False
            print(f"bare run {runs.index(r) + 1} failed: {errors}")
    print(f"nb_cudaguard refusals / diagnoses / notes in the guarded runs: {len(found)}")
    for line in found:
        print("  " + line)
    extra = set().union(*map(_masked, guarded_runs)) - set().union(*map(_masked, bare_runs))
    print(f"other output lines only the guarded runs printed: {len(extra)}")
    for line in sorted(extra):
        print("  " + line)
    sys.exit(0 if ok and not found else 1)


if __name__ == "__main__":
    main()
