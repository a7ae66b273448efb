"""%%cudacheck and %cudacheck on|off through a real IPython shell."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import IPython
import pytest
import torch
from IPython.core.error import UsageError

from nb_cudaguard import GuardError
from nb_cudaguard.input_guard.scope import active

SETUP = "import torch, torch.nn as nn, torch.nn.functional as F\nemb = nn.Embedding(10, 4)\n"


def mode_depth() -> int:
    return int(torch._C._len_torch_function_stack())


State = tuple[int, dict[tuple[str, str], int]]


def torch_state() -> State:
    """torch's mode stack depth and the identity of every attribute the guard may wrap."""
    owners = (torch, torch.nn.functional, torch.Tensor)
    return mode_depth(), {
        (owner.__name__, name): id(value) for owner in owners for name, value in vars(owner).items()
    }


def as_before(before: State, depth: int = 0) -> bool:
    now_depth, now = torch_state()
    added = [
        key for key in now if key not in before[1] and key[0] != "torch"
    ]  # torch: lazy imports
    return (
        now_depth == before[0] + depth
        and all(now.get(key) == value for key, value in before[1].items())
        and not added
    )


@pytest.fixture
def ip(shell: Any) -> Iterator[Any]:
    shell.run_cell("%load_ext nb_cudaguard")
    shell.run_cell(SETUP)
    results: list[Any] = []
    shell.events.register("post_run_cell", results.append)
    shell.user_ns["_results"] = results
    yield shell
    shell.events.unregister("post_run_cell", results.append)
    shell.run_cell("%cudacheck off")


def errors(shell: Any) -> list[BaseException]:
    return [r.error_in_exec for r in shell.user_ns["_results"] if r.error_in_exec is not None]


def test_a_bad_input_in_a_checked_cell_raises_guard_error(ip: Any) -> None:
    ip.run_cell("%%cudacheck\nout = emb(torch.tensor([3, 10]))")
    assert isinstance(errors(ip)[0], GuardError)


def test_variables_survive_a_caught_violation(ip: Any) -> None:
    ip.run_cell("%%cudacheck\nbefore = 1\nout = emb(torch.tensor([10]))\nafter = 2")
    assert ip.user_ns["before"] == 1 and "after" not in ip.user_ns
    assert ip.run_cell("emb(torch.tensor([9])).shape").result == torch.Size([1, 4])


def test_the_checked_cell_itself_fails_so_run_all_stops(ip: Any) -> None:
    result = ip.run_cell("%%cudacheck\nemb(torch.tensor([10]))")
    assert not result.success


def test_a_valid_cell_runs_normally(ip: Any) -> None:
    result = ip.run_cell(
        "%%cudacheck\nloss = F.cross_entropy(torch.randn(2, 3), torch.tensor([2, -100]))"
    )
    assert result.success and float(ip.user_ns["loss"]) > 0


def test_the_guard_ends_with_the_cell(ip: Any) -> None:
    before = torch_state()
    ip.run_cell(
        "%%cudacheck\nfrom nb_cudaguard.input_guard.scope import active as _active\n"
        "inside = _active()"
    )
    assert ip.user_ns["inside"] is True
    assert as_before(before) and not active()
    ip.run_cell("emb(torch.tensor([10]))")
    assert isinstance(errors(ip)[-1], IndexError) and not isinstance(errors(ip)[-1], GuardError)


def test_the_guard_ends_when_the_cell_is_interrupted(ip: Any) -> None:
    before = torch_state()
    ip.run_cell("%%cudacheck\nraise KeyboardInterrupt")
    assert isinstance(errors(ip)[0], KeyboardInterrupt)
    assert as_before(before) and not active()


def test_only_limits_the_checks(ip: Any) -> None:
    ip.run_cell("%%cudacheck --only loss\nemb(torch.tensor([10]))")
    assert not isinstance(errors(ip)[0], GuardError)


