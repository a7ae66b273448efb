"""Where is this kernel running, and which connection file names it?

Whether this process *is* a kernel is asked of ipykernel's own API: its application is
initialised, and ``ipykernel.connect.get_connection_file()`` names the connection file. Never
``"ipykernel" in sys.modules``: ipywidgets 7.7 (Colab's) imports ipykernel in terminal IPython too,
and a restart there would end the user's terminal session (ipywidgets 7.x's widget.py imports
``ipykernel.comm``). The rest are pure
functions over ``sys.modules``, ``os.environ`` and a connection file's name, so that tests can feed
them any environment. Nothing here imports the environment it detects (anywidget's way:
``"google.colab" in sys.modules``, never ``import google.colab``).
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Container, Mapping


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


_KERNEL_ID = re.compile(r"^kernel-(?P<id>[0-9A-Za-z-]+)\.json$")


def kernel_id(connection_path: str) -> str | None:
    """A Jupyter server names connection files ``kernel-<kernel id>.json``."""
    match = _KERNEL_ID.match(os.path.basename(connection_path))
    return match.group("id") if match else None


def is_vscode_connection(path: str) -> bool:
    """VS Code passes ``--f=<tmp>/kernel-v2-<n>.json``, a new file on every launch."""
    return os.path.basename(path).startswith("kernel-v2-")


def running_kernel_connection() -> str | None:
    """This process's connection file if it is a running ipykernel kernel, else None.

    Asked of ipykernel only where it is already loaded (a kernel has loaded ``kernelapp`` and,
    through it, ``connect`` long before; nothing is imported here): its application must be
    initialised, which an in-process kernel or a terminal that merely imported ipykernel never is.
    """
    app_class = getattr(sys.modules.get("ipykernel.kernelapp"), "IPKernelApp", None)
    get_connection_file = getattr(sys.modules.get("ipykernel.connect"), "get_connection_file", None)
    try:
        if app_class is None or get_connection_file is None or not app_class.initialized():
            return None
        return str(get_connection_file())
    except Exception:  # a kernel app without a connection file is nothing we can restart
        return None


_ASK_IPYKERNEL = "<ask ipykernel>"


def detect(
    modules: Container[str] | None = None,
    environ: Mapping[str, str] | None = None,
    connection: str | None = _ASK_IPYKERNEL,
) -> Environment:
    """The environment of this process; ``connection`` is its kernel's connection file (by
    default asked of ipykernel), None where it is not a kernel."""
    modules = sys.modules if modules is None else modules
    environ = os.environ if environ is None else environ
    if connection == _ASK_IPYKERNEL:
        connection = running_kernel_connection()
    if connection is None:
        return Environment.TERMINAL
    # Kaggle's image is built from Colab's runtime, so google.colab may be loaded there too:
    # test Kaggle's own variable first.
    if environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return Environment.KAGGLE
    if "google.colab" in modules:
        return Environment.COLAB
    if is_vscode_connection(connection):
        return Environment.VSCODE
    return Environment.JUPYTER
