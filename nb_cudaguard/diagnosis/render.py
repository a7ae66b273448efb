"""Diagnosis -> static text/plain and text/html.

Static on purpose: saved notebooks, nbconvert and Kaggle's rendering of saved versions keep only
static outputs, and a reopened notebook shows "model not found" for widgets (FIELD_NOTES §5).
Knows neither torch nor IPython.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .model import ContextState, Diagnosis
from .schema import MIME_TYPE, to_json

_CODE = re.compile(r"`([^`]+)`")

BROKEN = (
    "The GPU context of this kernel is broken, and only a kernel restart fixes it: "
    "re-running cells will keep failing."
)
PROBABLY_BROKEN = (
    "This kind of error normally breaks the GPU context of the process for good; a probe found "
    "this kernel's context still answering, so restart the kernel if CUDA calls keep failing."
)
RESTART_HOW = (
    "To see the true location, restart with blocking launches: run `%cudaguard restart` "
    "(the next kernel starts with CUDA_LAUNCH_BLOCKING=1, once), then re-run the notebook from "
    "the top. By hand: restart the kernel and make "
    "`import os; os.environ['CUDA_LAUNCH_BLOCKING'] = '1'` the first line of the first cell. "
    "Setting it in this kernel now does nothing: CUDA reads it only when it starts."
)


def lead_sentence(diagnosis: Diagnosis) -> str:
    if not diagnosis.sticky:
        return diagnosis.explanation
    return PROBABLY_BROKEN if diagnosis.context is ContextState.HEALTHY else BROKEN


def _sections(diagnosis: Diagnosis) -> list[tuple[str, list[str], bool]]:
    """(heading, items, preformatted) in reading order; empty sections dropped."""
    what = [diagnosis.explanation]
    if diagnosis.error is not None:
        what.insert(0, f"The error: `{diagnosis.error.message}`")
    sections: list[tuple[str, list[str], bool]] = [
        ("What happened", what, False),
        ("The GPU's own message", [str(line) for line in diagnosis.assert_lines], True),
        ("Likely causes, most likely first", list(diagnosis.likely_causes), False),
        ("Evidence", list(diagnosis.evidence), False),
        ("Where", [diagnosis.where] if diagnosis.where else [], False),
        ("How to fix it", list(diagnosis.fixes), False),
    ]
    if diagnosis.sticky:
        sections.append(("Find the true location", [RESTART_HOW], False))
    return [section for section in sections if section[1]]


_CONTEXT_WORDS = {
    ContextState.POISONED: "poisoned (probed)",
    ContextState.HEALTHY: "still answering (probed)",
    ContextState.NO_CUDA: "CUDA not initialised in this process",
    ContextState.UNKNOWN: "could not be probed",
}


def _footer(diagnosis: Diagnosis) -> str:
    device = "" if diagnosis.device is None else f", cuda:{diagnosis.device}"
    parts = [
        f"cause: {diagnosis.cause}",
        f"CUDA context: {_CONTEXT_WORDS[diagnosis.context]}{device}",
    ]
    if diagnosis.source:
        parts.append(f"rule from {diagnosis.source}")
    return "nb_cudaguard · " + " · ".join(parts)


def to_text(diagnosis: Diagnosis) -> str:
    lines = ["", f"nb_cudaguard: {diagnosis.title}", lead_sentence(diagnosis)]
    for heading, items, preformatted in _sections(diagnosis):
        lines.append("")
        lines.append(f"{heading}:")
        bullet = "    " if preformatted else "  - "
        lines.extend(bullet + item for item in items)
    lines.extend(["", _footer(diagnosis)])
    return "\n".join(lines)


def inline_html(text: str) -> str:
    """Escape user-derived text, then turn `code` spans into <code>."""
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def note_html(css_class: str, color: str, text: str) -> str:
    """A one-paragraph note with a coloured bar: the fallout line, the blocking-mode banner."""
    return (
        f"<div class='{css_class}' style='border-left:4px solid {color};padding:2px 8px;"
        f"margin:4px 0;font-family:sans-serif'>{inline_html(text)}</div>"
    )


def _html_list(items: Iterable[str], ordered: bool) -> str:
    tag = "ol" if ordered else "ul"
    body = "".join(f"<li>{inline_html(item)}</li>" for item in items)
    return f"<{tag} style='margin:2px 0 6px 0'>{body}</{tag}>"


def to_html(diagnosis: Diagnosis) -> str:
    color = "#b71c1c" if diagnosis.sticky else "#e65100"
    parts = [
        f"<div class='nb-cudaguard-panel' data-cause='{html.escape(diagnosis.cause)}' "
        f"style='border:2px solid {color};border-radius:6px;padding:8px 12px;margin:6px 0;"
        "font-family:sans-serif;line-height:1.4'>",
        f"<div style='font-weight:bold;color:{color};font-size:1.1em'>"
        f"&#9888; {inline_html(diagnosis.title)}</div>",
        f"<p style='margin:4px 0;font-weight:bold'>{inline_html(lead_sentence(diagnosis))}</p>",
    ]
    for heading, items, preformatted in _sections(diagnosis):
        parts.append(f"<div style='margin-top:6px;font-weight:bold'>{html.escape(heading)}</div>")
        if preformatted:
            body = html.escape("\n".join(items))
            parts.append(f"<pre style='white-space:pre-wrap;margin:2px 0'>{body}</pre>")
        elif len(items) == 1:
            parts.append(f"<div>{inline_html(items[0])}</div>")
        else:
            parts.append(_html_list(items, ordered=heading.startswith("Likely")))
    parts.append(
        "<div style='margin-top:6px;color:#666;font-size:0.85em'>"
        f"{html.escape(_footer(diagnosis))}</div>"
    )
    parts.append("</div>")
    return "".join(parts)


@dataclass(frozen=True)
class Panel:
    """A displayable diagnosis: IPython's display() asks it for its mimebundle."""

    diagnosis: Diagnosis

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, Any]:
        return {
            "text/plain": to_text(self.diagnosis),
            "text/html": to_html(self.diagnosis),
            MIME_TYPE: to_json(self.diagnosis),  # for assistants and tools that read outputs
        }


@dataclass(frozen=True)
class Fallout:
    """A short note for a later cell that fails because the context was already broken."""

    first_cell: int | None
    message: str

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
            "text/plain": text,
            "text/html": note_html("nb-cudaguard-fallout", "#b71c1c", text),
        }
