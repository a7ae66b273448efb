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

from ..diagnosis.render import inline_html

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

    def __init__(self, restart: Restarter, after_cell: int | None = None) -> None:
        import ipywidgets as widgets

        self._restart = restart
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


def restart_actions(
    restart: Restarter, after_cell: int | None = None
) -> RestartActions | CommandHint | None:
    """The buttons in a kernel with ipywidgets; otherwise the command; nothing in a terminal,
    where there is no kernel to restart (the panel already says how to start over)."""
    from ..restart.environment import Environment, detect

    if detect() is Environment.TERMINAL:
        return None
    try:
        return RestartActions(restart, after_cell)
    except Exception:  # no ipywidgets, or no comm support: the command still works
        return CommandHint()
