"""nb_cudaguard configured with traitlets: ``%config CudaGuard.guard = "deferred"`` (and keep,
keep_on_restart, buttons) in a real IPython shell, and a profile's ``ipython_config.py`` read by
a real kernel (issue 30)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Kernel, kernel_env
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from pytorch_texts import ASSERT_2_9

from nb_cudaguard import GuardError
from nb_cudaguard.input_guard.scope import active
from nb_cudaguard.notebook.actions import WIDGET_MIME

SETUP = "import torch, torch.nn as nn, torch.nn.functional as F\nemb = nn.Embedding(10, 4)\n"


@pytest.fixture
def ip(shell: Any) -> Iterator[Any]:
    shell.run_cell("%load_ext nb_cudaguard")
    shell.run_cell(SETUP)
    for name in ("model", "w"):  # left by other tests in the one shell
        shell.user_ns.pop(name, None)
    results: list[Any] = []
    shell.events.register("post_run_cell", results.append)
    shell.user_ns["_results"] = results
    yield shell
    shell.events.unregister("post_run_cell", results.append)
    # %config merges into the shell's own configuration: leave it as found for later tests
    for line in (
        'guard = "off"',
        'only = ""',
        'skip = ""',
        "keep = []",
        "keep_on_restart = True",
        "buttons = True",
    ):
        shell.run_cell(f"%config CudaGuard.{line}")
    shell.run_cell("%cudacheck off")


def last_error(shell: Any) -> BaseException | None:
    return shell.user_ns["_results"][-1].error_in_exec


def test_config_turns_the_guard_on_and_off_for_every_following_cell(ip: Any) -> None:
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(last_error(ip), GuardError)
    ip.run_cell('%config CudaGuard.guard = "deferred"')
    assert ip.run_cell("%cudacheck status").result is None  # printed
    for _ in range(2):
        ip.run_cell("emb(torch.tensor([10]))")
        assert isinstance(last_error(ip), GuardError)
    ip.run_cell('%config CudaGuard.guard = "off"')
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(last_error(ip), GuardError)
    assert not active()


def test_config_options_choose_the_checks(ip: Any) -> None:
    ip.run_cell('%config CudaGuard.only = "loss"')
    ip.run_cell('%config CudaGuard.guard = "strict"')
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(last_error(ip), GuardError)
    ip.run_cell("F.cross_entropy(torch.zeros(1, 3), torch.tensor([3]))")
    assert isinstance(last_error(ip), GuardError)


def test_a_cells_own_options_win_over_the_configuration(ip: Any) -> None:
    ip.run_cell('%config CudaGuard.guard = "deferred"')
    ip.run_cell("%%cudacheck --skip embedding\nemb(torch.tensor([10]))")
    body = [r.error_in_exec for r in ip.user_ns["_results"] if r.error_in_exec is not None]
    assert body and not any(isinstance(e, GuardError) for e in body)


def test_a_bad_check_name_in_the_configuration_leaves_the_guard_as_it_was(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_cell('%config CudaGuard.only = "nonsense"')
    ip.run_cell('%config CudaGuard.guard = "strict"')
    assert "unknown check" in capsys.readouterr().err
    ip.run_cell("emb(torch.tensor([10]))")
    assert not isinstance(last_error(ip), GuardError)


def test_a_profiles_ipython_config_turns_the_guard_on_in_a_kernel(tmp_path: Path) -> None:
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["nb_cudaguard"]\nc.CudaGuard.guard = "deferred"\n'
    )
    kernel = Kernel(kernel_env(IPYTHONDIR=str(tmp_path / "ipython")))
    try:
        kernel.execute(SETUP)
        out = kernel.execute("emb(torch.tensor([10]))")
        assert out.reply["status"] == "error"
        assert out.reply["ename"] == "GuardIndexError"
        status = kernel.execute("%cudacheck status")
        assert "cudacheck: on, deferred" in status.stream
    finally:
        kernel.shutdown()


# --- keep: CudaGuard.keep, CudaGuard.keep_on_restart ---------------------------------------------
def said(shell: Any, line: str) -> str:
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", line)
    return captured.stdout


def test_config_keep_snapshots_a_name_from_the_first_cell_that_binds_it(ip: Any) -> None:
    ip.run_cell('%config CudaGuard.keep = ["model"]')
    assert "CudaGuard.keep also names `model`" in said(ip, "keep")
    made = ip.run_cell("model = torch.nn.Linear(3, 2)")
    assert f"model (last good after cell [{made.execution_count}]" in said(ip, "keep")
    ip.run_cell("with torch.no_grad(): model.bias.add_(1)\n1/0")
    assert f"last good after cell [{made.execution_count}]" in said(ip, "keep")


def test_keep_stop_wins_over_the_configuration_for_the_session(ip: Any) -> None:
    ip.run_cell('%config CudaGuard.keep = ["model"]')
    ip.run_cell("model = torch.nn.Linear(3, 2)")
    assert "model (last good" in said(ip, "keep")
    assert "no snapshots" in said(ip, "keep --stop model")
    ip.run_cell("model = torch.nn.Linear(3, 2)")
    assert "no snapshots" in said(ip, "keep")


def test_a_name_taken_out_of_the_configuration_stops_unless_the_command_named_it(ip: Any) -> None:
    ip.run_cell('%config CudaGuard.keep = ["model", "w"]')
    ip.run_cell("model = torch.nn.Linear(3, 2)\nw = torch.ones(3)")
    ip.run_line_magic("cudaguard", "keep w")
    assert "keep): model, w (last good" in said(ip, "keep")
    ip.run_cell("%config CudaGuard.keep = []")
    assert "keep): w (last good" in said(ip, "keep")


def test_keep_and_no_keep_on_one_restart_exclude_each_other(ip: Any) -> None:
    with pytest.raises(UsageError, match="exclude each other"):
        ip.run_line_magic("cudaguard", "restart --keep --no-keep")


def test_config_lists_every_trait_with_its_help(ip: Any) -> None:
    with capture_output() as captured:
        ip.run_line_magic("config", "CudaGuard")
    for trait in ("guard", "keep", "keep_on_restart", "buttons"):
        assert f"CudaGuard.{trait}=" in captured.stdout
    assert "--no-keep" in captured.stdout


# --- a real kernel with a profile: keep and the panel --------------------------------------------
PROFILE = """\
c.InteractiveShellApp.extensions = ["nb_cudaguard"]
c.CudaGuard.keep = ["model"]
c.CudaGuard.keep_on_restart = False
c.CudaGuard.buttons = False
"""
KEPT = (
    "import nb_cudaguard\n"
    "plan = nb_cudaguard.restart_kernel(blocking=False, delay=600)  # the test ends it first\n"
    "print(repr(plan.kept[:5]))"
)


@pytest.fixture(scope="module")
def profile_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """A kernel whose profile's ipython_config.py loads nb_cudaguard and configures it."""
    ipython_dir = tmp_path_factory.mktemp("ipython")
    profile = ipython_dir / "profile_default"
    profile.mkdir()
    (profile / "ipython_config.py").write_text(PROFILE)
    kernel = Kernel(kernel_env(IPYTHONDIR=str(ipython_dir)))
    try:
        yield kernel
    finally:
        kernel.shutdown()


