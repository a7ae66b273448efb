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
