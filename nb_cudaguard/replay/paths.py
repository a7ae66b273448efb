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
import re
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from .escapes import aimported, ipython_call, strings

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
# Listers of a directory (``-1``: the directory is the ``Path`` the method is called on; for
# ``glob`` the argument is a pattern, whose directory is the part before its first wildcard).
# What they find is every file in it, so a later cell that writes one there changes it.
_LISTERS = {
    "glob": 0, "iglob": 0, "listdir": 0, "scandir": 0, "walk": 0, "iterdir": -1, "rglob": -1,
}  # fmt: skip
# Removers (``os.remove(p)``, ``Path(p).unlink()``, ``shutil.rmtree(d)``): a listing run again
# after them misses what they removed.
_REMOVERS = {"remove": 0, "unlink": 0, "rmtree": 0, "rmdir": 0}
# Copiers, by their module: they read their first argument and write their second
# (``shutil.copy("run/last.pt", "run/best.pt")``, ``os.replace(tmp, path)``).
_COPIERS = {"copy": "shutil", "copy2": "shutil", "copyfile": "shutil", "copytree": "shutil",
            "move": "shutil", "rename": "os", "replace": "os"}  # fmt: skip
# Memory maps of a file, by their name: the keyword of their mode, its position, its default.
_MAPPERS = {
    "load": ("mmap_mode", 1, None), "memmap": ("mode", 2, "r+"), "open_memmap": ("mode", 1, "r+"),
}  # fmt: skip
_WRITABLE_MAPS = frozenset({"r+", "w+", "readwrite", "write"})
# A cell that may read, write, list, remove or name a path: it calls one of the above, or binds
# a string.
_CALLS = (
    _WRITERS.keys() | _READERS.keys() | _LISTERS.keys() | _REMOVERS.keys() | _COPIERS.keys()
) | _MAPPERS.keys()
_MAY_USE_PATHS = re.compile(
    r"\b(?:open|import|" + "|".join(sorted(_CALLS)) + r")\b"
    r"|\w\s*=\s*(?:[rRbBfF]?['\"]|Path\(|os\.path\.join\()"
    r"|^\s*[!%]|=\s*[!%]"  # a shell command, a magic (``!echo x > f``, ``%%writefile``)
    r"|\b(?:system|getoutput|run_cell_magic|run_line_magic)\(",
    re.MULTILINE,
)
# Cell magics whose body is a shell script (IPython's ``%%bash``, ``%%sh``; ``%%script bash``).
_SHELL_CELLS = frozenset({"bash", "sh"})
_SHELLS = frozenset({"bash", "sh", "zsh"})
# Shell commands' file effects, as far as a command line says them: ``>``/``>>`` redirections
# (not to a descriptor, ``>&2``), and a few commands by their arguments.
_REDIRECT = re.compile(r"(?<![<>&])(\d?)(>>?)(?!&)\s*([^\s;&|<>()]+)")
# Programs that run a script whose file writes the command line does not say.
_INTERPRETERS = frozenset(
    {"python", "python3", "bash", "sh", "zsh", "Rscript", "node", "perl", "ruby", "julia"}
)
# Programs that write files their command line names only in part (an archive's members, a
# download's own name, a clone): run, they may have written any file, as a script may.
_UNPACKERS = frozenset(
    {"unzip", "tar", "7z", "git", "kaggle", "gdown", "rsync", "gsutil", "huggingface-cli", "hf"}
)
# Python's own ways to run a command line: ``os.system("...")``, ``subprocess.run([...])``.
_RUNNERS = {
    "os": frozenset({"system", "popen"}),
    "subprocess": frozenset(
        {"run", "call", "check_call", "check_output", "Popen", "getoutput", "getstatusoutput"}
    ),
}
_SEPARATORS = re.compile(r"&&|\|\||[;|\n]")
# ``np.save(path, x)`` but ``torch.save(x, path)``, ``joblib.dump(x, path)``.
_PATH_FIRST = frozenset({"np", "numpy"})


