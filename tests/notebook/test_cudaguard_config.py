"""The guard configured with traitlets: ``%config CudaGuard.guard = "deferred"`` in a real
IPython shell, and a profile's ``ipython_config.py`` read by a real kernel (issue 30)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Kernel, kernel_env

from nb_cudaguard import GuardError
from nb_cudaguard.input_guard.scope import active

SETUP = "import torch, torch.nn as nn, torch.nn.functional as F\nemb = nn.Embedding(10, 4)\n"


@pytest.fixture
def ip(shell: Any) -> Iterator[Any]:
    shell.run_cell("%load_ext nb_cudaguard")
    shell.run_cell(SETUP)
    results: list[Any] = []
    shell.events.register("post_run_cell", results.append)
    shell.user_ns["_results"] = results
    yield shell
    shell.events.unregister("post_run_cell", results.append)
    # %config merges into the shell's own configuration: leave it as found for later tests
    for line in ('guard = "off"', 'only = ""', 'skip = ""'):
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
