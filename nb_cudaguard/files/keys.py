"""Where a kernel's files live: its key (from its connection file), the private state directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def kernel_key(connection_path: str) -> str:
    """The kernel's key: its connection file's path survives restarts, another kernel has
    another one."""
    resolved = os.path.realpath(os.path.abspath(connection_path))
    return hashlib.sha256(resolved.encode()).hexdigest()[:24]


def state_dir(profile_location: str | os.PathLike[str]) -> Path:
    """nb_cudaguard's private directory in the IPython profile."""
    return Path(profile_location) / "nb_cudaguard"


USER_DIR_ENV = "NB_CUDAGUARD_USER_DIR"


def user_state_dir() -> Path:
    """nb_cudaguard's private directory of this user's, shared by every IPython profile (the
    one watcher of the user's keeps lives there): ``$NB_CUDAGUARD_USER_DIR``, else the XDG
    Base Directory specification's place for state, ``$XDG_STATE_HOME/nb_cudaguard``
    (``~/.local/state/nb_cudaguard``)."""
    chosen = os.environ.get(USER_DIR_ENV)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "nb_cudaguard"
