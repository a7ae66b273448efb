"""Where is this kernel running, and which connection file names it?

Pure functions over ``sys.modules``, ``os.environ`` and the interpreter's launch arguments, so that
tests can feed them any environment. Nothing here imports the environment it detects
(FIELD_NOTES §5: ``"google.colab" in sys.modules``, never ``import google.colab``).
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Container, Mapping, Sequence


class Environment(str, enum.Enum):
    """The frontend/kernel-manager family: it decides how a kernel can be restarted."""

    COLAB = "colab"  # restarts a killed kernel, shows "session crashed"
    KAGGLE = "kaggle"  # jupyter_server 2.x behind a proxy
    VSCODE = "vscode"  # never auto-restarts a dead kernel: restart in place
    JUPYTER = "jupyter"  # a kernel under a Jupyter server or a plain kernel manager
    TERMINAL = "terminal"  # not a kernel (terminal IPython, a script): nothing to restart


def launch_args() -> list[str]:
    """The process's original arguments: IPython swaps ``sys.argv`` while it runs startup files."""
    return list(getattr(sys, "orig_argv", None) or sys.argv)


_FILE_FLAG = re.compile(r"^--?f(?:=(?P<value>.+))?$")


def connection_file(argv: Sequence[str]) -> str | None:
    """The kernel's connection file from its launch arguments (``-f X``, ``-f=X``, ``--f=X``)."""
    for index, arg in enumerate(argv):
        match = _FILE_FLAG.match(arg)
        if match is None:
            continue
        value = match.group("value")
        if value is None and index + 1 < len(argv):
            value = argv[index + 1]
        if value:
            return value
    return None


_KERNEL_ID = re.compile(r"^kernel-(?P<id>[0-9A-Za-z-]+)\.json$")


def kernel_id(connection_path: str) -> str | None:
    """A Jupyter server names connection files ``kernel-<kernel id>.json``."""
    match = _KERNEL_ID.match(os.path.basename(connection_path))
    return match.group("id") if match else None


def is_vscode_launch(argv: Sequence[str]) -> bool:
    """VS Code passes ``--f=<tmp>/kernel-v2-<n>.json``, a new file on every launch."""
    path = connection_file(argv)
    return path is not None and os.path.basename(path).startswith("kernel-v2-")


def detect(
    modules: Container[str] | None = None,
    environ: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> Environment:
    modules = sys.modules if modules is None else modules
    environ = os.environ if environ is None else environ
    argv = launch_args() if argv is None else argv
    # Kaggle's image is built from Colab's runtime, so google.colab may be loaded there too:
    # test Kaggle's own variable first.
    if environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return Environment.KAGGLE
    if "google.colab" in modules:
        return Environment.COLAB
    if is_vscode_launch(argv):
        return Environment.VSCODE
    # A script may take its own ``-f`` argument: only an ipykernel process is a kernel.
    if "ipykernel" in modules:
        return Environment.JUPYTER
    return Environment.TERMINAL
