"""The guard against PyTorch's own OpInfo inputs with the bare CPU op as the oracle (see
opinfo_oracle.py): in strict and in deferred mode, with every rule judged before the call (as on
a GPU) and with the CPU op run first (the default for host memory), it raises exactly when the
CPU op raises, an exception of the CPU op's class, and where the CUDA kernel asserts on values
the CPU op takes; it never rejects what both accept. No input is left out: with the CPU op first,
the values only the CUDA kernel refuses are where the shortcut must not apply."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nb_cudaguard import guard
from nb_cudaguard.input_guard import judge
from nb_cudaguard.input_guard.judge import STATS

oracle = pytest.importorskip("opinfo_oracle", reason="needs torch.testing._internal (expecttest)")
pytest.importorskip("expecttest")


def _cases(name: str) -> Iterator[tuple[str, Callable[..., Any], Any]]:
    if name in oracle.MODULE_NAMES:
        yield from oracle.module_samples(name)
        return
    for op in oracle.op_infos():
        if f"{op.name}.{op.variant_test_name}".rstrip(".") == name:
            yield from oracle.op_samples(op)


NAMES = [
    *sorted({f"{op.name}.{op.variant_test_name}".rstrip(".") for op in oracle.op_infos()}),
    *oracle.MODULE_NAMES,
]


@pytest.mark.parametrize("mode", ["strict", "deferred", "strict, cpu op first"])
@pytest.mark.parametrize("name", NAMES)
def test_the_guard_raises_exactly_when_the_cpu_op_raises(
    name: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # strict and deferred: every rule judged before the call, as on a GPU; the third is the
    # default for host memory, the op first and the rules only when it raises
    if mode.endswith("cpu op first"):
        monkeypatch.setattr(judge, "TRUST_HOST_OPS", True)
    factory = functools.partial(guard, mode=mode.split(",")[0])
    wrong: list[str] = []
    checked = 0
    STATS.clear()
    for label, function, sample in _cases(name):
        for variant, case in oracle.variants(sample):
            checked += 1
            problem = oracle.compare(function, case, factory, oracle.cuda_asserts(name, case))
            if problem is not None:
                wrong.append(f"{label} {variant}: {problem}")
    assert checked > 0
    assert STATS["calls"] > 0, (
        "the guard never inspected a call: the oracle compared bare with bare"
    )
    assert not wrong, f"{len(wrong)} of {checked} cases:\n" + "\n".join(wrong[:30])
