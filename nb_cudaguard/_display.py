"""Put a diagnosis in front of the user: the static panel, then (where possible) the actions."""

from __future__ import annotations

from ._diagnosis import Diagnosis
from ._render import Fallout, Panel


def show_diagnosis(diagnosis: Diagnosis, cell: int | None = None) -> None:
    """The panel; under it, for a broken context, the restart actions (naming ``cell``)."""
    from IPython.display import display

    display(Panel(diagnosis))
    if diagnosis.sticky:
        from ._panel import restart_actions

        actions = restart_actions(cell)
        if actions is not None:
            display(actions)


def show_fallout(first_cell: int | None, message: str) -> None:
    from IPython.display import display

    display(Fallout(first_cell, message))
