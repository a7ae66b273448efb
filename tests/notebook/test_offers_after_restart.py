"""What a new kernel offers after our restart, as widgets in a real IPython shell: one primary
button (Restore, where something was kept; else none), and a sentence on what each does."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import ipywidgets as widgets
import pytest

from nb_cudaguard.keep.store import Kept, Manifest
from nb_cudaguard.notebook.actions import BLOCKING_REPLAY_LABEL
from nb_cudaguard.notebook.extension import CudaGuardExtension, current_state
from nb_cudaguard.notebook.keep_glue import (
    DISCARD_LABEL,
    RESTORE_LABEL,
    RestoreOffer,
    restore_offer,
)
from nb_cudaguard.notebook.replay_glue import REPLAY_LABEL, ReplayOffer, make_plan, plan_view
from nb_cudaguard.replay.history import Cell, SavedCells

CONNECTION = "/run/user/1000/jupyter/kernel-offers-1.json"
CELLS = (Cell("offered_base = [1]", 1, False), Cell("offered_base[3]", 2, True))


@pytest.fixture
def loaded(shell: Any) -> Iterator[CudaGuardExtension]:
    shell.run_line_magic("load_ext", "nb_cudaguard")
    state = current_state(shell)
    assert state is not None
    yield state
    shell.user_ns.pop("offered_base", None)


def kept_offer(state: CudaGuardExtension, tmp_path: Any) -> RestoreOffer:
    manifest = Manifest(
        kernel=CONNECTION, created=time.time(), kept=(Kept("count", "int", 28, "v1.bin"),)
    )
    profile = (str(tmp_path), str(tmp_path / "startup"))
    offer = restore_offer(state.shell, CONNECTION, profile, manifest, state.keep)
    assert isinstance(offer, RestoreOffer)
    return offer


def replay_offer(state: CudaGuardExtension) -> ReplayOffer:
    """The replay offered after a plain restart (blocking mode off), in a kernel that can
    restart itself."""
    saved = SavedCells(CELLS, 1, time.time(), 1)
    view = plan_view(state.shell, make_plan(state.shell, saved), saved, blocking_on=False)
    return ReplayOffer(state.shell, saved, view, lambda **_: None, state.replay)


def buttons(widget: Any) -> list[Any]:
    if isinstance(widget, widgets.Button):
        return [widget]
    return [b for child in getattr(widget, "children", ()) for b in buttons(child)]


def primary(found: list[Any]) -> list[str]:
    """The labels of the buttons drawn in a colour (ipywidgets' button_style)."""
    return [b.description for b in found if b.button_style]


def what_each_does(widget: Any) -> list[str]:
    """The sentences under the buttons, each cut at its first colon: the label it is about."""
    notes = [
        child.value
        for child in widget.children
        if isinstance(child, widgets.HTML) and "nb-cudaguard-does" in child.value
    ]
    assert len(notes) == 1, notes
    said = re.findall(r"<div class='nb-cudaguard-does'[^>]*>(.*?)</div>", notes[0])
    return [sentence.split(":")[0] for sentence in said]


def test_after_a_plain_restart_with_values_kept_restore_is_the_one_primary(loaded, tmp_path):
    shown = buttons(kept_offer(loaded, tmp_path).widget) + buttons(replay_offer(loaded).widget)
    assert [b.description for b in shown] == [
        RESTORE_LABEL,
        DISCARD_LABEL,
        BLOCKING_REPLAY_LABEL,
        REPLAY_LABEL,
    ]
    assert primary(shown) == [RESTORE_LABEL]


def test_with_nothing_kept_no_button_is_primary(loaded):
    shown = buttons(replay_offer(loaded).widget)
    assert [b.description for b in shown] == [BLOCKING_REPLAY_LABEL, REPLAY_LABEL]
    assert primary(shown) == []


def test_each_offer_says_in_one_sentence_what_each_of_its_buttons_does(loaded, tmp_path):
    for offer in (kept_offer(loaded, tmp_path), replay_offer(loaded)):
        labels = [b.description for b in buttons(offer.widget)]
        assert what_each_does(offer.widget) == labels


def test_once_a_button_acted_what_it_did_replaces_what_the_buttons_do(loaded, tmp_path):
    offer = kept_offer(loaded, tmp_path)
    offer.discard_button.click()
    assert offer.restore_button.disabled and offer.discard_button.disabled
    assert "nb-cudaguard-does" not in offer.note.value
    assert "Deleted what the previous process kept." in offer.status.value
