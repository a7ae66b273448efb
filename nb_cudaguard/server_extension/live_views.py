"""What a saved notebook holds where our buttons were: the static text, not a dangling widget view.

ipywidgets 8 in JupyterLab 4 / Notebook 7 renders ``application/vnd.jupyter.widget-view+json``
whenever an output carries it and never falls back to the output's other types
(jupyterlab_widgets ``renderer.ts``). Once the kernel that owned the widget is gone, and unless
the user turned on the frontend's "save widget state" setting (off by default), a reopened notebook
shows "Error displaying widget: model not found" there. No kernel-side step prevents it: the
frontend drops a restarted kernel's messages, and a kernel that is killed sends none.

So the notebook glue marks each output whose widget only adds buttons to its static text
(``MARK`` in the output's metadata), and the Jupyter server, before it writes a notebook, drops the
widget view from the marked outputs (``pre_save_hook``): the file holds the text/html and
text/plain that every frontend, nbconvert and Kaggle show. The open notebook keeps its live
buttons: this changes what is written, not what the browser holds. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
MARK = "nb_cudaguard"
MARK_VALUE = {"saved_as": "static"}  # the output's metadata: {MARK: MARK_VALUE}


def is_marked(output: Mapping[str, Any]) -> bool:
    metadata = output.get("metadata")
    return isinstance(metadata, Mapping) and metadata.get(MARK) == MARK_VALUE


def drop_live_views(notebook: Mapping[str, Any]) -> int:
    """Remove the widget view from every marked output that still has a static type to show;
    how many were changed. Other outputs (other libraries' widgets) are left as they are."""
    changed = 0
    for cell in notebook.get("cells") or ():
        if not isinstance(cell, Mapping) or cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs") or ():
            if not isinstance(output, Mapping) or not is_marked(output):
                continue
            data = output.get("data")
            if isinstance(data, dict) and WIDGET_VIEW_MIME in data and len(data) > 1:
                del data[WIDGET_VIEW_MIME]
                changed += 1
    return changed


def pre_save_hook(model: dict[str, Any], **_: object) -> None:
    """A Jupyter server contents-manager pre-save hook (``register_pre_save_hook``)."""
    content = model.get("content")
    if model.get("type") == "notebook" and isinstance(content, Mapping):
        drop_live_views(content)
