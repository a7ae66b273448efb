"""On a real GPU: every user-triggerable device-side assert we catalogue, fired for real in a fresh
kernel with the extension loaded, as a user meets it.

For each case the panel must name the cause from the device lines that the real fd 2 capture
read, the evidence must point at the user's own object, the probe must say the context is
poisoned, and the next CUDA cell must get the one-line fallout note instead of a second panel.

One kernel per case: a poisoned context never recovers. Where ``NB_CUDAGUARD_GPU_DUMP`` names a
folder, each case writes what the kernel showed there (JSON), the raw material for docs/gpu.md
and for the recognition tests' exact texts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from nb_cudaguard.diagnosis.schema import MIME_TYPE

pytestmark = pytest.mark.gpu

SETUP = """\
import torch, torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
dev = "cuda"
torch.ones(1, device=dev).sum().item()
"""
LABEL = ("label-out-of-range",)
INDEX = ("index-out-of-range",)
PROBABILITY = ("probability-out-of-range",)
# multinomial: checked by _assert_async on current releases, in the sampling kernel before.
SAMPLING = ("probability-out-of-range", "nan-detected")


@dataclass(frozen=True)
class Case:
    setup: str  # the user's objects, as a notebook builds them (CPU copies stay in the namespace)
    fail: str  # the cell that launches the bad kernel and reads a result
    causes: tuple[str, ...]
    evidence: str | None = None  # a piece of one evidence sentence, where objects tell the cause
    device_lines: bool = True  # an assert prints lines on fd 2; a memory fault prints none
    timeout: float = 60  # torch.compile needs longer


CASES: dict[str, Case] = {
    "cross-entropy-label-equals-classes": Case(
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)\n"
        "labels = torch.randint(1, 4, (32,))",
        "loss = F.cross_entropy(model(torch.randn(32, 8, device=dev)), labels.to(dev))\n"
        "print(loss.item())",
        LABEL,
        "`labels` contains 3 but the classifier",
    ),
    "nll-loss-negative-label": Case(
        "classifier = nn.Linear(8, 5).to(dev)\nlabels = torch.tensor([0, -1, 2, 1])",
        "F.nll_loss(classifier(torch.randn(4, 8, device=dev)).log_softmax(1), labels.to(dev))"
        ".item()",
        LABEL,
        "`labels` contains -1",
    ),
    "segmentation-void-255": Case(
        "head = nn.Conv2d(3, 21, 1).to(dev)\n"
        "masks = torch.randint(0, 21, (2, 8, 8))\nmasks[0, :2] = 255",
        "F.cross_entropy(head(torch.randn(2, 3, 8, 8, device=dev)), masks.to(dev)).item()",
        LABEL,
        "`masks` contains 255 but the classifier `head` has 21 outputs",  # a 1x1 conv head
    ),
    "multi-margin-label": Case(
        "labels = torch.tensor([0, 4, 1])",
        "F.multi_margin_loss(torch.randn(3, 4, device=dev), labels.to(dev)).item()",
        LABEL,
    ),
    "embedding-id-too-large-short": Case(
        "emb = nn.Embedding(10, 4).to(dev)\ninput_ids = torch.tensor([[1, 2, 10]])",
        "emb(input_ids.to(dev)).sum().item()",
        INDEX,
        "token id 10 in `input_ids` >= vocab size 10",
    ),
    # More than 16 ids: the vectorized gather kernel since PyTorch 2.8 (pytorch#151715).
    "embedding-id-too-large-batch": Case(
        "emb = nn.Embedding(100, 32).to(dev)\n"
        "input_ids = torch.randint(0, 100, (8, 64))\ninput_ids[3, 5] = 100",
        "emb(input_ids.to(dev)).sum().item()",
        INDEX,
        "token id 100 in `input_ids` >= vocab size 100",
    ),
    "embedding-negative-id": Case(
        "emb = nn.Embedding(10, 4).to(dev)\ninput_ids = torch.tensor([[1, -1]])",
        "emb(input_ids.to(dev)).sum().item()",
        INDEX,
        "`input_ids` contains the negative id -1",
    ),
    "embedding-bag-id-too-large": Case(
        "bag = nn.EmbeddingBag(10, 4, mode='sum').to(dev)\ninput_ids = torch.tensor([[1, 12]])",
        "bag(input_ids.to(dev)).sum().item()",
        INDEX,
        "token id 12 in `input_ids` >= vocab size 10",
    ),
    "bce-input-above-one": Case(
        "probs = torch.tensor([0.5, 1.5, 0.2])\ntarget = torch.tensor([0.0, 1.0, 1.0])",
        "F.binary_cross_entropy(probs.to(dev), target.to(dev)).item()",
        PROBABILITY,
        "`probs` has values outside [0, 1]",
    ),
    "bce-input-nan": Case(
        "probs = torch.tensor([0.5, float('nan')])\ntarget = torch.tensor([0.0, 1.0])",
        "F.binary_cross_entropy(probs.to(dev), target.to(dev)).item()",
        PROBABILITY,
        "`probs` has values outside [0, 1]",
    ),
    "bce-target-outside": Case(
        "p = torch.tensor([0.5, 0.5])\ntarget = torch.tensor([0.0, 2.0])",
        "F.binary_cross_entropy(p.to(dev), target.to(dev)).item()",
        PROBABILITY,
        "`target` has values outside [0, 1]",
    ),
    "multinomial-nan": Case(
        "probs = torch.tensor([[0.5, float('nan'), 0.2]])",
        "torch.multinomial(probs.to(dev), 1).item()",
        SAMPLING,
        "`probs` contains NaN or inf",
    ),
    "multinomial-negative": Case(
        "probs = torch.tensor([[0.5, -0.1, 0.2]])",
        "torch.multinomial(probs.to(dev), 1).item()",
        SAMPLING,
        "`probs` contains negative values",
    ),
    "bernoulli-above-one": Case(
        "p = torch.tensor([0.2, 1.5])",
        "torch.bernoulli(p.to(dev)).sum().item()",
        PROBABILITY,
    ),
    "gather-index-too-large": Case(
        "index = torch.tensor([[0, 3]])",
        "torch.gather(torch.randn(2, 3, device=dev), 1, index.to(dev).expand(2, 2)).sum().item()",
        INDEX,
    ),
    "scatter-add-index-too-large": Case(
        "index = torch.tensor([0, 1, 7])",
        "torch.zeros(5, device=dev).scatter_add(0, index.to(dev), torch.ones(3, device=dev))"
        ".sum().item()",
        INDEX,
    ),
    "index-select-too-large": Case(
        "index = torch.tensor([0, 3])",
        "torch.randn(3, 4, device=dev).index_select(0, index.to(dev)).sum().item()",
        INDEX,
    ),
    "index-add-too-large": Case(
        "index = torch.tensor([0, 9])",
        "torch.zeros(4, 2, device=dev).index_add_(0, index.to(dev), torch.ones(2, 2, device=dev))"
        ".sum().item()",
        INDEX,
    ),
    "advanced-indexing-read": Case(
        "idx = torch.tensor([0, 5])",
        "torch.arange(3, device=dev)[idx.to(dev)].sum().item()",
        INDEX,
    ),
    "advanced-indexing-write": Case(
        "idx = torch.tensor([1, 6])",
        "x = torch.zeros(3, device=dev)\nx[idx.to(dev)] = 1.0\nx.sum().item()",
        INDEX,
    ),
    "take-too-large": Case(
        "idx = torch.tensor([0, 12])",
        "torch.take(torch.randn(3, 3, device=dev), idx.to(dev)).sum().item()",
        INDEX,
    ),
    "assert-async-false": Case(
        "scores = torch.tensor([1.0, -1.0])",
        "torch._assert_async((scores.to(dev) > 0).all())\ntorch.cuda.synchronize()",
        ("user-assert",),
    ),
    # Inductor's own bounds check: a Triton device_assert in generated code.
    "compiled-embedding-id-too-large": Case(
        "emb = nn.Embedding(10, 4).to(dev)\n"
        "model = torch.compile(lambda ids: emb(ids) * 2)\n"
        "input_ids = torch.tensor([[1, 2, 10]])",
        "model(input_ids.to(dev)).sum().item()",
        INDEX,
        "token id 10 in `input_ids` >= vocab size 10",
        timeout=300,
    ),
    # Not an assert: a custom kernel (CuPy, sharing torch's primary context) writes through a
    # null pointer, and torch's next call reports the sticky illegal address.
    "custom-kernel-illegal-address": Case(
        "import cupy\n"
        "poke = cupy.RawKernel(r'extern \"C\" __global__ void poke(int* p) { p[0] = 1; }', 'poke')",
        "poke((1,), (1,), (cupy.uint64(0),))\ntorch.ones(1, device=dev).sum().item()",
        ("illegal-memory-access",),
        device_lines=False,
    ),
}


def _dump(name: str, record: dict[str, object]) -> None:
    folder = os.environ.get("NB_CUDAGUARD_GPU_DUMP")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(record, indent=1, default=str))


@pytest.mark.parametrize("name", list(CASES))
def test_a_real_assert_gets_the_panel_with_cause_evidence_probe_and_fallout(kernel, name):
    case = CASES[name]
    kernel.execute("%load_ext nb_cudaguard")
    ready = kernel.execute(SETUP + case.setup)
    assert ready.reply["status"] == "ok", ready.errors
    failed = kernel.execute(case.fail, timeout=case.timeout)
    payloads = [d[MIME_TYPE] for d in failed.displays if MIME_TYPE in d]
    later = kernel.execute("torch.ones(1, device=dev).sum().item()")
    _dump(
        name,
        {
            "fail": case.fail,
            "errors": failed.errors,
            "stream": failed.stream,
            "payloads": payloads,
            "later_errors": later.errors,
            "later_displays": [d.get("text/plain") for d in later.displays],
        },
    )

    assert failed.reply["status"] == "error", failed.stream
    assert len(payloads) == 1, (failed.errors, failed.stream)
    diagnosis = payloads[0]
    assert diagnosis["sticky"] is True
    assert diagnosis["context"] == "poisoned"
    assert diagnosis["device"] == 0  # the device the probe found poisoned
    # The cause comes from the device lines our fd 2 capture read, not from the exception text
    # alone (which says only "device-side assert triggered").
    if case.device_lines:
        assert diagnosis["assert_lines"], failed.stream
    assert diagnosis["cause"] in case.causes, diagnosis["assert_lines"]
    if case.evidence is not None:
        assert any(case.evidence in sentence for sentence in diagnosis["evidence"]), diagnosis[
            "evidence"
        ]

    assert later.reply["status"] == "error"
    notes = [d.get("text/plain", "") for d in later.displays]
    assert len(notes) == 1 and "fallout of the CUDA error" in notes[0], notes
