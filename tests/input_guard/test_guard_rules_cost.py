"""The rules path's cost per valid call does not grow with the index tensor (issue 30): one
fused reduction over the indices and a fixed handful of scalars read to the host, whatever their
size. Counted as the aten ops the guard runs beside the op itself, not timed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from nb_cudaguard import guard

# Past this many values the guard reduces instead of reading them (requirements._LISTED).
SMALL, LARGE = 512, 512 * 512


class _Recorded(TorchDispatchMode):
    """Every aten op run inside the block, with the number of elements it wrote."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        written = sum(o.numel() for o in outputs if isinstance(o, torch.Tensor))
        self.ops.append((str(func), written))
        return out


def _guard_ops(call: Callable[[], object], mode: str, own: str) -> list[tuple[str, int]]:
    """The ops a guarded ``call`` runs besides its own (``own``), once warmed up."""
    with guard(mode=mode):
        call()
        with _Recorded() as recorded:
            call()
    return [(name, written) for name, written in recorded.ops if not name.startswith(own)]


def _ids(numel: int, high: int) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randint(0, high, (numel // 512, 512))


CALLS: dict[str, tuple[Callable[[int], Callable[[], object]], str]] = {
    "F.embedding": (
        lambda n: (lambda ids=_ids(n, 8000), w=torch.randn(8000, 2): F.embedding(ids, w)),
        "aten.embedding",
    ),
    "F.embedding, padding_idx=0": (
        lambda n: (
            lambda ids=_ids(n, 8000), w=torch.randn(8000, 2): F.embedding(ids, w, padding_idx=0)
        ),
        "aten.embedding",
    ),
    "x[idx], negative indices": (
        lambda n: (lambda idx=_ids(n, 200) - 100, x=torch.randn(100, 2): x[idx]),
        "aten.index.Tensor",
    ),
    "F.cross_entropy": (
        lambda n: (
            lambda t=_ids(n, 3).reshape(-1), x=torch.randn(n, 3): F.cross_entropy(x, t)
        ),
        "aten._log_softmax",
    ),
}


@pytest.mark.parametrize("mode", ["strict", "deferred"])
@pytest.mark.parametrize("name", list(CALLS))
def test_a_valid_calls_checks_do_not_grow_with_its_indices(name: str, mode: str) -> None:
    make, own = CALLS[name]
    own_ops = ("aten.nll_loss", own) if name == "F.cross_entropy" else (own,)
    small = [op for op in _guard_ops(make(SMALL), mode, own) if not op[0].startswith(own_ops)]
    large = [op for op in _guard_ops(make(LARGE), mode, own) if not op[0].startswith(own_ops)]
    assert [op for op, _ in small] == [op for op, _ in large]
    # one reduction over the indices, its two extremes read: nothing the size of the input
    assert [op for op, _ in large].count("aten.aminmax.default") == 1
    assert all(written <= 2 for _, written in large), large
