"""What to do next, in the words of the place where the failure happened.

One diagnosis is read in three settings: the panel under a cell of the live kernel that failed
(the restart buttons right below it, ``%cudaguard restart``); a notebook's failure read outside its
kernel (``nb-cudaguard run``, a pasted notebook traceback), where a new kernel is started by
``nb-cudaguard run --blocking-rerun`` or by ``%cudaguard restart`` back in Jupyter; and a script's
log (or a test run), where "restart the kernel" and "the button below" mean nothing: the script
is run again with the variable set. Each setting is one record of phrases; ``render.py`` and
``schema.py`` build their sentences from it, so no sentence is written twice.
"""

from __future__ import annotations

import builtins
import keyword
import re
import shlex
from dataclasses import dataclass
from typing import Literal

from .where import failing_frames

BLOCKING = "CUDA_LAUNCH_BLOCKING=1"
_PROBE_UNSURE = "the probe could not tell whether the CUDA context still answers"
_NOT_PROBED = "read from the text alone: the failed process's CUDA context was not probed"


@dataclass(frozen=True)
class Setting:
    """Where the failing code ran, as the words that differ between the settings."""

    kind: Literal["kernel", "notebook", "script"]  # the JSON action's "setting"
    owner: str  # whose CUDA context broke: "this kernel"
    fresh: str  # what gives a working context again: "a kernel restart"
    start_afresh: str  # the same as an instruction: "restart the kernel"
    blocking_rerun: str  # how to run again in blocking mode, up to "in that kernel"
    too_late: str  # where setting the variable now does nothing
    command: str  # the command that runs again in blocking mode
    plain_command: str  # ... and without it, where blocking mode was on already
    restart_how: str  # the action's instruction: "Restart the kernel (`%cudaguard restart` ...)"
    cannot_retry: str  # why retrying where it failed is pointless
    again: str  # what to do once the input is fixed: "re-run the notebook from the top"
    retry: str  # what to do after an error that leaves the context usable: "re-run the cell"
    unknown_context: str  # what is known of the context without a probe's answer


KERNEL = Setting(
    kind="kernel",
    owner="this kernel",
    fresh="a kernel restart",
    start_afresh="restart the kernel",
    blocking_rerun=(
        f"Restart with {BLOCKING} (`%cudaguard restart`, or the button below) and re-run from "
        "the top: in that kernel every launch waits for its kernel (slower, that start only)"
    ),
    too_late="Setting the variable in this kernel now does nothing",
    command="%cudaguard restart",
    plain_command="%cudaguard restart --no-blocking",
    restart_how=(
        f"Restart the kernel (`%cudaguard restart` starts the next one with {BLOCKING}, so the "
        "traceback shows the true line)"
    ),
    cannot_retry="re-running cells in this kernel cannot succeed",
    again="re-run the notebook from the top",
    retry="re-run the cell",
    unknown_context=_PROBE_UNSURE,
)


def notebook_run(
    notebook: str = "NOTEBOOK", output: str = "OUT.ipynb", *, probed: bool = False
) -> Setting:
    """A notebook's failure read outside its kernel (a headless run, a pasted traceback);
    ``probed``: the diagnosis comes with what a probe of that kernel found."""
    command = f"nb-cudaguard run --blocking-rerun {notebook} -o {output}"
    return Setting(
        kind="notebook",
        owner="the kernel",
        fresh="a new kernel",
        start_afresh="start a new kernel",
        blocking_rerun=(
            f"Run the notebook again in a new kernel started with {BLOCKING}: `{command}` re-runs "
            "it up to the failing cell (in Jupyter, where the kernel has not loaded nb_cudaguard: "
            "`%load_ext nb_cudaguard`, then `%cudaguard restart`, then re-run from the top). In "
            "that kernel every launch waits for its kernel (slower, that run only)"
        ),
        too_late="Setting the variable in a kernel whose CUDA has started does nothing",
        command=command,
        plain_command=f"nb-cudaguard run {notebook} -o {output}",
        restart_how=(
            f"Run it again in a new kernel with {BLOCKING} (`{command}`, or in Jupyter "
            "`%load_ext nb_cudaguard` then `%cudaguard restart`), so the traceback shows the true "
            "line"
        ),
        cannot_retry="re-running cells in that kernel cannot succeed",
        again="re-run the notebook from the top",
        retry="run the notebook again",
        unknown_context=_PROBE_UNSURE if probed else _NOT_PROBED,
    )


