"""Where this shell's kernel keeps its files: its IPython profile and its connection file
(what the restart, the replay and the keep need to find this kernel's files again)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


def profile_dirs(shell: InteractiveShell) -> tuple[str, str] | None:
    """The shell's IPython profile (location, startup directory), where the restart leaves its
    one-shot startup file."""
    profile = getattr(shell, "profile_dir", None)
    if profile is None:
        return None
    return str(profile.location), str(profile.startup_dir)


def kernel_connection(shell: InteractiveShell) -> str | None:
    """The connection file of the kernel this shell runs in; None where it is not a kernel
    (terminal IPython, even with ipykernel imported, as ipywidgets 7.7 does; an in-process
    kernel). Asked of the shell's kernel object and ipykernel's own API, nothing else."""
    if getattr(shell, "kernel", None) is None:
        return None
    from ..restart.environment import running_kernel_connection

    return running_kernel_connection()
