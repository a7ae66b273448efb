"""CPU snapshots (``%cudaguard keep``): the same code path as on CUDA, with CPU copies."""

from __future__ import annotations

import pytest
import torch
from pytorch_texts import ASSERT_2_9

from nb_cudaguard.keep.snapshot import NotSnapshottable, Snapshots, tensors_of


def train_step(model, optimizer):
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.fixture
def notebook():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return {"model": model, "optimizer": optimizer}


def snapshot_of(snapshots: Snapshots, value) -> list[torch.Tensor]:
    substitutes, _, _ = snapshots.for_keep()
    from nb_cudaguard.keep.pickling import tensor_identity

    return [substitutes[tensor_identity(t)] for t in value.parameters()]


def test_the_snapshot_holds_the_state_at_the_end_of_the_last_cell(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.add("optimizer", notebook["optimizer"])
    train_step(notebook["model"], notebook["optimizer"])
    snapshots.after_cell(notebook, 1)
    expected = [p.detach().clone() for p in notebook["model"].parameters()]
    train_step(notebook["model"], notebook["optimizer"])  # a later cell, not yet snapshotted
    copies = snapshot_of(snapshots, notebook["model"])
    assert all(torch.equal(c, e) for c, e in zip(copies, expected, strict=True))
    snapshots.after_cell(notebook, 2)
    copies = snapshot_of(snapshots, notebook["model"])
    now = list(notebook["model"].parameters())
    assert all(torch.equal(c, p) for c, p in zip(copies, now, strict=True))
    _, notes, missing = snapshots.for_keep()
    assert notes == {"model": "snapshot after cell [2]", "optimizer": "snapshot after cell [2]"}
    assert missing == {}


def test_a_tensor_two_names_hold_is_copied_once(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.add("optimizer", notebook["optimizer"])
    snapshots.after_cell(notebook, 1)  # Adam has no state yet: the parameters only
    assert snapshots.last_bytes == sum(p.numel() * 4 for p in notebook["model"].parameters())


def test_only_what_changed_is_copied(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.after_cell(notebook, 1)
    first = snapshots.last_bytes
    snapshots.after_cell(notebook, 2)  # the other buffer set gets its first copy
    snapshots.after_cell(notebook, 3)  # nothing changed since that set was written
    assert first == sum(p.numel() * 4 for p in notebook["model"].parameters())
    assert snapshots.last_bytes == 0
    with torch.no_grad():
        notebook["model"][1].bias.add_(1)  # in place: bumps its version
    snapshots.after_cell(notebook, 4)
    assert snapshots.last_bytes == notebook["model"][1].bias.numel() * 4


def test_a_new_tensor_at_a_reused_address_is_copied_again():
    from nb_cudaguard.keep.pickling import tensor_identity

    storage = torch.zeros(4)
    first = torch.empty(0).set_(storage.untyped_storage(), 0, (4,), (1,))
    snapshots = Snapshots()
    namespace = {"w": first}
    snapshots.add("w", first)
    snapshots.after_cell(namespace, 1)
    snapshots.after_cell(namespace, 2)  # both buffer sets hold it now
    second = torch.empty(0).set_(storage.untyped_storage(), 0, (4,), (1,))
    with torch.no_grad():
        storage.fill_(7)  # new values, written through another tensor's version counter
    # The same memory at the same version, as a new tensor at a freed one's address.
    assert tensor_identity(second) == tensor_identity(first)
    assert second._version == first._version
    namespace["w"] = second
    snapshots.after_cell(namespace, 3)
    assert snapshots.last_bytes == 16
    assert torch.equal(snapshots.for_keep()[0][tensor_identity(second)], torch.full((4,), 7.0))


class BrokenContext:
    """What asking a CUDA event does once the context is broken: PyTorch raises the error."""

    def done(self) -> bool:
        raise torch.AcceleratorError(ASSERT_2_9)


def test_a_copy_that_never_completes_keeps_the_previous_good_snapshot(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.after_cell(notebook, 1)
    good = [c.clone() for c in snapshot_of(snapshots, notebook["model"])]
    train_step(notebook["model"], notebook["optimizer"])
    state = snapshots.state
    # The next copy goes into the other buffer set; make it one whose completion fails.
    target, _, _ = snapshots._copy([notebook["model"]])
    state.pending = (target, BrokenContext(), 2, ("model",))
    copies = snapshot_of(snapshots, notebook["model"])
    assert target != state.good
    assert all(torch.equal(c, g) for c, g in zip(copies, good, strict=True))
    assert "device-side assert triggered" in state.failed
    assert snapshots.for_keep()[1] == {"model": "snapshot after cell [1]"}


def test_the_status_names_the_last_good_cell_and_the_cost(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.after_cell(notebook, 1)
    text = "\n".join(snapshots.status())
    assert "model (last good after cell [1])" in text
    assert "ms median host time over the last 1 cells" in text


def test_something_without_tensors_cannot_be_snapshotted():
    with pytest.raises(NotSnapshottable, match="holds no tensors"):
        Snapshots().add("n", 3)


def test_stopping_a_name_frees_the_buffers_only_it_used(notebook):
    snapshots = Snapshots()
    snapshots.add("model", notebook["model"])
    snapshots.add("optimizer", notebook["optimizer"])
    train_step(notebook["model"], notebook["optimizer"])
    snapshots.after_cell(notebook, 1)
    train_step(notebook["model"], notebook["optimizer"])
    snapshots.after_cell(notebook, 2)  # both buffer sets in use now
    every = {id(t): t for name in notebook for t in tensors_of(notebook[name])}.values()
    assert snapshots.held() == 2 * sum(t.numel() * t.element_size() for t in every)
    parameters = sum(p.numel() * 4 for p in notebook["model"].parameters())
    snapshots.remove("optimizer", notebook)
    assert snapshots.held() == 2 * parameters
    assert snapshot_of(snapshots, notebook["model"])  # the model's last good snapshot stays
    snapshots.remove("model", notebook)
    assert snapshots.held() == 0 and snapshots.for_keep() == ({}, {}, {})