def test_skip_limits_the_checks(ip: Any) -> None:
    ip.run_cell("%%cudacheck --skip embedding,index\nemb(torch.tensor([10]))")
    assert not isinstance(errors(ip)[0], GuardError)


def test_sync_runs_on_a_machine_without_cuda(ip: Any) -> None:
    assert ip.run_cell("%%cudacheck --sync\nx = 1").success


def test_an_unknown_option_is_a_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError):
        ip.run_cell_magic("cudacheck", "--bogus", "x = 1")


def test_an_unknown_check_is_a_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError, match="unknown check"):
        ip.run_cell_magic("cudacheck", "--only embeddings", "x = 1")


def test_on_off_in_a_cell_magic_is_a_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError, match="line magic"):
        ip.run_cell_magic("cudacheck", "on", "x = 1")


def test_line_magic_on_guards_every_following_cell(ip: Any) -> None:
    ip.run_cell("%cudacheck on")
    ip.run_cell("emb(torch.tensor([10]))")
    ip.run_cell("emb(torch.tensor([11]))")
    assert [type(e) for e in errors(ip)] == [type(errors(ip)[0])] * 2
    assert all(isinstance(e, GuardError) for e in errors(ip))


def test_line_magic_off_stops_guarding(ip: Any) -> None:
    ip.run_cell("%cudacheck on")
    ip.run_cell("%cudacheck off")
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(errors(ip)[-1], GuardError)
    assert not active()


def test_between_cells_no_guard_is_active(ip: Any) -> None:
    before = torch_state()
    ip.run_cell("%cudacheck on")
    ip.run_cell("x = 1")
    assert as_before(before) and not active()


def test_a_checked_cell_inside_line_mode_unwinds_both(ip: Any) -> None:
    before = torch_state()
    ip.run_cell("%cudacheck on --only loss")
    ip.run_cell("%%cudacheck\nemb(torch.tensor([10]))")
    assert isinstance(errors(ip)[0], GuardError)
    assert as_before(before) and not active()


