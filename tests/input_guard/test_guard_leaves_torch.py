"""Whatever a guard installs leaves torch behaving exactly as bare, inside the block and after it:
the C slots CPython fills when ``torch.Tensor.__getitem__`` is set (issue 25: a tensor became a
sequence, ``torch.tensor([torch.tensor(1.5)])`` failed), and torch's tables of its own functions
built while the wrappers stood in for them (torch.compile, torch.fx, torch.overrides)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from nb_cudaguard import GuardError, guard

_sequence_check = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_sequence_check.PySequence_Check.argtypes = [ctypes.py_object]


def is_sequence(value: object) -> bool:
    """What C code asks of an object (torch.tensor's data parser, NumPy's array discovery)."""
    return bool(_sequence_check.PySequence_Check(value))


class Before(torch.Tensor):
    """A subclass created before any guard."""


class OwnIndexing(torch.Tensor):
    def __getitem__(self, index: object) -> torch.Tensor:
        return super().__getitem__(index)


def scalars() -> list[torch.Tensor]:
    return [torch.tensor(1.5), torch.tensor(2.5)]


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_tensor_is_no_sequence_inside_and_after_a_guard(mode: str) -> None:
    values = [
        torch.tensor(1.5),
        nn.Parameter(torch.tensor(2.0)),
        torch.ones(()).as_subclass(Before),
    ]
    assert not any(is_sequence(v) for v in values)
    with guard(mode=mode):
        assert not any(is_sequence(v) for v in values)
    assert not any(is_sequence(v) for v in values)


# torch warns of the Parameter made a scalar, as it does outside a guard: what is tested.
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True:UserWarning")
@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_a_list_of_0d_tensors_becomes_a_tensor_inside_and_after_a_guard(mode: str) -> None:
    with guard(mode=mode):
        assert torch.tensor(scalars()).tolist() == [1.5, 2.5]
        assert torch.as_tensor([nn.Parameter(torch.tensor(3.0))]).tolist() == [3.0]
    assert torch.tensor(scalars()).tolist() == [1.5, 2.5]


def test_a_subclass_created_inside_a_guard_is_no_sequence_there_or_after() -> None:
    with guard():

        class During(torch.Tensor):
            pass

        inside = torch.tensor(1.0).as_subclass(During)
        assert not is_sequence(inside)
        assert torch.tensor([inside, inside]).tolist() == [1.0, 1.0]

        class Grandchild(Before):
            pass

        assert not is_sequence(torch.tensor(1.0).as_subclass(Grandchild))
    assert not is_sequence(inside)


def test_a_subclass_with_its_own_indexing_keeps_it() -> None:
    own = torch.arange(3.0).as_subclass(OwnIndexing)
    assert is_sequence(own)  # CPython's own view of a class that defines __getitem__
    with guard():
        assert is_sequence(own)
    assert is_sequence(own)
    assert own[1].item() == 1.0


def test_indexing_is_still_checked_after_the_slots_are_put_back() -> None:
    with pytest.raises(GuardError), guard():
        torch.randn(3)[torch.tensor([3])]
    with pytest.raises(GuardError), guard():
        x = torch.zeros(3)
        x[torch.tensor([5])] = 1.0


def run_fresh(code: str) -> str:
    """torch's tables are built once per process: each case needs one where they are not."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_torch_compile_first_used_inside_a_guard_traces_torchs_ops_after_it() -> None:
    pytest.importorskip("torch._dynamo")
    out = run_fresh(
        """
        import torch, torch.nn.functional as F
        from nb_cudaguard import guard

        def step(x, i, y):
            return torch.gather(x, 1, i).sum() + F.cross_entropy(x, y) + x[i[:, 0]].sum()

        args = torch.randn(5, 5), torch.tensor([[1], [2], [0], [4], [3]]), torch.arange(5)
        with guard():
            inside = torch._dynamo.explain(step)(*args)
        torch._dynamo.reset()
        after = torch._dynamo.explain(step)(*args)
        print(inside.graph_break_count, after.graph_break_count)
        """
    )
    assert out.split() == ["0", "0"]


def test_torch_fx_and_overrides_first_used_inside_a_guard_know_torchs_methods_after_it() -> None:
    out = run_fresh(
        """
        import torch
        from nb_cudaguard import guard

        def pick(x, i):
            return x.gather(0, i)

        with guard():
            torch.overrides.is_tensor_method_or_property(torch.Tensor.add)  # builds the table
            torch.fx.symbolic_trace(pick)
        graph = torch.fx.symbolic_trace(pick).graph
        print(torch.overrides.is_tensor_method_or_property(torch.Tensor.gather))
        print([node.op for node in graph.nodes if node.target in ("gather", torch.Tensor.gather)])
        """
    )
    assert out.split("\n")[:2] == ["True", "['call_method']"]


def test_dynamos_tables_imported_after_an_earlier_guard_are_emptied_after_the_next() -> None:
    # The guard looks for torch's cached tables again only once more modules are loaded: a
    # table whose module came after the first guard is still found by the next one.
    pytest.importorskip("torch._dynamo")
    out = run_fresh(
        """
        import sys, torch
        from nb_cudaguard import guard

        with guard():
            pass
        assert "torch._dynamo" not in sys.modules
        from torch._dynamo import trace_rules
        with guard():
            trace_rules.get_tensor_method()  # built from the wrappers
        print(trace_rules.get_tensor_method.cache_info().currsize)
        """
    )
    assert out.split() == ["0"]


def builtin_table() -> dict[int, str]:
    import torch.jit._builtins as builtins

    return builtins._get_builtin_table()


def test_torchscripts_table_knows_the_wrapper_as_the_op_and_is_as_found_after_the_guard() -> None:
    before = dict(builtin_table())
    with guard():
        assert builtin_table()[id(torch.gather)] == before[id(torch.gather.__wrapped__)]  # type: ignore[attr-defined]
    assert builtin_table() == before
    with guard():  # the second guard's start, from the plan made at the first
        assert builtin_table()[id(torch.gather)] == before[id(torch.gather.__wrapped__)]  # type: ignore[attr-defined]
    assert builtin_table() == before


def test_an_op_replaced_between_guards_is_the_one_wrapped_and_stays_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with guard():
        pass  # the guard has planned torch's own gather
    calls: list[int] = []

    def replacement(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return torch._C._VariableFunctions.gather(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "gather", replacement)
    with guard():
        assert torch.gather.__wrapped__ is replacement  # type: ignore[attr-defined]
        with pytest.raises(GuardError):
            torch.gather(torch.randn(2, 3), 1, torch.tensor([[3], [0]]))
        calls.clear()
        torch.gather(torch.randn(2, 3), 1, torch.tensor([[2], [0]]))
        assert calls == [1]  # the valid call ran the replacement
    assert torch.gather is replacement


def test_an_entry_point_replaced_inside_the_guard_is_left_to_whoever_replaced_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def mine(*args: object, **kwargs: object) -> str:
        return "mine"

    monkeypatch.setattr(torch, "take", torch.take)  # put back after the test whatever happens
    with guard():
        torch.take = mine
    assert torch.take is mine
    assert "torch.take was replaced while the guard was active" in capsys.readouterr().err
    monkeypatch.undo()
    with guard():
        assert torch.take.__wrapped__ is not mine  # type: ignore[attr-defined]
    assert torch.take is not mine
