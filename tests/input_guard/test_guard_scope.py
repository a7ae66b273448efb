"""guard(): it is active exactly inside its block, nests, and always leaves torch as it found it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import gather

from nb_cudaguard import GuardError, guard
from nb_cudaguard.input_guard.judge import STATS
from nb_cudaguard.input_guard.scope import active

# TorchScript, which some tests compile through the guard, warns that it is deprecated
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")

early_take = torch.Tensor.take  # bound as a notebook's first cell would

OWNERS = (torch, torch.nn.functional, torch.Tensor, torch._C.TensorBase)


def torch_surface() -> dict[tuple[str, str], Any]:
    """Every attribute of torch, torch.nn.functional and torch.Tensor, by identity."""
    return {
        (owner.__name__, name): value for owner in OWNERS for name, value in vars(owner).items()
    }


def assert_as_before(before: dict[tuple[str, str], Any]) -> None:
    after = torch_surface()
    changed = [key for key, value in before.items() if after.get(key, before) is not value]
    # torch may import a submodule lazily meanwhile; nothing of ours may stay
    added = [key for key, value in after.items() if key not in before and _ours(value)]
    assert not changed and not added, (changed, added)


def _ours(value: Any) -> bool:
    return "nb_cudaguard" in (getattr(value, "__code__", None) or object).__class__.__module__ or (
        "nb_cudaguard" in getattr(getattr(value, "__code__", None), "co_filename", "")
    )


def mode_depth() -> int:
    return int(torch._C._len_torch_function_stack())


def bad_embedding() -> None:
    F.embedding(torch.tensor([10]), torch.randn(10, 2))


def test_inside_a_guard_only_the_checked_entry_points_are_wrapped() -> None:
    before = torch_surface()
    with guard():
        during = torch_surface()
    changed = {key for key, value in before.items() if during.get(key) is not value}
    added = {key for key in during if key not in before}
    assert ("torch.nn.functional", "cross_entropy") in changed
    assert ("torch", "gather") in changed
    assert ("Tensor", "__getitem__") in added  # inherited from TensorBase: shadowed, then deleted
    assert ("torch.nn.functional", "linear") not in changed and ("torch", "matmul") not in changed
    assert ("Tensor", "item") not in added  # only a deferred guard has verdicts to read there
    assert all(key[0] != "TensorBase" for key in changed | added)
    assert_as_before(before)
    assert mode_depth() == 0 and not active()


def test_a_deferred_guard_also_reads_its_verdicts_at_item() -> None:
    before = torch_surface()
    with guard(mode="deferred"):
        assert ("Tensor", "item") in set(torch_surface()) - set(before)
        with guard():  # a strict guard inside keeps the outer one's wrappers
            assert ("Tensor", "item") in set(torch_surface()) - set(before)
    assert_as_before(before)


def test_a_guard_leaves_torch_exactly_as_it_found_it() -> None:
    before = torch_surface()
    with guard():
        pass
    assert_as_before(before)
    assert not active()


def test_after_the_block_pytorch_raises_its_own_error_again() -> None:
    with guard():
        pass
    with pytest.raises(IndexError) as caught:
        bad_embedding()
    assert not isinstance(caught.value, GuardError)


@pytest.mark.parametrize("mode", ["strict", "deferred"])
@pytest.mark.parametrize(
    "ending", [GuardError, ValueError, KeyboardInterrupt, SystemExit, GeneratorExit]
)
def test_every_way_out_of_the_block_unpatches_torch(mode: str, ending: type) -> None:
    before = torch_surface()
    with pytest.raises(ending), guard(mode=mode):
        if ending is GuardError:
            bad_embedding()
        raise ending()
    assert_as_before(before)
    assert not active()


def test_a_deferred_verdict_raised_as_the_block_ends_unpatches_torch() -> None:
    before = torch_surface()
    with pytest.raises(GuardError), guard(mode="deferred"):
        bad_embedding()  # runs on clamped ids; raises at the end of the block
    assert_as_before(before)


def test_nested_guards_install_once_and_unwind_completely() -> None:
    before = torch_surface()
    with guard():
        outer = torch_surface()
        with guard(only="loss"):
            assert torch_surface() == outer  # the same wrappers, not wrappers of wrappers
        with pytest.raises(GuardError):
            bad_embedding()
    assert_as_before(before)


def test_interrupted_nested_guards_unwind_completely() -> None:
    before = torch_surface()
    with pytest.raises(KeyboardInterrupt), guard(), guard(skip="index"):
        raise KeyboardInterrupt
    assert_as_before(before)
    assert not active()


def guarded_batches() -> Iterator[int]:
    with guard():
        yield 1
        yield 2


def test_a_guard_in_a_generator_left_open_ends_when_the_generator_is_closed() -> None:
    before = torch_surface()
    batches = guarded_batches()
    next(batches)
    assert active()  # the generator's block has not ended yet
    batches.close()
    assert_as_before(before)
    assert not active()


def test_a_guard_in_a_generator_left_open_ends_when_it_is_collected() -> None:
    before = torch_surface()
    batches = guarded_batches()
    next(batches)
    del batches
    gc.collect()
    assert_as_before(before)
    assert not active()


def test_guards_ending_out_of_order_leave_the_right_one_active() -> None:
    before = torch_surface()
    batches = guarded_batches()  # strict, all checks
    outer = guard(only="loss")
    outer.__enter__()
    next(batches)  # the generator's guard is now the innermost
    outer.__exit__(None, None, None)  # ends first
    with pytest.raises(GuardError):
        bad_embedding()  # still under the generator's guard, which checks embeddings
    batches.close()
    assert_as_before(before)
    assert not active()


def test_a_wrapper_kept_past_the_guard_calls_the_bare_op() -> None:
    with guard():
        kept = F.embedding  # the wrapper, bound inside the block
    assert kept is not F.embedding
    with pytest.raises(IndexError) as caught:
        kept(torch.tensor([10]), torch.randn(10, 2))
    assert not isinstance(caught.value, GuardError)


def test_a_reference_in_a_functions_locals_taken_before_the_guard_is_not_seen() -> None:
    # the documented limit of wrapping entry points (scope.py's docstring, docs/guard.md)
    early_gather = torch.gather
    with guard(), pytest.raises(RuntimeError) as caught:
        early_gather(torch.randn(2, 3), 1, torch.tensor([[3], [0]]))
    assert not isinstance(caught.value, GuardError)


def test_a_name_the_callers_module_bound_before_the_guard_is_checked_and_put_back() -> None:
    # `from torch import gather` at the top of this module, `take = torch.Tensor.take` too
    with guard():
        assert gather is not torch.gather.__wrapped__  # type: ignore[attr-defined]
        with pytest.raises(GuardError, match=r"torch\.gather: index out of range"):
            gather(torch.randn(2, 3), 1, torch.tensor([[3], [0]]))
        with pytest.raises(GuardError, match=r"Tensor\.take: index out of range"):
            early_take(torch.arange(4), torch.tensor([4]))
    assert gather is torch.gather and early_take is torch.Tensor.take


def test_a_name_rebound_inside_the_guard_is_left_as_the_user_set_it() -> None:
    global gather
    mine = lambda *args: "mine"  # noqa: E731
    try:
        with guard():
            gather = mine
        assert gather is mine
    finally:
        gather = torch.gather


def test_a_name_bound_inside_the_guard_names_torchs_op_after_it() -> None:
    namespace: dict[str, Any] = {}
    with guard(namespace=namespace):
        exec("from torch import gather; take = torch.Tensor.take", {"torch": torch}, namespace)
        assert namespace["gather"] is not torch.gather.__wrapped__  # type: ignore[attr-defined]
        with guard(namespace=namespace):
            pass  # an inner guard leaves the outer one's names as they are
        assert namespace["gather"] is torch.gather
    assert namespace["gather"] is torch.gather and namespace["take"] is torch.Tensor.take


def test_the_namespace_given_is_the_one_seen() -> None:
    namespace = {"gather": torch.gather}
    with guard(namespace=namespace), pytest.raises(GuardError):
        namespace["gather"](torch.randn(2, 3), 1, torch.tensor([[3], [0]]))
    assert namespace["gather"] is torch.gather


def test_an_early_reference_to_a_functional_loss_is_caught_at_the_op_it_calls() -> None:
    from torch.nn.functional import cross_entropy, nll_loss  # as if at a notebook's top

    with guard():
        for loss in (cross_entropy, nll_loss):
            with pytest.raises(GuardError, match=rf"F\.{loss.__name__}: class index out of range"):
                loss(torch.randn(3, 4), torch.tensor([0, 4, -100]))


def test_an_early_reference_to_f_embedding_is_caught_at_torch_embedding_inside_it() -> None:
    early_embedding = F.embedding
    with guard(), pytest.raises(GuardError, match=r"torch\.embedding: token id out of range"):
        early_embedding(torch.tensor([10]), torch.randn(10, 2))


class _Embeddings(torch.nn.Module):
    """A model's three tables, named as Hugging Face names them (BERT's, GPT-2's)."""

    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(50, 4)
        self.wpe = torch.nn.Embedding(8, 4)
        self.token_type_embeddings = torch.nn.Embedding(2, 4)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor) -> Any:
        return self.word_embeddings(ids) + self.wpe(positions) + self.token_type_embeddings(types)


