"""guard(): it is active exactly inside its block, nests, and always leaves torch as it found it."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard.scope import STATS, active


def mode_depth() -> int:
    return int(torch._C._len_torch_function_stack())


def bad_embedding() -> None:
    F.embedding(torch.tensor([10]), torch.randn(10, 2))


def test_a_guard_leaves_no_mode_on_torchs_stack() -> None:
    before = mode_depth()
    with guard():
        assert mode_depth() == before + 1
    assert mode_depth() == before
    assert not active()


def test_after_the_block_pytorch_raises_its_own_error_again() -> None:
    with guard():
        pass
    with pytest.raises(IndexError) as caught:
        bad_embedding()
    assert not isinstance(caught.value, GuardError)


def test_a_guard_error_inside_the_block_still_removes_the_mode() -> None:
    before = mode_depth()
    with pytest.raises(GuardError), guard():
        bad_embedding()
    assert mode_depth() == before and not active()


def test_keyboard_interrupt_inside_the_block_still_removes_the_mode() -> None:
    before = mode_depth()
    with pytest.raises(KeyboardInterrupt), guard():
        raise KeyboardInterrupt
    assert mode_depth() == before and not active()


def test_nested_guards_push_one_mode_and_unwind_completely() -> None:
    before = mode_depth()
    with guard():
        with guard(only="loss"):
            assert mode_depth() == before + 1
        with pytest.raises(GuardError):
            bad_embedding()
    assert mode_depth() == before


def test_interrupted_nested_guards_unwind_completely() -> None:
    before = mode_depth()
    with pytest.raises(KeyboardInterrupt), guard(), guard(skip="index"):
        raise KeyboardInterrupt
    assert mode_depth() == before and not active()


def test_the_innermost_guard_selects_the_checks() -> None:
    with guard():
        with guard(only="loss"), pytest.raises(IndexError) as caught:
            bad_embedding()
        assert not isinstance(caught.value, GuardError)


def test_skip_names_a_family() -> None:
    with guard(skip="embedding"), pytest.raises(IndexError) as caught:
        bad_embedding()
    assert not isinstance(caught.value, GuardError)


def test_only_accepts_an_op_name() -> None:
    with guard(only=["embedding"]), pytest.raises(GuardError):
        bad_embedding()


def test_an_unknown_check_name_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown check"):
        guard(only="embeddings")


def test_a_guard_object_cannot_be_entered_twice() -> None:
    g = guard()
    with g, pytest.raises(RuntimeError, match="already active"), g:
        pass
    assert not active()


def test_another_thread_is_not_guarded() -> None:
    # TorchFunctionMode stacks are per thread; the guard says so rather than pretending
    errors: list[BaseException] = []

    def work() -> None:
        try:
            bad_embedding()
        except BaseException as error:
            errors.append(error)

    with guard():
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert len(errors) == 1 and not isinstance(errors[0], GuardError)


def test_guard_error_is_an_index_error_where_pytorch_raises_one() -> None:
    with guard(), pytest.raises(IndexError):
        bad_embedding()


def test_guard_error_is_a_runtime_error_like_the_cuda_error_it_replaces() -> None:
    with guard(), pytest.raises(RuntimeError):
        F.binary_cross_entropy(torch.tensor([2.0]), torch.tensor([1.0]))


def test_one_host_transfer_per_checked_call() -> None:
    STATS.clear()
    with guard():
        F.binary_cross_entropy(torch.rand(4), torch.rand(4))  # two requirements, one transfer
    assert STATS["transfers"] == 1


def test_a_check_whose_answer_the_dtype_gives_reads_nothing() -> None:
    STATS.clear()
    with guard():
        F.embedding(torch.tensor([3, 255], dtype=torch.uint8).long(), torch.randn(300, 2))
        F.cross_entropy(torch.randn(2, 300), torch.tensor([3, 255], dtype=torch.uint8))
        F.embedding(torch.tensor([], dtype=torch.long), torch.randn(3, 2))
    assert STATS["transfers"] == 1  # only the int64 ids needed their values read
    assert STATS["skipped"] == 2


def test_plain_indexing_costs_no_check() -> None:
    STATS.clear()
    x = torch.randn(3, 4)
    with guard():
        x[0], x[:, 1:], x[..., None], x[1, 2]
    assert STATS["calls"] == 0


def test_inner_ops_of_a_checked_op_are_not_checked_again() -> None:
    STATS.clear()
    with guard():
        F.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 2]))  # calls nll_loss inside
    assert STATS["calls"] == 1


def test_a_failing_check_lets_the_call_through() -> None:
    # a tensor whose values cannot be read (meta) is PyTorch's business, not ours
    weight = torch.randn(10, 2, device="meta")
    with guard():
        out = F.embedding(torch.tensor([1], device="meta"), weight)
    assert out.shape == (1, 2)


def test_autograd_still_works_through_a_guarded_call() -> None:
    logits = torch.randn(3, 4, requires_grad=True)
    with guard():
        F.cross_entropy(logits, torch.tensor([0, 3, -100])).backward()
    assert logits.grad is not None and logits.grad.shape == (3, 4)


def test_a_mode_the_block_leaves_on_keeps_working_and_the_guard_still_leaves() -> None:
    before = mode_depth()
    try:
        with guard():
            torch.set_default_device("cpu")  # pushes torch's device mode above the guard's
        assert mode_depth() == before + 1 and not active()
        with pytest.raises(IndexError) as caught:
            bad_embedding()  # no guard left under torch's mode
        assert not isinstance(caught.value, GuardError)
    finally:
        torch.set_default_device(None)  # pops torch's mode: it must still be on top
    assert mode_depth() == before
