"""Keep and restore across our restarts, and snapshots of GPU objects: the IPython side of keep/.

- ``keep_before_restart``: called by every restart we do (button, ``%cudaguard restart``,
  ``restart_kernel()``) before the restart is scheduled; saves the namespace's CPU state
  (``keep.store``) and returns the sentence the restart message ends with. It never raises and
  never waits longer than the store's deadline: nothing of ours may stand between a broken
  kernel and its cure.
- ``offer_restore``: at the extension's load in the new process (our restart loads it there; it
  shows at the first cell), what was kept (names,
  types, sizes, what was not kept and why) with a Restore button (text + HTML saying the command
  where widgets do not render, as ``actions.py`` does).
- ``%cudaguard restore [NAME ...]``, ``%cudaguard keep [NAME ...]``: the commands
  (``cudaguard_magic.py``).
- Snapshots: a ``post_run_cell`` hook, registered while a name is kept and removed on unload.

What one shell holds (the offers shown, the snapshot hook) is a ``KeepState``, owned by the
extension object and handed in.
"""

from __future__ import annotations

import contextlib
import html
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..diagnosis.render import TEXT_ERROR
from ..keep.select import human_size
from ..keep.snapshot import NotSnapshottable, Snapshots
from ..keep.store import Manifest, StoreError
from ..keep.text import count, kept_sentence, offer_text, restored_text
from ..keep.text import not_kept_text as not_kept_text  # the magic's, with the others here
from .actions import button_row, does_note, listing, live_bundle, status_html
from .cell_output import into_cell, showing_cell

if TYPE_CHECKING:
    from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

    from ..replay.record import Recorder

RESTORE_LABEL = "Restore"
DISCARD_LABEL = "Discard"
DOES_RESTORE = "Restore: puts every kept variable back into this kernel."
DOES_DISCARD = "Discard: deletes what was kept."


def where_kept(shell: InteractiveShell) -> tuple[str | None, tuple[str, str] | None]:
    """(this kernel's connection file, its IPython profile (location, startup dir)), as
    ``extension.kernel_connection`` and ``extension.profile_dirs`` find them (that module
    imports this one, so it is not imported back)."""
    from ..restart.environment import running_kernel_connection

    profile = getattr(shell, "profile_dir", None)
    dirs = None if profile is None else (str(profile.location), str(profile.startup_dir))
    if getattr(shell, "kernel", None) is None:
        return None, dirs
    return running_kernel_connection(), dirs


# --- keep ----------------------------------------------------------------------------------------


def keep_before_restart(
    shell: InteractiveShell,
    connection: str | None,
    profile: tuple[str, str] | None,
    snapshots: SnapshotHook | None = None,
) -> str:
    """Save this kernel's CPU state for its next process (GPU objects from ``snapshots``, the
    extension's snapshot hook, where it has one); the sentence for the restart message ("" where
    there is no kernel, or nothing to say)."""
    if connection is None or profile is None:
        return ""
    try:
        from ..keep import store

        substitutes: dict[Any, Any] = {}
        notes: dict[str, str] = {}
        missing: dict[str, str] = {}
        fallbacks = {}
        if snapshots is not None:
            substitutes, notes, missing = snapshots.snapshots.for_keep()
            # An object with nothing on a GPU is written as it is now, not from its snapshot.
            on_gpu = {n for n in {*notes, *missing} if _on_gpu(shell.user_ns.get(n))}
            notes = {n: v for n, v in notes.items() if n in on_gpu}
            missing = {n: v for n, v in missing.items() if n in on_gpu}
            for name in notes:
                fallbacks[name] = _state_dict_of(shell.user_ns, name)
        manifest = store.save(
            shell.user_ns,
            profile[0],
            connection,
            store.SaveOptions(
                hidden=getattr(shell, "user_ns_hidden", {}),
                substitutes=substitutes,
                notes=notes,
                fallbacks=fallbacks,
                why_not={n: f"holds GPU memory, and {why}" for n, why in missing.items()},
            ),
        )
        if manifest.kept:
            from ..keep.lifetime import watch

            watch(profile[0])  # gone with the kernel
    except BaseException as error:  # the restart goes on, whatever happened here
        why = f"{type(error).__name__}: {error}"
        return f"Nothing was kept ({why}).{_earlier_still(connection, profile)}"
    return kept_sentence(manifest)


def _earlier_still(connection: str, profile: tuple[str, str]) -> str:
    """After a save that failed: what an earlier restart kept, there still for the new kernel."""
    from ..keep import store

    try:
        manifest = store.read_manifest(profile[0], connection)
    except Exception:
        return ""
    if manifest is None or not manifest.kept:
        return ""
    return (
        f" What an earlier restart kept is still there for the new kernel "
        f"({count(len(manifest.kept))}, {human_size(manifest.size)})."
    )


