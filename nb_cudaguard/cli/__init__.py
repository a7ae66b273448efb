"""The command line, for the same failure outside a live notebook: a log, a headless run.

``nb-cudaguard explain FILE|-`` diagnoses a log or traceback; ``nb-cudaguard run NOTEBOOK -o OUT``
executes a notebook headless with the extension loaded. Imports neither IPython nor torch.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
