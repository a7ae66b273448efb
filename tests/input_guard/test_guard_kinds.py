"""The fused range checks themselves, on every integer width and on floats with NaN/inf."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nb_cudaguard.input_guard.judge import first_violation
from nb_cudaguard.input_guard.requirements import FloatRange, IntRange

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


def _reference(t: torch.Tensor, lo: int, hi: int, ignore: int | None) -> bool:
    ok = (t >= lo) & (t < hi)
    if ignore is not None:
        ok |= t == ignore
    return bool(ok.all())


@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (64,), (65,), (3, 4), (4, 40), ()], ids=str)
@pytest.mark.parametrize("ignore", [None, -100, 255, 3], ids=str)
def test_the_host_verdict_and_the_device_summary_agree_with_the_definition(
    shape: tuple[int, ...], ignore: int | None
) -> None:
    """Both ways to judge a range (values read where they are; the summary a GPU reads) against
    its definition, with the ignore_index below the range, above it, inside it or absent, on
    tensors read as a list and tensors reduced."""
    generator = torch.Generator().manual_seed(len(shape) * 1000 + (ignore or 0))
    lo, hi = 0, 21
    for trial in range(60):
        t = torch.randint(lo, hi, shape, generator=generator)
        if t.numel():
            flat = t.view(-1)
            for _ in range(trial % 4):  # some ignores, some bad values, some both
                where = int(torch.randint(0, t.numel(), (1,), generator=generator))
                flat[where] = [ignore if ignore is not None else -1, -1, 21, 255, -100][trial % 5]
        expected = _reference(t, lo, hi, ignore)
        requirement = IntRange("target", t, lo, hi, "", ignore=ignore)
        assert requirement.holds_now() == expected, (t, ignore)
        fresh = IntRange("target", t, lo, hi, "", ignore=ignore)
        values = [v.item() for v in fresh.summary()] if t.numel() else None
        assert values is None or fresh.holds(values) == expected, (t, ignore)


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_an_ignore_index_above_the_classes_is_no_violation_in_a_large_mask(mode: str) -> None:
    import torch.nn.functional as F

    from nb_cudaguard import guard

    masks = torch.randint(0, 21, (2, 8, 8))
    masks[:, 0] = 255  # void pixels, skipped by ignore_index=255
    with guard(mode=mode):
        loss = F.cross_entropy(torch.randn(2, 21, 8, 8), masks, ignore_index=255)
    assert loss.isfinite()


# Past 64 values a host tensor's extremes come from one aminmax into a per-thread buffer.
MANY = 300


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_many_values_inside_the_range_pass_for_every_integer_width(dtype: torch.dtype) -> None:
    ids = torch.arange(MANY).remainder(100).to(dtype)
    assert first_violation([IntRange("ids", ids, 0, 100, "")]) is None


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_one_value_past_the_range_among_many_fails_for_every_integer_width(
    dtype: torch.dtype,
) -> None:
    ids = torch.arange(MANY).remainder(100).to(dtype)
    ids[123] = 100
    found = first_violation([IntRange("ids", ids, 0, 100, "")])
    assert found is not None and found.samples == (("[123]", "100"),)


def test_many_targets_with_ignored_ones_pass_and_a_negative_among_them_fails() -> None:
    target = torch.arange(MANY).remainder(4)
    target[::7] = -100
    assert first_violation([IntRange("target", target, 0, 4, "", ignore=-100)]) is None
    target[200] = -1
    found = first_violation([IntRange("target", target, 0, 4, "", ignore=-100)])
    assert found is not None and found.samples == (("[200]", "-1"),)


def test_a_thread_whose_first_check_ran_in_inference_mode_reads_extremes_in_one_go_after() -> None:
    """The buffer the extremes are read into is made on a thread's first check: made inside
    inference mode, it must still take aminmax's output outside it (an inference tensor could
    not, and every later check would reduce twice)."""
    results: list[object] = []
    ops: list[str] = []

    class Recorded(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def checks() -> None:
        good, bad = torch.arange(MANY).remainder(100), torch.arange(MANY)
        with torch.inference_mode():
            results.append(first_violation([IntRange("ids", good, 0, 100, "")]))
        with Recorded():
            results.append(first_violation([IntRange("ids", good, 0, 100, "")]))
        results.append(first_violation([IntRange("ids", bad, 0, 100, "")]))

    thread = threading.Thread(target=checks)
    thread.start()
    thread.join()
    assert results[:2] == [None, None]
    assert results[2] is not None and results[2].count == MANY - 100  # type: ignore[attr-defined]
    assert [op for op in ops if op.startswith("aten.aminmax")] == ["aten.aminmax.out"]
