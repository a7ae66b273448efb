"""The guard's traitlets configuration: ``%config CudaGuard.guard = "deferred"`` or a profile's
``ipython_config.py`` (``c.CudaGuard.guard = "deferred"``) turns it on for every cell.

The traits are a session's default, as ``%cudacheck on`` sets it: a ``%%cudacheck`` cell's own
options still win for that cell, and ``%cudacheck on|off`` still changes the session until the
configuration changes again. IPython's ``%config`` finds this object in ``shell.configurables``.
"""

from __future__ import annotations

from traitlets import Bool, CaselessStrEnum, Unicode
from traitlets.config import Configurable

GUARD_MODES = ("off", "strict", "deferred")


class CudaGuard(Configurable):
    """nb_cudaguard's guard, configured like any IPython component."""

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
