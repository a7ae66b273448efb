"""Every checked op against PyTorch's own CPU checks: the guard raises GuardError exactly when
the unguarded CPU call raises, so it misses nothing and rejects nothing valid.

Each case is a call with a value problem or without one; shape and dtype mistakes are left out
because PyTorch checks those on the host, on CUDA too, and the guard leaves them to it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nb_cudaguard import GuardError, guard

warnings.filterwarnings("ignore", category=UserWarning)

NAN, INF = float("nan"), float("inf")


def t(*values: Any, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def x34() -> torch.Tensor:
    return torch.arange(12.0).reshape(3, 4)


def ctc(targets: torch.Tensor, lengths: Any = (2, 2)) -> torch.Tensor:
    log_probs = torch.randn(6, 2, 5).log_softmax(2)
    return F.ctc_loss(log_probs, targets, (6, 6), lengths)


CASES: dict[str, Callable[[], Any]] = {
    # cross_entropy / nll_loss: 1d, unbatched, 2d segmentation, weights, ignore_index, smoothing
    "ce valid": lambda: F.cross_entropy(torch.randn(3, 4), t(0, 3, 2)),
    "ce too big": lambda: F.cross_entropy(torch.randn(3, 4), t(0, 4, 2)),
    "ce negative": lambda: F.cross_entropy(torch.randn(3, 4), t(0, -1, 2)),
    "ce default ignore_index": lambda: F.cross_entropy(torch.randn(3, 4), t(0, -100, 2)),
    "ce all ignored": lambda: F.cross_entropy(torch.randn(2, 4), t(-100, -100)),
    "ce custom ignore_index": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, 9, 2), ignore_index=9
    ),
    "ce custom ignore, -100 bad": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, -100, 2), ignore_index=9
    ),
    "ce ignore_index inside range": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, 0, 2), ignore_index=0
    ),
    "ce weights valid": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, 3, 2), weight=torch.ones(4)
    ),
    "ce weights bad": lambda: F.cross_entropy(torch.randn(3, 4), t(0, 5, 2), weight=torch.ones(4)),
    "ce smoothing valid": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, -100, 3), label_smoothing=0.1
    ),
    "ce smoothing bad": lambda: F.cross_entropy(torch.randn(3, 4), t(0, 4, 3), label_smoothing=0.1),
    "ce reduction none bad": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, 4, 3), reduction="none"
    ),
    "ce unbatched valid": lambda: F.cross_entropy(torch.randn(4), torch.tensor(3)),
    "ce unbatched bad": lambda: F.cross_entropy(torch.randn(4), torch.tensor(4)),
    "ce soft targets": lambda: F.cross_entropy(torch.randn(3, 4), torch.rand(3, 4) * 7 - 2),
    "ce segmentation valid": lambda: F.cross_entropy(
        torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4))
    ),
    "ce segmentation bad": lambda: F.cross_entropy(
        torch.randn(2, 3, 4, 4), torch.randint(0, 3, (2, 4, 4)).index_fill(2, t(1), 3)
    ),
    "ce segmentation ignored": lambda: F.cross_entropy(
        torch.randn(2, 3, 4, 4), torch.full((2, 4, 4), 255), ignore_index=255
    ),
    "ce uint8 targets": lambda: F.cross_entropy(torch.randn(3, 4), t(0, 3, 1, dtype=torch.uint8)),
    "ce uint8 targets bad": lambda: F.cross_entropy(
        torch.randn(3, 4), t(0, 7, 1, dtype=torch.uint8)
    ),
    "ce empty batch": lambda: F.cross_entropy(torch.randn(0, 4), t(), reduction="sum"),
    "CrossEntropyLoss module bad": lambda: nn.CrossEntropyLoss()(torch.randn(3, 4), t(0, 4, 1)),
    "CrossEntropyLoss module ignore": lambda: nn.CrossEntropyLoss(ignore_index=-1)(
        torch.randn(3, 4), t(0, -1, 1)
    ),
    "nll valid": lambda: F.nll_loss(torch.randn(3, 4), t(0, 3, -100)),
    "nll bad": lambda: F.nll_loss(torch.randn(3, 4), t(0, 4, 1)),
    "nll 2d bad": lambda: F.nll_loss(torch.randn(1, 3, 2, 2), t(0, 1, 2, 3).reshape(1, 2, 2)),
    "NLLLoss module bad": lambda: nn.NLLLoss()(torch.randn(3, 4), t(-2, 0, 1)),
    "multi_margin valid": lambda: F.multi_margin_loss(torch.randn(3, 4), t(0, 3, 1)),
    "multi_margin bad": lambda: F.multi_margin_loss(torch.randn(3, 4), t(0, 4, 1)),
    "multi_margin negative": lambda: F.multi_margin_loss(torch.randn(3, 4), t(0, -1, 1)),
    "MultiMarginLoss module bad": lambda: nn.MultiMarginLoss()(torch.randn(3, 4), t(0, 9, 1)),
    # binary_cross_entropy
    "bce valid": lambda: F.binary_cross_entropy(t(0.0, 0.5, 1.0, dtype=torch.float), torch.rand(3)),
    "bce input above 1": lambda: F.binary_cross_entropy(
        t(0.2, 1.5, dtype=torch.float), torch.rand(2)
    ),
    "bce input negative": lambda: F.binary_cross_entropy(t(-0.1, dtype=torch.float), torch.rand(1)),
    "bce input nan": lambda: F.binary_cross_entropy(t(NAN, dtype=torch.float), torch.rand(1)),
    "bce target bad": lambda: F.binary_cross_entropy(torch.rand(2), t(0.0, 2.0, dtype=torch.float)),
    "BCELoss module logits": lambda: nn.BCELoss()(torch.randn(8) * 5, torch.rand(8)),
    "bce empty": lambda: F.binary_cross_entropy(torch.rand(0), torch.rand(0)),
    # embedding / embedding_bag
    "embedding valid": lambda: F.embedding(t(0, 9), torch.randn(10, 2)),
    "embedding too big": lambda: F.embedding(t(0, 10), torch.randn(10, 2)),
    "embedding negative": lambda: F.embedding(t(-1), torch.randn(10, 2)),
    "embedding padding_idx": lambda: F.embedding(t(0, 3), torch.randn(10, 2), padding_idx=3),
    "embedding int32": lambda: F.embedding(t(1, 9, dtype=torch.int32), torch.randn(10, 2)),
    "embedding int32 bad": lambda: F.embedding(t(1, 10, dtype=torch.int32), torch.randn(10, 2)),
    "embedding max_norm bad": lambda: F.embedding(t(1, 12), torch.randn(10, 2), max_norm=1.0),
    "embedding max_norm valid": lambda: F.embedding(t(1, 9), torch.randn(10, 2), max_norm=1.0),
    "embedding empty": lambda: F.embedding(t(), torch.randn(10, 2)),
    "Embedding module bad": lambda: nn.Embedding(5, 2)(t(1, 2, 5)),
    "Embedding module padding": lambda: nn.Embedding(5, 2, padding_idx=0)(t(0, 0, 4)),
    "Embedding module negative padding": lambda: nn.Embedding(5, 2, padding_idx=-1)(t(4, 0)),
    "embedding_bag valid": lambda: F.embedding_bag(t(1, 2, 4), torch.randn(5, 2), t(0, 1)),
    "embedding_bag index bad": lambda: F.embedding_bag(t(1, 2, 5), torch.randn(5, 2), t(0, 1)),
    "embedding_bag offsets not from 0": lambda: F.embedding_bag(
        t(1, 2, 3), torch.randn(5, 2), t(1, 2)
    ),
    "embedding_bag offsets decreasing": lambda: F.embedding_bag(
        t(1, 2, 3), torch.randn(5, 2), t(0, 2, 1)
    ),
    "embedding_bag offsets past end": lambda: F.embedding_bag(
        t(1, 2, 3), torch.randn(5, 2), t(0, 4)
    ),
    "embedding_bag last offset": lambda: F.embedding_bag(
        t(1, 2, 3), torch.randn(5, 2), t(0, 3), include_last_offset=True
    ),
    "embedding_bag 2d valid": lambda: F.embedding_bag(
        t(1, 2, 0, 4).reshape(2, 2), torch.randn(5, 2)
    ),
    "embedding_bag 2d bad": lambda: F.embedding_bag(t(1, 2, 0, 5).reshape(2, 2), torch.randn(5, 2)),
    "EmbeddingBag module bad": lambda: nn.EmbeddingBag(5, 2)(t(1, 7), t(0, 1)),
    "EmbeddingBag padding_idx": lambda: nn.EmbeddingBag(5, 2, padding_idx=2)(t(2, 2), t(0, 1)),
    # sampling
    "multinomial valid": lambda: torch.multinomial(t(0.2, 0.0, 0.8, dtype=torch.float), 1),
    "multinomial nan": lambda: torch.multinomial(t(0.2, NAN, dtype=torch.float), 1),
    "multinomial inf": lambda: torch.multinomial(t(0.2, INF, dtype=torch.float), 1),
    "multinomial negative": lambda: torch.multinomial(t(0.2, -0.1, dtype=torch.float), 1),
    "multinomial zero row": lambda: torch.multinomial(
        t(0.0, 0.0, 1.0, 1.0, dtype=torch.float).reshape(2, 2), 1
    ),
    "multinomial method bad": lambda: t(NAN, 1.0, dtype=torch.float).multinomial(1),
    "multinomial unnormalised": lambda: torch.multinomial(t(3.0, 5.0, dtype=torch.float), 2, True),
    "bernoulli valid": lambda: torch.bernoulli(t(0.0, 0.3, 1.0, dtype=torch.float)),
    "bernoulli above 1": lambda: torch.bernoulli(t(0.3, 1.2, dtype=torch.float)),
    "bernoulli nan": lambda: torch.bernoulli(t(NAN, dtype=torch.float)),
    "bernoulli float p": lambda: torch.bernoulli(t(3.0, dtype=torch.float), 0.5),
    "bernoulli method bad": lambda: t(-0.5, dtype=torch.float).bernoulli(),
    "bernoulli_ tensor p bad": lambda: torch.zeros(2).bernoulli_(t(0.5, 2.0, dtype=torch.float)),
    "bernoulli_ tensor p valid": lambda: torch.zeros(2).bernoulli_(t(0.5, 1.0, dtype=torch.float)),
    "bernoulli_ self ignored": lambda: torch.full((2,), 7.0).bernoulli_(0.5),
    "poisson valid": lambda: torch.poisson(t(0.0, 2.5, dtype=torch.float)),
    "poisson negative": lambda: torch.poisson(t(1.0, -1.0, dtype=torch.float)),
    "poisson nan": lambda: torch.poisson(t(NAN, dtype=torch.float)),
    # gather / scatter
    "gather valid": lambda: x34().gather(1, t(0, 3, 2).reshape(3, 1)),
    "gather too big": lambda: x34().gather(1, t(0, 4, 2).reshape(3, 1)),
    "gather negative": lambda: x34().gather(1, t(0, -1, 2).reshape(3, 1)),
    "gather negative dim": lambda: torch.gather(x34(), -1, t(0, 4, 2).reshape(3, 1)),
    "gather int32 is fine": lambda: x34().gather(0, t(2, dtype=torch.int32).reshape(1, 1)),
    "gather 0-d": lambda: torch.tensor(1.0).gather(0, torch.tensor(0)),
    "gather 0-d bad": lambda: torch.tensor(1.0).gather(0, torch.tensor(1)),
    "gather empty": lambda: x34().gather(1, t().reshape(3, 0)),
    "scatter valid": lambda: x34().scatter(1, t(3).reshape(1, 1), 1.0),
    "scatter bad": lambda: x34().scatter(1, t(4).reshape(1, 1), 1.0),
    "scatter_ bad": lambda: x34().scatter_(0, t(3).reshape(1, 1), 1.0),
    "scatter_ negative": lambda: x34().scatter_(0, t(-1).reshape(1, 1), 1.0),
    "scatter_add bad": lambda: torch.scatter_add(x34(), 1, t(4).reshape(1, 1), x34()),
    "scatter_add_ valid": lambda: x34().scatter_add_(1, t(3).reshape(1, 1), x34()),
    "scatter_reduce bad": lambda: x34().scatter_reduce(1, t(9).reshape(1, 1), x34(), "amax"),
    "scatter_reduce_ valid": lambda: x34().scatter_reduce_(0, t(2).reshape(1, 1), x34(), "sum"),
    # index_*
    "index_select valid": lambda: x34().index_select(0, t(0, 2)),
    "index_select bad": lambda: x34().index_select(0, t(0, 3)),
    "index_select negative": lambda: torch.index_select(x34(), 1, t(-1)),
    "index_select int32 bad": lambda: x34().index_select(1, t(4, dtype=torch.int32)),
    "index_add valid": lambda: x34().index_add(0, t(2), torch.ones(1, 4)),
    "index_add bad": lambda: x34().index_add_(0, t(3), torch.ones(1, 4)),
    "index_add negative": lambda: torch.index_add(x34(), 0, t(-1), torch.ones(1, 4)),
    "index_copy valid": lambda: x34().index_copy(0, t(2), torch.ones(1, 4)),
    "index_copy bad": lambda: x34().index_copy_(0, t(3), torch.ones(1, 4)),
    "index_copy negative": lambda: x34().index_copy(0, t(-1), torch.ones(1, 4)),
    "index_fill negative ok": lambda: x34().index_fill(0, t(-3), 1.0),
    "index_fill too negative": lambda: x34().index_fill_(0, t(-4), 1.0),
    "index_fill bad": lambda: torch.index_fill(x34(), 1, t(4), 1.0),
    # index_put and tensor indexing
    "index_put valid": lambda: x34().index_put_((t(2, -3),), torch.tensor(1.0)),
    "index_put bad": lambda: x34().index_put_((t(3),), torch.tensor(1.0)),
    "index_put second dim bad": lambda: x34().index_put((t(0), t(4)), torch.tensor(1.0)),
    "index_put accumulate bad": lambda: x34().index_put_((t(5),), torch.tensor(1.0), True),
    "index_put bool mask": lambda: x34().index_put_((x34() > 5,), torch.tensor(0.0)),
    "getitem valid": lambda: x34()[t(2, -3)],
    "getitem bad": lambda: x34()[t(0, 3)],
    "getitem too negative": lambda: x34()[t(-4)],
    "getitem second dim": lambda: x34()[:, t(4)],
    "getitem two tensors": lambda: x34()[t(0, 1), t(3, 4)],
    "getitem ellipsis": lambda: x34()[..., t(4)],
    "getitem ellipsis valid": lambda: x34()[..., t(3)],
    "getitem None then tensor": lambda: x34()[None, t(2)],
    "getitem None then bad": lambda: x34()[None, t(3)],
    "getitem int then tensor": lambda: x34()[1, t(4)],
    "getitem list valid": lambda: x34()[[0, 2]],
    "getitem list bad": lambda: x34()[[0, 3]],
    "getitem bool mask": lambda: x34()[x34() > 3],
    "getitem bool list": lambda: x34()[[True, False, True]],
    "getitem uint8 mask": lambda: x34()[t(1, 0, 1, dtype=torch.uint8)],
    "getitem 0-d tensor": lambda: x34()[torch.tensor(-3)],
    "getitem 0-d tensor bad": lambda: x34()[torch.tensor(3)],
    "getitem int32": lambda: x34()[t(2, dtype=torch.int32)],
    "getitem int32 bad": lambda: x34()[t(3, dtype=torch.int32)],
    "getitem empty": lambda: x34()[t()],
    "getitem 2d index tensor": lambda: x34()[t(0, 2, 1, 2).reshape(2, 2)],
    "getitem mask then index": lambda: x34()[t(True, False, True, dtype=torch.bool), t(3, 4)],
    "getitem mask then valid": lambda: x34()[t(True, False, True, dtype=torch.bool), t(3, 0)],
    "getitem numpy valid": lambda: x34()[np.array([0, -3])],
    "getitem numpy bad": lambda: x34()[np.array([0, 3])],
    "getitem numpy scalar bad": lambda: x34()[:, np.int64(4)],
    "setitem list bad": lambda: x34().__setitem__([0, 3], 1.0),
    "setitem valid": lambda: x34().__setitem__(t(2), 0.0),
    "setitem bad": lambda: x34().__setitem__(t(3), 0.0),
    "setitem second dim bad": lambda: x34().__setitem__((slice(None), t(5)), 0.0),
    # take / put
    "take valid": lambda: x34().take(t(11, -12)),
    "take bad": lambda: torch.take(x34(), t(12)),
    "take too negative": lambda: x34().take(t(-13)),
    "put valid": lambda: x34().put_(t(-12, 11), torch.zeros(2)),
    "put bad": lambda: x34().put_(t(12), torch.zeros(1)),
    "put out-of-place bad": lambda: x34().put(t(-13), torch.zeros(1)),
    # one_hot
    "one_hot valid": lambda: F.one_hot(t(0, 2), 3),
    "one_hot bad": lambda: F.one_hot(t(0, 3), 3),
    "one_hot negative": lambda: F.one_hot(t(-1, 2)),
    "one_hot inferred": lambda: F.one_hot(t(0, 7)),
    # ctc_loss: valid cases (bad ones are below: CPU does not check them)
    "ctc valid": lambda: ctc(t(1, 4, 2, 3).reshape(2, 2)),
    "ctc padding ignored": lambda: ctc(t(1, 99, 2, -5).reshape(2, 2), (1, 1)),
    "ctc concatenated valid": lambda: ctc(t(1, 4, 2, 3)),
    # repeat_interleave
    "repeat_interleave valid": lambda: torch.repeat_interleave(t(1, 0, 2)),
    "repeat_interleave negative": lambda: torch.repeat_interleave(t(1, -1)),
    "repeat_interleave output_size ok": lambda: torch.repeat_interleave(t(1, 2), output_size=3),
    "repeat_interleave output_size small": lambda: torch.repeat_interleave(t(1, 2), output_size=2),
    "repeat_interleave output_size big": lambda: torch.repeat_interleave(t(1, 2), output_size=4),
    "repeat_interleave method": lambda: t(5, 6).repeat_interleave(t(2, -1), dim=0),
    "repeat_interleave method ok": lambda: t(5, 6).repeat_interleave(t(2, 1), dim=0, output_size=3),
    "repeat_interleave int repeats": lambda: t(5, 6).repeat_interleave(3),
    "repeat_interleave one repeat": lambda: t(5, 6).repeat_interleave(t(3), output_size=6),
    # max_unpool
    "max_unpool1d valid": lambda: F.max_unpool1d(torch.randn(1, 1, 2), t(0, 3).reshape(1, 1, 2), 2),
    "max_unpool1d bad": lambda: F.max_unpool1d(torch.randn(1, 1, 2), t(0, 4).reshape(1, 1, 2), 2),
    "max_unpool1d negative": lambda: F.max_unpool1d(
        torch.randn(1, 1, 2), t(0, -1).reshape(1, 1, 2), 2
    ),
    "max_unpool2d valid": lambda: F.max_unpool2d(
        *F.max_pool2d(torch.randn(1, 2, 4, 4), 2, return_indices=True), 2
    ),
    "max_unpool2d bad": lambda: F.max_unpool2d(
        torch.randn(1, 1, 2, 2), t(0, 3, 8, 16).reshape(1, 1, 2, 2), 2
    ),
    "max_unpool2d output_size": lambda: F.max_unpool2d(
        torch.randn(1, 1, 2, 2), t(0, 3, 8, 24).reshape(1, 1, 2, 2), 2, output_size=(5, 5)
    ),
    "MaxUnpool2d module bad": lambda: nn.MaxUnpool2d(2)(
        torch.randn(1, 1, 2, 2), t(0, 3, 8, 16).reshape(1, 1, 2, 2)
    ),
    "max_unpool3d valid": lambda: F.max_unpool3d(
        torch.randn(1, 1, 1, 1, 2), t(0, 15).reshape(1, 1, 1, 1, 2), 2
    ),
    "max_unpool3d bad": lambda: F.max_unpool3d(
        torch.randn(1, 1, 1, 1, 2), t(0, 16).reshape(1, 1, 1, 1, 2), 2
    ),
}


def _raises(call: Callable[[], Any]) -> bool:
    try:
        call()
    except (IndexError, RuntimeError):
        return True
    return False


# the uint8 mask case: torch warns of its deprecation with the guard or without
@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8:UserWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_guard_raises_exactly_when_the_cpu_op_raises(name: str) -> None:
    call = CASES[name]
    cpu_rejects = _raises(call)
    with guard():
        try:
            call()
        except GuardError:
            guarded_rejects = True
        else:
            guarded_rejects = False
    assert guarded_rejects == cpu_rejects, f"{name}: CPU raises {cpu_rejects}"


CTC_BAD: dict[str, Callable[[], Any]] = {
    "target equal to the class count": lambda: ctc(t(1, 5, 2, 3).reshape(2, 2)),
    "negative target": lambda: ctc(t(1, -1, 2, 3).reshape(2, 2)),
    "concatenated target too big": lambda: ctc(t(1, 4, 9, 3)),
    "bad target within the length": lambda: ctc(t(7, 1, 2, 3).reshape(2, 2), (1, 2)),
    "CTCLoss module, lengths as tensors": lambda: nn.CTCLoss()(
        torch.randn(6, 1, 5).log_softmax(2), t(1, 5).reshape(1, 2), t(6), t(2)
    ),
}


@pytest.mark.parametrize("name", list(CTC_BAD))
def test_ctc_targets_cuda_never_checks_are_rejected(name: str) -> None:
    CTC_BAD[name]()  # CPU accepts them silently; CUDA reads out of bounds
    with guard(), pytest.raises(GuardError, match="ctc_loss"):
        CTC_BAD[name]()
