"""Diagnosis -> static text/plain and text/html, the one thing that matters first.

Reading order (the same in both): one headline (what broke, and that only a restart helps), the
evidence about the user's own objects (or the GPU's own message where there is none), the single
best next step; the restart buttons come right after, as a separate display. Everything else
(other likely causes, all fixes, the error text, where, how blocking mode works, what the probe
found, the rule's source) sits in one collapsed ``<details>`` section, which Lab, Notebook 7,
Colab, VS Code, nbconvert HTML and GitHub's renderer all support. No sentence appears twice.

Static on purpose: saved notebooks, nbconvert and Kaggle's rendering of saved versions keep only
static outputs, and a reopened notebook shows "model not found" for widgets
(docs/panel.md#buttons-live-text-when-saved).
Knows neither torch nor IPython.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .advice import (
    KERNEL,
    Setting,
    blocking_was_on,
    on_a_gpu,
    probably_broken,
    restart_only,
    true_line,
)
from .model import ContextState, Diagnosis
from .schema import MIME_TYPE, to_json, verdict

# Re-exported for the glue that still imports them from here; their home is theme.py.
from .theme import BAR_DONE as BAR_DONE
from .theme import BAR_ERROR as BAR_ERROR
from .theme import BAR_INFO as BAR_INFO
from .theme import BAR_QUIET as BAR_QUIET
from .theme import BAR_WARN as BAR_WARN
from .theme import TEXT_ERROR as TEXT_ERROR
from .theme import TEXT_QUIET as TEXT_QUIET
from .theme import inline_html as inline_html
from .theme import note_html as note_html

_DSA_FACT = "TORCH_USE_CUDA_DSA"  # a fact about a build flag, not a fix: shown with the above


def _context_words(context: ContextState, setting: Setting, sticky: bool = True) -> str:
    """What the probe found, about the setting's process."""
    if context is ContextState.NO_CUDA and not sticky:  # another process's error (a rank's)
        return f"{setting.owner} has not started CUDA: its own CUDA context is not involved"
    return {
        ContextState.POISONED: f"the probe found {setting.owner}'s CUDA context broken",
        ContextState.HEALTHY: f"the probe found {setting.owner}'s CUDA context still answering",
        ContextState.NO_CUDA: (
            f"{setting.owner} has not started CUDA, so the error did not come from its GPU (a "
            "simulated failure, as in the demos, or an error re-raised from elsewhere); on a GPU "
            "the context would be broken"
        ),
        ContextState.UNKNOWN: setting.unknown_context,
    }[context]


def headline(diagnosis: Diagnosis, setting: Setting = KERNEL) -> str:
    """What broke, and that only a restart helps, in one line."""
    if not diagnosis.sticky:
        return f"{diagnosis.title}. {diagnosis.explanation}"
    if diagnosis.context is ContextState.HEALTHY:
        verdict = probably_broken(setting)
    elif diagnosis.context is ContextState.NO_CUDA:
        verdict = on_a_gpu(setting)
    else:
        verdict = restart_only(setting)
    return f"{diagnosis.title}. {verdict}"


def _fixes(diagnosis: Diagnosis) -> list[str]:
    return [fix for fix in diagnosis.fixes if _DSA_FACT not in fix]


def _dsa_facts(diagnosis: Diagnosis) -> list[str]:
    return [fix for fix in diagnosis.fixes if _DSA_FACT in fix]


def evidence(diagnosis: Diagnosis) -> tuple[str, list[str], bool]:
    """(label, lines, preformatted): the user's objects, else the GPU's message, else the error."""
    if diagnosis.evidence:
        return "Your data", list(diagnosis.evidence), False
    if diagnosis.assert_lines:
        return "The GPU said", [str(line) for line in diagnosis.assert_lines], True
    if diagnosis.error is not None:
        return "The error", [diagnosis.error.message], True
    return "", [], False


def best_step(diagnosis: Diagnosis) -> tuple[str, str] | None:
    """The single best next step: the likely cause the evidence ranked first (its words carry the
    fix), else the rule's first fix."""
    if diagnosis.evidence and diagnosis.likely_causes:
        return "Most likely", diagnosis.likely_causes[0]
    fixes = _fixes(diagnosis)
    if fixes:
        return "Fix", fixes[0]
    if diagnosis.likely_causes:
        return "Most likely", diagnosis.likely_causes[0]
    return None


