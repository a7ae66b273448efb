"""Torch's checked ops, as a guard's wrappers stand in for them, pickle, copy and cross process
boundaries as torch's own functions, inside the guard and after it (issue 30)."""

from __future__ import annotations

import copy
import inspect
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from picklable import Classifier, Picked, Stack

from nb_cudaguard import guard


def test_pickle_of_torchs_ops_inside_a_guard_loads_torchs_ops() -> None:
    with guard():
        assert torch.gather is not torch.gather.__wrapped__  # the wrapper is what pickle sees
        saved = [pickle.dumps(op) for op in (torch.gather, F.cross_entropy, torch.Tensor.take)]
    assert [pickle.loads(data) for data in saved] == [
        torch.gather,
        F.cross_entropy,
        torch.Tensor.take,
    ]
    assert not any(b"nb_cudaguard" in data for data in saved)  # the reader needs torch only


@pytest.mark.parametrize("when", ["inside", "after"])
def test_torch_save_of_a_model_built_inside_a_guard(when: str) -> None:
    with guard():
        model = Classifier(F.cross_entropy)
        if when == "inside":
            buffer = io.BytesIO()
            torch.save(model, buffer)
    if when == "after":
        buffer = io.BytesIO()
        torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.loss_fn is F.cross_entropy
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    assert torch.equal(loaded(x, y), model(x, y))


def test_deepcopy_and_copy_keep_the_op_inside_and_after_a_guard() -> None:
    with guard(mode="deferred"):
        model = Classifier(F.cross_entropy)
        inside = copy.deepcopy(model)
        assert inside.loss_fn is model.loss_fn and copy.copy(model.loss_fn) is model.loss_fn
        with pytest.raises(IndexError):  # still the guard's checked op
            inside(torch.randn(2, 4), torch.tensor([0, 3]))
    after = copy.deepcopy(model)
    assert after.loss_fn is model.loss_fn
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    assert torch.equal(after(x, y), F.cross_entropy(model.head(x), y))


def test_a_spawned_dataloader_worker_gets_torchs_ops() -> None:
    with guard():
        loader = torch.utils.data.DataLoader(
            Picked(torch.gather),
            batch_size=4,
            collate_fn=Stack(F.one_hot),
            num_workers=1,
            multiprocessing_context="spawn",
            timeout=120,
        )
        ((batch, encoded),) = list(loader)
    assert batch.tolist() == torch.arange(12.0).reshape(4, 3).tolist()
    assert encoded.tolist() == F.one_hot(torch.tensor([0, 1, 2, 0]), 3).tolist()


def test_the_wrapper_reads_as_torchs_function() -> None:
    bare = [
        (inspect.getsource(F.cross_entropy), inspect.signature(F.cross_entropy)),
        F.cross_entropy.__code__,
        F.cross_entropy.__defaults__,
        repr(torch.gather),
    ]
    with guard():
        assert F.cross_entropy is not F.cross_entropy.__wrapped__
        inside = [
            (inspect.getsource(F.cross_entropy), inspect.signature(F.cross_entropy)),
            F.cross_entropy.__code__,
            F.cross_entropy.__defaults__,
            repr(torch.gather),
        ]
    assert inside == bare