@pytest.mark.parametrize(
    ("bad", "problem", "fix"),
    [
        ("ids", "token id out of range", "num_embeddings"),
        ("positions", "position id out of range", "max_position_embeddings"),
        ("types", "token type id out of range", "type_vocab_size"),
    ],
)
def test_an_embeddings_ids_are_named_by_what_its_table_holds(bad: str, problem: str, fix: str):
    # Sequences longer than the position table, a third segment: no token id is wrong there,
    # and the tokenizer's vocabulary is not what to fix.
    model = _Embeddings()
    good = {"ids": torch.tensor([[1, 2, 3]]), "positions": torch.arange(3)[None], "types": None}
    good["types"] = torch.zeros(1, 3, dtype=torch.long)
    args = {**good, bad: good[bad] + {"ids": 50, "positions": 6, "types": 2}[bad]}
    with guard(), pytest.raises(GuardError) as caught:
        model(**args)
    message = str(caught.value)
    assert f"F.embedding: {problem} in input" in message
    assert fix in message.split("How to fix it")[1]


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
    # the wrappers are process-wide, the guard is per thread
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


def test_an_unguarded_thread_runs_no_check_at_all() -> None:
    STATS.clear()

    def work() -> None:
        for _ in range(3):
            F.cross_entropy(torch.randn(3, 4), torch.tensor([0, 1, 2]))
            torch.randn(3, 4)[torch.tensor([0, 2])]

    with guard():
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert STATS["calls"] == 0