def _details(
    diagnosis: Diagnosis, blocking: bool, setting: Setting = KERNEL
) -> list[tuple[str, list[str], bool]]:
    """(heading, items, preformatted) for the collapsed section; what is shown above is left out."""
    step = best_step(diagnosis)
    shown = {step[1]} if step else set()
    label, _, _ = evidence(diagnosis)
    causes = [c for c in diagnosis.likely_causes if c not in shown]
    fixes = [f for f in _fixes(diagnosis) if f not in shown]
    sections: list[tuple[str, list[str], bool]] = [
        (
            "Likely causes, most likely first"
            if len(causes) == len(diagnosis.likely_causes)
            else "Other likely causes",
            causes,
            False,
        ),
        ("How to fix it" if not shown & set(diagnosis.fixes) else "Other fixes", fixes, False),
        # a non-sticky error's explanation is its headline already
        (
            _explanation_heading(diagnosis),
            [diagnosis.explanation] if diagnosis.sticky else [],
            False,
        ),
    ]
    if label != "The GPU said":
        lines = [str(line) for line in diagnosis.assert_lines]
        sections.append(("The GPU's own message", lines, True))
    if label != "The error" and diagnosis.error is not None:
        sections.append(("The error", [diagnosis.error.message], True))
    if diagnosis.where and not blocking:
        sections.append(("Where", [diagnosis.where], False))
    if diagnosis.sticky and not blocking:
        sections.append(
            ("Finding the true line", [true_line(setting), *_dsa_facts(diagnosis)], False)
        )
    elif _dsa_facts(diagnosis):
        sections.append(("Device-side assertions", _dsa_facts(diagnosis), False))
    context = _context_words(diagnosis.context, setting, diagnosis.sticky)
    device = "" if diagnosis.device is None else f" (cuda:{diagnosis.device})"
    about = [context[0].upper() + context[1:] + device + "."]
    about.append(
        f"Cause id: `{diagnosis.cause}`"
        + (f"; rule from {diagnosis.source}." if diagnosis.source else ".")
    )
    sections.append(("About this diagnosis", about, False))
    return [section for section in sections if section[1]]


def _explanation_heading(diagnosis: Diagnosis) -> str:
    """Only a device assert is something the GPU checked; a fault or a launch error is not."""
    return "What the GPU checked" if diagnosis.assert_lines else "What it means"


def _top(
    diagnosis: Diagnosis, blocking: bool, setting: Setting = KERNEL
) -> list[tuple[str, list[str], bool]]:
    """(label, lines, preformatted) shown open, after the headline."""
    top: list[tuple[str, list[str], bool]] = []
    label, lines, pre = evidence(diagnosis)
    if lines:
        top.append((label, lines, pre))
    if blocking and diagnosis.sticky:
        top.append(("", [blocking_was_on(setting)], False))
    step = best_step(diagnosis)
    if step is not None:
        top.append((step[0], [step[1]], False))
    return top


def to_text(diagnosis: Diagnosis, blocking: bool = False, setting: Setting = KERNEL) -> str:
    """The plain-text panel; ``setting``: where the failure happened (the live kernel by
    default, a notebook run or a script's log for the CLI), which decides the advice's words."""
    lines = [verdict(diagnosis, blocking, setting), f"nb_cudaguard: {headline(diagnosis, setting)}"]
    for label, items, preformatted in _top(diagnosis, blocking, setting):
        if len(items) == 1 and not preformatted:
            lines.append(f"{label}: {items[0]}" if label else items[0])
        else:
            lines.append(f"{label}:")
            lines.extend(("    " if preformatted else "  - ") + item for item in items)
    lines.extend(["", "Details:"])
    for heading, items, preformatted in _details(diagnosis, blocking, setting):
        lines.append(f"  {heading}:")
        lines.extend(("      " if preformatted else "    - ") + item for item in items)
    return "\n".join(lines)


def _html_items(items: list[str], preformatted: bool, ordered: bool = False) -> str:
    if preformatted:
        body = html.escape("\n".join(items))
        return f"<pre style='white-space:pre-wrap;margin:2px 0;font-size:0.9em'>{body}</pre>"
    if len(items) == 1:
        return f"<div>{inline_html(items[0])}</div>"
    tag = "ol" if ordered else "ul"
    body = "".join(f"<li>{inline_html(item)}</li>" for item in items)
    return f"<{tag} style='margin:2px 0 4px 0;padding-left:1.4em'>{body}</{tag}>"


def _summary(sections: Iterable[tuple[str, list[str], bool]]) -> str:
    names = {
        "Likely causes, most likely first": "likely causes",
        "Other likely causes": "other causes",
        "How to fix it": "fixes",
        "Other fixes": "more fixes",
        "The GPU's own message": "the GPU's message",
        "The error": "the error",
        "Where": "where",
        "Finding the true line": "finding the true line",
    }
    parts = [names[heading] for heading, _, _ in sections if heading in names]
    return "Details: " + ", ".join(parts) if parts else "Details"


