"""The house rules, read from the source: imports flow one way, and only the glue imports IPython.

Every import counts, function-level ones included (they form cycles just as well at run time);
only type-only imports under ``if TYPE_CHECKING:`` are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "nb_cudaguard"
GLUE = "nb_cudaguard.notebook"
FRONTEND_LIBRARIES = ("IPython", "ipywidgets", "ipykernel")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in [child, *_run_time_nodes(child)])
            continue
        yield node
        yield from _run_time_nodes(node)


def imports_of(name: str) -> set[str]:
    """Absolute names of every module ``name`` imports at run time."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _run_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            found.add(stem)
            # `from . import injection` imports a module, not a name
            found.update(f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in MODULES)
    return found


def internal_graph() -> dict[str, set[str]]:
    return {name: {m for m in imports_of(name) if m in MODULES} - {name} for name in MODULES}


def test_the_import_graph_has_no_cycle():
    graph = internal_graph()
    # A package's __init__ is imported by each of its modules; its lazy entry points are not
    # edges that make a cycle worth the name, so the top-level package is left out.
    graph = {k: {m for m in v if m != "nb_cudaguard"} for k, v in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_only_the_notebook_glue_imports_ipython_or_ipywidgets():
    offenders = {
        name: sorted(m for m in imports_of(name) if m.split(".")[0] in FRONTEND_LIBRARIES)
        for name in MODULES
        if not name.startswith(GLUE)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_below_the_glue_imports_the_glue():
    # The package's own lazy entry points (load_ipython_extension, restart_kernel) aside.
    offenders = {
        name: sorted(m for m in imports_of(name) if m.startswith(GLUE))
        for name in MODULES
        if not name.startswith(GLUE) and name != "nb_cudaguard"
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_keep_and_files_sit_below_restart():
    # restart/ hands keep/ what it needs (keep_glue calls the save); keys and paths that both
    # use live in files/, the lowest layer, which imports nothing else of the package.
    offenders = {
        name: sorted(m for m in imports_of(name) if m.startswith("nb_cudaguard.restart"))
        for name in MODULES
        if name.startswith(("nb_cudaguard.keep", "nb_cudaguard.files"))
    }
    offenders |= {
        name: sorted(
            m
            for m in imports_of(name)
            if m.startswith("nb_cudaguard.") and not m.startswith("nb_cudaguard.files")
        )
        for name in MODULES
        if name.startswith("nb_cudaguard.files")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_two_modules_differ_by_a_suffix_only():
    stems = [p.stem for p in PACKAGE.rglob("*.py") if not p.stem.startswith("__")]
    clashes = sorted((a, b) for a in stems for b in stems if a != b and b.startswith(a))
    assert clashes == []


def test_importing_the_package_and_every_pure_layer_loads_no_frontend_and_no_torch():
    pure = [
        m
        for m in MODULES
        if m.startswith(
            (
                "nb_cudaguard.diagnosis",
                "nb_cudaguard.files",
                "nb_cudaguard.runtime",
                "nb_cudaguard.restart",
                "nb_cudaguard.replay",
                "nb_cudaguard.keep",
            )
        )
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {pure!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'IPython', 'ipywidgets', 'ipykernel') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