def test_threads_each_in_their_own_guard_unpatch_torch_when_the_last_ends() -> None:
    before = torch_surface()
    main_in = threading.Event()
    other_in, other_may_leave, other_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def other() -> None:
        main_in.wait(5)
        with guard():
            other_in.set()
            try:
                bad_embedding()
            except BaseException as error:
                seen.append(error)
            other_may_leave.wait(5)
        other_out.set()

    thread = threading.Thread(target=other)
    thread.start()
    with guard(only="loss"):
        main_in.set()
        other_in.wait(5)
        with pytest.raises(IndexError) as caught:
            bad_embedding()  # this thread's guard checks losses only
        assert not isinstance(caught.value, GuardError)
    assert torch_surface() != before  # the other thread's guard is still on
    other_may_leave.set()
    other_out.wait(5)
    thread.join(5)
    assert len(seen) == 1 and isinstance(seen[0], GuardError)
    assert_as_before(before)


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


def test_a_checked_op_that_calls_another_checked_entry_point_is_checked_once() -> None:
    STATS.clear()
    with guard():
        F.embedding(torch.tensor([1, 2]), torch.randn(4, 2))  # calls torch.embedding inside
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
    surface = torch_surface()
    try:
        with guard():
            torch.set_default_device("cpu")  # pushes torch's device mode
        assert mode_depth() == before + 1 and not active()
        assert_as_before(surface)
        with pytest.raises(IndexError) as caught:
            bad_embedding()  # no guard left under torch's mode
        assert not isinstance(caught.value, GuardError)
    finally:
        torch.set_default_device(None)  # pops torch's mode: it must still be on top
    assert mode_depth() == before


def test_torchscript_compiles_a_module_inside_a_guard_as_outside() -> None:
    from compiled_model import Lookup

    ids, labels = torch.tensor([1, 2]), torch.tensor([0, 3])
    with guard():
        scripted = torch.jit.script(Lookup())
        assert scripted(ids, labels).shape == ()


def test_a_torch_compiled_module_runs_inside_a_guard_as_outside() -> None:
    pytest.importorskip("torch._dynamo")
    from compiled_model import Lookup

    torch.manual_seed(0)
    model = Lookup()
    ids, labels = torch.tensor([1, 2]), torch.tensor([0, 3])
    expected = model(ids, labels)
    with guard():
        got = torch.compile(model, backend="eager")(ids, labels)
    assert torch.allclose(got, expected)