def _on_gpu(value: Any) -> bool:
    from ..keep.snapshot import tensors_of

    try:
        return any(t.device.type != "cpu" for t in tensors_of(value))
    except Exception:
        return False


def _state_dict_of(namespace: dict[str, Any], name: str) -> Any:
    def fallback() -> tuple[str, Any]:
        return f"{name}_state_dict", namespace[name].state_dict()

    return fallback


# --- restore -------------------------------------------------------------------------------------


def offer_restore(
    shell: InteractiveShell,
    connection: str | None,
    profile: tuple[str, str] | None,
    keep: KeepState,
    buttons: bool = True,
) -> None:
    """At load: show what the previous process kept, with the Restore button (``keep``: the
    extension's, which disables the offer's buttons once nothing is left; without ``buttons``,
    the text with the command)."""
    if connection is None or profile is None:
        return
    from IPython.display import display

    from ..keep import store

    try:
        store.remove_expired(profile[0])  # leftovers of kernels that never came back
        manifest = store.read_manifest(profile[0], connection)
    except StoreError as error:
        display(_Note(f"what the previous process of this kernel kept cannot be used: {error}."))
        return
    if manifest is None:
        return
    store.remove_unlisted(profile[0], connection, manifest)
    if not manifest.kept:
        if not manifest.restored:  # only reasons: said at the restart already
            store.discard_keep(profile[0], connection)
        return
    display(restore_offer(shell, connection, profile, manifest, keep, buttons))


def _pre_html(text: str, css: str) -> str:
    return (
        f"<div class='{css}' style='font-family:sans-serif'><pre style='margin:0'>"
        f"{html.escape(text)}</pre></div>"
    )


class _Note:
    def __init__(self, text: str) -> None:
        self.text = f"nb_cudaguard: {text}"

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {"text/plain": self.text, "text/html": _pre_html(self.text, "nb-cudaguard-keep")}


class RestoreOffer:
    """What was kept, the Restore and Discard buttons with a sentence on what each does, and a
    status line under them. Restore is the one primary button of a new kernel's offers (there
    is something to restore wherever this offer is shown); the replay's are secondary."""

    def __init__(
        self,
        shell: InteractiveShell,
        connection: str,
        profile: tuple[str, str],
        manifest: Manifest,
        keep: KeepState,
    ) -> None:
        import ipywidgets as widgets

        self.shell, self.connection, self.profile = shell, connection, profile
        self.keep = keep
        self.text = offer_text(manifest)
        self.restore_button = widgets.Button(
            description=RESTORE_LABEL,
            button_style="success",
            tooltip=DOES_RESTORE,
            layout=widgets.Layout(width="auto"),
        )
        self.discard_button = widgets.Button(
            description=DISCARD_LABEL,
            tooltip=DOES_DISCARD,
            layout=widgets.Layout(width="auto"),
        )
        self.note = does_note([DOES_RESTORE, DOES_DISCARD])
        self.status = widgets.HTML(value="")
        self.cell = showing_cell(shell)  # what a click says goes to its real outputs too
        self.restore_button.on_click(self._restore)
        self.discard_button.on_click(self._discard)
        self.widget = widgets.VBox(
            [
                listing(_pre_html(self.text, "nb-cudaguard-keep")),
                button_row([self.restore_button, self.discard_button]),
                self.note,
                self.status,
            ]
        )

    def _say(self, text: str, color: str = "inherit") -> None:
        self.note.value = ""  # the buttons are done with: what happened replaces what they do
        self.status.value = status_html(text, color)

    def _restore(self, _button: Any) -> None:
        self.disable()
        try:
            text = restore(self.shell, self.connection, self.profile, keep=self.keep)
            self._say(text)
        except Exception as error:
            text = f"Could not restore: {error}"
            self._say(text, color=TEXT_ERROR)
        self._keep_in_cell(text)

    def _discard(self, _button: Any) -> None:
        self.disable()
        text = discard(self.connection, self.profile, self.keep)
        self._say(text)
        self._keep_in_cell(text)

    def _keep_in_cell(self, text: str) -> None:
        """What the click did, also as a real output of the cell that showed the offer: the
        status line lives in the widget, which a saved or converted notebook does not hold."""
        if self.cell is None:
            return
        from IPython.display import display

        with into_cell(self.shell, self.cell):
            display(_Note(text.removeprefix("nb_cudaguard: ")))

    def disable(self) -> None:
        self.restore_button.disabled = self.discard_button.disabled = True

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        static = {"text/plain": self.text, "text/html": _pre_html(self.text, "nb-cudaguard-keep")}
        return live_bundle(static, self.widget)