def script(launcher: str | None = None, *, probed: bool = False) -> Setting:
    """A script's log, or a test run: ``launcher`` is how it was started ("python train.py"),
    where known; the rest of its command line never is, hence the "...". ``probed``: the
    diagnosis comes with what a probe of that process found (the pytest plugin's)."""
    command = f"{BLOCKING} {launcher or 'python'} ..."
    return Setting(
        kind="script",
        owner="the process",
        fresh="a new process",
        start_afresh="start a new process",
        blocking_rerun=(
            f"Run it again with {BLOCKING} set before it starts (`{command}`, your usual command "
            "with the variable in front): in that process every launch waits for its kernel "
            "(slower, that run only)"
        ),
        too_late="Setting the variable inside the script once CUDA has started does nothing",
        command=command,
        plain_command=f"{launcher or 'python'} ...",
        restart_how=f"Run it again with {BLOCKING} (`{command}`) to see the true line",
        cannot_retry="nothing more can run on the GPU in that process",
        again="then run it as usual",
        retry="run it again",
        unknown_context=_PROBE_UNSURE if probed else _NOT_PROBED,
    )


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def restart_only(setting: Setting) -> str:
    return f"The GPU context is broken: only {setting.fresh} fixes it."


def probably_broken(setting: Setting) -> str:
    return (
        "This error normally breaks the GPU context for good, but a probe found it still "
        f"answering: {setting.start_afresh} if CUDA calls keep failing."
    )


def on_a_gpu(setting: Setting) -> str:
    return (
        f"On a GPU this breaks {setting.owner}'s CUDA context, and only {setting.fresh} fixes it."
    )


def blocking_was_on(setting: Setting) -> str:
    """Where the failed process ran in blocking mode: its traceback is the true line."""
    now = setting is KERNEL
    return (
        f"Blocking mode {'is' if now else 'was'} on in {setting.owner} ({BLOCKING}): every "
        f"launch {'waits' if now else 'waited'} for its kernel, so the traceback above points at "
        "the line that launched the failing one."
    )


def true_line(setting: Setting) -> str:
    """How blocking mode finds the line that launched the failing kernel."""
    return (
        "CUDA reports a kernel's failure at a later call, so the traceback may point at an "
        f"innocent line. {setting.blocking_rerun}, and the error is raised at the line that "
        f"caused it. {setting.too_late}: CUDA reads it only when it starts."
    )


def broken_message(setting: Setting) -> str:
    """The JSON action's message for a broken context."""
    return (
        f"{_capital(setting.owner)}'s CUDA context is broken: every later CUDA call fails, so "
        f"{setting.cannot_retry}. {setting.restart_how}, fix the input, and {setting.again}."
    )


def broken_blocking_message(setting: Setting) -> str:
    """The JSON action's message for a broken context where blocking mode was on already."""
    return (
        f"{_capital(setting.owner)}'s CUDA context is broken: every later CUDA call fails, so "
        f"{setting.cannot_retry}. Blocking mode was on, so the traceback shows the true line: "
        f"fix the input there, {setting.start_afresh} (`{setting.plain_command}`), and "
        f"{setting.again}."
    )


def usable_message(setting: Setting) -> str:
    """The JSON action's message for an error that leaves the context usable."""
    return f"The CUDA context is still usable: fix the cause and {setting.retry}."


def unsure_message(setting: Setting) -> str:
    """The JSON action's message for an error NVIDIA does not say the context survives
    (cudaErrorUnknown), read from a text: nothing probed the context."""
    return (
        "Whether the CUDA context survived is unknown: try one small CUDA call first; if it "
        f"fails, start a new process, else fix the cause and {setting.retry}."
    )


