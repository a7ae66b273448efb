"""The %cudaguard line magic."""

from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ._probe import probe_context


@magics_class
class CudaGuardMagics(Magics):
    @magic_arguments()
    @argument(
        "command",
        choices=["status"],
        help="status: torch and CUDA state of this kernel, and whether its CUDA context is healthy.",
    )
    @line_magic
    def cudaguard(self, line: str) -> None:
        """Inspect and repair this kernel's CUDA state.

        Usage::

            %cudaguard status
        """
        args = parse_argstring(self.cudaguard, line)
        if args.command == "status":
            print(f"CUDA context: {probe_context().value}")
