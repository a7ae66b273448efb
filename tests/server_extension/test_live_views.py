"""Saved notebooks hold our static text where our buttons were (server_extension/live_views.py).

The pure rule on notebook dicts, the shipped config that enables it, and a real Jupyter server
saving what a real kernel displayed: ours loses its widget view, another library's keeps it.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from jupyter_harness import SERVER_CONFIG, JupyterServer, installed_extensions

from nb_cudaguard.server_extension import _jupyter_server_extension_points
from nb_cudaguard.server_extension.live_views import (
    MARK,
    MARK_VALUE,
    WIDGET_VIEW_MIME,
    drop_live_views,
    pre_save_hook,
)

VIEW = {"version_major": 2, "version_minor": 0, "model_id": "abc"}
STATIC = {"text/plain": "Restart: `%cudaguard restart`", "text/html": "<div>Restart</div>"}


def _output(data: dict[str, object], marked: bool) -> dict[str, object]:
    return {
        "output_type": "display_data",
        "data": data,
        "metadata": {MARK: dict(MARK_VALUE)} if marked else {},
    }


def _notebook(*outputs: dict[str, object]) -> dict[str, object]:
    return {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": "x"},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": list(outputs)},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _data(notebook: dict[str, object]) -> list[dict[str, object]]:
    return [o["data"] for o in notebook["cells"][1]["outputs"]]  # type: ignore[index]


def test_a_marked_output_is_saved_with_its_static_types_only():
    nb = _notebook(_output({**STATIC, WIDGET_VIEW_MIME: VIEW}, marked=True))
    assert drop_live_views(nb) == 1
    assert _data(nb) == [STATIC]


@pytest.mark.parametrize(
    "output",
    [
        _output({**STATIC, WIDGET_VIEW_MIME: VIEW}, marked=False),  # another library's widget
        _output({WIDGET_VIEW_MIME: VIEW}, marked=True),  # nothing else to show: left as it is
        _output(dict(STATIC), marked=True),
        {"output_type": "stream", "name": "stdout", "text": "x"},
    ],
    ids=["unmarked", "widget-only", "static-only", "stream"],
)
def test_other_outputs_are_left_as_they_are(output):
    nb = _notebook(output)
    before = copy.deepcopy(nb)
    assert drop_live_views(nb) == 0
    assert nb == before


def test_the_hook_changes_notebooks_only():
    text = {"type": "file", "content": {"cells": "not a notebook"}}
    pre_save_hook(text, path="a.txt")
    assert text == {"type": "file", "content": {"cells": "not a notebook"}}
    nb = {
        "type": "notebook",
        "content": _notebook(_output({**STATIC, WIDGET_VIEW_MIME: VIEW}, True)),
    }
    pre_save_hook(nb, path="a.ipynb", contents_manager=None)
    assert _data(nb["content"]) == [STATIC]  # type: ignore[arg-type]


def test_the_package_enables_the_extension_where_it_is_installed():
    enabled = json.loads(SERVER_CONFIG.read_text())["ServerApp"]["jpserver_extensions"]
    assert enabled == {"nb_cudaguard.server_extension": True}
    assert _jupyter_server_extension_points() == [{"module": "nb_cudaguard.server_extension"}]
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]
    shared = build["targets"]["wheel"]["shared-data"]
    assert shared == {
        "jupyter-config/jupyter_server_config.d": "etc/jupyter/jupyter_server_config.d"
    }
    installed = Path(sys.prefix, "etc/jupyter/jupyter_server_config.d", SERVER_CONFIG.name)
    if not installed.exists():
        pytest.skip(f"nb_cudaguard is not installed in {sys.prefix} (run from a source tree)")
    assert json.loads(installed.read_text()) == json.loads(SERVER_CONFIG.read_text())


SHOW = (
    "import ipywidgets\n"
    "from IPython.display import display\n"
    "from nb_cudaguard.notebook.actions import restart_actions\n"
    "display(restart_actions(lambda **kw: None, 3))\n"
    "display(ipywidgets.Button(description='theirs'))"
)


def _save_what_the_kernel_showed(server: JupyterServer) -> list[dict[str, object]]:
    """Display our restart buttons and another library's button in a kernel of ``server``,
    save a notebook holding those outputs through the server (as a frontend does), and read
    back the file's outputs."""
    with server.new_kernel() as (kid, _):
        reply = server.execute(kid, SHOW, timeout=60)
    outputs = [
        {
            "output_type": "display_data",
            "data": m["content"]["data"],
            "metadata": m["content"]["metadata"],
        }
        for m in reply.messages
        if m["msg_type"] == "display_data"
    ]
    assert len(outputs) == 2 and all(WIDGET_VIEW_MIME in o["data"] for o in outputs), reply.errors
    status, _ = server.request(
        "PUT", "/api/contents/saved.ipynb", {"type": "notebook", "content": _notebook(*outputs)}
    )
    assert status in (200, 201), status
    saved = json.loads((server.root / "saved.ipynb").read_text())
    return saved["cells"][1]["outputs"]  # type: ignore[no-any-return]


def test_a_server_with_the_extension_saves_our_buttons_as_their_static_text(tmp_path):
    server = JupyterServer(tmp_path, extra_args=installed_extensions())
    try:
        ours, theirs = _save_what_the_kernel_showed(server)
    finally:
        server.stop()
    assert WIDGET_VIEW_MIME not in ours["data"]
    # nbformat writes multi-line strings as lists of lines
    assert "%cudaguard restart" in "".join(ours["data"]["text/plain"])
    assert "%cudaguard restart" in "".join(ours["data"]["text/html"])
    assert WIDGET_VIEW_MIME in theirs["data"]  # another library's widget: not ours to change


def test_without_the_extension_the_widget_view_is_saved(tmp_path):
    """What a reopened notebook then shows as "model not found": the case the extension is for."""
    server = JupyterServer(tmp_path)
    try:
        ours, _ = _save_what_the_kernel_showed(server)
    finally:
        server.stop()
    assert WIDGET_VIEW_MIME in ours["data"]