def test_torch_compile_traces_a_guarded_model_without_a_graph_break_and_says_it_is_unchecked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dynamo = pytest.importorskip("torch._dynamo")
    from compiled_model import Lookup

    from nb_cudaguard.input_guard import scope

    monkeypatch.setattr(scope, "_NOTED", set())
    torch.manual_seed(0)
    model = Lookup()
    ids, labels = torch.tensor([1, 2]), torch.tensor([0, 3])
    expected = model(ids, labels)
    for _ in range(2):
        with guard():
            assert dynamo.explain(model)(ids, labels).graph_break_count == 0
            got = torch.compile(model)(ids, labels)  # inductor, C++ on CPU
    assert torch.allclose(got, expected)
    note = "code compiled by torch.compile is not checked by the guard"
    assert capsys.readouterr().err.count(note) == 1


# --- host memory: the CPU op first, the check only when it raises --------------------------------
@pytest.mark.usefixtures("cpu_op_first")
def test_a_valid_call_on_host_memory_runs_no_check() -> None:
    STATS.clear()
    with guard():
        F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 2, -100, 1]))
        F.embedding(torch.tensor([[0, 4]]), torch.randn(5, 2), padding_idx=4)
        torch.randn(6)[torch.tensor([-6, 5])]
    assert STATS["calls"] == 0 and STATS["transfers"] == 0


@pytest.mark.usefixtures("cpu_op_first")
def test_a_bad_call_on_host_memory_ends_in_the_guards_error_alone() -> None:
    with pytest.raises(GuardError) as caught, guard():
        F.cross_entropy(torch.randn(4, 3), torch.tensor([0, 2, 3, 1]))
    assert isinstance(caught.value, IndexError)  # the CPU op's own class
    assert "class index out of range" in str(caught.value) and "3" in str(caught.value)
    assert caught.value.__suppress_context__  # the CPU op's complaint is not shown beside it


@pytest.mark.usefixtures("cpu_op_first")
def test_an_error_the_guard_does_not_check_is_pytorchs_own() -> None:
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1])  # a batch-size mismatch
    with pytest.raises(ValueError) as bare:
        F.cross_entropy(logits, labels)
    with pytest.raises(ValueError) as caught, guard():
        F.cross_entropy(logits, labels)
    assert not isinstance(caught.value, GuardError)
    assert str(caught.value) == str(bare.value)


IN_PLACE = {
    "index_add_": lambda x, bad: x.index_add_(0, bad, torch.ones(3, 2)),
    "index_copy_": lambda x, bad: x.index_copy_(0, bad, torch.ones(3, 2)),
    "scatter_": lambda x, bad: x.scatter_(0, bad[:, None].expand(3, 2), torch.ones(3, 2)),
    "x[i] = v": lambda x, bad: x.__setitem__(bad, 1.0),
    "index_put_": lambda x, bad: x.index_put_((bad,), torch.tensor(1.0)),
    "gather(out=)": lambda x, bad: torch.gather(
        torch.ones(4, 2), 0, bad[1:, None].expand(2, 2), out=x[:2]
    ),
}


@pytest.mark.usefixtures("cpu_op_first")
@pytest.mark.parametrize("call", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_an_in_place_call_is_checked_before_the_cpu_op_writes(call: Any) -> None:
    bad = torch.tensor([0, 1, 9])  # the CPU op writes rows 0 and 1 before it meets 9
    target = torch.zeros(4, 2)
    with pytest.raises(Exception):  # noqa: B017 - PyTorch's own class varies by op
        call(target.clone(), bad)
    with pytest.raises(GuardError), guard():
        call(target, bad)
    assert not target.any()


@pytest.mark.usefixtures("cpu_op_first")
def test_max_norm_embedding_is_checked_before_it_rescales_the_weight() -> None:
    weight = torch.randn(5, 3) * 10
    before = weight.clone()
    with pytest.raises(GuardError), guard():
        F.embedding(torch.tensor([0, 9]), weight, max_norm=1.0)
    assert torch.equal(weight, before)


@pytest.mark.usefixtures("cpu_op_first")
def test_ctc_targets_the_cpu_op_does_not_check_are_still_checked() -> None:
    log_probs = torch.randn(6, 1, 4).log_softmax(2)
    args = (log_probs, torch.tensor([[1, 7]]), torch.tensor([6]), torch.tensor([2]))
    with pytest.raises(GuardError), guard():
        F.ctc_loss(*args)


def test_an_error_the_user_was_handling_stays_shown_beside_the_guards() -> None:
    with pytest.raises(GuardError) as caught, guard():
        try:
            raise KeyError("the user's own")
        except KeyError:
            torch.randn(3)[torch.tensor([3])]
    assert isinstance(caught.value.__context__, KeyError)
    assert not caught.value.__suppress_context__
