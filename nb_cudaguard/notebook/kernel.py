"""This kernel as the restart sees it: the public ``restart_kernel()`` and the startup entry point.

Both need what only IPython knows (the running shell, its profile directory, the loaded
extension's last crash cell); they look it up here, in the glue, and hand it down to ``restart``.
"""

from __future__ import annotations

from ..restart.methods import DELAY_S, RestartError, RestartPlan
from ..restart.methods import restart_kernel as _restart_kernel
from .extension import current_state, profile_dirs


def restart_kernel(
    blocking: bool = True, *, after_cell: int | None = None, delay: float = DELAY_S
) -> RestartPlan:
    """Restart this kernel; with ``blocking``, its next process alone gets CUDA_LAUNCH_BLOCKING=1.

    Returns at once with the plan; the kernel goes away ``delay`` seconds later, so that this
    cell's output and reply still reach the frontend. ``after_cell`` (default: the cell whose
    error nb_cudaguard last explained) is named in the new kernel's banner. Re-run the notebook
    from the top afterwards. Raises ``RestartError`` where there is no kernel to restart.
    """
    state = current_state()
    if state is not None:
        return state.restart(blocking, after_cell=after_cell, delay=delay)
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RestartError("not running inside IPython: there is no kernel to restart")
    return _restart_kernel(
        blocking, after_cell=after_cell, profile=profile_dirs(shell), delay=delay
    )


_ran = False


def run_startup() -> None:
    """Entry point of the one-shot startup file: runs once per process, however many exist."""
    global _ran
    if _ran:
        return
    _ran = True
    from IPython import get_ipython

    from ..restart.environment import connection_file, launch_args
    from ..restart.injection import apply_pending

    shell = get_ipython()
    if shell is None:
        return
    profile = shell.profile_dir
    apply_pending(profile.location, profile.startup_dir, connection_file(launch_args()))
