"""The %cudaguard line magic."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ._probe import probe_context


@magics_class
class CudaGuardMagics(Magics):
    @magic_arguments()
    @argument(
        "command",
        choices=["status", "sync"],
        help="status: torch and CUDA state of this kernel, and whether its CUDA context is "
        "healthy. sync on|off: synchronise CUDA at the end of every cell, so an asynchronous "
        "error surfaces in the cell that launched it (off by default: it waits for the GPU "
        "after every cell).",
    )
    @argument("value", nargs="?", choices=["on", "off"], help="for sync: on or off")
    @line_magic
    def cudaguard(self, line: str) -> None:
        """Inspect and repair this kernel's CUDA state.

        Usage::

            %cudaguard status
            %cudaguard sync on
            %cudaguard sync off
        """
        args = parse_argstring(self.cudaguard, line)
        if args.command == "status":
            print(f"CUDA context: {probe_context().value}")
        elif args.command == "sync":
            from ._extension import current_state

            state = current_state(self.shell)
            if state is None:
                raise UsageError("load the extension first: %load_ext nb_cudaguard")
            if args.value is not None:
                state.set_sync(args.value == "on")
            print(f"nb_cudaguard: end-of-cell CUDA synchronise is {'on' if state.sync else 'off'}.")
