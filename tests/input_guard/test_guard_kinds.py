"""The fused range checks themselves, on every integer width and on floats with NaN/inf."""

from __future__ import annotations

import pytest
import torch

from nb_cudaguard.input_guard.requirements import FloatRange, IntRange
from nb_cudaguard.input_guard.scope import first_violation

INT_TYPES = [
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
]


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_values_inside_the_range_pass_for_every_integer_width(dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 5, 99], dtype=dtype)
    assert first_violation([IntRange("ids", ids, 0, 100, "")]) is None


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_a_value_past_the_range_fails_for_every_integer_width(dtype: torch.dtype) -> None:
    ids = torch.tensor([0, 100, 5], dtype=dtype)
    found = first_violation([IntRange("ids", ids, 0, 100, "")])
    assert found is not None and found.samples == (("[1]", "100"),)


def test_ignore_outside_the_range_passes_but_other_negatives_fail() -> None:
    target = torch.tensor([-100, 3, -1])
    found = first_violation([IntRange("target", target, 0, 4, "", ignore=-100)])
    assert found is not None and (found.count, found.samples) == (1, (("[2]", "-1"),))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, 1.5])
def test_unit_interval_rejects_nan_inf_and_outside_values(bad: float) -> None:
    p = torch.tensor([0.0, bad, 1.0])
    assert first_violation([FloatRange("p", p, 0.0, 1.0, "", "")]) is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_unit_interval_accepts_its_ends_in_every_float_type(dtype: torch.dtype) -> None:
    p = torch.tensor([0.0, 1.0], dtype=dtype)
    assert first_violation([FloatRange("p", p, 0.0, 1.0, "", "")]) is None


def test_a_huge_int64_is_compared_exactly() -> None:
    ids = torch.tensor([2**62 + 1])
    assert first_violation([IntRange("ids", ids, 0, 2**62 + 1, "")]) is not None
