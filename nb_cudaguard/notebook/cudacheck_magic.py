"""The %%cudacheck cell magic and the %cudacheck on|off|status line magic.

The cell body runs through ``shell.run_cell``, as ``%%capture`` does, so events, tracebacks and
the diagnosis hook behave exactly as for a plain cell. torch is imported only when the magic is
used (the guard module needs it), never when the extension loads.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..input_guard.scope import Guard


class CellStopped(Exception):
    """Makes a %%cudacheck cell whose body failed fail too, so "run all" stops there.

    The body's own traceback has been shown already; this adds one line, not a second traceback.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"%%cudacheck: {self}"]


@magics_class
class CudaCheckMagics(Magics):
    def __init__(self, shell: InteractiveShell) -> None:
        super().__init__(shell)
        self.ip = shell  # typed: Magics.shell is Optional
        self._session: dict[str, Any] | None = None  # guard() arguments while `on`
        # entered in pre_run_cell, left in post_run_cell; None for a cell run by %%cudacheck,
        # whose own options win over the session's
        self._cell_guards: list[Guard | None] = []
        self._hooked = False

    @magic_arguments()
    @argument(
        "state",
        nargs="?",
        choices=["on", "off", "status"],
        help="line magic only: guard every following cell (on), stop (off), or show the state.",
    )
    @argument(
        "--only",
        metavar="CHECKS",
        help="comma-separated checks to run, by op (cross_entropy, embedding, getitem, ...) or "
        "family (loss, embedding, sampling, gather_scatter, index, one_hot, "
        "repeat_interleave, unpool); default: all.",
    )
    @argument("--skip", metavar="CHECKS", help="comma-separated checks not to run.")
    @argument(
        "--sync",
        action="store_true",
        help="synchronise CUDA at the end of the cell, so an asynchronous error from an "
        "unchecked op is reported by this cell and not a later one.",
    )
    @line_cell_magic
    def cudacheck(self, line: str, cell: str | None = None) -> None:
        """Check the inputs of assert-prone torch ops before their GPU kernels run.

        Inside a guarded cell, a bad class id, token id, index or probability raises
        ``nb_cudaguard.GuardError`` before the kernel launches: no device-side assert, the CUDA
        context stays healthy, and every variable survives. Checked: cross_entropy, nll_loss,
        multi_margin_loss, binary_cross_entropy, ctc_loss targets, embedding, embedding_bag,
        multinomial, bernoulli, poisson, gather, scatter*, index_select/add/copy/fill/put,
        ``x[idx]``, ``x[idx] = v``, take, put, one_hot, repeat_interleave, max_unpool*d. Each
        check on a CUDA tensor reads a few numbers back, which synchronises: use it to find a bad
        batch, not for every training run. In scripts and DDP ranks use
        ``with nb_cudaguard.guard():``.

        Usage::

            %%cudacheck [--only CHECKS] [--skip CHECKS] [--sync]
            <cell body>

            %cudacheck on [--only CHECKS] [--skip CHECKS] [--sync]
            %cudacheck off
            %cudacheck status
        """
        args = parse_argstring(self.cudacheck, line)
        if cell is not None:
            if args.state is not None:
                raise UsageError(
                    "%%cudacheck takes options only; `%cudacheck on|off|status` is the line magic."
                )
            self._run_guarded(cell, self._options(args))
        elif args.state == "on":
            self._turn_on(self._options(args))
        elif args.state == "off":
            self._session = None
            print("cudacheck: off")
        else:
            print(self.status())

    # --- cell ----------------------------------------------------------------------------------
    def _run_guarded(self, cell: str, options: dict[str, Any]) -> None:
        from ..input_guard.scope import guard

        with guard(**options):
            result = self.ip.run_cell(cell)
        if result.error_before_exec is not None or result.error_in_exec is not None:
            raise CellStopped("the cell stopped at the error above.")

    # --- line: on / off / status ---------------------------------------------------------------
    def _turn_on(self, options: dict[str, Any]) -> None:
        self._session = options
        if not self._hooked:
            self.ip.events.register("pre_run_cell", self._pre_run_cell)
            self.ip.events.register("post_run_cell", self._post_run_cell)
            self._hooked = True
        print("cudacheck: on for every following cell (`%cudacheck off` to stop)")

    def status(self) -> str:
        if self._session is None:
            return "cudacheck: off"
        chosen = [f"{k}={v}" for k, v in self._session.items() if v]
        return "cudacheck: on" + (f" ({', '.join(chosen)})" if chosen else "")

    def _pre_run_cell(self, *info: Any) -> None:
        if self._session is None:
            return
        from ..input_guard.scope import active, guard

        if active():
            self._cell_guards.append(None)
            return
        entered = guard(**self._session)
        entered.__enter__()
        self._cell_guards.append(entered)

    def _post_run_cell(self, *result: Any) -> None:
        if self._cell_guards:
            self._leave(self._cell_guards.pop())

    @staticmethod
    def _leave(entered: Guard | None) -> None:
        if entered is not None:
            entered.__exit__(None, None, None)

    def close(self) -> None:
        """Turn the line-mode guard off and remove its hooks (extension unload)."""
        self._session = None
        while self._cell_guards:
            self._leave(self._cell_guards.pop())
        if self._hooked:
            for event, callback in (
                ("pre_run_cell", self._pre_run_cell),
                ("post_run_cell", self._post_run_cell),
            ):
                with contextlib.suppress(ValueError):  # someone removed it already
                    self.ip.events.unregister(event, callback)
            self._hooked = False

    @staticmethod
    def _options(args: Any) -> dict[str, Any]:
        try:
            from ..input_guard.scope import parse_names
        except ImportError as error:  # the guard checks torch calls: no torch, nothing to guard
            raise UsageError(
                f"%cudacheck needs PyTorch, which cannot be imported: {error}"
            ) from None

        try:
            only, skip = parse_names(args.only), parse_names(args.skip)
        except ValueError as error:
            raise UsageError(str(error)) from None
        return {"only": only, "skip": skip, "sync": bool(args.sync)}