@dataclass
class KeepState:
    """What keep and restore hold in one shell, owned by the extension object: the offers shown,
    whose buttons are disabled once nothing is left to restore (a restore or a discard, by a
    button or a command), so that none restores over what is there; the snapshot hook."""

    offers: list[RestoreOffer] = field(default_factory=list)
    snapshots: SnapshotHook | None = None
    # The extension's record of what each cell did: told what a restore put back, so that a
    # replay can tell what the user changed since (None: no recorder, nothing to tell).
    recorder: Recorder | None = None

    def settle_offers(self, text: str) -> None:
        offers, self.offers = self.offers, []
        for offer in offers:
            with contextlib.suppress(Exception):  # a closed comm: nothing to update
                if not offer.restore_button.disabled:
                    offer.disable()
                    offer._say(text)

    def close(self) -> None:
        """At unload: the offers are forgotten, the snapshot hook goes, and its buffers."""
        self.offers = []
        if self.snapshots is not None:
            self.snapshots.close()
            self.snapshots = None


def restore_offer(
    shell: InteractiveShell,
    connection: str,
    profile: tuple[str, str],
    manifest: Manifest,
    keep: KeepState,
    buttons: bool = True,
) -> RestoreOffer | _Note:
    if not buttons:
        return _Note(offer_text(manifest).removeprefix("nb_cudaguard: "))
    try:
        offer = RestoreOffer(shell, connection, profile, manifest, keep)
    except Exception:  # no ipywidgets, or no comm support: the command still works
        return _Note(offer_text(manifest).removeprefix("nb_cudaguard: "))
    keep.offers.append(offer)
    return offer


def restore(
    shell: InteractiveShell,
    connection: str | None,
    profile: tuple[str, str] | None,
    names: Iterable[str] | None = None,
    force: bool = False,
    keep: KeepState | None = None,
) -> str:
    """Put what was kept (all, or ``names`` and what shares state with them) into the namespace,
    leaving the names defined here again as they are unless ``force``; the sentence saying what
    came back, what not, and what to do with GPU snapshots (``keep``: whose offers are settled
    once everything is back). Raises ``StoreError`` / ``store.NotKept``."""
    if connection is None or profile is None:
        raise StoreError("this is not a Jupyter kernel: nothing is kept here")
    from ..keep import store

    started = time.perf_counter()
    done = store.restore(shell.user_ns, profile[0], connection, names, force=force)
    text = restored_text(done, time.perf_counter() - started)
    if keep is not None and keep.recorder is not None:
        with contextlib.suppress(Exception):  # bookkeeping: never a failed restore
            keep.recorder.put_back([k.name for k in done.restored], shell.user_ns)
    if keep is not None and not done.remaining:
        keep.settle_offers(text)
    return text


