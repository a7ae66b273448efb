"""The restart actions under a diagnosis: buttons where widgets work, the command everywhere.

Core ipywidgets only (Button, HTML, HBox, VBox), so they render in JupyterLab 4, Notebook 7,
Kaggle, VS Code and Colab's ipywidgets 7.7. Every display also carries ``text/plain`` and
``text/html`` with the equivalent command: saved notebooks, nbconvert and frontends without a widget
manager show that instead (docs/panel.md#buttons-live-text-when-saved). What happens after a
click is written into the widget, not printed: VS Code often drops prints from widget callbacks.
The panel above already says what broke and why; nothing here repeats it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..diagnosis.theme import TEXT_ERROR, TEXT_QUIET, inline_html
from ..server_extension.live_views import MARK, MARK_VALUE
from ..server_extension.live_views import WIDGET_VIEW_MIME as WIDGET_MIME

BLOCKING_LABEL = "Restart with CUDA_LAUNCH_BLOCKING=1"
BLOCKING_REPLAY_LABEL = "Restart with CUDA_LAUNCH_BLOCKING=1, then replay"
PLAIN_LABEL = "Restart"
PLAIN_OFF_LABEL = "Restart (blocking mode off)"
PRIMARY_STYLE = "danger"  # the one primary restart under a failure: the context is broken
# What the next kernel does: our restart loads the extension there (restart/injection.py), which
# only lists what was kept and offers it back, at the first cell; the values return on the
# Restore button or `%cudaguard restore` (keep_glue.offer_restore).
RERUN = (
    "then the new kernel lists the kept CPU variables at its first cell and "
    "`%cudaguard restore` puts them back; re-run the rest"
)
# One sentence per button, saying what it does (the primary one first).
DOES_PLAIN_FIX = (
    "Restart: a new kernel with your CPU variables kept (GPU memory is not); apply the fix above, "
    "then re-run the failing cell."
)
DOES_PLAIN = "Restart: a new kernel with your CPU variables kept (GPU memory is not)."
DOES_BLOCKING = (
    "Restart with CUDA_LAUNCH_BLOCKING=1: a new kernel whose CUDA launches wait for their kernels "
    "(slower, that start only), so re-running shows the line that failed; CPU variables kept."
)
# The same where CudaGuard.keep_on_restart is False: nothing is kept for the new kernel.
RERUN_UNKEPT = "then re-run the notebook from the top (CudaGuard.keep_on_restart is off)"
DOES_PLAIN_FIX_UNKEPT = (
    "Restart: a new kernel, without your variables (CudaGuard.keep_on_restart is off); apply "
    "the fix above, then re-run the notebook."
)
DOES_PLAIN_UNKEPT = (
    "Restart: a new kernel, without your variables (CudaGuard.keep_on_restart is off)."
)
DOES_BLOCKING_UNKEPT = (
    "Restart with CUDA_LAUNCH_BLOCKING=1: a new kernel whose CUDA launches wait for their kernels "
    "(slower, that start only), so re-running shows the line that failed."
)
DOES_BLOCKING_REPLAY = (
    "Restart with CUDA_LAUNCH_BLOCKING=1, then replay: a new kernel in blocking mode (CPU "
    "variables kept) that offers the replay again; its traceback points at the line that failed."
)
DOES_BLOCKING_REPLAY_UNKEPT = (
    "Restart with CUDA_LAUNCH_BLOCKING=1, then replay: a new kernel in blocking mode (without "
    "your variables: CudaGuard.keep_on_restart is off) that offers the replay again; its "
    "traceback points at the line that failed."
)


def primary_is_plain(cause_known: bool, blocking_on: bool) -> bool:
    """Which restart the panel puts first. Where the panel named the cause and its fix from the
    user's own objects, the next step is a plain restart that keeps the variables, then the
    fix: blocking mode would only cost time. Where the line is unknown, blocking mode finds it.
    In a kernel already in blocking mode the plain restart is the only one."""
    return cause_known or blocking_on


def command_text(blocking_on: bool, cause_known: bool = False, keeps: bool = True) -> str:
    """The static stand-in for the buttons, as a command, the primary one first (``keeps``:
    whether a restart keeps the CPU variables, ``CudaGuard.keep_on_restart``)."""
    rerun = RERUN if keeps else RERUN_UNKEPT
    if blocking_on:
        return f"Restart: `%cudaguard restart --no-blocking`, {rerun}."
    if cause_known:
        then = "keeps the CPU variables; then apply" if keeps else "then apply"
        return (
            f"Restart: `%cudaguard restart --no-blocking` ({then} the fix above), or "
            f"`%cudaguard restart` to find the line with CUDA_LAUNCH_BLOCKING=1, {rerun}."
        )
    return (
        "Restart: `%cudaguard restart` (the next kernel only gets CUDA_LAUNCH_BLOCKING=1) or "
        f"`%cudaguard restart --no-blocking`, {rerun}."
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
            " It starts with CUDA_LAUNCH_BLOCKING=1 (that start only) and says so at its first "
            "cell."
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
    cause_known: bool = False
    keeps: bool = True

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        text = command_text(self.blocking_on, self.cause_known, self.keeps)
        return {
            "text/plain": "nb_cudaguard: " + text,
            "text/html": "<div class='nb-cudaguard-restart-hint' style='font-family:sans-serif'>"
            f"{inline_html(text)}</div>",
        }


def live_bundle(static: dict[str, str], widget: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``static`` (text/plain, text/html) and the view of ``widget``, which shows the same and
    adds the buttons. Frontends with a widget manager show the widget, others the static types
    (ipywidgets 7 and 8 both use view format 2.0). Marked so that a Jupyter server with our
    extension saves the static types only (server_extension/live_views.py): a reopened notebook
    shows the text there, not "model not found"."""
    view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    return {**static, WIDGET_MIME: view}, {MARK: dict(MARK_VALUE)}


