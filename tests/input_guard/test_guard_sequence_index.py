"""A list used as an index means what PyTorch's ``treatSequenceAsTuple`` says it means (NumPy's
legacy rule): a list (any sequence but a tuple, a tensor or an ndarray) of fewer than 32 items
with a tensor, slice, ``None``, ``...`` or any other sequence among them (a NumPy array, a 0-d
one too) is a tuple of indices, one per dimension; any other list is one index, made a tensor
whole (a list of 32 or more lists indexes dimension 0).

The guard read a list of NumPy arrays as one index into dimension 0 (a false alarm where a later
dimension is wider than the first, and in deferred mode a different result: the index was
replaced by one tensor), and a list of 32 or more lists as a tuple (a false alarm, and a
TypeError in deferred mode); a deque of index tensors was one index as well. The rules run
first here, as for a GPU's tensors.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from nb_cudaguard import GuardError, guard

# torch deprecates a non-tuple sequence used as a tuple: it warns with the guard or without
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")


def x25() -> torch.Tensor:
    return torch.arange(10.0).reshape(2, 5)


def x100() -> torch.Tensor:
    return torch.arange(300.0).reshape(100, 3)


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values)


def assigned(x: torch.Tensor, idx: Any) -> torch.Tensor:
    x[idx] = -1.0
    return x


VALID: dict[str, Callable[[], torch.Tensor]] = {
    "list of arrays is a tuple": lambda: x25()[[np.array([0, 1]), np.array([4, 4])]],
    "list of 0-d arrays is a tuple": lambda: x25()[[np.array(1), np.array(4)]],
    "list of a tensor and an array": lambda: x25()[[torch.tensor([1]), np.array([4])]],
    "list of 32 lists is one index": lambda: x100()[[[i, i + 5] for i in range(32)]],
    "list of 40 ints": lambda: x100()[list(range(40))],
    "set with a list of arrays": lambda: assigned(x25(), [np.array([0, 1]), np.array([4, 4])]),
    "set with 40 lists": lambda: assigned(x100(), [[i, i + 5] for i in range(40)]),
    "any sequence of tensors is a tuple": lambda: x25()[deque([torch.tensor([0, 1]), t([4, 4])])],
    "set with a sequence of tensors": lambda: assigned(x25(), deque([t([0, 1]), t([4, 3])])),
}

BAD: dict[str, Callable[[], torch.Tensor]] = {
    "list of arrays, second too big": lambda: x25()[[np.array([0, 1]), np.array([4, 5])]],
    "list of 31 lists is a tuple": lambda: x100()[[[i, i + 5] for i in range(31)]],
    "list of 32 lists, too big": lambda: x100()[[[i, i + 100] for i in range(32)]],
    "a sequence of tensors, second too big": lambda: x25()[deque([t([0, 1]), t([4, 5])])],
    "set with a list of arrays, too big": lambda: assigned(
        x25(), [np.array([0, 1]), np.array([5, 4])]
    ),
}


@pytest.mark.parametrize("mode", ["strict", "deferred"])
@pytest.mark.parametrize("name", list(VALID))
def test_a_valid_list_index_runs_as_bare(name: str, mode: str, device_path: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = VALID[name]()
        with guard(mode=mode):  # type: ignore[arg-type]
            inside = VALID[name]()
    assert torch.equal(inside, bare)


@pytest.mark.parametrize("mode", ["strict", "deferred"])
@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_list_index_is_caught(name: str, mode: str, device_path: None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(IndexError):
            BAD[name]()
        with pytest.raises(GuardError), guard(mode=mode):  # type: ignore[arg-type]
            BAD[name]()
