"""On a real GPU: the cell tracker tells the cells that launched CUDA work from those that did
not, from the caching allocator's count and the stream, without waiting for the device."""

from __future__ import annotations

import pytest

from nb_cudaguard.runtime.cells import CellTracker

pytestmark = pytest.mark.gpu


def test_the_tracker_sees_which_cells_launched_cuda_work() -> None:
    import torch

    tracker = CellTracker()
    x = torch.zeros(1024, device="cuda")
    cells = {
        1: lambda: torch.ones(4, device="cuda").sum().item(),  # allocates, fully synced
        2: lambda: sum(range(100)),  # no CUDA work
        3: lambda: torch.cuda._sleep(50_000_000),  # allocates nothing, still queued at the end
        4: lambda: None,
    }
    for cell, body in cells.items():
        tracker.start()
        body()
        tracker.finish(cell)
        torch.cuda.synchronize()  # time passes between cells: the queue drains
    del x
    assert tracker.settle(timeout=5) == {1: True, 2: False, 3: True, 4: False}


def test_the_panel_names_the_cell_that_launched_the_failing_kernel(kernel) -> None:
    # Through the real extension: cell A launches the bad kernel and does not wait for it, cell B
    # does no CUDA work, cell C surfaces the error at `.item()`.
    kernel.execute("%load_ext nb_cudaguard\nimport torch, torch.nn.functional as F")
    launch = kernel.execute(
        "logits = torch.randn(4, 3, device='cuda')\n"
        "labels = torch.tensor([0, 1, 2, 3], device='cuda')\n"
        "loss = F.cross_entropy(logits, labels)"
    )
    assert launch.reply["status"] == "ok"
    assert kernel.execute("x = 1").reply["status"] == "ok"
    failed = kernel.execute("print(loss.item())")
    assert failed.reply["status"] == "error"
    panels = [d for d in failed.displays if "nb-cudaguard-panel" in d.get("text/html", "")]
    assert len(panels) == 1, failed.messages
    cell_a = launch.reply["execution_count"]
    assert f"in cell [{cell_a}]" in panels[0]["text/plain"]
