"""The %cudaguard line magic."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..restart.methods import RestartPlan


class ExtensionState(Protocol):
    """What the commands need of the loaded extension (handed in, never looked up)."""

    @property
    def sync(self) -> bool: ...

    def set_sync(self, on: bool) -> None: ...

    def restart(self, blocking: bool = True) -> RestartPlan: ...


def _status(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..runtime.status import gather

    print(gather().text())


def _restart(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..restart.methods import RestartError

    blocking = not args.no_blocking
    try:
        plan = state.restart(blocking)
    except RestartError as error:
        raise UsageError(f"cannot restart: {error}") from None
    print(f"nb_cudaguard: {plan.describe(blocking)}", flush=True)


def _sync(state: ExtensionState, args: argparse.Namespace) -> None:
    if args.value is not None:
        state.set_sync(args.value == "on")
    print(f"nb_cudaguard: end-of-cell CUDA synchronise is {'on' if state.sync else 'off'}.")


# One entry per subcommand: adding a command is adding an entry.
COMMANDS: dict[str, Callable[[ExtensionState, argparse.Namespace], None]] = {
    "status": _status,
    "restart": _restart,
    "sync": _sync,
}


@magics_class
class CudaGuardMagics(Magics):
    def __init__(self, shell: InteractiveShell, state: ExtensionState) -> None:
        super().__init__(shell)
        self.state = state

    @magic_arguments()
    @argument(
        "command",
        choices=list(COMMANDS),
        help="status: torch and CUDA state of this kernel, whether its CUDA context is healthy, "
        "and whether CUDA_LAUNCH_BLOCKING is set and effective. "
        "restart: a new kernel process, with CUDA_LAUNCH_BLOCKING=1 for that one start. "
        "sync on|off: synchronise CUDA at the end of every cell, so an asynchronous error "
        "surfaces in the cell that launched it (off by default: it waits for the GPU after "
        "every cell).",
    )
    @argument("value", nargs="?", choices=["on", "off"], help="for sync: on or off")
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
            %cudaguard sync on                # errors surface in the cell that launched them
            %cudaguard sync off

        After a restart, re-run the notebook from the top: all variables are gone.
        """
        args = parse_argstring(self.cudaguard, line)
        if args.value is not None and args.command != "sync":
            raise UsageError(f"%cudaguard {args.command} takes no on/off")
        COMMANDS[args.command](self.state, args)
