"""The %cudaguard line magic."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ..diagnosis.model import Diagnosis
    from ..restart.methods import RestartPlan
    from .config import CudaGuard
    from .keep_glue import KeepState
    from .replay_glue import ReplayState


class ExtensionState(Protocol):
    """What the commands need of the loaded extension (handed in, never looked up)."""

    @property
    def sync(self) -> bool: ...

    def set_sync(self, on: bool) -> None: ...

    def restart(self, blocking: bool = True, *, keep: bool | None = None) -> RestartPlan: ...

    @property
    def last_diagnosis(self) -> Diagnosis | None: ...

    @property
    def shell(self) -> InteractiveShell: ...

    @property
    def keep(self) -> KeepState: ...

    @property
    def replay(self) -> ReplayState: ...

    @property
    def settings(self) -> CudaGuard: ...


def _status(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..runtime.status import gather
    from .keep_glue import status_lines

    print("\n".join([gather().text(), *status_lines(state.keep)]))


def _restart(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..restart.methods import RestartError

    blocking = not args.no_blocking
    if args.keep and args.no_keep:
        raise UsageError("--keep and --no-keep exclude each other: choose one.")
    # Neither: CudaGuard.keep_on_restart decides (True unless configured off).
    keep = True if args.keep else False if args.no_keep else None
    try:
        plan = state.restart(blocking, keep=keep)
    except RestartError as error:
        raise UsageError(f"cannot restart: {error}") from None
    from .actions import after_restart_text

    text = after_restart_text(plan.method.value, blocking, warning=plan.warning, kept=plan.kept)
    print(f"nb_cudaguard: {text}", flush=True)


def _one_value(args: argparse.Namespace) -> str | None:
    if len(args.value) > 1:
        raise UsageError(f"%cudaguard {args.command} takes one value, not {len(args.value)}")
    return args.value[0] if args.value else None


def _sync(state: ExtensionState, args: argparse.Namespace) -> None:
    value = _one_value(args)
    if value not in (None, "on", "off"):
        raise UsageError(f"%cudaguard sync takes on or off, not {value!r}")
    if value is not None:
        state.set_sync(value == "on")
    print(f"nb_cudaguard: end-of-cell CUDA synchronise is {'on' if state.sync else 'off'}.")


def _repro(state: ExtensionState, args: argparse.Namespace) -> None:
    import sys
    from pathlib import Path

    from ..diagnosis.evidence import frames_of
    from ..diagnosis.repro import replay_script

    diagnosis = state.last_diagnosis
    if diagnosis is None:
        raise UsageError("no CUDA error has been diagnosed in this kernel yet")
    path = Path(_one_value(args) or "nb_cudaguard_repro.py")
    error = getattr(sys, "last_value", None)  # IPython keeps the last traceback's exception
    replay = replay_script(
        diagnosis,
        frames=frames_of(error) if isinstance(error, BaseException) else (),
        namespace=state.shell.user_ns,
        name=path.name,
    )
    if replay is None:
        raise UsageError(
            f"no replay for this error ({diagnosis.cause}): no CPU tensor with the bad value was "
            "found (the batch before `.to(device)`, the labels, the ids)"
        )
    try:
        path.write_text(replay.script, encoding="utf-8")
    except OSError as error_writing:
        raise UsageError(f"cannot write {path}: {error_writing}") from None
    print(
        f"nb_cudaguard: wrote {path}: it replays {replay.op} on CPU. Run `python {path}` "
        f"(expect {replay.expected}), or on a GPU: `REPRO_DEVICE=cuda CUDA_LAUNCH_BLOCKING=1 "
        f"python {path}`."
    )


def _replay(state: ExtensionState, args: argparse.Namespace) -> None:
    from .display import blocking_in_force
    from .replay_glue import replay_command

    replay_command(
        state.shell,
        state.replay,
        yes=args.yes,
        blocking_on=blocking_in_force()[0],
        restart=state.restart,
        buttons=state.settings.buttons,
        keeps=state.settings.keep_on_restart,
    )


def _restore(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..keep.store import NotKept, StoreError
    from .keep_glue import discard, not_kept_text, restore, where_kept

    shell = state.shell
    connection, profile = where_kept(shell)
    if args.discard:
        if args.value or args.force:
            raise UsageError("%cudaguard restore --discard deletes everything kept: no NAME")
        print(f"nb_cudaguard: {discard(connection, profile, state.keep)}")
        return
    try:
        text = restore(
            shell, connection, profile, args.value or None, force=args.force, keep=state.keep
        )
    except StoreError as error:
        raise UsageError(f"nothing to restore: {error}") from None
    except NotKept as error:
        raise UsageError(not_kept_text(error)) from None
    print(f"nb_cudaguard: {text}")


def _keep(state: ExtensionState, args: argparse.Namespace) -> None:
    from ..keep.snapshot import NotSnapshottable
    from .keep_glue import keep_command

    def is_poisoned() -> bool:
        return getattr(state, "poisoned_since", None) is not None

    try:
        print(
            keep_command(state.shell, state.keep, is_poisoned, list(args.value), args.stop, state)
        )
    except NotSnapshottable as error:
        raise UsageError(str(error)) from None


# One entry per subcommand: adding a command is adding an entry.
COMMANDS: dict[str, Callable[[ExtensionState, argparse.Namespace], None]] = {
    "status": _status,
    "restart": _restart,
    "sync": _sync,
    "repro": _repro,
    "replay": _replay,
    "restore": _restore,
    "keep": _keep,
}
# The flags each command takes (a flag given to another command is a UsageError).
FLAGS = {
    "no_blocking": "restart",
    "no_keep": "restart",
    "keep": "restart",
    "discard": "restore",
    "force": "restore",
    "stop": "keep",
    "yes": "replay",
}


LISTING = """\
%cudaguard commands (`%cudaguard?` for the manual):
  %cudaguard status                 torch and CUDA state: is the context healthy, is blocking on
  %cudaguard restart                a new kernel, with CUDA_LAUNCH_BLOCKING=1 for that start only
  %cudaguard restart --no-blocking  a plain new kernel
  %cudaguard restart --no-keep      ... without keeping the CPU variables for the new kernel
  %cudaguard restart --keep         ... keeping them where CudaGuard.keep_on_restart is False
  %cudaguard restore [NAME ...]     put back what the previous process kept (all, or NAMEs)
  %cudaguard restore --force        ... also over names this kernel has defined again
  %cudaguard keep NAME ...          CPU snapshots of GPU objects after each cell (--stop ends)
  %cudaguard sync on|off            wait for each cell's GPU work at its end (errors surface there)
  %cudaguard repro [PATH]           write a script that replays the failing op on CPU
  %cudaguard replay [--yes]         after our restart: re-run the cells the failing one needs"""


@magics_class
class CudaGuardMagics(Magics):
    def __init__(self, shell: InteractiveShell, state: ExtensionState) -> None:
        super().__init__(shell)
        self.state = state

    @magic_arguments()
    @argument(
        "command",
        nargs="?",
        choices=list(COMMANDS),
        help="status: torch and CUDA state of this kernel, whether its CUDA context is healthy, "
        "and whether CUDA_LAUNCH_BLOCKING is set and effective. "
        "restart: a new kernel process, with CUDA_LAUNCH_BLOCKING=1 for that one start. "
        "sync on|off: synchronise CUDA at the end of every cell, so an asynchronous error "
        "surfaces in the cell that launched it (off by default: it waits for the GPU after "
        "every cell). "
        "repro [PATH]: write a script that replays the failing operation on CPU with the "
        "inputs found in this kernel (default PATH: nb_cudaguard_repro.py). "
        "replay: in the kernel nb_cudaguard restarted, list the previous kernel's cells needed "
        "to rebuild what the failing cell uses and is missing now, then that cell (each with "
        "its whole code, flagged where it runs shell commands, installs, writes files or to "
        "the network, or ran long), and ask; with --yes, run them (stopping at the first "
        "error, which fails this cell too). "
        "restore [NAME ...]: put back what the previous process of this kernel kept at the "
        "restart (all, or the NAMEs, each with the names it shares objects or memory with); a "
        "name this kernel has defined again is left as it is (--force replaces it); files are "
        "deleted once restored. "
        "keep NAME ...: copy these GPU objects' state (a module, an optimizer, tensors) to CPU "
        "buffers at the end of every successful cell, so that the restart after a CUDA error "
        "keeps the last good copy; without NAME, list them and their cost.",
    )
    @argument(
        "value",
        nargs="*",
        help="for sync: on or off; for repro: the script's PATH; for restore and keep: NAMEs",
    )
    @argument(
        "--no-blocking",
        action="store_true",
        help="restart: a plain restart, without CUDA_LAUNCH_BLOCKING=1.",
    )
    @argument(
        "--yes",
        action="store_true",
        help="replay: run the cells without asking.",
    )
    @argument(
        "--no-keep",
        action="store_true",
        help="restart: do not save the CPU variables for the new kernel (they are by default, "
        "unless CudaGuard.keep_on_restart is False).",
    )
    @argument(
        "--keep",
        action="store_true",
        help="restart: save the CPU variables for the new kernel even where "
        "CudaGuard.keep_on_restart is False.",
    )
    @argument("--discard", action="store_true", help="restore: delete what was kept instead.")
    @argument(
        "--force",
        action="store_true",
        help="restore: put the kept values back over names this kernel has defined again.",
    )
    @argument(
        "--stop",
        action="store_true",
        help="keep: stop the snapshots (of NAMEs, or all) and free the buffers no other name uses.",
    )
    @line_magic
    def cudaguard(self, line: str) -> None:
        """Inspect and repair this kernel's CUDA state.

        Usage::

            %cudaguard                        # lists the commands
            %cudaguard status
            %cudaguard restart                # next kernel starts with CUDA_LAUNCH_BLOCKING=1
            %cudaguard restart --no-blocking  # plain restart
            %cudaguard sync on                # errors surface in the cell that launched them
            %cudaguard sync off
            %cudaguard repro [PATH]           # the failing op, replayed on CPU, as a script
            %cudaguard replay                 # after our restart: the cells to re-run, and ask
            %cudaguard replay --yes           # ... and run them
            %cudaguard restart --no-keep      # do not keep the CPU variables
            %cudaguard restart --keep         # keep them (CudaGuard.keep_on_restart = False)
            %cudaguard restore                # in the new kernel: everything kept
            %cudaguard restore df tokenizer   # ... or these names (and what shares with them)
            %cudaguard restore --force labels # ... over the `labels` made again in this kernel
            %cudaguard restore --discard      # delete what was kept
            %cudaguard keep model optimizer   # CPU snapshots after each successful cell
            %cudaguard keep --stop            # no more snapshots (their buffers freed)

        After a restart all variables are gone. nb_cudaguard's own restart keeps the list of
        the kernel's cells for its next process: ``%cudaguard replay`` (also offered, with a
        button, at the first cell there) re-runs only the cells that rebuild what the failing
        cell uses and the namespace lacks, in their order, then the failing cell, and
        stops at the first error (``--yes`` then fails its own cell, so Run All stops); in
        blocking mode that traceback points at the line that failed. The cells are found from
        their text: a cell whose effect cannot be known (``exec``, ``globals()``, a star import,
        ``%run``) is included, and the list says why. What the namespace has (restored, or made
        again here) stays: a replayed cell that binds it anew gets it put back after it; a
        restored value that already has a replayed cell's change (the failing cell's
        ``history.append``, ``labels -= 1``) is built again from the earlier cells, and the list
        says so (or, where no cell builds it, that it changes twice). After a seed, cells that
        drew random numbers run again so later draws match; without a seed the list says the
        draws differ. Each cell's whole code is shown, with what it does beyond Python.

        Every restart we do keeps the CPU variables first (unless ``CudaGuard.keep_on_restart``
        is False: ``%config CudaGuard``, docs/configuration.md), each on its own: GPU tensors,
        open files, generators, locks, sockets and anything over the size cap are listed as not
        kept, with the reason; modules are imported again. Variables that share objects or
        memory (an optimizer and its model, a scheduler and its optimizer, a tensor made by
        ``torch.from_numpy`` and its array, a view and its base) are written together, each
        byte once, and come back together and still sharing: restoring one restores the others.
        A name this kernel has defined again is not overwritten without ``--force``; the output
        says which were left. The new kernel, which our restart starts with nb_cudaguard
        loaded, offers them at its first cell with a Restore button. Files are private to you
        and to this kernel, deleted once restored or when the kernel is shut down (not by our
        own restart), and expire after a day; a save that fails never deletes what an earlier
        restart kept.
        """
        # Intermixed: `restore --force labels` as well as `restore labels --force`.
        args = self.cudaguard.parser.parse_intermixed_args(arg_split(line))
        flags = [flag for flag in FLAGS if getattr(args, flag)]
        if args.command is None:
            if args.value or flags:
                raise UsageError("%cudaguard: name a command first: " + ", ".join(COMMANDS))
            print(LISTING)
            return
        if args.value and args.command not in ("sync", "repro", "restore", "keep"):
            raise UsageError(
                f"%cudaguard {args.command} takes no {' '.join(args.value)!r}: only sync "
                "(on|off), repro (PATH), restore and keep (NAMEs) take values"
            )
        for flag in flags:
            if FLAGS[flag] != args.command:
                option = "--" + flag.replace("_", "-")
                raise UsageError(
                    f"%cudaguard {args.command} takes no {option}: it goes with {FLAGS[flag]} only"
                )
        COMMANDS[args.command](self.state, args)