def test_a_profiles_keep_configuration_takes_effect_in_a_kernel(profile_kernel: Kernel) -> None:
    made = profile_kernel.execute("import torch\nmodel = torch.nn.Linear(3, 2)", timeout=120)
    cell = made.reply["execution_count"]
    listed = profile_kernel.execute("%cudaguard keep").stream
    assert f"model (last good after cell [{cell}]" in listed
    assert profile_kernel.execute(KEPT).stream.strip() == "''"  # keep_on_restart = False
    profile_kernel.execute("%config CudaGuard.keep_on_restart = True")
    assert profile_kernel.execute(KEPT).stream.strip() == "'Kept '"
    profile_kernel.execute("%config CudaGuard.keep_on_restart = False")


def test_a_profiles_panel_configuration_takes_effect_in_a_kernel(profile_kernel: Kernel) -> None:
    failed = profile_kernel.execute(
        f"import torch\nraise torch.AcceleratorError({ASSERT_2_9!r})", timeout=120
    )
    assert failed.reply["status"] == "error"
    assert any("nb-cudaguard-panel" in d.get("text/html", "") for d in failed.displays)
    # CudaGuard.buttons = False: the commands' text, no widget
    assert not any(WIDGET_MIME in d for d in failed.displays)
    assert not failed.of_type("comm_open")
    (hint,) = [d for d in failed.displays if "nb-cudaguard-restart-hint" in d["text/html"]]
    # CudaGuard.keep_on_restart = False: the hint does not promise the variables back
    assert "kept CPU variables" not in hint["text/plain"]
    assert (
        "re-run the notebook from the top (CudaGuard.keep_on_restart is off)" in hint["text/plain"]
    )


def test_without_buttons_the_restore_and_replay_offers_are_their_text(
    ip: Any, tmp_path: Path
) -> None:
    import time

    from nb_cudaguard.keep.store import Kept, Manifest
    from nb_cudaguard.notebook.extension import current_state
    from nb_cudaguard.notebook.keep_glue import RestoreOffer, restore_offer
    from nb_cudaguard.notebook.replay_glue import offer
    from nb_cudaguard.replay.history import Cell, SavedCells

    ip.run_cell("%config CudaGuard.buttons = False")
    state = current_state(ip)
    assert state is not None and state.settings.buttons is False
    manifest = Manifest(
        kernel="/k.json", created=time.time(), kept=(Kept("count", "int", 28, "v1.bin"),)
    )
    profile = (str(tmp_path), str(tmp_path / "startup"))
    shown = restore_offer(ip, "/k.json", profile, manifest, state.keep, state.settings.buttons)
    assert not isinstance(shown, RestoreOffer)
    assert "%cudaguard restore" in shown._repr_mimebundle_()["text/plain"]
    saved = SavedCells((Cell("base = [1]", 1, False), Cell("base[3]", 2, True)), 1, time.time(), 1)
    with capture_output() as captured:
        offer(ip, saved, False, lambda **_: None, state.replay, state.settings.buttons)
    (bundle,) = [o.data for o in captured.outputs]
    assert WIDGET_MIME not in bundle and "%cudaguard replay --yes" in bundle["text/plain"]


def test_without_keep_on_restart_no_offer_says_the_variables_are_kept(ip: Any) -> None:
    import time

    from nb_cudaguard.notebook.actions import RestartActions
    from nb_cudaguard.notebook.replay_glue import ReplayOffer, make_plan, plan_view
    from nb_cudaguard.replay.history import Cell, SavedCells

    saved = SavedCells((Cell("base = [1]", 1, False), Cell("base[3]", 2, True)), 1, time.time(), 1)
    view = plan_view(ip, make_plan(ip, saved, None), saved, False)
    replayed = ReplayOffer(ip, saved, view, lambda **_: None, None, keeps=False)
    panel = RestartActions(lambda **_: None, blocking_on=False, cause_known=False, keeps=False)
    for shown in (replayed, panel):
        texts = [b.tooltip for b in shown.buttons] + [shown.note.value]
        assert not any("variables kept" in t for t in texts), texts
        assert any("keep_on_restart is off" in t for t in texts), texts
