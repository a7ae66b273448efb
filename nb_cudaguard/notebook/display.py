"""Put a diagnosis in front of the user: the static panel, then (where possible) the actions;
and, in a kernel that nb_cudaguard restarted in blocking mode, the banner that says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..diagnosis.model import Diagnosis
from ..diagnosis.render import Fallout, Panel
from ..diagnosis.theme import BAR_INFO, note_html
from ..runtime.blocking import Marker
from .actions import Restarter

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from .replay_glue import ReplayState


def blocking_in_force() -> tuple[bool, bool]:
    """(blocking mode is in force in this kernel, nb_cudaguard switched it on), from
    runtime/blocking.py; never initialises CUDA."""
    import sys

    from ..runtime.blocking import blocking_state, marker

    ours = marker() is not None
    torch = sys.modules.get("torch")
    initialised: bool | None = False
    if torch is not None:
        try:
            initialised = bool(torch.cuda.is_initialized())
        except Exception:
            initialised = None
    return ours or blocking_state(initialised).effective is True, ours


def show_diagnosis(
    diagnosis: Diagnosis,
    cell: int | None,
    restart: Restarter,
    device_lines: tuple[str, ...] = (),
    *,
    buttons: bool = True,
    keeps: bool = True,
) -> None:
    """The panel; under it, for a broken context, the restart actions (naming ``cell``). In a
    kernel already in blocking mode the panel says the traceback is right, and only a plain
    restart is offered. ``buttons``: widgets, or only the commands' text; ``keeps``: whether a
    restart keeps the CPU variables (``CudaGuard.buttons``, ``CudaGuard.keep_on_restart``)."""
    from IPython.display import display

    blocking_on, ours = blocking_in_force()
    display(Panel(diagnosis, blocking=blocking_on, device_lines=device_lines))
    if diagnosis.sticky:
        from .actions import restart_actions

        actions = restart_actions(
            restart,
            cell,
            blocking_on=blocking_on,
            blocking_ours=ours,
            cause_known=bool(diagnosis.evidence),  # the user's own objects name cause and fix
            buttons=buttons,
            keeps=keeps,
        )
        if actions is not None:
            display(actions)


def show_fallout(first_cell: int | None, message: str, first: Diagnosis | None = None) -> None:
    """The note under a later failure; ``first``: the diagnosis of the failure that broke the
    context, whose verdict line the note's text starts with."""
    from IPython.display import display

    from ..diagnosis.schema import verdict

    said = "" if first is None else verdict(first, blocking_in_force()[0])
    display(Fallout(first_cell, message, said))


@dataclass(frozen=True)
class Banner:
    """Shown in the kernel that nb_cudaguard started in blocking mode."""

    marker: Marker

    def text(self) -> str:
        where = (
            f"after the crash in cell [{self.marker.after_cell}] of the previous kernel"
            if self.marker.after_cell is not None
            else "by the restart from the previous kernel"
        )
        return (
            f"nb_cudaguard: blocking mode is on: CUDA_LAUNCH_BLOCKING=1 was set {where}. "
            "Every CUDA launch now waits until it finishes, so an error is raised at the line "
            "that caused it; this slows every launch. It turns itself off at the next restart."
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        text = self.text()
        return {
            "text/plain": text,
            "text/html": note_html("nb-cudaguard-banner", BAR_INFO, text),
        }


def on_load(
    shell: InteractiveShell,
    replay: ReplayState,
    restart: Restarter | None = None,
    *,
    buttons: bool = True,
    keeps: bool = True,
) -> None:
    """At extension load: the blocking-mode banner, then the replay offered (``replay``: the
    extension's, which remembers it was; ``buttons``: as widgets, or its text; ``keeps``: whether
    its restart keeps the CPU variables); and watch
    torch's CUDA start, so that ``%cudaguard status`` can tell whether the variable came in
    time."""
    from ..runtime.blocking import marker, watch_cuda_init

    watch_cuda_init()
    found = marker()
    if found is not None:
        from IPython.display import display

        display(Banner(found))
    from .replay_glue import offer_after_restart

    # After our restart: the previous kernel's cells that lead to the error, replayed on a click.
    # ``restart``: the extension's own, for the offer's blocking-restart button.
    offer_after_restart(
        shell, replay, blocking_in_force()[0], restart, buttons=buttons, keeps=keeps
    )
