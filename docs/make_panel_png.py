"""Render the panel's real HTML for a real diagnosis and screenshot it with headless Chromium.

    .venv/bin/python docs/make_panel_png.py   # writes docs/panel.png, docs/panel-details.png

The diagnosis is ``nb_cudaguard.diagnose()`` of the device line an NVIDIA H100 printed for a
label out of range and the torch 2.9+ exception (``tests/pytorch_texts.py``), with a namespace
holding a 3-class ``model`` and ``labels`` containing 3. The page holds ``render.to_html()``
exactly as a notebook receives it in ``text/html``; the restart buttons are an ipywidgets display
of their own and are not in it. Run it again after the panel's look changes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS.parent / "tests")]

import torch  # noqa: E402
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11  # noqa: E402
from torch import nn  # noqa: E402

import nb_cudaguard  # noqa: E402
from nb_cudaguard.diagnosis import render  # noqa: E402

PAGE = """<!doctype html><html><head><meta charset="utf-8"></head>
<body style="margin:0;padding:6px 10px;background:#fff;width:860px">{panel}</body></html>"""


def panel_html() -> str:
    line = H100_TORCH_2_11["cross-entropy-label"][0]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    labels = torch.tensor([0, 2, 3, 1])
    diagnosis = nb_cudaguard.diagnose(
        f"{line}\ntorch.AcceleratorError: {ASSERT_2_9}",
        namespace={"model": model, "labels": labels},
    )
    assert diagnosis is not None and diagnosis.cause == "label-out-of-range"
    return render.to_html(diagnosis)


def screenshot(html: str, out: Path, height: int) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "panel.html"
        page.write_text(PAGE.format(panel=html), encoding="utf-8")
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--window-size=880,{height}",
                f"--screenshot={out}",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
        )


def main() -> None:
    html = panel_html()
    screenshot(html, DOCS / "panel.png", 150)
    screenshot(html.replace("<details ", "<details open ", 1), DOCS / "panel-details.png", 860)


if __name__ == "__main__":
    main()
