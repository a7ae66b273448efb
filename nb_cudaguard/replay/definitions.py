"""A replayed cell's ``class`` or ``def`` of a name the namespace keeps: bound at once to the one
kept, so that what the rest of the cell makes is of it.

A cell that defines a class and makes instances (``class Tok: ...`` then ``tok = Tok(3)``) runs
again when a name it makes is missing (``tok`` held a lock, so it was not kept), while the class
the namespace has (restored, with instances of it in other restored names) is put back after
the cell. Made from the cell's new class, ``tok`` would fail ``type(tok) is Tok`` and
``isinstance(tok, Tok)`` ever after. So right after each such statement the cell binds the name
to the one kept: an assignment added to the cell's tree at the statement's last line, so every
other line, and a traceback's line numbers, stay as typed. The statement itself still runs (its
decorators and metaclass see a new class, as they did when the cell first ran).
"""

from __future__ import annotations

import ast
from collections.abc import Collection

HOLDER = "_nb_cudaguard_kept"  # bound in the namespace only while the cell runs

_DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# Statements whose bodies run in the module's own scope (a function's or class's do not).
_BLOCKS = ("body", "orelse", "finalbody")


class KeptDefinitions(ast.NodeTransformer):
    """IPython's ``ast_transformers`` protocol: ``visit`` gets and returns the cell's Module."""

    def __init__(self, names: Collection[str], holder: str = HOLDER) -> None:
        self.names = frozenset(names)
        self.holder = holder

    def visit_Module(self, node: ast.Module) -> ast.Module:
        node.body = self._statements(node.body)
        return node

    def _statements(self, statements: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for statement in statements:
            out.append(statement)
            if isinstance(statement, _DEFINITIONS):
                if statement.name in self.names:
                    out.append(self._bind(statement))
                continue
            for block in _BLOCKS:
                inner = getattr(statement, block, None)
                if isinstance(inner, list) and inner:
                    setattr(statement, block, self._statements(inner))
            for handler in getattr(statement, "handlers", ()):
                handler.body = self._statements(handler.body)
            for case in getattr(statement, "cases", ()):
                case.body = self._statements(case.body)
        return out

    def _bind(self, statement: ast.stmt) -> ast.stmt:
        name = statement.name  # type: ignore[attr-defined]
        value = ast.Subscript(ast.Name(self.holder, ast.Load()), ast.Constant(name), ast.Load())
        bind = ast.Assign([ast.Name(name, ast.Store())], value)
        line = statement.end_lineno or statement.lineno
        for node in ast.walk(bind):
            node.lineno = node.end_lineno = line  # type: ignore[attr-defined]
            node.col_offset = node.end_col_offset = 0  # type: ignore[attr-defined]
        return bind
