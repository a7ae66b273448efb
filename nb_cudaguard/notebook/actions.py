"""The restart actions under a diagnosis: buttons where widgets work, the command everywhere.

Core ipywidgets only (Button, HTML, HBox, VBox), so they render in JupyterLab 4, Notebook 7,
Kaggle, VS Code and Colab's ipywidgets 7.7. Every display also carries ``text/plain`` and
``text/html`` with the equivalent command: saved notebooks, nbconvert and frontends without a widget
manager show that instead (FIELD_NOTES §5). What happens after a click is written into the widget,
not printed: VS Code often drops prints from widget callbacks. The panel above already says what
broke and why; nothing here repeats it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..diagnosis.render import inline_html

BLOCKING_LABEL = "Restart with CUDA_LAUNCH_BLOCKING=1"
PLAIN_LABEL = "Restart"
PLAIN_OFF_LABEL = "Restart (blocking mode off)"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LOST = "Either button starts a new kernel process: CPU variables are kept, GPU memory is not."
RERUN = "then `%load_ext nb_cudaguard` there restores the CPU variables; re-run the rest"


def command_text(blocking_on: bool) -> str:
    """The static stand-in for the buttons, as a command."""
    if blocking_on:
        return f"Restart: `%cudaguard restart --no-blocking`, {RERUN}."
    return (
        "Restart: `%cudaguard restart` (the next kernel only gets CUDA_LAUNCH_BLOCKING=1) or "
        f"`%cudaguard restart --no-blocking`, {RERUN}."
    )


# What each frontend shows while the kernel comes back, by restart method (restart/methods.py).
_EXPECT = {
    "rest": "The kernel is back in about a second and its status returns to Idle.",
    "exit": (
        "This kernel process ends and the server starts a new one within a few seconds; the "
        "notebook may say the kernel died or is restarting: that is expected."
    ),
    "kill": (
        "Colab will say the session crashed and reconnect in a few seconds: that is expected."
    ),
    "execve": ("The kernel restarts in place (same process and connection) in about a second."),
}


def after_restart_text(
    method: str, blocking: bool, blocking_kept: bool = False, warning: str = "", kept: str = ""
) -> str:
    """What the user will see after asking for a restart, and what to do then; first, a
    ``warning`` about blocking mode (several GPUs, DataParallel, a process group); last, what
    was ``kept`` for the new kernel to restore (``notebook/keep_glue.py``)."""
    expect = _EXPECT.get(method, "The kernel restarts.")
    if blocking:
        mode = (
            " It starts with CUDA_LAUNCH_BLOCKING=1 (that start only); `%load_ext nb_cudaguard` "
            "will say so."
        )
    elif blocking_kept:
        mode = (
            " CUDA_LAUNCH_BLOCKING=1 came with this kernel's start environment (kernel.json, "
            "the server's environment), so the new kernel keeps it; remove it there to turn it "
            "off."
        )
    else:
        mode = ""
    first = f"WARNING: {warning} " if warning and blocking else ""
    if kept:
        return f"{first}Restarting. {expect}{mode} {kept}"
    return f"{first}Restarting. {expect}{mode} Then re-run the notebook from the top."


@dataclass(frozen=True)
class CommandHint:
    """The static stand-in for the buttons."""

    blocking_on: bool = False

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        text = command_text(self.blocking_on)
        return {
            "text/plain": "nb_cudaguard: " + text,
            "text/html": "<div class='nb-cudaguard-restart-hint' style='font-family:sans-serif'>"
            f"{inline_html(text)}</div>",
        }


Restarter = Callable[..., Any]  # restart_kernel's signature: (blocking=..., after_cell=...) -> plan


class RestartActions:
    """The buttons and a status line, wired to ``restart``. In a kernel already in blocking mode
    only the plain restart is offered: the blocking one is the step already done."""

    def __init__(
        self,
        restart: Restarter,
        after_cell: int | None = None,
        *,
        blocking_on: bool = False,
        blocking_ours: bool = False,
    ) -> None:
        import ipywidgets as widgets

        self._restart = restart
        self.after_cell = after_cell
        self.blocking_on = blocking_on
        self.blocking_ours = blocking_ours
        self.blocking_button: Any = None  # not offered where blocking mode is already on
        self.buttons: list[Any] = []
        if not blocking_on:
            self.blocking_button = widgets.Button(
                description=BLOCKING_LABEL,
                button_style="danger",
                tooltip="A new kernel process whose CUDA launches wait for their kernels, "
                "this start only: the traceback then points at the line that failed",
                layout=widgets.Layout(width="auto"),
            )
            self.buttons.append(self.blocking_button)
        self.plain_button = widgets.Button(
            description=PLAIN_OFF_LABEL if blocking_on and blocking_ours else PLAIN_LABEL,
            button_style="danger" if blocking_on else "",
            tooltip="A new kernel process with the normal environment",
            layout=widgets.Layout(width="auto"),
        )
        self.buttons.append(self.plain_button)
        note = LOST if len(self.buttons) > 1 else LOST.replace("Either", "The")
        self.note = widgets.HTML(
            value="<span style='font-family:sans-serif;color:#555;margin-left:8px'>"
            f"{inline_html(note)}</span>"
        )
        self.status = widgets.HTML(value="")  # what happens after a click, under the buttons
        for button in self.buttons:
            button.on_click(self._clicked)
        self.widget = widgets.VBox([widgets.HBox([*self.buttons, self.note]), self.status])

    def _say(self, text: str, color: str = "#1b5e20") -> None:
        self.note.value = ""
        self.status.value = (
            f"<div style='font-family:sans-serif;font-weight:bold;color:{color};"
            f"line-height:1.4'>{inline_html(text)}</div>"
        )

    def _clicked(self, button: Any) -> None:
        blocking = button is self.blocking_button
        for each in self.buttons:
            each.disabled = True
        # The CPU variables are saved first (keep_glue): seconds for gigabytes.
        self._say("Keeping the CPU variables for the new kernel, then restarting...", "#555")
        try:
            plan = self._restart(blocking=blocking, after_cell=self.after_cell)
        except Exception as error:
            for each in self.buttons:
                each.disabled = False
            self._say(
                f"Could not restart from here ({error}). Use the Kernel menu's restart; "
                "for blocking mode make `import os; os.environ['CUDA_LAUNCH_BLOCKING'] = '1'` the "
                "first line of the first cell.",
                color="#e65100",
            )
            return
        kept = self.blocking_on and not self.blocking_ours and not blocking
        self._say(
            after_restart_text(
                plan.method.value,
                blocking,
                blocking_kept=kept,
                warning=plan.warning,
                kept=plan.kept,
            )
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        hint = CommandHint(self.blocking_on)._repr_mimebundle_()
        # Widget view where a widget manager exists, the command where not (ipywidgets 7 and 8
        # both use view format 2.0).
        return {
            **hint,
            WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id},
        }


def restart_actions(
    restart: Restarter,
    after_cell: int | None = None,
    *,
    blocking_on: bool = False,
    blocking_ours: bool = False,
) -> RestartActions | CommandHint | None:
    """The buttons in a kernel with ipywidgets; otherwise the command; nothing in a terminal,
    where there is no kernel to restart."""
    from ..restart.environment import Environment, detect

    if detect() is Environment.TERMINAL:
        return None
    try:
        return RestartActions(
            restart, after_cell, blocking_on=blocking_on, blocking_ours=blocking_ours
        )
    except Exception:  # no ipywidgets, or no comm support: the command still works
        return CommandHint(blocking_on)
