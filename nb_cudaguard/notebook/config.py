"""nb_cudaguard's traitlets configuration: ``%config CudaGuard.guard = "deferred"`` in a notebook,
or ``c.CudaGuard.guard = "deferred"`` in a profile's ``ipython_config.py`` for every notebook.

The traits are a session's defaults: a magic's own options still win for its cell or command
(``%%cudacheck --skip``, ``%cudaguard restart --keep``), and ``%cudacheck on|off`` or
``%cudaguard keep --stop`` change the session until the configuration changes again. IPython's
``%config`` finds this object in ``shell.configurables``; the help texts are the manual
(``%config CudaGuard``, docs/configuration.md).
"""

from __future__ import annotations

from traitlets import Bool, CaselessStrEnum, List, Unicode
from traitlets.config import Configurable

GUARD_MODES = ("off", "strict", "deferred")


class CudaGuard(Configurable):
    """nb_cudaguard, configured like any IPython component."""

    guard = CaselessStrEnum(
        GUARD_MODES,
        default_value="off",
        help="Check the inputs of assert-prone torch calls in every cell: off, strict (each "
        "verdict read at once) or deferred (read before optimizer.step(), at .item(), at the end "
        "of the cell). The same as `%cudacheck on [--strict]`.",
    ).tag(config=True)
    only = Unicode(
        "",
        help="Comma-separated checks to run, by op (cross_entropy, embedding, getitem, ...) or "
        "family (loss, embedding, ...); empty: all. As `%cudacheck on --only`.",
    ).tag(config=True)
    skip = Unicode("", help="Comma-separated checks not to run. As `--skip`.").tag(config=True)
    sync = Bool(
        False,
        help="Synchronise CUDA at the end of every guarded cell, so an asynchronous error from "
        "an unchecked op is reported by its cell. As `--sync`.",
    ).tag(config=True)
    keep = List(
        Unicode(),
        help="Names of GPU objects (a model, an optimizer, tensors) to copy to CPU buffers after "
        "every successful cell, as `%cudaguard keep NAME ...`, so that the restart after a CUDA "
        "error keeps the last good copy. A name starts being copied after the first cell that "
        "binds it to something holding tensors; `%cudaguard keep --stop NAME` stops it for the "
        "session.",
    ).tag(config=True)
    keep_on_restart = Bool(
        True,
        help="Save the CPU variables for the new kernel at every restart nb_cudaguard does (the "
        "panel's buttons, `%cudaguard restart`, `restart_kernel()`). False: as "
        "`%cudaguard restart --no-keep`; `%cudaguard restart --keep` still keeps.",
    ).tag(config=True)
    buttons = Bool(
        True,
        help="Show the restart buttons under the panel, the Restore offer and the replay offer "
        "as widgets. False: their static text with the commands to type (what a frontend "
        "without a widget manager shows), for frontends where widgets do not work.",
    ).tag(config=True)
