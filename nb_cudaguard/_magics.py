"""The %cudaguard line magic."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


def _status(args: argparse.Namespace) -> None:
    from ._status import gather

    print(gather().text())


def _restart(args: argparse.Namespace) -> None:
    from ._restart import RestartError, restart_kernel

    blocking = not args.no_blocking
    try:
        plan = restart_kernel(blocking=blocking)
    except RestartError as error:
        raise UsageError(f"cannot restart: {error}") from None
    print(f"nb_cudaguard: {plan.describe(blocking)}", flush=True)


# One entry per subcommand: adding a command is adding an entry (and its choice below).
COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "status": _status,
    "restart": _restart,
}


@magics_class
class CudaGuardMagics(Magics):
    @magic_arguments()
    @argument(
        "command",
        choices=list(COMMANDS),
        help="status: torch and CUDA state of this kernel, whether its CUDA context is healthy, "
        "and whether CUDA_LAUNCH_BLOCKING is set and effective. "
        "restart: a new kernel process, with CUDA_LAUNCH_BLOCKING=1 for that one start.",
    )
    @argument(
        "--no-blocking",
        action="store_true",
        help="restart: a plain restart, without CUDA_LAUNCH_BLOCKING=1.",
    )
    @line_magic
    def cudaguard(self, line: str) -> None:
        """Inspect and repair this kernel's CUDA state.

        Usage::

            %cudaguard status
            %cudaguard restart                # next kernel starts with CUDA_LAUNCH_BLOCKING=1
            %cudaguard restart --no-blocking  # plain restart

        After a restart, re-run the notebook from the top: all variables are gone.
        """
        args = parse_argstring(self.cudaguard, line)
        COMMANDS[args.command](args)
