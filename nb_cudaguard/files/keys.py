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
