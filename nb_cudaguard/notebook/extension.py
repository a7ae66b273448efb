"""IPython glue: one object owns every hook it installs and removes exactly those.

Only ``post_run_cell`` is used to see errors: it gets the ``ExecutionResult`` whatever handled the
exception, coexists with every other extension, and leaves the standard ``error`` output and the
cell's ``status: error`` alone (stop-on-error and nbconvert rely on them). ``set_custom_exc`` is
deliberately left untouched: it has one slot per shell (IPython/core/interactiveshell.py,
``set_custom_exc``) and Colab already uses it.

Nothing escapes a hook, ``BaseException`` included: a Ctrl-C during our analysis, or IPython 7.34
firing ``post_run_cell`` from a ``finally`` with no result (its interactiveshell.py ``run_cell``),
would otherwise print
"Error in callback" and leave the tee half-stopped. The tee is stopped first, in its own guard, so
fd 2 is always given back.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..diagnosis.assert_lines import parse_assert_lines
from ..diagnosis.engine import explain, recognise
from ..diagnosis.model import ContextState, Diagnosis
from ..diagnosis.where import where_sentence
from ..ranks.launched import RankDir, verdict
from ..replay.prefix import stopped_line
from ..replay.record import Recorder
from ..runtime.capture import FdTee
from ..runtime.cells import CellTracker, SyncAfterCell, is_sync_frame, toggle_transformer
from ..runtime.probe import Probe, probe_devices
from .config import CudaGuard
from .keep_glue import KeepState

# Re-exported: they lived here before the replay needed them without importing this module.
from .locate import kernel_connection as kernel_connection
from .locate import profile_dirs as profile_dirs
from .replay_glue import ReplayState, own_modules

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

    from ..restart.methods import RestartPlan


class CudaGuardExtension:
    """The loaded extension's state in one shell."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell
        self.loaded = False
        self.poisoned_in_cell: int | None = None  # the cell whose error first broke the context
        self.poisoned_since: Diagnosis | None = None
        self.last_diagnosis: Diagnosis | None = None
        self.last_sticky_cell: int | None = None  # the cell last shown a sticky diagnosis
        self._magic_names: dict[str, list[str]] = {"line": [], "cell": []}
        self._registered_magics: list[Any] = []
        # Device assert lines, shown as before and kept for the diagnosis; held between cells,
        # where the driver often prints them (runtime/capture.py).
        self.tee = FdTee(2, hold=True)
        self._tee_failed = False
        self.cells = CellTracker()
        self.outcomes: dict[int, bool] = {}  # execution count -> succeeded (for a replay)
        self.seconds: dict[int, float] = {}  # execution count -> how long it ran (the same)
        self._started: list[float] = []  # per running cell (a replay's nest), when it began
        self._sync: SyncAfterCell | None = None
        self.recorder: Recorder | None = None  # what each cell did, for a replay
        # Callbacks of other parts of the glue (the snapshots of `%cudaguard keep`, a recorder)
        # run at the end of this object's own post_run_cell, in the order added: this object owns
        # the one IPython hook, and unload removes them all with it.
        self.cell_hooks: list[Callable[[ExecutionResult], None]] = []
        self.rank_dir = RankDir()  # where ranks launched from a cell write their records
        self.keep = KeepState()  # the restore offers shown, the snapshots of `%cudaguard keep`
        self.replay = ReplayState()  # the previous kernel's cells, the cells a replay ran
        self._greet_at_first_cell = False
        # The traitlets configuration (a profile's ipython_config.py, `%config CudaGuard.x = y`):
        # read where it is used, so a change made with %config counts from the next use.
        self.settings = CudaGuard(parent=shell)

    # --- load / unload -------------------------------------------------------------------------
    def load(self) -> None:
        if self.loaded:
            return
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        configurables: list[Any] = self.shell.configurables  # typed as shells in IPython's stubs
        configurables.append(self.settings)  # what %config lists and sets
        self._register_magics()
        self.settings.observe(self._keep_configured, names=["keep"])
        self._keep_configured()
        self.loaded = True
        with contextlib.suppress(Exception):  # a replay then plans from the cells' text alone
            self.recorder = Recorder(set(self.shell.user_ns_hidden), own_modules)
            self.recorder.prime(self.shell.user_ns)
        # What a restore puts back, and what the user changes after it, for the replay's plan.
        self.keep.recorder = self.replay.recorder = self.recorder
        with contextlib.suppress(Exception):  # without it, device lines reach the cell unfolded
            self.tee.fold = _fold_spec()
        try:  # children of a launcher started in a cell inherit its name
            self.rank_dir.open()
        except Exception as internal:
            print(f"nb_cudaguard: no folder for ranks' records ({internal}).", file=sys.stderr)
        if _answering_a_request(self.shell):
            self._greet()
        else:  # loaded by our restart's startup file: what it shows would reach no cell
            self._greet_at_first_cell = True

    def _greet(self) -> None:
        """What a load shows: the blocking-mode banner, what was kept, the replay."""
        try:
            from .display import on_load

            # the blocking-mode banner, the replay, after our restart
            settings = self.settings
            on_load(
                self.shell,
                self.replay,
                self.restart,
                buttons=settings.buttons,
                keeps=settings.keep_on_restart,
            )
        except Exception as internal:  # a banner is never worth a failed %load_ext
            print(f"nb_cudaguard: {type(internal).__name__}: {internal}", file=sys.stderr)
        try:
            from .keep_glue import offer_restore

            connection, profile = kernel_connection(self.shell), profile_dirs(self.shell)
            offer_restore(self.shell, connection, profile, self.keep, self.settings.buttons)
        except Exception as internal:  # nor is the offer to restore what was kept
            print(f"nb_cudaguard: {type(internal).__name__}: {internal}", file=sys.stderr)

    def unload(self) -> None:
        if not self.loaded:
            return
        self.loaded = False
        for event, callback in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            with contextlib.suppress(ValueError):  # someone already removed it
                self.shell.events.unregister(event, callback)
        self.set_sync(False)
        with contextlib.suppress(ValueError):
            self.settings.unobserve(self._keep_configured, names=["keep"])
        with contextlib.suppress(ValueError):  # what %config lists and sets is ours no more
            configurables: list[Any] = self.shell.configurables
            configurables.remove(self.settings)
        with contextlib.suppress(Exception):  # the snapshot hook, if %cudaguard keep started one
            self.keep.close()
        self.keep, self.replay = KeepState(), ReplayState()  # a later load starts afresh
        self._greet_at_first_cell = False
        self.tee.close()
        self.cell_hooks.clear()
        self.rank_dir.close()
        self._unregister_magics()

    def add_cell_hook(self, callback: Callable[[ExecutionResult], None]) -> None:
        """Run ``callback(result)`` after every cell, after the diagnosis (once per callback)."""
        if callback not in self.cell_hooks:
            self.cell_hooks.append(callback)

    def remove_cell_hook(self, callback: Callable[[ExecutionResult], None]) -> None:
        with contextlib.suppress(ValueError):
            self.cell_hooks.remove(callback)

    def set_sync(self, on: bool) -> None:
        """Synchronise CUDA at the end of every cell (``%cudaguard sync on``), or stop."""
        self._sync = toggle_transformer(self.shell.ast_transformers, self._sync, on, SyncAfterCell)

    @property
    def sync(self) -> bool:
        return self._sync is not None

    def _keep_configured(self, change: Any = None) -> None:
        """``CudaGuard.keep``: the names snapshotted after each successful cell."""
        from .keep_glue import snapshot_configured

        snapshot_configured(
            self.shell, self.keep, lambda: self.poisoned_since is not None, self.settings.keep, self
        )

    def restart(
        self,
        blocking: bool = True,
        *,
        after_cell: int | None = None,
        delay: float | None = None,
        keep: bool | None = None,
    ) -> RestartPlan:
        """Restart this kernel (see ``restart.methods.restart_kernel``), handing down what only
        the shell knows: its profile, and the cell whose error was last explained. With ``keep``
        (None: ``CudaGuard.keep_on_restart``), the CPU state is saved first for the new process
        to restore (``keep_glue``)."""
        from dataclasses import replace

        from ..restart.methods import DELAY_S, restart_kernel
        from .replay_glue import cells_kept_for_restart

        profile, connection = profile_dirs(self.shell), kernel_connection(self.shell)
        kept = ""
        if self.settings.keep_on_restart if keep is None else keep:
            from .keep_glue import keep_before_restart

            kept = keep_before_restart(self.shell, connection, profile, self.keep.snapshots)
        # Once the context is known broken no further panel is shown, so the last panel's cell is
        # also the one that broke it; where the probe could not tell, the panel still named it.
        after_cell = self.last_sticky_cell if after_cell is None else after_cell
        # The cells, for `%cudaguard replay` in the next process.
        records = self.recorder.settle() if self.recorder is not None else {}
        with cells_kept_for_restart(
            self.shell, self.outcomes, after_cell, self.seconds, records, self.replay
        ):
            plan = restart_kernel(
                blocking,
                after_cell=after_cell,
                profile=profile,
                delay=DELAY_S if delay is None else delay,
                connection=connection,
                warning=multi_gpu_warning(self.shell.user_ns) if blocking else "",
                load_extension=True,  # so that the commands the panel shows work there
            )
        return replace(plan, kept=kept)

    def _register_magics(self) -> None:
        from .cudacheck_magic import CudaCheckMagics
        from .cudaguard_magic import CudaGuardMagics

        magics = (CudaGuardMagics(self.shell, self), CudaCheckMagics(self.shell, self.settings))
        for instance in magics:
            for kind in ("line", "cell"):
                self._magic_names[kind].extend(instance.magics[kind])
            self.shell.register_magics(instance)
            self._registered_magics.append(instance)

    def _unregister_magics(self) -> None:
        table = self.shell.magics_manager.magics
        for kind, names in self._magic_names.items():
            for name in names:
                bound = table[kind].get(name)
                # Only remove what is still ours: another extension may have redefined the name.
                if getattr(bound, "__self__", None) in self._registered_magics:
                    del table[kind][name]
        for instance in self._registered_magics:
            close = getattr(instance, "close", None)  # e.g. %cudacheck on: its guard and hooks
            if close is not None:
                close()
        self._magic_names = {"line": [], "cell": []}
        self._registered_magics = []

    # --- the hook ------------------------------------------------------------------------------
    def pre_run_cell(self, *_info: Any) -> None:
        if self._greet_at_first_cell:
            self._greet_at_first_cell = False
            with contextlib.suppress(BaseException):
                self._greet()
        # Bookkeeping only: never break the user's cell. (``try``, not ``contextlib.suppress``,
        # in this hook and the next: it runs at every cell, and a try that raises nothing costs
        # nothing, where a suppress is an object and two calls.)
        try:
            self._started.append(time.perf_counter())
            self.cells.start()
            if self.recorder is not None:
                self.recorder.start(self.shell.user_ns)
            if not self._tee_failed:
                self._start_tee()
        except BaseException:
            pass

    def _start_tee(self) -> None:
        try:
            self.tee.start()
        except Exception as internal:  # fd games can fail (closed fd 2): never break the cell
            self._tee_failed = True  # say it once, not under every cell
            with contextlib.suppress(Exception):  # sys.stderr may be that very fd
                print(f"nb_cudaguard: not capturing device output ({internal}).", file=sys.stderr)

    def post_run_cell(self, result: ExecutionResult | None = None) -> None:
        # IPython 7.34 may pass None (fired from a `finally`); then there is nothing to explain.
        error = getattr(result, "error_in_exec", None)
        cell = getattr(result, "execution_count", None)
        try:  # noqa: SIM105 (at every cell: see pre_run_cell)
            self.tee.stop()
        except BaseException:
            pass
        since = 0.0  # when the cell began, by the clock ranks' records use
        try:
            self.cells.finish(cell)
            # Only cells in the history: a nested run_cell (a replay's) reports a count too.
            stored = result is not None and bool(getattr(result.info, "store_history", False))
            started = self._started.pop() if self._started else None
            since = time.time() - (time.perf_counter() - started) if started is not None else 0.0
            if cell is not None and result is not None and stored:
                self.outcomes[cell] = bool(result.success)
                if started is not None:
                    self.seconds[cell] = time.perf_counter() - started
            if self.recorder is not None:
                failed = not getattr(result, "success", True)
                stopped = stopped_line(error, self.shell.user_ns) if failed else 0
                self.recorder.finish(self.shell.user_ns, cell if stored else None, failed, stopped)
        except BaseException:
            pass
        try:
            if error is None:
                if result is not None and self.tee.depth == 0 and self.tee.received():
                    self._forget_device_output()
            elif not self._explain_launch(cell, since):
                self._explain(error, cell)
        except BaseException as internal:  # never let our failure cost the user their traceback
            with contextlib.suppress(BaseException):
                print(
                    f"nb_cudaguard: could not analyse this error ({type(internal).__name__}: "
                    f"{internal}); the traceback above is complete.",
                    file=sys.stderr,
                )
        if result is not None:
            for callback in list(self.cell_hooks):
                try:  # noqa: SIM105 (at every cell: see pre_run_cell)
                    callback(result)
                except BaseException:  # one hook's failure stops no other
                    pass

    def _forget_device_output(self) -> None:
        """After a successful cell, older output never decides a later error, except assert
        lines: the GPU prints them at a later launch or sync, often in a cell that succeeds,
        while the error surfaces cells later (seen on an H100: launch in one cell, `.item()` two
        cells on). They are kept until a failure reads them."""
        if not parse_assert_lines(self.tee.text()):
            self.tee.clear()

    def _explain(self, error: BaseException, cell: int | None) -> None:
        recognised = recognise(error)
        if recognised is None:
            return  # not a CUDA error (from its own text): no need to ask the tee's child
        launched = self.cells.settle(timeout=0.1)  # answers still on their way: ms at most
        where = where_sentence(
            error, cell, launched, synced=is_sync_frame(error), queued=self.cells.queued
        )
        # What fd 2 received since the last diagnosis, less what successful cells printed
        # besides assert lines (_forget_device_output); read once: later errors start afresh.
        device_output = self.tee.text()
        self.tee.clear()
        diagnosis = explain(
            recognised, device_output=device_output, namespace=self.shell.user_ns, where=where
        )
        if self.poisoned_since is not None:
            self._show_fallout(diagnosis)
            return
        probe = probe_devices()
        context = probe.state
        if not diagnosis.sticky and context is not ContextState.POISONED:
            return  # out of memory & co.: IPython's traceback says it all, the kernel lives on
        diagnosis = _with_context(diagnosis, probe)
        self.last_diagnosis = diagnosis
        self.last_sticky_cell = cell
        if context is ContextState.POISONED:
            self.poisoned_in_cell, self.poisoned_since = cell, diagnosis
        from .display import show_diagnosis

        raw = tuple(line for line in device_output.splitlines() if "ssert" in line)
        settings = self.settings
        show_diagnosis(
            diagnosis,
            cell,
            self.restart,
            raw,
            buttons=settings.buttons,
            keeps=settings.keep_on_restart,
        )

    def _explain_launch(self, cell: int | None, since: float) -> bool:
        """A job launched in this cell failed: its ranks' records, written before their errors
        left them, decide (the launcher's own exception names no cause, or a victim)."""
        torch = sys.modules.get("torch")
        kernel_cuda = torch is not None and bool(torch.cuda.is_initialized())
        diagnosis = verdict(self.rank_dir.take(since), kernel_cuda)
        if diagnosis is None:
            return False
        self.tee.clear()  # the children's assert lines are this failure's, read from the records
        if kernel_cuda:
            probe = probe_devices()
            diagnosis = _with_context(diagnosis, probe)
        self.last_diagnosis = diagnosis
        from .display import show_diagnosis

        settings = self.settings
        show_diagnosis(
            diagnosis, cell, self.restart, buttons=settings.buttons, keeps=settings.keep_on_restart
        )
        return True

    def _show_fallout(self, diagnosis: Diagnosis) -> None:
        from .display import show_fallout

        message = diagnosis.error.message if diagnosis.error is not None else diagnosis.title
        show_fallout(self.poisoned_in_cell, message, self.poisoned_since)


