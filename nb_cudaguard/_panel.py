"""The restart actions under a diagnosis: two buttons where widgets work, the command everywhere.

Core ipywidgets only (Button, HTML, HBox, VBox), so they render in JupyterLab 4, Notebook 7,
Kaggle, VS Code and Colab's ipywidgets 7.7. Every display also carries ``text/plain`` and
``text/html`` with the equivalent command: saved notebooks, nbconvert and frontends without a widget
manager show that instead (FIELD_NOTES §5). What happens after a click is written into the widget,
not printed: VS Code often drops prints from widget callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._inject import Marker
from ._render import inline_html, note_html

BLOCKING_LABEL = "Restart with CUDA_LAUNCH_BLOCKING=1"
PLAIN_LABEL = "Restart"
COMMAND_TEXT = (
    "Restart this kernel with CUDA_LAUNCH_BLOCKING=1 (next start only) to find the true location: "
    "run `%cudaguard restart` (or `%cudaguard restart --no-blocking` for a plain restart), "
    "then re-run the notebook from the top."
)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@dataclass(frozen=True)
class CommandHint:
    """The static stand-in for the buttons."""

    text: str = COMMAND_TEXT

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        return {
            "text/plain": "nb_cudaguard: " + self.text,
            "text/html": "<div class='nb-cudaguard-restart-hint' style='font-family:sans-serif'>"
            f"{inline_html(self.text)}</div>",
        }


Restarter = Callable[..., Any]  # restart_kernel's signature: (blocking=..., after_cell=...) -> plan


class RestartActions:
    """The two buttons and a status line, wired to ``restart``."""

    def __init__(self, after_cell: int | None = None, restart: Restarter | None = None) -> None:
        import ipywidgets as widgets

        if restart is None:
            from ._restart import restart_kernel

            restart = restart_kernel
        self._restart: Restarter = restart
        self.after_cell = after_cell
        self.blocking_button = widgets.Button(
            description=BLOCKING_LABEL,
            button_style="danger",
            tooltip="New kernel process with blocking CUDA launches, for the next start only",
            layout=widgets.Layout(width="auto"),
        )
        self.plain_button = widgets.Button(
            description=PLAIN_LABEL,
            tooltip="New kernel process with the normal environment",
            layout=widgets.Layout(width="auto"),
        )
        self.status = widgets.HTML(
            value="<span style='font-family:sans-serif'>Only a new kernel process fixes a broken "
            "CUDA context. All variables will be lost.</span>"
        )
        self.blocking_button.on_click(self._clicked)
        self.plain_button.on_click(self._clicked)
        self.widget = widgets.VBox(
            [widgets.HBox([self.blocking_button, self.plain_button]), self.status]
        )

    def _say(self, text: str, color: str = "#b71c1c") -> None:
        self.status.value = (
            f"<div style='font-family:sans-serif;font-weight:bold;color:{color}'>"
            f"{inline_html(text)}</div>"
        )

    def _clicked(self, button: Any) -> None:
        blocking = button is self.blocking_button
        self.blocking_button.disabled = self.plain_button.disabled = True
        self._say("Restarting this kernel... when it is back, re-run the notebook from the top.")
        try:
            plan = self._restart(blocking=blocking, after_cell=self.after_cell)
        except Exception as error:
            self.blocking_button.disabled = self.plain_button.disabled = False
            self._say(
                f"Could not restart from here ({error}). Use the Kernel menu's restart; "
                "for blocking mode make `import os; os.environ['CUDA_LAUNCH_BLOCKING'] = '1'` the "
                "first line of the first cell.",
                color="#e65100",
            )
            return
        self._say(plan.describe(blocking))

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        hint = CommandHint()._repr_mimebundle_()
        # Widget view where a widget manager exists, the command where not (ipywidgets 7 and 8
        # both use view format 2.0).
        return {
            **hint,
            WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id},
        }


def restart_actions(after_cell: int | None = None) -> RestartActions | CommandHint | None:
    """The buttons in a kernel with ipywidgets; otherwise the command; nothing in a terminal,
    where there is no kernel to restart (the panel already says how to start over)."""
    from ._environment import Environment, detect

    if detect() is Environment.TERMINAL:
        return None
    try:
        return RestartActions(after_cell)
    except Exception:  # no ipywidgets, or no comm support: the command still works
        return CommandHint()


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
            "text/html": note_html("nb-cudaguard-banner", "#1565c0", text),
        }


_banner_shown: list[bool] = []


def on_load() -> None:
    """At extension load: the blocking-mode banner (once per process); and watch torch's CUDA
    start, so that ``%cudaguard status`` can tell whether the variable came in time."""
    from ._inject import marker
    from ._status import watch_cuda_init

    watch_cuda_init()
    found = marker()
    if found is None or _banner_shown:
        return
    _banner_shown.append(True)
    from IPython.display import display

    display(Banner(found))
