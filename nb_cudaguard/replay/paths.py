"""The files a cell reads and writes, by path, for what a replay cannot rebuild from the cells:
files are state the namespace does not hold.

A replayed cell runs against the files as the previous kernel left them, not as they were when
it first ran: one that reads ``ckpt.pt`` after a later cell overwrote it reads the later
weights; one that appends to ``log.csv`` appends its lines a second time. A plan names what
follows from that. Read from the cell's text: paths given as strings, names bound to strings
(in this cell or an earlier one), ``os.path.join`` and ``Path(...) / ...`` of those; a path
built otherwise is not followed.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

# Writers by their name's end, and where the path is among their arguments.
_WRITERS = {
    "save": 1, "savez": 0, "savez_compressed": 0, "savetxt": 0, "imwrite": 0, "dump": 1,
    "to_csv": 0, "to_parquet": 0, "to_pickle": 0, "to_json": 0, "to_excel": 0, "to_feather": 0,
    "savefig": 0, "save_pretrained": 0, "save_model": 0, "save_to_disk": 0,
    "write_text": -1, "write_bytes": -1,
}  # fmt: skip
# Readers likewise (``-1``: the path is the object the method is called on, a ``Path``).
_READERS = {
    "load": 0, "loadtxt": 0, "genfromtxt": 0, "fromfile": 0, "imread": 0, "from_pretrained": 0,
    "read_csv": 0, "read_parquet": 0, "read_pickle": 0, "read_json": 0, "read_excel": 0,
    "read_feather": 0, "read_table": 0, "load_from_disk": 0, "read_text": -1, "read_bytes": -1,
}  # fmt: skip
# ``np.save(path, x)`` but ``torch.save(x, path)``, ``joblib.dump(x, path)``.
_PATH_FIRST = frozenset({"np", "numpy"})


@dataclass(frozen=True)
class FileUse:
    """What one cell does to files, by path."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()  # written whole (``open(p, "w")``, ``torch.save``)
    appends: frozenset[str] = frozenset()  # added to (``open(p, "a")``, ``to_csv(mode="a")``)


def file_uses(trees: Sequence[ast.AST | None]) -> list[FileUse]:
    """Each cell's ``FileUse``, in order: a name bound to a path in one cell names it in the
    later ones."""
    strings: dict[str, str] = {}
    found = []
    for tree in trees:
        finder = _Finder(strings)
        if tree is not None:
            finder.visit(tree)
        found.append(
            FileUse(frozenset(finder.reads), frozenset(finder.writes), frozenset(finder.appends))
        )
    return found


@dataclass
class _Finder(ast.NodeVisitor):
    strings: dict[str, str]
    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    appends: set[str] = field(default_factory=set)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        path = self._path(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if path is None:
                    self.strings.pop(target.id, None)
                else:
                    self.strings[target.id] = path

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name == "open":
            self._open(node, func)
            return
        owner = func.value if isinstance(func, ast.Attribute) else None
        for table, into in ((_WRITERS, self.writes), (_READERS, self.reads)):
            where = table.get(name)
            if where is None:
                continue
            if where >= 0 and name in ("save", "dump") and _owner_name(owner) in _PATH_FIRST:
                where = 0
            path = (
                self._path(owner)
                if where < 0 and owner is not None
                else self._argument(node, where)
            )
            if path is not None:
                if into is self.writes and _keyword(node, "mode") == "a":
                    self.appends.add(path)
                else:
                    into.add(path)

    def _open(self, node: ast.Call, func: ast.expr) -> None:
        on_path = isinstance(func, ast.Attribute)  # Path(p).open(mode)
        path = (
            self._path(func.value) if isinstance(func, ast.Attribute) else self._argument(node, 0)
        )
        if path is None:
            return
        mode = _keyword(node, "mode")
        if mode is None:
            given = (
                node.args[0 if on_path else 1] if len(node.args) > (0 if on_path else 1) else None
            )
            mode = (
                given.value
                if isinstance(given, ast.Constant) and isinstance(given.value, str)
                else "r"
            )
        if "a" in mode:
            self.appends.add(path)
        elif "w" in mode or "x" in mode:
            self.writes.add(path)
        else:
            self.reads.add(path)

    def _argument(self, node: ast.Call, position: int) -> str | None:
        given = node.args[position] if len(node.args) > position else None
        if given is None:
            given = next(
                (k.value for k in node.keywords if k.arg in ("f", "file", "path", "fname")), None
            )
        return self._path(given) if given is not None else None

    def _path(self, node: ast.AST | None) -> str | None:
        """The path ``node`` stands for, normalised, or None where the text cannot say."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return posixpath.normpath(node.value) if node.value else None
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            parts: Iterable[ast.AST] = node.args
            if name in ("Path", "PurePath", "PosixPath", "join") and node.args:
                found = [self._path(p) for p in parts]
                if all(p is not None for p in found):
                    return posixpath.normpath(posixpath.join(*found))  # type: ignore[arg-type]
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self._path(node.left), self._path(node.right)
            if left is not None and right is not None:
                return posixpath.normpath(posixpath.join(left, right))
        return None


def _owner_name(node: ast.AST | None) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _keyword(node: ast.Call, name: str) -> str | None:
    for keyword in node.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    return None