def restored_names(
    shell: InteractiveShell,
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The names restores have put back into this kernel from what its previous process kept,
    in order (the keep's record; empty where there is none): what a replay must not build
    again; of those, the ones kept at the restart, after the failing cell (not a
    ``%cudaguard keep`` snapshot, taken after the last cell that succeeded); and the ones that
    held a tensor autograd computed, which came back a leaf, without its graph."""
    from ..keep import store

    connection, profile = where_kept(shell)
    if connection is None or profile is None:
        return (), (), ()
    try:
        manifest = store.read_manifest(profile[0], connection)
    except Exception:
        return (), (), ()
    if manifest is None:
        return (), (), ()
    restored = manifest.restored
    return (
        tuple(k.name for k in restored),
        tuple(k.name for k in restored if k.kind != "snapshot"),
        tuple(k.name for k in restored if k.graph),
    )


def discard(
    connection: str | None, profile: tuple[str, str] | None, keep: KeepState | None = None
) -> str:
    if connection is None or profile is None:
        return "Nothing is kept here."
    from ..keep import store

    store.discard_keep(profile[0], connection)  # in the profile and in RAM
    text = "Deleted what the previous process kept."
    if keep is not None:
        keep.settle_offers(text)
    return text


# --- snapshots -----------------------------------------------------------------------------------


class SnapshotHook:
    """The ``post_run_cell`` hook that takes the snapshots, owned per shell."""

    def __init__(self, shell: InteractiveShell, is_poisoned: Any, hooks: Any) -> None:
        self.shell = shell
        self.snapshots = Snapshots()
        self.is_poisoned = is_poisoned
        # The extension object, which owns every hook: it runs ours after each cell.
        self.hooks = hooks
        self.registered = False
        # CudaGuard.keep: names taken up after the first successful cell that binds each to
        # something holding tensors (a profile names them before any cell has run).
        self.configured: tuple[str, ...] = ()
        self.from_configuration: set[str] = set()

    def post_run_cell(self, result: ExecutionResult | None = None) -> None:
        if result is None or getattr(result, "error_in_exec", None) is not None:
            return
        if getattr(result, "error_before_exec", None) is not None:
            return
        with contextlib.suppress(BaseException):  # never break the notebook
            if self.is_poisoned():
                return  # GPU memory can no longer be read: the last good snapshot stays
            self._take_up_configured()
            self.snapshots.after_cell(self.shell.user_ns, result.execution_count)

    def keep(self, names: Iterable[str]) -> None:
        for name in names:
            if name not in self.shell.user_ns:
                raise KeyError(name)
            self.snapshots.add(name, self.shell.user_ns[name])
            self.from_configuration.discard(name)  # named by the command as well
        self._hook_while_needed()

    def configure(self, names: Iterable[str]) -> None:
        """``CudaGuard.keep``: snapshot ``names`` from now on; names it listed before and no
        longer does stop, unless ``%cudaguard keep`` named them too."""
        wanted = tuple(dict.fromkeys(names))
        dropped = [n for n in self.from_configuration if n not in wanted]
        self.from_configuration -= set(dropped)
        for name in dropped:
            self.snapshots.remove(name, self.shell.user_ns)
        self.configured = wanted
        self._hook_while_needed()

    def _take_up_configured(self) -> None:
        for name in self.configured:
            if name in self.snapshots.names or name not in self.shell.user_ns:
                continue
            with contextlib.suppress(NotSnapshottable):  # no tensors yet: the next cell again
                self.snapshots.add(name, self.shell.user_ns[name])
                self.from_configuration.add(name)

    def stop(self, names: Iterable[str] | None = None) -> None:
        stopped = list(self.snapshots.names) if names is None else list(names)
        # The command wins over the configuration for this session.
        self.configured = (
            () if names is None else tuple(n for n in self.configured if n not in stopped)
        )
        for name in stopped:
            self.snapshots.remove(name, self.shell.user_ns)
            self.from_configuration.discard(name)
        self._hook_while_needed()

    def _hook_while_needed(self) -> None:
        if self.snapshots.names or self.configured:
            if not self.registered:
                self.hooks.add_cell_hook(self.post_run_cell)
                self.registered = True
        else:
            self.close()

    def waiting(self) -> list[str]:
        """The configured names not snapshotted yet, for the status."""
        return [n for n in self.configured if n not in self.snapshots.names]

    def close(self) -> None:
        if self.registered:
            self.hooks.remove_cell_hook(self.post_run_cell)
            self.registered = False


def status_lines(keep: KeepState) -> list[str]:
    if keep.snapshots is None:
        return []
    return keep.snapshots.snapshots.status() + _waiting_line(keep.snapshots)


def _waiting_line(hook: SnapshotHook) -> list[str]:
    waiting = hook.waiting()
    if not waiting:
        return []
    names = ", ".join(f"`{n}`" for n in waiting)
    return [
        f"CudaGuard.keep also names {names}: copied from the first successful cell that binds "
        "each to something holding tensors."
    ]


def snapshot_configured(
    shell: InteractiveShell, keep: KeepState, is_poisoned: Any, names: list[str], hooks: Any
) -> None:
    """``CudaGuard.keep``: snapshot ``names`` as ``%cudaguard keep`` would, each once defined
    (``hooks``: the extension object, which runs the snapshot hook after each cell)."""
    if keep.snapshots is None:
        if not names:
            return
        keep.snapshots = SnapshotHook(shell, is_poisoned, hooks)
    keep.snapshots.configure(names)


def keep_command(
    shell: InteractiveShell,
    keep: KeepState,
    is_poisoned: Any,
    names: list[str],
    stop: bool,
    hooks: Any,
) -> str:
    """``%cudaguard keep [NAME ...] [--stop]``: start or stop snapshots; list them. ``hooks``:
    the extension object, which runs the snapshot hook after each cell."""
    if keep.snapshots is None:
        keep.snapshots = SnapshotHook(shell, is_poisoned, hooks)
    hook = keep.snapshots
    if stop:
        hook.stop(names or None)
    elif names:
        try:
            hook.keep(names)
        except KeyError as error:
            raise NotSnapshottable(f"`{error.args[0]}` is not defined") from None
    lines = hook.snapshots.status() + _waiting_line(hook)
    if not lines:
        return "nb_cudaguard: no snapshots (`%cudaguard keep NAME ...` starts them)."
    if names and not stop:
        lines.append(
            "A CPU copy is taken at the end of each successful cell; after a CUDA error the last "
            "good one is kept at the restart and restored on the CPU."
        )
    return "nb_cudaguard: " + "\n".join(lines)