def to_html(
    diagnosis: Diagnosis, blocking: bool = False, device_lines: tuple[str, ...] = ()
) -> str:
    """The HTML panel; ``device_lines``: every assert line the GPU printed, one per thread, as
    captured (the cell's stream shows each site once, with a count: runtime/capture.py)."""
    # The bar says how bad it is; the headline keeps the text colour around it, so the panel
    # looks the same in a trusted and a sanitized (untrusted) notebook (theme.py).
    bar = BAR_ERROR if diagnosis.sticky else BAR_WARN
    parts = [
        f"<div class='nb-cudaguard-panel' data-cause='{html.escape(diagnosis.cause)}' "
        f"data-blocking='{str(blocking).lower()}' "
        f"style='border-left:4px solid {bar};padding:4px 10px;margin:6px 0;"
        "font-family:sans-serif;line-height:1.4'>",
        "<div class='nb-cudaguard-headline' style='font-weight:bold'>"
        f"&#9888; {inline_html(headline(diagnosis))}</div>",
    ]
    for label, items, preformatted in _top(diagnosis, blocking):
        prefix = f"<b>{html.escape(label)}:</b> " if label else ""
        if len(items) == 1 and not preformatted:
            parts.append(f"<div>{prefix}{inline_html(items[0])}</div>")
        else:
            parts.append(f"<div>{prefix}</div>{_html_items(items, preformatted)}")
    details = _details(diagnosis, blocking)
    parts.append(
        "<details class='nb-cudaguard-details' style='margin-top:2px'>"
        "<summary style='cursor:pointer'>"
        f"{html.escape(_summary(details))}</summary>"
    )
    if len(device_lines) > len(diagnosis.assert_lines):
        details.append((f"Every line the GPU printed ({len(device_lines)})", [*device_lines], True))
    for heading, items, preformatted in details:
        parts.append(f"<div style='margin-top:4px;font-weight:bold'>{html.escape(heading)}</div>")
        parts.append(_html_items(items, preformatted, ordered=heading.startswith("Likely")))
    parts.append("</details></div>")
    return "".join(parts)


@dataclass(frozen=True)
class Panel:
    """A displayable diagnosis: IPython's display() asks it for its mimebundle. ``blocking``: this
    kernel already runs with CUDA_LAUNCH_BLOCKING in force, so the traceback is already right.

    Every reader gets the verdict line first. ``text/plain`` is what VS Code's "attach cell
    output" and terminals take; ``text/markdown`` is what text-only readers prefer (the Jupyter
    MCP server reads markdown, LaTeX, ``application/json``, then plain text, never HTML or vendor
    types), so it carries the diagnosis as a JSON block too. Frontends rank ``text/html`` above
    markdown (JupyterLab, Notebook 7, VS Code, Colab, nbconvert), so what they render is
    unchanged; plain ``application/json`` is left out on purpose: JupyterLab ranks its JSON
    viewer above HTML."""

    diagnosis: Diagnosis
    blocking: bool = False
    device_lines: tuple[str, ...] = ()  # every assert line captured, for the HTML details

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        text = to_text(self.diagnosis, self.blocking)
        payload = to_json(self.diagnosis, blocking_on=self.blocking)
        return {
            "text/plain": text,
            "text/html": to_html(self.diagnosis, self.blocking, self.device_lines),
            "text/markdown": to_markdown(text, payload),
            # for tools that know the type
            MIME_TYPE: payload,
        }


def to_markdown(text: str, payload: dict[str, Any]) -> str:
    """The plain-text panel as a literal block, then the machine-readable diagnosis as JSON."""
    import json

    first, _, rest = text.partition("\n")
    return (
        f"{first}\n\n```text\n{rest}\n```\n\n"
        f"Machine-readable diagnosis (`{MIME_TYPE}`):\n\n"
        f"```json\n{json.dumps(payload, indent=1, ensure_ascii=False)}\n```\n"
    )


@dataclass(frozen=True)
class Fallout:
    """A short note for a later cell that fails because the context was already broken."""

    first_cell: int | None
    message: str
    verdict: str = ""  # the first failure's verdict line: a reader of this cell gets it first

    def text(self) -> str:
        where = f"cell [{self.first_cell}]" if self.first_cell is not None else "an earlier cell"
        return (
            f"nb_cudaguard: fallout of the CUDA error in {where}. The GPU context has been broken "
            f"since then, so every CUDA call fails ({self.message}). Only a kernel restart helps: "
            f"`%cudaguard restart`, then re-run from the top. The diagnosis is under {where}."
        )

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        text = self.text()
        return {
            "text/plain": f"{self.verdict}\n{text}" if self.verdict else text,
            "text/html": note_html("nb-cudaguard-fallout", BAR_ERROR, text),
        }