def test_status_reports_the_state(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%cudacheck on --only loss")
    ip.run_cell("%cudacheck status")
    assert "cudacheck: on, deferred (only=" in capsys.readouterr().out


def test_unloading_the_extension_turns_line_mode_off(ip: Any) -> None:
    ip.run_cell("%cudacheck on")
    ip.run_cell("%unload_ext nb_cudaguard")
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(errors(ip)[-1], GuardError)
    assert "cudacheck" not in ip.magics_manager.magics["line"]


def test_the_docstring_is_the_manual(ip: Any) -> None:
    doc = ip.magics_manager.magics["cell"]["cudacheck"].__doc__
    assert "Usage::" in doc and "--only" in doc


def test_in_a_real_kernel_the_cell_fails_with_the_guard_errors_traceback(kernel: Any) -> None:
    kernel.execute("%load_ext nb_cudaguard\n" + SETUP)
    out = kernel.execute("%%cudacheck\nemb(torch.tensor([3, 10]))")
    assert out.reply["status"] == "error"
    assert out.errors[0]["ename"] == "GuardIndexError"
    assert "nn.Embedding(10, 4) at emb" in "\n".join(out.errors[0]["traceback"])
    assert kernel.execute("print(emb.weight.shape)").stream.strip() == "torch.Size([10, 4])"


@pytest.mark.skipif(
    int(IPython.version_info[0]) < 8,
    reason="IPython 7 under ipykernel 6 names a cell's code by a temp file, not by its number",
)
def test_in_a_real_kernel_the_traceback_names_the_cell_number_the_user_sees(kernel: Any) -> None:
    kernel.execute("%load_ext nb_cudaguard\n" + SETUP)
    kernel.execute("x = 1")  # the count moves on: In[3] below, not In[1]
    out = kernel.execute("%%cudacheck\nok = emb(torch.tensor([3]))\nemb(torch.tensor([3, 10]))")
    shown = out.reply["execution_count"]
    assert shown >= 3
    traceback = "\n".join(out.errors[0]["traceback"])
    assert f"Cell In[{shown}], line 2: emb(torch.tensor([3, 10]))" in traceback, traceback
    assert f"your line: Cell In[{shown}], line 2" in traceback, traceback


SEGMENTATION = """
class Segmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1))
        self.classifier = nn.Conv2d(8, 21, 1)

    def forward(self, images):
        return self.classifier(self.backbone(images))

model = Segmenter()
images = torch.randn(2, 3, 4, 4)
masks = torch.randint(0, 21, (2, 4, 4))
masks[:, 0, :] = 255
"""


def test_a_segmentation_mask_with_255_names_the_head_and_hints_ignore_index(ip: Any) -> None:
    ip.run_cell(SEGMENTATION)
    ip.run_cell("%%cudacheck\nloss = F.cross_entropy(model(images), masks)")
    text = str(errors(ip)[0])
    head = "nn.Conv2d(8, 21, kernel_size=(1, 1), stride=(1, 1))"
    assert f"the classifier {head} at model.classifier (input.shape[1] = 21" in text
    assert "pass `ignore_index=255`" in text


def test_a_guard_error_is_not_diagnosed_as_a_cuda_error(ip: Any) -> None:
    from nb_cudaguard.notebook.extension import current_state

    ip.run_cell("%%cudacheck\nemb(torch.tensor([10]))")
    state = current_state(ip)
    assert state is not None and state.last_diagnosis is None


# --- modes ----------------------------------------------------------------------------------
TRAIN = """
import torch, torch.nn.functional as F
model = torch.nn.Linear(4, 3)
opt = torch.optim.SGD(model.parameters(), lr=1.0)
before = model.weight.detach().clone()
"""
BAD_STEP = """
loss = F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 3]))
loss.backward()
reached_step = True
opt.step()
"""


@pytest.mark.usefixtures("device_path")
def test_a_deferred_cell_raises_before_the_optimizer_step(ip: Any) -> None:
    ip.run_cell(TRAIN)
    result = ip.run_cell("%%cudacheck --deferred\n" + BAD_STEP)
    assert not result.success and isinstance(errors(ip)[0], GuardError)
    assert ip.user_ns["reached_step"] is True  # the bad call itself ran, on safe values
    assert torch.equal(ip.user_ns["model"].weight, ip.user_ns["before"])


@pytest.mark.usefixtures("device_path")
def test_a_deferred_cell_raises_at_its_end(ip: Any) -> None:
    before = torch_state()
    ip.run_cell("%%cudacheck --deferred\nout = emb(torch.tensor([3, 10]))\nafter = 1")
    assert isinstance(errors(ip)[0], GuardError) and ip.user_ns["after"] == 1
    assert as_before(before) and not active()


@pytest.mark.usefixtures("device_path")
def test_line_mode_is_deferred_by_default_and_fails_the_cell(ip: Any) -> None:
    ip.run_cell(TRAIN)
    ip.run_cell("%cudacheck on")
    result = ip.run_cell(BAD_STEP)
    assert not result.success and isinstance(result.error_in_exec, GuardError)
    assert torch.equal(ip.user_ns["model"].weight, ip.user_ns["before"])


def test_line_mode_keeps_the_displayed_value_of_a_good_cell(ip: Any) -> None:
    ip.run_cell("%cudacheck on")
    result = ip.run_cell("emb(torch.tensor([1])).shape")
    assert result.success and result.result == torch.Size([1, 4])


def test_line_mode_strict_raises_at_the_bad_call(ip: Any) -> None:
    ip.run_cell("%cudacheck on --strict")
    ip.run_cell("emb(torch.tensor([10]))\nafter_strict = 1")
    assert isinstance(errors(ip)[0], GuardError) and "after_strict" not in ip.user_ns


def test_line_mode_off_removes_its_transformer(ip: Any) -> None:
    before = list(ip.ast_transformers)
    ip.run_cell("%cudacheck on")
    assert len(ip.ast_transformers) == len(before) + 1
    ip.run_cell("%cudacheck off")
    assert ip.ast_transformers == before


def test_a_cell_that_pushes_its_own_mode_does_not_strand_the_guard(ip: Any) -> None:
    before = torch_state()
    ip.run_cell("%cudacheck on")
    for _ in range(3):
        ip.run_cell('torch.set_default_device("cpu")')
    assert as_before(before, depth=1)  # torch's device mode only, no guard left under it
    assert not active()
    ip.run_cell("torch.set_default_device(None)")
    assert as_before(before)


# --- options that mean nothing where they are given ------------------------------------------
@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("--only nonsense", "options go with"),
        ("--only loss", "bare"),
        ("off --sync", "--sync would do nothing with `%cudacheck off`"),
        ("status --only loss", "`%cudacheck status`"),
        ("on --deferred", "deferred already"),
        ("on --deferred --strict", "exclude each other"),
    ],
)
def test_a_line_option_that_does_nothing_is_a_usage_error(ip: Any, line: str, why: str) -> None:
    with pytest.raises(UsageError, match=why.replace("(", "\\(")):
        ip.run_line_magic("cudacheck", line)