def does_note(sentences: list[str]) -> Any:
    """One sentence per button, in the buttons' order, saying what it does (quiet, under them;
    the line height of text, not the 28 px ipywidgets gives an HTML widget's lines)."""
    import ipywidgets as widgets

    return widgets.HTML(
        value="".join(
            f"<div class='nb-cudaguard-does' style='font-family:sans-serif;line-height:1.4;"
            f"color:{TEXT_QUIET};white-space:normal'>{inline_html(sentence)}</div>"
            for sentence in sentences
        )
    )


def status_html(text: str, color: str = "inherit", bold: bool = False) -> str:
    """A widget's status line: in the text colour around it (done), or one of the theme's
    ``TEXT_*`` (diagnosis/render.py): under way, failed."""
    weight = "font-weight:bold;" if bold else ""
    return (
        f"<div style='font-family:sans-serif;{weight}color:{color};line-height:1.4;"
        f"white-space:normal'>{inline_html(text)}</div>"
    )


def button_row(children: list[Any]) -> Any:
    """Buttons side by side that wrap onto the next line where the output is narrow. In a row
    that does not wrap, ipywidgets shrinks a button and cuts its label ("Rest...", issue 23);
    here a button keeps its width (no longer than the row), and a text child takes what is left
    and wraps its words."""
    import ipywidgets as widgets

    for child in children:
        if isinstance(child, widgets.Button):
            child.layout.flex = "0 0 auto"
            child.layout.max_width = "100%"
        else:
            child.layout.flex = "1 1 16em"
            child.layout.width = "auto"
    return widgets.HBox(children, layout=widgets.Layout(flex_flow="row wrap", width="100%"))


def listing(html: str) -> Any:
    """The static text's HTML (what will run, what comes back, what was not kept) as a widget at
    the top of the offer, so that the live widget shows it too: a frontend that renders the
    widget shows none of the output's other types (issue 22)."""
    import ipywidgets as widgets

    # ipywidgets gives an HTML widget the line height of a one-line control (28 px)
    return widgets.HTML(
        value=f"<div style='line-height:1.4'>{html}</div>", layout=widgets.Layout(width="100%")
    )


Restarter = Callable[..., Any]  # restart_kernel's signature: (blocking=..., after_cell=...) -> plan


def blocking_restart_button(primary: bool, then_replay: bool = False, keeps: bool = True) -> Any:
    """The button that restarts in blocking mode, wherever it is offered: under the panel, and
    (``then_replay``) under the replay offered after a plain restart; ``keeps``: whether that
    restart keeps the CPU variables (``CudaGuard.keep_on_restart``)."""
    import ipywidgets as widgets

    return widgets.Button(
        description=BLOCKING_REPLAY_LABEL if then_replay else BLOCKING_LABEL,
        button_style=PRIMARY_STYLE if primary else "",
        tooltip=does_blocking(then_replay, keeps),
        layout=widgets.Layout(width="auto"),
    )


def does_blocking(then_replay: bool, keeps: bool) -> str:
    """The sentence on what the blocking restart does."""
    if then_replay:
        return DOES_BLOCKING_REPLAY if keeps else DOES_BLOCKING_REPLAY_UNKEPT
    return DOES_BLOCKING if keeps else DOES_BLOCKING_UNKEPT


