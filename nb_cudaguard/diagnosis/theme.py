"""Colours and the small HTML pieces every display of nb_cudaguard shares (panel, notes, offers).

Two kinds of colour, for two kinds of output:

- Saved, static HTML (the panel, the notes) may be shown untrusted: JupyterLab and Notebook 7
  sanitize the HTML of a notebook that was not run in this browser (``nb-cudaguard run`` outputs,
  executed demo copies), and their sanitizer keeps a ``style`` declaration only where its value
  matches the CSS grammar it allows (JupyterLab's ``@jupyterlab/apputils`` ``sanitizer.ts``,
  ``allowedStyles``): no ``var(...)``. So the ``BAR_*`` colours are fixed values, the same trusted
  or not; bars carry no text, so one value serves the light and the dark theme. Text keeps the
  colour around it (issue 23: no fixed text colour reads at 4.5:1 on both).
- Live widgets are never sanitized, so their text may follow the frontend's theme (``TEXT_*``):
  JupyterLab and Notebook 7 (``--jp-*``), then VS Code (``--vscode-*``), else the colour around it.
  The JupyterLab Light / Dark values: error 5.0 / 5.1, quiet 4.6 / 9.5 (tests/notebook/
  test_browser_panel.py measures them in the rendered page).
"""

from __future__ import annotations

import html
import re

TEXT_ERROR = "var(--jp-error-color1, var(--vscode-errorForeground, inherit))"
TEXT_QUIET = "var(--jp-content-font-color2, var(--vscode-descriptionForeground, inherit))"
BAR_ERROR = "#d32f2f"
BAR_WARN = "#f57c00"
BAR_INFO = "#1976d2"
BAR_DONE = "#388e3c"
BAR_QUIET = "#9e9e9e"

_CODE = re.compile(r"`([^`]+)`")


def inline_html(text: str) -> str:
    """Escape user-derived text, then turn `code` spans into <code>."""
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def note_html(css_class: str, color: str, text: str) -> str:
    """A one-paragraph note with a bar in ``color`` (one of the ``BAR_*``), in the text colour
    around it: the fallout line, the blocking-mode banner."""
    return (
        f"<div class='{css_class}' style='border-left:4px solid {color};padding:2px 8px;"
        f"margin:4px 0;font-family:sans-serif'>{inline_html(text)}</div>"
    )
