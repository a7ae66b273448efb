"""How IPython's input transformer writes its escapes into a cell's Python, as the replay's
readers of a cell's text find them: ``!cmd`` as ``get_ipython().system('cmd')``, ``x = !cmd`` as
``getoutput``, ``%magic line`` as ``run_line_magic('magic', 'line')``, a ``%%magic`` cell as
``run_cell_magic('magic', 'line', 'body')`` (IPython/core/inputtransformer2.py). The text
analysis, the files a cell uses and what it reads that a new process cannot read the same all
read them here.
"""

from __future__ import annotations

import ast
import re


def ipython_call(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """(method, args) for ``get_ipython().method(args...)``; else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    ):
        return node.func.attr, list(node.args)
    return None


def string(node: ast.expr) -> str | None:
    """The string ``node`` is, where it is a string literal; else None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def strings(args: list[ast.expr]) -> list[str | None]:
    """The arguments as the strings they are, None for one that is not a string literal."""
    return [string(a) for a in args]


def aimported(line: str) -> list[str]:
    """The modules autoreload's ``%aimport a, b.c`` imports, each pushing its top-level name
    (IPython/extensions/autoreload.py; ``-a`` only marks one not to reload)."""
    return [m for m in (m.strip() for m in line.split(",")) if re.fullmatch(r"[A-Za-z_][\w.]*", m)]
