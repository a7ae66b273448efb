"""A probe of torch's own behaviour where a guard touches it, compared before a guard, inside it
and after it, for a guard that ends normally, one ended by a strict violation and one ended by a
deferred violation (issue 30). What the guard changes while it stands: the attributes it
replaces (torch's checked entry points) and, through ``torch.Tensor.__getitem__``/``__setitem__``,
the C slots of the tensor types that C code reads (issue 25: ``torch.tensor([0-d tensors])``
broke, while other projects' suites in tests/plugin/test_peer_suites.py still passed).

The probe reads the slots through what C code asks of an object (``PySequence_Check``,
``PySequence_GetItem``, ``PySequence_SetItem``, ``PyMapping_Check``) and the behaviours that rest
on them, and the identity of every attribute of the objects the guard patches."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nb_cudaguard import GuardError, guard

_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
for _name in ("PySequence_Check", "PyMapping_Check"):
    getattr(_api, _name).argtypes = [ctypes.py_object]
_api.PySequence_GetItem.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_api.PySequence_GetItem.restype = ctypes.py_object
_api.PySequence_SetItem.argtypes = [ctypes.py_object, ctypes.c_ssize_t, ctypes.py_object]


class Before(torch.Tensor):
    """A subclass created before any guard."""


class OwnIndexing(torch.Tensor):
    def __getitem__(self, index: object) -> torch.Tensor:
        return super().__getitem__(index)


def outcome(run: Callable[[], object]) -> object:
    """The value, or the exception's type and text: what a user of torch observes."""
    try:
        value = run()
    except Exception as error:
        return (type(error).__name__, str(error).split("\n")[0])
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.tolist())
    return value


def set_first(value: object) -> object:
    x = torch.zeros(3)
    _api.PySequence_SetItem(x, 0, value)
    return x


def assigned() -> torch.Tensor:
    x = torch.zeros(2, 3)
    x[1] = 5.0
    x[torch.tensor([0])] = torch.ones(3)
    return x


def behaviours() -> dict[str, object]:
    """Each probe on a plain tensor, a Parameter, subclasses made before and now (a module
    imported inside a guard creates its own), and one that defines its own ``__getitem__``."""
    now = type("Now", (torch.Tensor,), {})
    kinds = {
        "tensor": torch.arange(3.0),
        "0-d": torch.tensor(1.5),
        "parameter": nn.Parameter(torch.arange(3.0)),
        "before": torch.arange(3.0).as_subclass(Before),
        "now": torch.arange(3.0).as_subclass(now),
        "own": torch.arange(3.0).as_subclass(OwnIndexing),
    }
    probes: dict[str, object] = {}
    for kind, x in kinds.items():
        probes[f"PySequence_Check {kind}"] = _api.PySequence_Check(x)
        probes[f"PyMapping_Check {kind}"] = _api.PyMapping_Check(x)
        probes[f"PySequence_GetItem {kind}"] = outcome(lambda x=x: _api.PySequence_GetItem(x, 0))
        probes[f"len {kind}"] = outcome(lambda x=x: len(x))
        probes[f"x[1] {kind}"] = outcome(lambda x=x: x[1])
        probes[f"x[mask] {kind}"] = outcome(lambda x=x: x[x > 0.5])
        probes[f"list {kind}"] = outcome(lambda x=x: [float(v) for v in x])
    zero_d = [torch.tensor(1.5), torch.tensor(2.5)]
    probes.update(
        {
            "PySequence_SetItem": outcome(lambda: set_first(7.0)),
            "torch.tensor([0-d])": outcome(lambda: torch.tensor(zero_d)),
            "torch.as_tensor([0-d Parameter])": outcome(
                lambda: torch.as_tensor([nn.Parameter(torch.tensor(3.0))])
            ),
            "torch.tensor([[0-d], [0-d]])": outcome(lambda: torch.tensor([zero_d, zero_d])),
            "np.array([0-d])": outcome(lambda: np.array(zero_d)),
            "np.asarray(1-d)": outcome(lambda: np.asarray(torch.arange(3.0))),
            "torch.stack([0-d])": outcome(lambda: torch.stack(zero_d)),
            "x[i] = v": outcome(assigned),
            "del x[0]": outcome(lambda: torch.zeros(2).__delitem__(0)),
            "iter 0-d": outcome(lambda: iter(torch.tensor(1.0))),
            "x[[0, 2]]": outcome(lambda: torch.arange(3.0)[[0, 2]]),
            "x[None, ...]": outcome(lambda: torch.arange(3.0)[None, ...]),
            "gather": outcome(
                lambda: torch.gather(torch.arange(6.0).view(2, 3), 1, torch.tensor([[2], [0]]))
            ),
            "cross_entropy": outcome(
                lambda: F.cross_entropy(torch.eye(3), torch.tensor([0, 1, 2])).round(decimals=4)
            ),
        }
    )
    return probes


PATCHED = (torch, F, torch._C._nn, torch.Tensor, torch._C.TensorBase)


def attributes() -> dict[tuple[str, str], int]:
    """The identity of every attribute of the objects the guard patches, as their own
    ``__dict__`` holds it (an attribute set on a subclass shadows its base's)."""
    return {
        (owner.__name__, name): id(value)
        for owner in PATCHED
        for name, value in list(vars(owner).items())
    }


def guarded(mode: str, raised: bool) -> Iterator[dict[str, object]]:
    """Probes taken inside a guard that ends normally, or by its own violation."""
    with pytest.raises(GuardError) if raised else contextlib.nullcontext(), guard(mode=mode):
        yield behaviours()
        if raised:
            F.cross_entropy(torch.eye(3), torch.tensor([0, 1, 3]))


def differences(before: dict[Any, object], now: dict[Any, object]) -> str:
    keys = sorted({*before, *now} - {k for k in before if now.get(k, ...) == before[k]}, key=str)
    return "; ".join(f"{key}: {before.get(key)} -> {now.get(key)}" for key in keys)


def check(mode: str, raised: bool) -> None:
    before, names = behaviours(), attributes()
    for inside in guarded(mode, raised):
        assert inside == before, f"inside: {differences(before, inside)}"
        changed = {key for key, value in attributes().items() if names.get(key) != value}
        assert changed, "the guard installs its wrappers"
    after = behaviours()
    assert after == before, f"after: {differences(before, after)}"
    assert attributes() == names, f"after: {differences(names, attributes())}"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "raised"), [("strict", False), ("strict", True), ("deferred", True)]
)
def test_torch_behaves_the_same_before_inside_and_after_a_guard(mode: str, raised: bool) -> None:
    """In a fresh process: a guard that left torch changed earlier in this one would already
    have changed what "before" reads."""
    here = Path(__file__).parent
    code = (
        "import warnings, test_guard_probe as probe\n"
        # torch warns of the Parameter made a scalar, as it does outside a guard
        "warnings.filterwarnings('ignore', 'Converting a tensor with requires_grad')\n"
        f"probe.check({mode!r}, {raised!r})"
    )
    path = os.pathsep.join([str(here), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
