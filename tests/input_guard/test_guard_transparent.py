"""What torch's users observe of a checked op is the same inside a guard as bare: a warning
torch raises in the op comes from the caller's line and module (issue 30: it came from
``input_guard/scope.py``), and ``torch.jit.trace`` records the user's ops, not the checks."""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from nb_cudaguard import guard

UINT8 = "indexing with dtype torch.uint8 is now deprecated"


def mask_twice() -> list[int]:
    """Two call sites of torch ops that warn (TORCH_WARN: attributed to the calling frame)."""
    x, mask = torch.arange(4.0), torch.tensor([1, 0, 1, 0], dtype=torch.uint8)
    first = mask_twice.__code__.co_firstlineno
    x[mask]  # a torch.Tensor dunder (x[idx])
    torch.index_put(x, (mask,), torch.zeros(2))  # a function of the torch module
    return [first + 4, first + 5]


def caught(run: Callable[[], object], action: str = "always") -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter(action)
        run()
    return [w for w in seen if UINT8 in str(w.message)]


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_warning_in_a_checked_op_comes_from_the_callers_line(mode: str) -> None:
    lines: list[int] = []
    bare = caught(lambda: lines.extend(mask_twice()))
    with guard(mode=mode):
        inside = caught(mask_twice)
    assert [(w.filename, w.lineno) for w in bare] == [(__file__, line) for line in lines]
    assert [(w.filename, w.lineno) for w in inside] == [(w.filename, w.lineno) for w in bare]


def test_a_module_filter_and_once_per_location_match_inside_a_guard() -> None:
    with guard():
        # "default": once per location, so two lines give two warnings (not one for scope.py)
        assert len(caught(mask_twice, "default")) == 2
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", module=re.escape(__name__))
            mask_twice()
        assert not [w for w in seen if UINT8 in str(w.message)]


def step(h: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    picked = torch.gather(h, 1, ids[:, None] % 4)
    return F.cross_entropy(h, labels) + picked.sum() + h[ids % 2].sum()


def traced(run: Callable[[], torch.jit.ScriptFunction]) -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        graph = run().graph
    return [node.kind() for node in graph.nodes()], [str(w.message) for w in seen]


# the trace run for the note: torch warns that torch.jit.trace is deprecated, as bare
@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_torch_jit_trace_records_the_users_ops_only_and_the_guard_says_so(
    mode: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nb_cudaguard.input_guard import scope

    monkeypatch.setattr(scope, "_NOTED", set())
    # the rules run first here (tests/conftest.py), as they do for a GPU's tensors
    args = (torch.randn(3, 4), torch.tensor([0, 3, 1]), torch.tensor([1, 2, 3]))
    bare = traced(lambda: torch.jit.trace(step, args))
    with guard(mode=mode):
        inside = traced(lambda: torch.jit.trace(step, args))
    assert inside == bare
    with guard(mode=mode), pytest.raises(IndexError):  # checked again once tracing is done
        step(args[0], args[1], torch.tensor([1, 2, 4]))
    with guard(mode=mode):
        torch.jit.trace(step, args)
    note = "torch.jit.trace ran checked ops unchecked"
    assert capsys.readouterr().err.count(note) == 1  # once a process


def test_a_checked_op_called_from_c_with_no_python_frame_above_runs() -> None:
    # _thread calls its function from C: the wrapper has no caller frame to take warnings from
    import _thread

    x = torch.zeros(4)
    with guard():
        _thread.start_new_thread(x.index_fill_, (0, torch.tensor([1, 2]), 7.0))
        deadline = time.monotonic() + 10
        while x.sum() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert x.tolist() == [0.0, 7.0, 7.0, 0.0]