def _answering_a_request(shell: InteractiveShell) -> bool:
    """Whether what is displayed now reaches a frontend: a kernel files output under the request
    it answers, and frontends drop output without one (a startup file's, before the first
    request); a shell that is not a kernel's prints it."""
    get_parent = getattr(shell, "get_parent", None)  # ipykernel's ZMQInteractiveShell
    if get_parent is None:
        return True
    try:
        parent = get_parent()
    except Exception:
        return True
    return isinstance(parent, dict) and bool(parent.get("header"))


def _fold_spec() -> tuple[str, str, str]:
    """What the tee's child needs to fold repeated device assert lines (runtime/capture.py):
    where this package is, the module that reads the lines, the command its verdict names."""
    import os

    from ..diagnosis import folding
    from ..diagnosis.advice import KERNEL
    from .display import blocking_in_force

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(folding.__file__))))
    command = KERNEL.plain_command if blocking_in_force()[0] else KERNEL.command
    return root, folding.__name__, command


def _with_context(diagnosis: Diagnosis, probe: Probe) -> Diagnosis:
    from dataclasses import replace

    context, device = probe.state, probe.device
    if diagnosis.sticky or context is not ContextState.POISONED:
        return replace(diagnosis, context=context, device=device)
    # A "harmless" error (cuBLAS not initialised, ...) in a context an earlier, unseen error broke.
    return replace(
        diagnosis,
        cause="other-sticky",
        sticky=True,
        title="The CUDA context of this kernel was already broken",
        explanation=(
            "This error is fallout: an earlier CUDA error (printed elsewhere, or caught by code) "
            "broke the context, and every CUDA call fails since."
        ),
        context=context,
        device=device,
    )


