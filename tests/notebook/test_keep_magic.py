"""`%cudaguard keep` in a real IPython shell: the snapshot hook, its status, and its undoing."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output


def our_snapshot_hooks(shell) -> list[object]:
    """The snapshot hooks: run by the extension's own post_run_cell (it owns every hook)."""
    from nb_cudaguard.notebook.extension import current_state
    from nb_cudaguard.notebook.keep_glue import SnapshotHook

    state = current_state(shell)
    hooks = [*shell.events.callbacks["post_run_cell"], *(state.cell_hooks if state else [])]
    return [cb for cb in hooks if isinstance(getattr(cb, "__self__", None), SnapshotHook)]


def status(shell) -> str:
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", "status")
    return captured.stdout


def test_keep_snapshots_after_successful_cells_only(shell):
    shell.run_cell("import torch\nmodel = torch.nn.Linear(3, 2)")
    shell.run_line_magic("load_ext", "nb_cudaguard")
    shell.run_line_magic("cudaguard", "keep model")
    assert len(our_snapshot_hooks(shell)) == 1
    ok = shell.run_cell("with torch.no_grad(): model.bias.add_(1)")
    assert "model (last good after cell" in status(shell)
    assert f"cell [{ok.execution_count}]" in status(shell)
    failed = shell.run_cell("with torch.no_grad(): model.bias.add_(1)\n1/0")
    assert failed.error_in_exec is not None
    assert f"cell [{ok.execution_count}]" in status(shell)  # the failed cell took none
    assert "snapshot cost per cell:" in status(shell)


def test_stop_and_unload_remove_the_hook(shell):
    shell.run_cell("import torch\nw = torch.ones(3)")
    shell.run_line_magic("load_ext", "nb_cudaguard")
    shell.run_line_magic("cudaguard", "keep w")
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", "keep --stop")
    assert "no snapshots" in captured.stdout
    assert our_snapshot_hooks(shell) == []
    shell.run_line_magic("cudaguard", "keep w")
    shell.run_line_magic("unload_ext", "nb_cudaguard")
    assert our_snapshot_hooks(shell) == []


@pytest.mark.parametrize(
    ("line", "reason"),
    [("keep not_defined_here", "is not defined"), ("keep number", "holds no tensors")],
)
def test_keeping_what_cannot_be_snapshotted_is_a_usage_error(shell, line, reason):
    shell.run_cell("number = 3")
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match=reason):
        shell.run_line_magic("cudaguard", line)
