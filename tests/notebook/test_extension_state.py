"""The extension's state has one owner, its object: an unload leaves the shell as it found it, a
reload starts afresh, and a second shell in the same process has state of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.profiledir import ProfileDir
from IPython.utils.capture import capture_output
from traitlets.config import Config

from nb_cudaguard.keep.store import Kept, Manifest
from nb_cudaguard.notebook.extension import current_state
from nb_cudaguard.notebook.keep_glue import discard, restore_offer

CONNECTION = "/run/user/1000/jupyter/kernel-state-1.json"


def footprint(shell: Any) -> dict[str, Any]:
    """What a load could leave on the shell: its attributes, event callbacks, magics and
    AST transformers."""
    return {
        "attributes": set(vars(shell)),
        "events": {name: list(found) for name, found in shell.events.callbacks.items()},
        "magics": {kind: set(table) for kind, table in shell.magics_manager.magics.items()},
        "ast_transformers": list(shell.ast_transformers),
    }


def keep_output(shell: Any, line: str) -> str:
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", line)
    return captured.stdout


@pytest.fixture
def weights(shell: Any) -> Iterator[Any]:
    pytest.importorskip("torch")
    shell.run_cell("import torch\nweights = torch.zeros(3)")
    yield shell
    shell.user_ns.pop("weights", None)


@pytest.fixture
def other(tmp_path: Any) -> Iterator[Any]:
    """A second real shell in this process, with a profile of its own."""
    config = Config()
    config.HistoryManager.enabled = False
    second = InteractiveShell(config=config, profile_dir=ProfileDir(location=str(tmp_path)))
    yield second
    if current_state(second) is not None:
        second.run_line_magic("unload_ext", "nb_cudaguard")


def manifest() -> Manifest:
    return Manifest(
        kernel=CONNECTION,
        created=1000.0,
        kept=(Kept("count", "int", 28, "v1.bin"),),
        skipped=(),
        ipython_names=0,
        total=28,
    )


def test_unload_leaves_the_shell_as_it_was_before_the_load(weights):
    shell = weights
    before = footprint(shell)
    shell.run_line_magic("load_ext", "nb_cudaguard")
    keep_output(shell, "keep weights")
    keep_output(shell, "sync on")
    assert footprint(shell) != before
    shell.run_line_magic("unload_ext", "nb_cudaguard")
    assert footprint(shell) == before
    assert current_state(shell) is None


def test_a_reload_starts_afresh_and_its_unload_leaves_nothing_either(weights):
    shell = weights
    before = footprint(shell)
    shell.run_line_magic("load_ext", "nb_cudaguard")
    first = current_state(shell)
    keep_output(shell, "keep weights")
    shell.run_line_magic("reload_ext", "nb_cudaguard")
    second = current_state(shell)
    assert second is not None and second is not first
    # The snapshots went with the first load: the hook's and the status's.
    assert "no snapshots" in keep_output(shell, "keep")
    assert "weights" not in keep_output(shell, "status")
    shell.run_line_magic("unload_ext", "nb_cudaguard")
    assert footprint(shell) == before


def test_two_shells_in_one_process_keep_their_own_state(weights, other):
    shell = weights
    shell.run_line_magic("load_ext", "nb_cudaguard")
    other.run_line_magic("load_ext", "nb_cudaguard")
    mine, theirs = current_state(shell), current_state(other)
    assert mine is not None and theirs is not None and mine is not theirs
    keep_output(shell, "keep weights")
    assert "weights" in keep_output(shell, "keep")
    assert "no snapshots" in keep_output(other, "keep")
    other.run_line_magic("unload_ext", "nb_cudaguard")
    assert "weights" in keep_output(shell, "keep")  # the other's unload took nothing of mine


def test_two_shells_do_not_share_restore_offers(shell, other, tmp_path):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    other.run_line_magic("load_ext", "nb_cudaguard")
    mine, theirs = current_state(shell), current_state(other)
    assert mine is not None and theirs is not None
    profile = (str(tmp_path / "profile"), str(tmp_path / "profile" / "startup"))
    offer = restore_offer(shell, CONNECTION, profile, manifest(), mine.keep)
    assert mine.keep.offers == [offer] and theirs.keep.offers == []
    # A discard in the other shell settles its own offers only: this one's buttons stay live.
    discard(CONNECTION, profile, theirs.keep)
    assert not offer.restore_button.disabled
    discard(CONNECTION, profile, mine.keep)
    assert offer.restore_button.disabled and mine.keep.offers == []


def test_unload_forgets_the_offers_shown(shell, tmp_path):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    state = current_state(shell)
    assert state is not None
    profile = (str(tmp_path / "profile"), str(tmp_path / "profile" / "startup"))
    restore_offer(shell, CONNECTION, profile, manifest(), state.keep)
    shell.run_line_magic("unload_ext", "nb_cudaguard")
    assert state.keep.offers == []
