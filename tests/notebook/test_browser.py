"""The whole path in a real browser: JupyterLab 4 in headless Chromium, driven by Playwright.

Open a demo notebook, run the failing cell, see the panel and the buttons, click "Restart with
CUDA_LAUNCH_BLOCKING=1", run a probe cell, and read the variable from the new kernel's output.
Skipped, with the reason, only where Chromium (Debian's ``chromium``) or Playwright is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from jupyter_harness import JupyterServer, probe, wait_for_new_process
from pytorch_texts import RAISE_ASSERT

from nb_cudaguard.notebook.actions import BLOCKING_LABEL

CHROMIUM = os.environ.get("NB_CUDAGUARD_CHROMIUM") or shutil.which("chromium") or ""
SCREENSHOT = os.environ.get("NB_CUDAGUARD_SCREENSHOT", "/tmp/nb_cudaguard_panel.png")

CELLS = [
    "%load_ext nb_cudaguard",
    RAISE_ASSERT,
    "import os\nprint('CLB=' + str(os.environ.get('CUDA_LAUNCH_BLOCKING')))",
]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _notebook() -> dict[str, object]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for src in CELLS
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture
def lab(tmp_path):
    if not CHROMIUM or not os.access(CHROMIUM, os.X_OK):
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed")
    server = JupyterServer(tmp_path, app="jupyterlab")
    (server.root / "demo.ipynb").write_text(json.dumps(_notebook()))
    yield server
    server.stop()


def _run_cell(page, index: int) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Escape")  # command mode on this cell
    page.keyboard.press("Control+Enter")  # run it, stay put


def test_clicking_the_button_gives_a_new_kernel_with_the_variable(lab):
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(f"{lab.url}/lab/tree/demo.ipynb?token={lab.token}")
            page.locator(".jp-Notebook .jp-Cell").nth(2).wait_for()
            expect(
                page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            ).to_have_count(1, timeout=30_000)
            _run_cell(page, 0)
            _run_cell(page, 1)
            expect(page.locator(".nb-cudaguard-panel")).to_be_visible()
            button = page.get_by_role("button", name=BLOCKING_LABEL)
            expect(button).to_be_visible()
            page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(path=SCREENSHOT)

            _, sessions = lab.request("GET", "/api/sessions")
            kid = sessions[0]["kernel"]["id"]
            old_pid, _ = probe(lab, kid)
            button.click()
            expect(page.get_by_text("re-run the notebook from the top").first).to_be_visible()
            expect(button).to_be_disabled()
            page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(
                path=SCREENSHOT.replace(".png", "_clicked.png")
            )
            wait_for_new_process(lab, kid, old_pid)

            _run_cell(page, 2)
            expect(page.get_by_text("CLB=1")).to_be_visible()
        finally:
            browser.close()
    assert time.monotonic() - started < 90