@dataclass(frozen=True)
class FileUse:
    """What one cell does to files, by path."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()  # written whole (``open(p, "w")``, ``torch.save``)
    appends: frozenset[str] = frozenset()  # added to (``open(p, "a")``, ``to_csv(mode="a")``)
    lists: frozenset[str] = frozenset()  # directories listed (``glob("d/*.txt")``: ``d``)
    removes: frozenset[str] = frozenset()  # files or directories removed (``os.remove(p)``)
    # Programs it runs whose writes no text here says (``!python gen.py``, ``%run s.py``), as
    # spelled: they may have written any file.
    runs: frozenset[str] = frozenset()


def lies_in(path: str, directory: str) -> bool:
    """Whether ``path`` lies in ``directory`` or below it (both as ``file_uses`` gives them)."""
    if directory == ".":
        return not posixpath.isabs(path)
    return path.startswith(directory.rstrip("/") + "/")


_NONE = FileUse()
_KINDS = ("reads", "writes", "appends", "lists", "removes", "runs")  # FileUse's, in order

# A path as the text spells it: its parts, each a string or, marked by _NAME, a name whose string
# an earlier statement or cell gives.
_Path = tuple[str, ...]
_NAME = "\x00"
# One cell's path events in order: ("bind", name, path or None), ("maps", name, path): the name
# is a writable memory map of the file, or ("reads" | "writes" | "appends" | "lists" |
# "removes", "", path). Kept with the cell's facts; ``file_uses``
# resolves them across cells.
PathEvents = tuple[tuple[str, str, _Path | None], ...]


def path_events(tree: ast.AST, source: str | None = None) -> PathEvents:
    """One cell's path events; ``source``, its text, where given, spares the walk of a cell
    that names no reader or writer and binds no string (most cells)."""
    if source is not None and not _MAY_USE_PATHS.search(source):
        return ()
    finder = _Finder()
    finder.visit(tree)
    return tuple(finder.events)


def file_uses(
    cells: Sequence[PathEvents], changes: Sequence[Collection[str]] | None = None
) -> list[FileUse]:
    """Each cell's ``FileUse``, in order: a name bound to a path in one cell names it in the
    later ones. ``changes``, each cell's names changed in place where given: a change to an
    array mapped writable from a file (``np.load(p, mmap_mode="r+")``, ``np.memmap(p)``) is
    a write of that file, which a cell run again that maps it finds."""
    strings: dict[str, str] = {}
    mapped: dict[str, str] = {}  # name -> the file it is a writable memory map of
    found = []
    for i, events in enumerate(cells):
        changed = [n for n in changes[i] if n in mapped] if changes and mapped else ()
        if not events and not changed:
            found.append(_NONE)
            continue
        uses: dict[str, set[str]] = {k: set() for k in _KINDS}
        for kind, name, parts in events:
            if kind == "runs":  # a command line, not a path
                uses[kind].update(parts or ())
                continue
            path = _resolved(parts, strings)
            if kind == "maps":
                if path is not None:
                    mapped[name] = path
                continue
            if kind == "reads" and path in uses["writes"]:
                continue  # its own write, read back: what it finds is what it made
            if kind != "bind":
                if path is not None:
                    uses[kind].add(path)
                continue
            mapped.pop(name, None)
            if path is None:
                strings.pop(name, None)
            else:
                strings[name] = path
        if changes:
            uses["writes"].update(mapped[n] for n in changes[i] if n in mapped)
        found.append(FileUse(*(frozenset(uses[k]) for k in _KINDS)))
    return found


def _resolved(parts: _Path | None, strings: dict[str, str]) -> str | None:
    if not parts:
        return None
    given = [strings.get(p[1:]) if p[:1] == _NAME else p for p in parts]
    if any(p is None for p in given):
        return None
    return posixpath.normpath(posixpath.join(*given))  # type: ignore[arg-type]


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, _Path | None]] = []

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        path = self._path(node.value)
        mapped = self._mapped(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.events.append(("bind", target.id, path))
                if mapped is not None:
                    self.events.append(("maps", target.id, mapped))

    def _mapped(self, node: ast.expr) -> _Path | None:
        """The file ``node`` maps writable into memory, where it does: ``np.load(p,
        mmap_mode="r+")``, ``np.memmap(p)`` (``r+`` unless told), ``open_memmap(p, "r+")``;
        a change in place of the array is then a change of the file."""
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in _MAPPERS:
            return None
        if (_map_mode(node, name) or _MAPPERS[name][2]) not in _WRITABLE_MAPS:
            return None
        return self._argument(node, 0)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._imports(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self._imports(node.module)

    def _imports(self, module: str) -> None:
        """An import reads the module's file where it is the notebook's own (``helpers.py``
        beside it, maybe written by a ``%%writefile`` cell); a library's name is no path any
        cell writes, so naming ``torch.py`` too costs nothing. (A package's ``__init__.py`` is
        not followed.)"""
        self.events.append(("reads", "", (module.split(".")[0] + ".py",)))

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        ipython = ipython_call(node)
        if ipython is not None:
            self._ipython(ipython[0], strings(ipython[1]))
            return
        owner = func.value if isinstance(func, ast.Attribute) else None
        if name in _RUNNERS.get(_owner_name(owner), ()) and node.args:
            command = node.args[0]
            if isinstance(command, ast.Constant) and isinstance(command.value, str):
                self._shell(command.value)
            elif isinstance(command, ast.List | ast.Tuple):
                words = [
                    e.value
                    for e in command.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                if len(words) == len(command.elts):
                    self._shell(shlex.join(words))
            return
        if name == "open":
            self._open(node, func)
            return
        if name in _LISTERS:
            self._lists(node, name, owner)
            return
        if name in _REMOVERS and (owner is None or _owner_name(owner) in ("os", "shutil")):
            path = self._argument(node, 0)  # ``os.remove(p)``, ``shutil.rmtree(d)``
        elif name == "unlink" and owner is not None:
            path = self._path(owner)  # ``Path(p).unlink()``
        else:
            path = None
        if path is not None:
            self.events.append(("removes", "", path))
            return
        if name in _COPIERS and _owner_name(owner) == _COPIERS[name]:
            source, target = self._argument(node, 0), self._argument(node, 1)
            if source is not None:
                self.events.append(("reads", "", source))
            if target is not None:
                self.events.append(("writes", "", target))
            return
        if name in ("memmap", "open_memmap"):  # reads the file, or makes it anew (``w+``)
            path = self._argument(node, 0)
            mode = _map_mode(node, name)
            if path is not None:
                self.events.append(("writes" if mode in ("w+", "write") else "reads", "", path))
            return
        for table, kind in ((_WRITERS, "writes"), (_READERS, "reads")):
            where = table.get(name)
            if where is None:
                continue
            if where >= 0 and name in ("save", "dump") and _owner_name(owner) in _PATH_FIRST:
                where = 0
            on_owner = where < 0 and owner is not None
            path = self._path(owner) if on_owner else self._argument(node, where)
            if path is not None:
                appending = kind == "writes" and _keyword(node, "mode") == "a"
                self.events.append(("appends" if appending else kind, "", path))

    def _ipython(self, method: str, args: list[str | None]) -> None:
        """What IPython's escapes do to files, as its transform spells them: ``!cmd`` and
        ``x = !cmd`` (``system``, ``getoutput``), ``%%bash``/``%%sh`` cells, ``%%writefile``
        (IPython/core/magics/osm.py: ``-a`` appends, else it writes the file whole)."""
        name, line, body = [*args, None, None, None][:3]
        if method in ("system", "getoutput") and name is not None:
            self._shell(name)
        elif method == "run_line_magic" and name in ("system", "sx", "sc") and line:
            self._shell(line)
        elif method == "run_line_magic" and name == "aimport" and line:
            for module in aimported(line):  # (autoreload's: an import of each)
                self._imports(module)
        elif method == "run_line_magic" and name == "run" and line:
            self.events.append(("runs", "", (f"%run {line}",)))
        elif method == "run_cell_magic" and line is not None and body is not None:
            words = _words(line)
            if name in ("writefile", "file") and words:
                appending = any(w in ("-a", "--append") for w in words)
                path = next((w for w in words if not w.startswith("-")), None)
                if path is not None and not _expands(path):
                    self.events.append(("appends" if appending else "writes", "", (path,)))
            elif name in _SHELL_CELLS or (name == "script" and words[:1] and words[0] in _SHELLS):
                self._shell(body)
            elif name in ("script", "python", "python2", "python3", "perl", "ruby"):
                self.events.append(("runs", "", (f"%%{name} {line}".strip(),)))

    def _shell(self, command: str) -> None:
        """A shell command line's redirections, ``touch``, ``rm``, ``ls``, ``cp``, ``mv``,
        ``wget -O`` and ``curl -o``, with paths spelled out (none IPython expands: ``$x``,
        ``{x}``)."""
        for to, kind in ((m.group(3), m.group(2)) for m in _REDIRECT.finditer(command)):
            if not _expands(to) and not to.startswith("/dev/"):
                self.events.append(("appends" if kind == ">>" else "writes", "", (to,)))
        for simple in _SEPARATORS.split(_REDIRECT.sub(" ", command)):
            words = [w for w in _words(simple) if not _expands(w)]
            if not words:
                continue
            program, operands = words[0], [w for w in words[1:] if not w.startswith("-")]
            downloads = (program == "wget" and "-O" not in words) or (
                program == "curl" and "-O" in words
            )
            if program in _INTERPRETERS | _UNPACKERS or program.startswith("./") or downloads:
                self.events.append(("runs", "", (" ".join(words),)))
            elif program == "touch":
                self.events += [("writes", "", (p,)) for p in operands]
            elif program == "rm":
                self.events += [("removes", "", _pattern_directory((p,))) for p in operands]
            elif program == "ls":
                for p in operands or ["."]:
                    self.events.append(("lists", "", _pattern_directory((p,))))
            elif program in ("cp", "mv") and len(operands) == 2:
                self.events.append(("reads", "", (operands[0],)))
                self.events.append(("writes", "", (operands[1],)))
            elif program in ("wget", "curl"):
                flag = "-O" if program == "wget" else "-o"
                at = words.index(flag) if flag in words[:-1] else -1
                if at >= 0:
                    self.events.append(("writes", "", (words[at + 1],)))

    def _open(self, node: ast.Call, func: ast.expr) -> None:
        on_path = isinstance(func, ast.Attribute)  # Path(p).open(mode)
        path = (
            self._path(func.value) if isinstance(func, ast.Attribute) else self._argument(node, 0)
        )
        if path is None:
            return
        mode = _keyword(node, "mode")
        if mode is None:
            at = 0 if on_path else 1
            given = node.args[at] if len(node.args) > at else None
            is_text = isinstance(given, ast.Constant) and isinstance(given.value, str)
            mode = given.value if is_text else "r"  # type: ignore[union-attr]
        kind = "appends" if "a" in mode else "writes" if "w" in mode or "x" in mode else "reads"
        self.events.append((kind, "", path))

    def _lists(self, node: ast.Call, name: str, owner: ast.expr | None) -> None:
        """``glob("d/*.txt")``, ``os.listdir(d)``, ``Path(d).iterdir()``: the directory read."""
        on_path = owner is not None and _owner_name(owner) not in ("glob", "os")
        if _LISTERS[name] < 0 or (name == "glob" and on_path):
            path = self._path(owner)  # ``Path(d).glob("*.txt")``: ``d``
        elif node.args:
            path = self._path(node.args[0])
            if name in ("glob", "iglob") and path is not None:
                path = _pattern_directory(path)
        else:
            path = (".",) if name in ("listdir", "scandir") else None  # the working directory
        if path is not None:
            self.events.append(("lists", "", path))

    def _argument(self, node: ast.Call, position: int) -> _Path | None:
        given = node.args[position] if len(node.args) > position else None
        if given is None:
            keywords = ("f", "file", "path", "fname")
            given = next((k.value for k in node.keywords if k.arg in keywords), None)
        return self._path(given) if given is not None else None

    def _path(self, node: ast.AST | None) -> _Path | None:
        """The parts of the path ``node`` stands for, or None where the text cannot say."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return (node.value,) if node.value else None
        if isinstance(node, ast.Name):
            return (_NAME + node.id,)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in ("Path", "PurePath", "PosixPath", "join") and node.args:
                found = [self._path(p) for p in node.args]
                if all(p is not None for p in found):
                    return tuple(part for p in found for part in p)  # type: ignore[union-attr]
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self._path(node.left), self._path(node.right)
            if left is not None and right is not None:
                return left + right
        return None


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unclosed quote: the words as they stand
        return text.split()


