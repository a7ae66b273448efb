"""The %%cudacheck cell magic and the %cudacheck on|off|status line magic.

The cell body runs through ``shell.run_cell``, as ``%%capture`` does, so events, tracebacks and
the diagnosis hook behave exactly as for a plain cell. torch is imported only when the magic is
used (the guard module needs it), never when the extension loads.

In line mode the guard is entered in ``pre_run_cell`` and left in ``post_run_cell``; a deferred
guard's verdicts must be read *inside* the cell (an exception in a post_run_cell callback only
prints "Error in callback"), so an AST transformer ends each cell with
``flush_after_cell(<last expression>)``, as ``%cudaguard sync on`` does with its synchronise.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..runtime.cells import CallAtCellEnd, toggle_transformer

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..input_guard.scope import Guard
    from .config import CudaGuard


_OLD_CELL_NAME = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


def _calling_cell(shell: InteractiveShell, frame: FrameType | None) -> int | None:
    """The number of the cell whose code called us (its In[N]), from the nearest cell frame."""
    format_code_name = getattr(shell.compile, "format_code_name", None)
    for _ in range(30):
        if frame is None:
            return None
        filename = frame.f_code.co_filename
        name = format_code_name(filename) if format_code_name is not None else None
        match = re.fullmatch(r"In\[(\d+)\]", name[1]) if name else None
        match = match or _OLD_CELL_NAME.fullmatch(filename)
        if match:
            return int(match.group(1))
        frame = frame.f_back
    return None


class CellStopped(Exception):
    """Makes a %%cudacheck cell whose body failed fail too, so "run all" stops there.

    The body's own traceback has been shown already; this adds one line, not a second traceback.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"%%cudacheck: {self}"]


COMMANDS = """\
%%cudacheck [--only CHECKS] [--skip CHECKS] [--deferred] [--sync]   check one cell (strict)
%cudacheck on [--only CHECKS] [--skip CHECKS] [--strict] [--sync]   check every following cell
                                                                     (deferred unless --strict)
%cudacheck off                                                       stop
%cudacheck status                                                    say what is on
%cudacheck?                                                          the manual"""


class FlushAtCellEnd(CallAtCellEnd):
    """Ends every cell with a read of the deferred verdicts (line mode, deferred)."""

    def __init__(self) -> None:
        super().__init__("nb_cudaguard.input_guard.deferral", "flush_after_cell")