def test_strict_in_a_cell_magic_is_a_usage_error(ip: Any) -> None:
    with pytest.raises(UsageError, match="strict already"):
        ip.run_cell_magic("cudacheck", "--strict", "x = 1")


def test_a_bare_line_magic_lists_its_commands(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("cudacheck", "")
    out = capsys.readouterr().out
    assert "cudacheck: off" in out
    for command in ("%%cudacheck", "%cudacheck on", "%cudacheck off", "%cudacheck status"):
        assert command in out


def test_the_traceback_shows_the_users_lines_not_torchs(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_cell("def lookup(ids):\n    return emb(ids)\n")
    capsys.readouterr()
    ip.run_cell("%%cudacheck\nx = 1\nlookup(torch.tensor([10]))")
    out = capsys.readouterr().out
    assert "GuardIndexError: raised at" in out and "return emb(ids)" in out
    ours = ("scope.py", "wrappers.py", "judge.py", "deferral.py", "report.py")
    for internal in ("torch/nn/", "functional.py", *ours, "interactiveshell.py"):
        assert internal not in out, out


@pytest.mark.usefixtures("device_path")
def test_a_deferred_error_shows_where_it_was_read_and_the_bad_line(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_cell(TRAIN)
    capsys.readouterr()
    ip.run_cell("%%cudacheck --deferred\n" + BAD_STEP)
    out = capsys.readouterr().out
    assert "opt.step()" in out  # where the verdict was read
    assert "your line: Cell In[" in out and "F.cross_entropy(model(" in out  # the bad call


@pytest.mark.parametrize("cells", [["%%cudacheck\n{call}"], ["%cudacheck on --strict", "{call}"]])
def test_a_name_bound_to_a_torch_op_before_the_guard_is_checked_and_put_back(
    ip: Any, cells: list[str]
) -> None:
    ip.run_cell("from torch import gather")
    call = "gather(torch.randn(2, 3), 1, torch.tensor([[3], [0]]))"
    for cell in cells:
        ip.run_cell(cell.format(call=call))
    ip.run_cell("%cudacheck off")
    assert any(isinstance(error, GuardError) for error in errors(ip))
    assert ip.user_ns["gather"] is torch.gather


@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True:UserWarning")
def test_a_list_of_0d_tensors_becomes_a_tensor_in_guarded_cells_and_after(ip: Any) -> None:
    make = "made = torch.tensor([torch.tensor(1.5), torch.nn.Parameter(torch.tensor(2.5))])"
    for before, cell in (
        ("", "%%cudacheck\n" + make),
        ("%cudacheck on", make),
        ("%cudacheck off", make),
    ):
        ip.user_ns.pop("made", None)
        ip.run_cell(before)
        result = ip.run_cell(cell)
        assert result.success, result.error_in_exec
        assert ip.user_ns["made"].tolist() == [1.5, 2.5]
