"""Put a diagnosis in front of the user: the static panel, then (where possible) the actions."""

from __future__ import annotations

from ._diagnosis import Diagnosis
from ._render import Fallout, Panel


def show_diagnosis(diagnosis: Diagnosis) -> None:
    from IPython.display import display

    display(Panel(diagnosis))
    if diagnosis.sticky:
        from ._extension import current_state
        from ._panel import restart_actions

        state = current_state()
        display(restart_actions(state.poisoned_in_cell if state is not None else None))


def show_fallout(first_cell: int | None, message: str) -> None:
    from IPython.display import display

    display(Fallout(first_cell, message))
