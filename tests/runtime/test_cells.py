"""Where an asynchronous CUDA error surfaced, where it was launched, and the opt-in sync setting."""

from __future__ import annotations

import pytest
from pytorch_texts import HEADLINE as ASSERT_TEXT

from nb_cudaguard.diagnosis.where import where_sentence
from nb_cudaguard.runtime.cells import CellTracker, SyncAfterCell


@pytest.fixture
def loaded(shell):
    shell.extension_manager.load_extension("nb_cudaguard")
    from nb_cudaguard.notebook.extension import current_state

    return current_state(shell)


def _error_from_cell(shell, code: str) -> BaseException:
    result = shell.run_cell(code)
    assert result.error_in_exec is not None
    return result.error_in_exec


@pytest.fixture
def poisoned_item(shell, tmp_path, monkeypatch):
    """Functions from a library file that raise the CUDA error: ``item``, where an earlier
    kernel's error surfaces, as `.item()` does; ``launch``, a call that launches kernels."""
    raising = f"    raise torch.AcceleratorError({ASSERT_TEXT!r})\n"
    (tmp_path / "fake_lib_for_cells.py").write_text(
        f"import torch\ndef launch(*args):\n{raising}def item(*args):\n{raising}"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    shell.run_cell("import fake_lib_for_cells")
    return "fake_lib_for_cells.launch"


def test_error_at_an_operation_that_cannot_assert_points_to_the_last_launching_cell(
    shell, poisoned_item
):
    error = _error_from_cell(shell, "print(fake_lib_for_cells.item(0))")
    tracker = CellTracker(launched={3: True, 4: True, 5: False})
    sentence = where_sentence(error, 6, tracker.launched)
    assert sentence is not None
    assert "cell [6] at `print(fake_lib_for_cells.item(0))`" in sentence
    assert "cannot assert" in sentence
    assert "cell [4]" in sentence


def test_error_in_a_cell_without_cuda_work_points_to_the_last_launching_cell(shell, poisoned_item):
    error = _error_from_cell(shell, f"x = {poisoned_item}(0)")
    tracker = CellTracker(launched={2: True, 7: False})
    sentence = where_sentence(error, 7, tracker.launched)
    assert sentence is not None
    assert "did no CUDA work of its own" in sentence
    assert "`x = fake_lib_for_cells.launch(0)`" in sentence
    assert "cell [2]" in sentence


def test_a_cell_marked_only_by_work_still_queued_names_the_launching_cell_before_it_too(
    shell, poisoned_item
):
    # On an H100, the cell right after the one that launched a failing kernel still found work
    # queued at its end (the kernel that hit the assert): it may not be that cell's own work.
    error = _error_from_cell(shell, f"x = {poisoned_item}(0)")
    launched = {2: True, 3: True, 4: False}
    sentence = where_sentence(error, 4, launched, queued={3})
    assert sentence is not None
    assert "launched in cell [3] or in cell [2]" in sentence
    assert "cell [2]" not in where_sentence(error, 4, launched)  # allocated in 3: sure


def test_error_at_a_real_kernel_call_in_a_launching_cell_gets_no_guess(shell, poisoned_item):
    error = _error_from_cell(shell, f"loss = {poisoned_item}(0)")
    tracker = CellTracker(launched={2: True, 7: True})
    assert where_sentence(error, 7, tracker.launched) is None


@pytest.mark.parametrize(
    "code",
    [
        "loss = criterion(outputs, targets.to(device))",  # demo 05: BCELoss launches here
        "picked = log_probs.gather(1, targets.to(device)[:, None])",  # demo 07
        "print(model(x).item())",
        "loss = criterion(\n    outputs, targets.to(device)\n)",  # not a statement alone
    ],
)
def test_a_line_that_also_calls_an_op_that_can_assert_is_not_called_innocent(
    shell, poisoned_item, code
):
    """The error raised at the line that launched the kernel (blocking mode, a simulation): the
    copy on that line (``.to``, ``.item``) does not make it an innocent line."""
    assert shell.run_cell(
        "import types, torch\n"
        f"criterion = model = {poisoned_item}\n"
        f"log_probs = types.SimpleNamespace(gather={poisoned_item})\n"
        "outputs = targets = x = torch.zeros(2)\n"
        "device = 'cpu'"
    ).success
    error = _error_from_cell(shell, code)
    assert where_sentence(error, 7, {2: True, 7: True}) is None


def test_synced_error_says_it_was_launched_by_this_cell(shell, poisoned_item):
    error = _error_from_cell(shell, f"loss = {poisoned_item}(0)")
    sentence = where_sentence(error, 9, {}, synced=True)
    assert "launched by this cell" in sentence


def test_cells_without_cuda_initialised_record_nothing(shell, loaded):
    # Real cells through the real hooks; torch imported, CUDA never started: nothing to record.
    for code in ("import torch", "t = torch.ones(3) * 2", "t.add_(1)"):
        assert shell.run_cell(code).success
    assert loaded.cells.settle(timeout=1) == {}


def test_sync_is_off_by_default(loaded):
    assert not loaded.sync
    assert not any(isinstance(t, SyncAfterCell) for t in loaded.shell.ast_transformers)


def test_sync_magic_turns_the_transformer_on_and_off(shell, loaded):
    shell.run_line_magic("cudaguard", "sync on")
    assert loaded.sync
    assert sum(isinstance(t, SyncAfterCell) for t in shell.ast_transformers) == 1
    shell.run_line_magic("cudaguard", "sync off")
    assert not any(isinstance(t, SyncAfterCell) for t in shell.ast_transformers)


def test_sync_keeps_the_cells_displayed_value(shell, loaded):
    shell.run_line_magic("cudaguard", "sync on")
    try:
        result = shell.run_cell("a = 20\na + 22")
        assert result.success
        assert result.result == 42
        result = shell.run_cell("b = 1")
        assert result.success and result.result is None
        assert "__import__" not in shell.user_ns and "sync_after_cell" not in shell.user_ns
    finally:
        shell.run_line_magic("cudaguard", "sync off")


def test_unload_removes_the_sync_transformer(shell, loaded):
    shell.run_line_magic("cudaguard", "sync on")
    shell.extension_manager.unload_extension("nb_cudaguard")
    assert not any(isinstance(t, SyncAfterCell) for t in shell.ast_transformers)


def test_unload_removes_the_pre_run_cell_hook(shell, loaded):
    shell.extension_manager.unload_extension("nb_cudaguard")
    assert loaded.pre_run_cell not in shell.events.callbacks["pre_run_cell"]
    assert not loaded.tee.active