# IPython keeps no object of an extension's (its extension manager records module names) and
# hands unload only the shell: so the shell carries its extension, in this one attribute, set at
# load and removed at unload. Each shell has its own; nothing of ours is kept at module level.
_ATTRIBUTE = "_nb_cudaguard_extension"


def load_ipython_extension(shell: InteractiveShell) -> None:
    state = current_state(shell)
    if state is None:
        state = CudaGuardExtension(shell)
        setattr(shell, _ATTRIBUTE, state)
    state.load()


def unload_ipython_extension(shell: InteractiveShell) -> None:
    state = current_state(shell)
    if state is not None:
        state.unload()
        delattr(shell, _ATTRIBUTE)


def current_state(shell: InteractiveShell | None = None) -> CudaGuardExtension | None:
    """The extension loaded in ``shell`` (default: the running one), if any."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    state = getattr(shell, _ATTRIBUTE, None)
    return state if isinstance(state, CudaGuardExtension) else None


def multi_gpu_warning(namespace: dict[str, Any]) -> str:
    """Why blocking mode may hang this notebook, or "": CUDA_LAUNCH_BLOCKING=1 with DataParallel
    or NCCL can deadlock (pytorch#9163, nccl#750)."""
    from ..runtime.probe import probe_devices

    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    reasons = []
    with contextlib.suppress(Exception):
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            reasons.append("a torch.distributed process group is initialised")
    with contextlib.suppress(Exception):
        used = probe_devices(torch).used
        if len(used) > 1:
            reasons.append(
                f"it used {len(used)} GPUs (" + ", ".join(f"cuda:{i}" for i in used) + ")"
            )
    with contextlib.suppress(Exception):
        parallel = torch.nn.DataParallel
        names = [n for n, v in list(namespace.items()) if isinstance(v, parallel)]
        if names:
            reasons.append(f"`{names[0]}` is a DataParallel model")
    if not reasons:
        return ""
    return (
        f"this notebook may hang in blocking mode: {'; '.join(reasons)}. CUDA_LAUNCH_BLOCKING=1 "
        "with DataParallel or NCCL can deadlock (pytorch#9163, nccl#750); if the next run hangs, "
        "restart with `%cudaguard restart --no-blocking` and run on one GPU to find the error."
    )