def setting_of_text(text: str) -> Setting:
    """Where a log or a pasted traceback comes from: a notebook when its failing traceback runs
    through a cell; else a script, started as its outermost frame's file where that is the
    user's (``python train.py``)."""
    frames = failing_frames(text)
    if any(frame.in_notebook for frame in frames):
        return notebook_run()
    first = frames[0] if frames else None
    if first is not None and first.is_user_code and first.file.endswith(".py"):
        return script(f"python {shlex.quote(first.file)}")
    return script()


# --- fixes in the words of a log ---------------------------------------------------------------
# The rules' fixes are written with placeholder names (`ids`, `embedding`, `labels`); read outside
# the kernel, only the log's own names may appear. Each placeholder: what it stands for, and what
# the last part of a name in the log's source lines must look like to stand for the same object.
_PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "ids": ("the token ids", r"_?ids$|^tokens$|^token_ids$"),
    "input_ids": ("the token ids", r"_?ids$|^tokens$"),
    "embedding": ("the embedding", r"emb"),
    "labels": ("the labels", r"label|target|^y$|^y_true$|^gt$"),
    "target": ("the targets", r"label|target|^y$|^gt$"),
    "logits": ("the logits", r"logit|^outputs?$|^out$|^preds?$|^scores$"),
    "model": ("your model", r"model$|^net$"),
    "tokenizer": ("your tokenizer", r"tokenizer$"),
    "index": ("the index tensor", r"^ind(?:ex|ices)$|^idx$|_idx$|_index$"),
    "idx": ("the index tensor", r"^ind(?:ex|ices)$|^idx$|_idx$|_index$"),
    "num_classes": ("the number of classes", r"^(?:num|n)_(?:classes|labels)$"),
    "probs": ("the probabilities", r"prob"),
}
_NOT_OBJECTS = frozenset(
    {*keyword.kwlist, *dir(builtins), "torch", "nn", "F", "np", "math", "functools"}
)
_CODE_SPAN = re.compile(r"`([^`]+)`")
_FREE_NAME = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(?![\w])(?!\s*=(?!=))")
_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _names_in_code(text: str) -> list[str]:
    """The names the log's quoted source lines use, innermost user frame first."""
    frames = [frame for frame in failing_frames(text) if frame.code]
    frames.sort(key=lambda frame: not frame.is_user_code)  # stable: user frames first
    names: list[str] = []
    for frame in reversed(frames):
        for name in _DOTTED.findall(frame.code or ""):
            if name not in names:
                names.append(name)
    return names


def _in_the_logs_words(fix: str, words: set[str], names: list[str]) -> str:
    def span(match: re.Match[str]) -> str:
        code = match.group(1)
        if ("(" not in code and "." not in code) or " --" in code:
            return match.group(0)  # a concept (`token_type_ids`) or a shell command, no object

        def name(found: re.Match[str]) -> str:
            placeholder = found.group(1)
            if placeholder in words or placeholder in _NOT_OBJECTS or placeholder[0].isupper():
                return placeholder
            meaning, looks = _PLACEHOLDERS.get(placeholder, (f"your {placeholder}", ""))
            for own in names:
                if looks and re.search(looks, own.rsplit(".", 1)[-1]):
                    return own
            return f"<{meaning}>"

        return f"`{_FREE_NAME.sub(name, code)}`"

    return _CODE_SPAN.sub(span, fix)


def fixes_in_the_logs_names(fixes: tuple[str, ...], text: str) -> tuple[str, ...]:
    """The fixes with every object their code names taken from the log: a name the log does not
    hold becomes the log's own name for the same object (`self.tok_emb` for `embedding`) where
    its source lines show one, else a description in angle brackets (`<the token ids>`)."""
    words = set(re.findall(r"\w+", text))
    names = _names_in_code(text)
    return tuple(_in_the_logs_words(fix, words, names) for fix in fixes)
