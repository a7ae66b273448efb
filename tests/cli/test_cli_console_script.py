"""The installed `nb-cudaguard` console script: its version, its help on a bare call, and
`explain`'s fixes in the names of the user's own log (issue 33)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

import nb_cudaguard


def _console_script() -> str:
    beside = Path(sys.executable).with_name("nb-cudaguard")
    found = str(beside) if beside.exists() else shutil.which("nb-cudaguard")
    if found is None:
        pytest.skip("the nb-cudaguard console script is not installed in this environment")
    return found


def script(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [_console_script(), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def test_version_prints_the_packages_version():
    result = script("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"nb-cudaguard {nb_cudaguard.__version__}\n"


def test_a_bare_call_prints_the_help_not_an_error():
    result = script()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: nb-cudaguard")
    assert "explain" in result.stdout and "run" in result.stdout
    assert "error" not in result.stderr


def test_an_unknown_command_is_still_a_usage_error():
    result = script("explian")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def _log(frame_code: str, device_line: str) -> str:
    return (
        "epoch 1 step 120 loss 0.693\n"
        f"{device_line}\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        f"    {frame_code}\n"
        f"torch.AcceleratorError: {ASSERT_2_9}"
    )


_DESCRIPTION = re.compile(r"<[^<>`]+>")
_FREE_NAME = re.compile(r"(?<![\w.])([a-z_]\w*)(?![\w])(?!\s*=(?!=))")
_NOT_OBJECTS = {"assert", "and", "or", "not", "all", "any", "len", "min", "max", "in", "is"}


def _objects_named_by_the_fix(stdout: str) -> set[str]:
    fix = next(line for line in stdout.splitlines() if line.startswith("Fix:"))
    names: set[str] = set()
    for code in re.findall(r"`([^`]+)`", fix):
        names.update(_FREE_NAME.findall(_DESCRIPTION.sub("", code)))
    return names - _NOT_OBJECTS


@pytest.mark.parametrize(
    ("case", "frame_code"),
    [
        ("cross-entropy-label", "running_loss += loss.item()"),
        ("embedding-16-ids-or-fewer", "print(out.mean().item())"),
    ],
)
def test_explains_fix_names_no_object_that_the_log_does_not_show(
    tmp_path: Path, case: str, frame_code: str
):
    log = _log(frame_code, H100_TORCH_2_11[case][0])
    (tmp_path / "train.log").write_text(log, encoding="utf-8")
    result = script("explain", str(tmp_path / "train.log"))
    assert result.returncode == 0, result.stderr
    words = set(re.findall(r"\w+", log))
    assert _objects_named_by_the_fix(result.stdout) <= words, result.stdout
    assert "<the" in result.stdout  # said in words where the log has no name for it


@pytest.mark.parametrize(
    ("case", "frame_code", "names"),
    [
        (
            "cross-entropy-label",
            "loss = criterion(outputs, batch_labels)",
            {"outputs", "batch_labels"},
        ),
        ("embedding-16-ids-or-fewer", "x = self.tok_emb(tokens)", {"self", "tokens"}),
    ],
)
def test_explains_fix_uses_the_logs_own_names_for_the_objects(
    tmp_path: Path, case: str, frame_code: str, names: set[str]
):
    (tmp_path / "train.log").write_text(_log(frame_code, H100_TORCH_2_11[case][0]), "utf-8")
    result = script("explain", str(tmp_path / "train.log"))
    assert result.returncode == 0, result.stderr
    assert _objects_named_by_the_fix(result.stdout) == names, result.stdout