class RestartActions:
    """The buttons and a status line, wired to ``restart``: one primary button, the step the
    diagnosis calls for (``primary_is_plain``), and one sentence on what each does. In a kernel
    already in blocking mode only the plain restart is offered: the blocking one is the step
    already done."""

    def __init__(
        self,
        restart: Restarter,
        after_cell: int | None = None,
        *,
        blocking_on: bool = False,
        blocking_ours: bool = False,
        cause_known: bool = False,
        keeps: bool = True,
    ) -> None:
        import ipywidgets as widgets

        self._restart = restart
        self.keeps = keeps
        self.after_cell = after_cell
        self.blocking_on = blocking_on
        self.blocking_ours = blocking_ours
        self.cause_known = cause_known
        plain_first = primary_is_plain(cause_known, blocking_on)

        def plain() -> Any:
            return widgets.Button(
                description=PLAIN_OFF_LABEL if blocking_on and blocking_ours else PLAIN_LABEL,
                button_style=PRIMARY_STYLE if plain_first else "",
                tooltip=DOES_PLAIN if keeps else DOES_PLAIN_UNKEPT,
                layout=widgets.Layout(width="auto"),
            )

        def blocking() -> Any:
            return blocking_restart_button(primary=not plain_first, keeps=keeps)

        # Built in the order shown (a frontend lists the models as they are created).
        self.blocking_button: Any = None  # not offered where blocking mode is already on
        if keeps:
            sentences = [DOES_PLAIN_FIX if cause_known else DOES_PLAIN]
        else:
            sentences = [DOES_PLAIN_FIX_UNKEPT if cause_known else DOES_PLAIN_UNKEPT]
        blocking_does = does_blocking(then_replay=False, keeps=keeps)
        if blocking_on:
            self.plain_button = plain()
            self.buttons: list[Any] = [self.plain_button]
        elif plain_first:
            self.plain_button, self.blocking_button = plain(), blocking()
            self.buttons = [self.plain_button, self.blocking_button]
            sentences.append(blocking_does)
        else:
            self.blocking_button, self.plain_button = blocking(), plain()
            self.buttons = [self.blocking_button, self.plain_button]
            sentences.insert(0, blocking_does)
        self.note = does_note(sentences)
        self.status = widgets.HTML(value="")  # what happens after a click, under the buttons
        for button in self.buttons:
            button.on_click(self._clicked)
        self.widget = widgets.VBox([button_row(list(self.buttons)), self.note, self.status])

    def _say(self, text: str, color: str = "inherit") -> None:
        self.note.value = ""
        self.status.value = status_html(text, color, bold=True)

    def _clicked(self, button: Any) -> None:
        blocking = button is self.blocking_button
        for each in self.buttons:
            each.disabled = True
        # The CPU variables are saved first (keep_glue): seconds for gigabytes.
        first = "Keeping the CPU variables for the new kernel, then restarting..."
        self._say(first if self.keeps else "Restarting...", TEXT_QUIET)
        try:
            plan = self._restart(blocking=blocking, after_cell=self.after_cell)
        except Exception as error:
            for each in self.buttons:
                each.disabled = False
            self._say(
                f"Could not restart from here ({error}). Use the Kernel menu's restart; "
                "for blocking mode make `import os; os.environ['CUDA_LAUNCH_BLOCKING'] = '1'` the "
                "first line of the first cell.",
                color=TEXT_ERROR,
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

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        hint = CommandHint(self.blocking_on, self.cause_known, self.keeps)
        return live_bundle(hint._repr_mimebundle_(), self.widget)


def restart_actions(
    restart: Restarter,
    after_cell: int | None = None,
    *,
    blocking_on: bool = False,
    blocking_ours: bool = False,
    cause_known: bool = False,
    buttons: bool = True,
    keeps: bool = True,
) -> RestartActions | CommandHint | None:
    """The buttons in a kernel with ipywidgets (unless not ``buttons``: ``CudaGuard.buttons``);
    otherwise the command; nothing in a terminal, where there is no kernel to restart.
    ``cause_known``: the panel named the cause and its fix from the user's own objects;
    ``keeps``: whether a restart keeps the CPU variables (``CudaGuard.keep_on_restart``)."""
    from ..restart.environment import Environment, detect

    if detect() is Environment.TERMINAL:
        return None
    if not buttons:
        return CommandHint(blocking_on, cause_known, keeps)
    try:
        return RestartActions(
            restart,
            after_cell,
            blocking_on=blocking_on,
            blocking_ours=blocking_ours,
            cause_known=cause_known,
            keeps=keeps,
        )
    except Exception:  # no ipywidgets, or no comm support: the command still works
        return CommandHint(blocking_on, cause_known, keeps)