def _expands(word: str) -> bool:
    """Whether IPython (``$x``, ``{x}``) or the shell (``$x``, ``~``) makes the word another
    path than it reads: such a path is not followed."""
    return any(c in word for c in "${}~`")


def _pattern_directory(parts: _Path) -> _Path:
    """The directory a glob pattern lists: its parts before the first piece with a wildcard
    (``"data/*/x.txt"``: ``data``; ``os.path.join(root, "*.txt")``: ``root``)."""
    kept: list[str] = []
    for part in parts:
        if part[:1] == _NAME:
            kept.append(part)
            continue
        pieces = part.split("/")
        wild = next((i for i, p in enumerate(pieces) if re.search(r"[*?[]", p)), None)
        if wild is None:
            kept.append(part)
            continue
        if wild:
            kept.append("/".join(pieces[:wild]) or "/")
        break
    return tuple(kept) or (".",)


def _owner_name(node: ast.AST | None) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _map_mode(node: ast.Call, name: str) -> Any:
    """The mode a memory map (``name``, one of ``_MAPPERS``) is given, by keyword or by
    position: the constant, "?" where it is not one, None where none is given."""
    keyword, at, _ = _MAPPERS[name]
    mode: Any = _keyword(node, keyword)
    if mode is None and len(node.args) > at:
        given = node.args[at]
        mode = given.value if isinstance(given, ast.Constant) else "?"
    return mode


def _keyword(node: ast.Call, name: str) -> str | None:
    for keyword in node.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    return None
