"""Calls a probe of 261 cases found the guard got wrong (issue 30): a tensor subclass whose
``__torch_function__`` refuses or counts attribute reads, a deferred call's output layout, a call
that writes into its own index, a dim given as a numpy integer, ``F.embedding_bag``'s old
argument order. Each runs bare and guarded, and the two must agree (or the guard must catch the
bad value, where PyTorch's CUDA kernel would assert on it)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nb_cudaguard import GuardError, guard


class Refusing(torch.Tensor):
    """A subclass that serves cross_entropy and refuses everything else (an attribute read
    included), logging what it was asked."""

    asked: list[str] = []  # noqa: RUF012 (the log of one test)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", repr(func))
        cls.asked.append(name)
        if name != "cross_entropy":
            raise NotImplementedError(name)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_subclass_is_asked_only_what_the_call_asks_it(cpu_op_first: None, mode: str):
    logits = torch.randn(3, 4).as_subclass(Refusing)
    target = torch.tensor([0, 3, -100])
    Refusing.asked = []
    bare = F.cross_entropy(logits, target)
    asked_bare = list(Refusing.asked)
    Refusing.asked = []
    with guard(mode=mode):
        guarded = F.cross_entropy(logits, target)
    assert Refusing.asked == asked_bare == ["cross_entropy"]
    assert torch.equal(bare, guarded)


def test_a_deferred_calls_output_keeps_the_inputs_layout(device_path: None):
    # binary_cross_entropy(reduction="none") on a transposed input: the output is laid out as
    # the input is, so out.view(-1) fails bare and must fail guarded too
    for probabilities in (
        torch.rand(3, 4).t(),
        torch.rand(2, 3, 4, 4).to(memory_format=torch.channels_last),
    ):
        target = torch.rand(probabilities.shape)
        bare = F.binary_cross_entropy(probabilities, target, reduction="none")
        with guard(mode="deferred"):
            guarded = F.binary_cross_entropy(probabilities, target, reduction="none")
        assert guarded.stride() == bare.stride()
        assert torch.equal(guarded, bare)


@pytest.mark.parametrize(
    "write",
    [
        lambda t: t.scatter_(0, t, torch.tensor([5, 6, 7])),
        lambda t: t.__setitem__(t, torch.tensor([5, 6, 7])),
        lambda t: t.index_copy_(0, t, torch.tensor([5, 6, 7])),
    ],
    ids=["scatter_", "setitem", "index_copy_"],
)
def test_a_call_writing_into_its_own_index_is_refused_by_pytorch_as_bare(
    device_path: None, write: Any
):
    with pytest.raises(RuntimeError, match="single memory location") as bare:
        write(torch.tensor([2, 0, 1]))
    t = torch.tensor([2, 0, 1])
    with pytest.raises(RuntimeError, match="single memory location") as guarded:  # noqa: SIM117
        with guard(mode="deferred"):
            write(t)
    assert str(guarded.value) == str(bare.value)
    assert t.tolist() == [2, 0, 1]


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_dim_given_as_a_numpy_integer_is_checked(mode: str):
    x, index = torch.randn(3, 5), torch.tensor([[9], [0], [1]])
    with pytest.raises(GuardError, match="index"), guard(mode=mode):
        torch.gather(x, np.int64(1), index)
    with guard(mode=mode):  # and a valid one passes, with the same result
        good = torch.gather(x, np.int64(-1), index.clamp(max=4))
    assert torch.equal(good, torch.gather(x, -1, index.clamp(max=4)))


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_embedding_bags_old_argument_order_is_checked(mode: str):
    weight, offsets = torch.randn(10, 3), torch.tensor([0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns of the old order and swaps the two
        with pytest.raises(GuardError), guard(mode=mode):
            F.embedding_bag(weight, torch.tensor([1, 12]), offsets)
        bare = F.embedding_bag(weight, torch.tensor([1, 9]), offsets)
        with guard(mode=mode):
            guarded = F.embedding_bag(weight, torch.tensor([1, 9]), offsets)
    assert torch.equal(bare, guarded)
