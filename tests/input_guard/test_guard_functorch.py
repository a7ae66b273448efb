"""Checked calls inside ``torch.func`` transforms (``vmap``, ``grad``, ``functionalize``):
per-sample gradients, a vmapped lookup. Inside ``vmap`` a tensor is a wrapper whose values cannot
be read: the strict guard's check failed there and let every call through unchecked, and the
deferred guard kept summaries of wrappers past the transform and failed at the end of the block
with functorch's internal assert (``maybe_level.has_value()``) on valid code (under
``functionalize``: "tolist() shouldn't be called on a tensor with unallocated storage"). The
checks now read the plain tensor beneath, batch entries included. The rules run first here, as
for a GPU's tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, functionalize, grad, vmap

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard.judge import STATS

MODES = ["strict", "deferred"]


def per_sample_grads(labels: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, torch.randn(5, 4), labels)
    return torch.cat([g.flatten() for g in grads.values()])


WEIGHT = torch.arange(18.0).reshape(6, 3)
X25 = torch.arange(10.0).reshape(2, 5)

VALID: dict[str, Callable[[], torch.Tensor]] = {
    "per-sample grads": lambda: per_sample_grads(torch.tensor([0, 2, 1, -100, 2])),
    "vmapped embedding": lambda: vmap(lambda i: F.embedding(i, WEIGHT))(torch.tensor([[0, 5]])),
    "vmapped index, negative": lambda: vmap(lambda i: X25[:, i])(torch.tensor([[0, 4], [1, -5]])),
    "nested vmap, batch in dim 1": lambda: vmap(vmap(lambda i: X25[:, i]), in_dims=1)(
        torch.tensor([[0, 4, 1], [-5, 2, 3]])
    ),
    "vmapped multinomial": lambda: vmap(lambda p: torch.multinomial(p, 2), randomness="different")(
        torch.tensor([[0.0, 1.0, 1.0], [2.0, 0.0, 1.0]])
    ),
    "functionalized index_put_": lambda: functionalize(
        lambda z: z.index_put_((torch.tensor([1, -2]),), torch.tensor(5.0))
    )(torch.zeros(4)),
    "vmapped repeat_interleave of one count": lambda: vmap(
        lambda x: x.repeat_interleave(torch.tensor(2))
    )(torch.ones(2, 3)),
}

BAD: dict[str, Callable[[], torch.Tensor]] = {
    "per-sample grads, a label too big": lambda: per_sample_grads(torch.tensor([0, 2, 1, 3, 2])),
    "vmapped embedding": lambda: vmap(lambda i: F.embedding(i, WEIGHT))(torch.tensor([[0, 6]])),
    "nested vmap, batch in dim 1": lambda: vmap(vmap(lambda i: X25[:, i]), in_dims=1)(
        torch.tensor([[0, 4, 1], [-5, 2, 5]])
    ),
    "functionalized getitem": lambda: functionalize(lambda z: z[torch.tensor([1, 4])])(
        torch.zeros(4)
    ),
    "vmapped multinomial, a zero row": lambda: vmap(
        lambda p: torch.multinomial(p, 1), randomness="different"
    )(torch.tensor([[0.0, 1.0], [0.0, 0.0]])),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(VALID))
def test_a_valid_call_inside_a_transform_runs_as_bare(
    name: str, mode: str, device_path: None
) -> None:
    torch.manual_seed(1)
    bare = VALID[name]()
    STATS.clear()
    torch.manual_seed(1)
    with guard(mode=mode):  # type: ignore[arg-type]
        inside = VALID[name]()
    assert torch.equal(inside, bare)
    assert STATS["check_failed"] == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_call_inside_a_transform_is_caught(name: str, mode: str, device_path: None) -> None:
    with pytest.raises((IndexError, RuntimeError)):  # the CPU op's own error
        BAD[name]()
    STATS.clear()
    with pytest.raises(GuardError), guard(mode=mode):  # type: ignore[arg-type]
        BAD[name]()
    assert STATS["check_failed"] == 0
