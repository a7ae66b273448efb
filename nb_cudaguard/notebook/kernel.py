"""This kernel as the restart sees it: the public ``restart_kernel()``.

It needs what only IPython knows (the running shell, its kernel object and profile directory, the
loaded extension's last crash cell); it looks them up here, in the glue, and hands them down to
``restart``. (The one-shot startup file that a blocking restart leaves is self-contained: see
``restart/startup_once.py``.)
"""

from __future__ import annotations

from dataclasses import replace

from ..restart.methods import DELAY_S, RestartError, RestartPlan
from ..restart.methods import restart_kernel as _restart_kernel
from .extension import current_state, kernel_connection, multi_gpu_warning, profile_dirs
from .keep_glue import keep_before_restart


def restart_kernel(
    blocking: bool = True,
    *,
    after_cell: int | None = None,
    delay: float = DELAY_S,
    keep: bool | None = None,
) -> RestartPlan:
    """Restart this kernel; with ``blocking``, its next process alone gets CUDA_LAUNCH_BLOCKING=1.

    Returns at once with the plan; the kernel goes away ``delay`` seconds later, so that this
    cell's output and reply still reach the frontend. ``after_cell`` (default: the cell whose
    error nb_cudaguard last explained) is named in the new kernel's banner. Re-run the notebook
    from the top afterwards. Raises ``RestartError`` where there is no kernel to restart.
    With ``keep`` (None: ``CudaGuard.keep_on_restart``, True unless configured off), the CPU
    variables are saved first for the new process: the new kernel loads nb_cudaguard, which
    offers to restore them at its first cell; ``plan.kept`` says what was kept.
    """
    state = current_state()
    if state is not None:
        return state.restart(blocking, after_cell=after_cell, delay=delay, keep=keep)
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RestartError("not running inside IPython: there is no kernel to restart")
    profile, connection = profile_dirs(shell), kernel_connection(shell)
    # Not loaded: no configuration was read, so the default (keep) holds.
    kept = keep_before_restart(shell, connection, profile) if keep is not False else ""
    plan = _restart_kernel(
        blocking,
        after_cell=after_cell,
        profile=profile,
        delay=delay,
        connection=connection,
        warning=multi_gpu_warning(shell.user_ns) if blocking else "",
        load_extension=True,  # it offers back what was kept
    )
    return replace(plan, kept=kept)