@magics_class
class CudaCheckMagics(Magics):
    def __init__(self, shell: InteractiveShell, settings: CudaGuard) -> None:
        super().__init__(shell)
        self.ip = shell  # typed: Magics.shell is Optional
        self._session: dict[str, Any] | None = None  # guard() arguments while `on`
        # entered in pre_run_cell, left in post_run_cell; None for a cell run by %%cudacheck,
        # whose own options win over the session's
        self._cell_guards: list[Guard | None] = []
        self._hooked = False
        self._flusher: FlushAtCellEnd | None = None
        # The extension's configurable: its guard traits are this session's default guard.
        self._settings = settings
        settings.observe(self._configured, names=["guard", "only", "skip", "sync"])
        if settings.guard != "off":
            self._configured()

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
        "--deferred",
        action="store_true",
        help="no synchronisation per checked call: the call runs on clamped (safe) values and "
        "the first violation is raised before the next optimizer.step(), at the next .item(), or "
        "at the end of the cell. The default of `%%cudacheck on`.",
    )
    @argument(
        "--strict",
        action="store_true",
        help="read each checked call's verdict at once and raise before its kernel launches (one "
        "synchronisation per checked call on a GPU). The default of %%%%cudacheck.",
    )
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
        ``nb_cudaguard.GuardError`` instead of reaching a kernel: no device-side assert, the CUDA
        context stays healthy. Checked: cross_entropy, nll_loss, multi_margin_loss,
        binary_cross_entropy, ctc_loss targets, embedding, embedding_bag, multinomial,
        bernoulli, poisson, gather, scatter*, index_select/add/copy/fill/put, ``x[idx]``,
        ``x[idx] = v``, take, put, one_hot, repeat_interleave, max_unpool*d.

        Two modes. Strict (the default of ``%%cudacheck``): the error comes from the bad call
        itself, before it runs, and every variable survives; on a GPU each checked call
        synchronises. Deferred (the default of ``%cudacheck on``, which stays on while you
        train): no synchronisation per call; the bad call runs on clamped values (its output is
        garbage, the context stays healthy) and the error, naming the bad call's line, comes
        before the next ``optimizer.step()`` (weights are never updated from a bad batch), at
        the next ``.item()``, or at the end of the cell. Tensors in host memory have nothing to
        defer: there the error comes from the bad call itself in both modes, where PyTorch's
        CPU op raises its own (whose words the message quotes). In scripts and DDP ranks use
        ``with nb_cudaguard.guard():`` (``mode="deferred"`` for the second).

        Names the notebook bound to a checked op before (``from torch import gather``) are
        checked too, and name torch's op again after the cell. Not checked: code compiled by
        ``torch.compile`` (it runs as compiled, without a graph break; the guard says so once)
        or TorchScript. Nothing of the guard stays in torch after the cell.

        Usage::

            %%cudacheck [--only CHECKS] [--skip CHECKS] [--deferred] [--sync]
            <cell body>

            %cudacheck on [--only CHECKS] [--skip CHECKS] [--strict] [--sync]
            %cudacheck off
            %cudacheck status
            %cudacheck            (lists these commands)
        """
        args = parse_argstring(self.cudacheck, line)
        if args.deferred and args.strict:
            raise UsageError("--deferred and --strict exclude each other: choose one mode.")
        if cell is not None:
            if args.state is not None:
                raise UsageError(
                    "%%cudacheck takes options only; `%cudacheck on|off|status` is the line magic."
                )
            if args.strict:
                raise UsageError("%%cudacheck is strict already; --strict is for `%cudacheck on`.")
            self._run_guarded(cell, self._options(args, deferred=bool(args.deferred)))
            return
        given = [f"--{name}" for name in ("only", "skip") if getattr(args, name) is not None]
        given += [f"--{name}" for name in ("deferred", "strict", "sync") if getattr(args, name)]
        if args.state == "on":
            if args.deferred:
                raise UsageError(
                    "`%cudacheck on` is deferred already; --deferred is for %%cudacheck "
                    "(use --strict for a strict session)."
                )
            self._turn_on(self._options(args, deferred=not args.strict))
        elif given:
            where = f"`%cudacheck {args.state}`" if args.state else "a bare `%cudacheck`"
            raise UsageError(
                f"{', '.join(given)} would do nothing with {where}: options go with "
                "`%cudacheck on` or %%cudacheck.\n" + COMMANDS
            )
        elif args.state == "off":
            self._turn_off()
            print("cudacheck: off")
        elif args.state == "status":
            print(self.status())
        else:
            print(self.status() + "\n\n" + COMMANDS)

    # --- cell ----------------------------------------------------------------------------------
    def _run_guarded(self, cell: str, options: dict[str, Any]) -> None:
        from ..input_guard.scope import guard

        entered = guard(**options, namespace=self.ip.user_ns)
        with entered, self._counted_as(_calling_cell(self.ip, sys._getframe(1))):
            result = self.ip.run_cell(cell)
        if result.error_before_exec is not None or result.error_in_exec is not None:
            raise CellStopped("the cell stopped at the error above.")

    @contextlib.contextmanager
    def _counted_as(self, number: int | None) -> Iterator[None]:
        """IPython 8+ counts a cell before running it, so a body run by ``run_cell`` is compiled
        under the *next* number: an error in cell 3 would point at "Cell In[4]". Hold the count
        at the number the user sees while the body runs (IPython 7 needs nothing)."""
        if number is None or number == self.ip.execution_count:
            yield
            return
        counted, self.ip.execution_count = self.ip.execution_count, number
        try:
            yield
        finally:
            self.ip.execution_count = counted

    # --- line: on / off / status ---------------------------------------------------------------
    def _turn_on(self, options: dict[str, Any]) -> None:
        self._session = options
        if not self._hooked:
            self.ip.events.register("pre_run_cell", self._pre_run_cell)
            self.ip.events.register("post_run_cell", self._post_run_cell)
            self._hooked = True
        self._set_flusher(options["mode"] == "deferred")
        print(
            f"cudacheck: on ({options['mode']}) for every following cell (`%cudacheck off` to stop)"
        )

    def _turn_off(self) -> None:
        self._session = None
        self._set_flusher(False)

    def _set_flusher(self, on: bool) -> None:
        transformers = self.ip.ast_transformers
        self._flusher = toggle_transformer(transformers, self._flusher, on, FlushAtCellEnd)

    def status(self) -> str:
        if self._session is None:
            return "cudacheck: off"
        chosen = [f"{k}={v}" for k, v in self._session.items() if v and k != "mode"]
        return f"cudacheck: on, {self._session['mode']}" + (
            f" ({', '.join(chosen)})" if chosen else ""
        )

    def _pre_run_cell(self, *info: Any) -> None:
        if self._session is None:
            return
        from ..input_guard.scope import active, guard

        if active():
            self._cell_guards.append(None)
            return
        entered = guard(**self._session, namespace=self.ip.user_ns)
        entered.__enter__()
        self._cell_guards.append(entered)

    def _post_run_cell(self, *result: Any) -> None:
        if self._cell_guards:
            self._leave(self._cell_guards.pop())

    @staticmethod
    def _leave(entered: Guard | None) -> None:
        if entered is None:
            return
        from ..input_guard.errors import GuardError

        try:
            entered.__exit__(None, None, None)
        except GuardError as error:
            # Verdicts of a cell that stopped before its end (the transformer's read never
            # ran): a callback must not raise, so say it here.
            print(f"nb_cudaguard: {str(error).splitlines()[0]}", file=sys.stderr)

    # --- traitlets: CudaGuard.guard, .only, .skip, .sync ----------------------------------------
    def _configured(self, change: Any = None) -> None:
        settings = self._settings if change is None else change["owner"]
        if settings.guard == "off":
            if self._session is not None:
                self._turn_off()
                print("cudacheck: off (CudaGuard.guard)")
            return
        from argparse import Namespace

        args = Namespace(only=settings.only or None, skip=settings.skip or None, sync=settings.sync)
        try:
            options = self._options(args, deferred=settings.guard == "deferred")
        except UsageError as error:  # a bad name in a profile must not break the extension
            print(f"nb_cudaguard: CudaGuard: {error}; the guard stays as it was", file=sys.stderr)
            return
        self._turn_on(options)

    def close(self) -> None:
        """Turn the line-mode guard off and remove its hooks (extension unload)."""
        self._turn_off()
        with contextlib.suppress(ValueError):  # a second close
            self._settings.unobserve(self._configured, names=["guard", "only", "skip", "sync"])
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
    def _options(args: Any, deferred: bool) -> dict[str, Any]:
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
        mode = "deferred" if deferred else "strict"
        return {"only": only, "skip": skip, "sync": bool(args.sync), "mode": mode}
