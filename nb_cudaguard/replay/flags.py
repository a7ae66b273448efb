"""What a cell does beyond the namespace, for the user's consent before a replay runs it again:
shell commands, installs, writes to files or the network, and a long run time before.

From the cell's tree as IPython runs it (``analysis.parse_cell``: ``!cmd`` is a
``get_ipython().system(...)`` call, ``%%bash`` a ``run_cell_magic``), by the names of the calls:
it can miss what a function defined elsewhere does, and it says what it found, not what is safe.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence

from .analysis import Transform, parse_cell

LONG_S = 30.0  # a cell that ran this long before is flagged: a training loop, a download

SHELL_CELL_MAGICS = frozenset({"bash", "sh", "script", "system", "powershell", "cmd"})
SHELL_LINE_MAGICS = frozenset({"sx", "system", "sc"})
INSTALL_MAGICS = frozenset({"pip", "conda", "mamba", "micromamba", "uv"})
_INSTALL_COMMAND = re.compile(
    r"^\s*(?:sudo\s+)?(?:python3?\s+-m\s+)?(?:pip3?|conda|mamba|micromamba|uv|apt|apt-get|yum|"
    r"brew|npm)\b.*\b(?:install|add|upgrade|update|uninstall|remove)\b"
)
# Calls that run a program, by their dotted name's end.
SHELL_CALLS = frozenset(
    {
        "os.system", "os.popen", "os.execv", "os.execvp", "os.execl", "os.execlp", "os.spawnv",
        "os.spawnl", "subprocess.run", "subprocess.call", "subprocess.check_call",
        "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput",
        "subprocess.getstatusoutput", "pty.spawn",
    }
)  # fmt: skip
# Calls that write, move or delete files, by their dotted name's end (the module matters:
# ``os.remove`` deletes a file, ``lst.remove(x)`` does not).
FILE_CALLS = frozenset(
    {
        "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames",
        "os.replace", "os.makedirs", "os.mkdir", "os.truncate", "os.symlink", "os.link",
        "shutil.rmtree", "shutil.move", "shutil.copy", "shutil.copy2", "shutil.copyfile",
        "shutil.copytree", "shutil.make_archive", "shutil.unpack_archive",
        "torch.save", "np.save", "np.savez", "np.savez_compressed", "np.savetxt", "numpy.save",
        "numpy.savez", "numpy.savez_compressed", "numpy.savetxt", "pickle.dump", "json.dump",
        "joblib.dump", "yaml.dump", "yaml.safe_dump", "cv2.imwrite", "imageio.imwrite",
        "sf.write", "soundfile.write", "urllib.request.urlretrieve", "urlretrieve",
        "save_file", "tarfile.open", "zipfile.ZipFile",
    }
)  # fmt: skip
# Methods that write files whatever their object (pandas, matplotlib, Hugging Face, pathlib).
FILE_METHODS = frozenset(
    {
        "to_csv", "to_parquet", "to_pickle", "to_excel", "to_feather", "to_hdf", "to_sql",
        "to_json", "to_netcdf", "to_zarr", "savefig", "save_pretrained", "save_model",
        "write_text", "write_bytes", "unlink", "rmdir", "mkdir", "touch", "rmtree",
        "extractall", "save_to_disk", "to_file",
    }
)  # fmt: skip
# Calls that send data elsewhere.
NETWORK_CALLS = frozenset(
    {
        "requests.post", "requests.put", "requests.patch", "requests.delete", "requests.request",
        "httpx.post", "httpx.put", "httpx.patch", "httpx.delete", "urlopen", "sendmail",
        "send_message", "push_to_hub", "upload_file", "upload_folder", "create_repo",
        "wandb.log", "wandb.init", "mlflow.log_artifact", "kaggle.api.dataset_create_version",
    }
)  # fmt: skip
_WRITE_MODE = re.compile(r"[wax+]")


def cell_flags(
    raw: str, transform: Transform | None, seconds: float | None, earlier: Iterable[str] = ()
) -> tuple[str, ...]:
    """Short phrases for what ``raw`` (a cell as typed) does beyond the namespace, each said
    once: ``runs shell commands (!ls)``, ``installs packages (%pip install x; not run again)``,
    ``writes files (torch.save)``, ``sends over the network (requests.post)``, ``ran 2 min
    5 s before``. ``seconds``: how long it ran in the previous kernel, if known; ``earlier``:
    the cells that ran before it, in order, whose imports and assignments say what its names
    are (``import os as o`` there makes ``o.system`` here a shell command)."""
    reader = Reader(transform)
    for source in earlier:
        reader.read(source)
    return reader.read(raw, seconds)


class Reader:
    """Reads a notebook's cells in the order they ran and flags each by what its calls resolve
    to through the imports and assignments seen so far, not by how they are spelled."""

    def __init__(self, transform: Transform | None) -> None:
        self._transform = transform
        self._names: dict[str, str] = {}  # a name -> what it was bound to, resolved
        self._strings: dict[str, str] = {}  # a name -> the string constant bound to it

    def read(self, raw: str, seconds: float | None = None) -> tuple[str, ...]:
        """``raw``'s flags (see ``cell_flags``); what it binds counts for the cells after it."""
        found: dict[str, list[str]] = {}
        tree = parse_cell(raw, self._transform)
        visitor = _Visitor(self._names, self._strings)
        for statement in tree.body if tree is not None else []:
            visitor.visit(statement)
        for kind, what in visitor.found:
            found.setdefault(kind, []).append(what)
        flags = [
            f"{kind} ({', '.join(dict.fromkeys(what))})"
            for kind, what in sorted(found.items(), key=lambda kv: _ORDER.index(kv[0]))
        ]
        if seconds is not None and seconds >= LONG_S:
            flags.append(f"ran {duration(seconds)} before")
        return tuple(flags)


SHELL, INSTALL, FILES, NETWORK = (
    "runs shell commands",
    "installs packages",
    "writes or deletes files",
    "sends over the network",
)
_ORDER = (INSTALL, SHELL, FILES, NETWORK)


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


# What a name bound to a file opened for writing resolves to, and that file's writing methods.
WRITABLE_FILE = "<a file opened for writing>"
FILE_HANDLE_WRITES = frozenset({"write", "writelines", "truncate"})
# pathlib's methods that change the file system (``df.rename`` does not: only on a Path).
PATH_TYPES = frozenset({"pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath"})
PATH_WRITES = frozenset(
    {
        "rename", "replace", "unlink", "rmdir", "mkdir", "touch", "write_text", "write_bytes",
        "symlink_to", "hardlink_to", "chmod", "open",
    }
)  # fmt: skip
# DB-API cursors and connections (sqlite3, psycopg, pymysql) and SQLAlchemy run SQL through these.
SQL_CALLS = frozenset({"execute", "executemany", "executescript", "exec_driver_sql", "text"})
_SQL_WRITE = re.compile(
    r"^\s*(?:WITH\b.*?\)\s*)?(DELETE|DROP|TRUNCATE|INSERT|UPDATE|ALTER|CREATE|REPLACE|MERGE|"
    r"GRANT|REVOKE|VACUUM)\b",
    re.IGNORECASE | re.DOTALL,
)


class _Visitor(ast.NodeVisitor):
    """One cell's calls in source order, each resolved through what the names were bound to
    (earlier cells' bindings in ``names``, updated as this cell binds more)."""

    def __init__(self, names: dict[str, str], strings: dict[str, str]) -> None:
        self.names, self.strings = names, strings
        self.found: list[tuple[str, str]] = []
        self.bound_here: set[str] = set()  # a file opened here is flagged at its open()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.names[alias.asname] = alias.name
            else:  # ``import os.path`` binds ``os``
                top = alias.name.split(".")[0]
                self.names[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = ("." * node.level) + (node.module or "")
        for alias in node.names:
            if alias.name != "*":
                self.names[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._bind(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._bind(node.target, node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._bind(node.target, node.value)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, item.context_expr)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if not isinstance(target, ast.Name):
            return
        self.bound_here.add(target.id)
        self.names.pop(target.id, None)
        self.strings.pop(target.id, None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            self.strings[target.id] = value.value
        resolved = self.resolve(value)
        if resolved:
            self.names[target.id] = resolved

    def resolve(self, node: ast.expr) -> str:
        """What ``node`` stands for: a dotted name through the imports (``o.system`` after
        ``import os as o`` is ``os.system``), a call's result as ``name()`` (``pathlib.Path()``),
        ``WRITABLE_FILE`` for ``open(p, "w")``; ``""`` where it cannot say."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else ""
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Call) and _dotted(node.func.func) == "get_ipython":
                return ""
            func = self.resolve(node.func)
            if _is_open(func) and _opens_for_writing(node):
                return WRITABLE_FILE
            return f"{func}()" if func else ""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # Path("a") / "b"
            left = self.resolve(node.left)
            return left if _is_path(left) else ""
        return ""

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        self.found.extend(self._call(node))

    def _call(self, node: ast.Call) -> Iterable[tuple[str, str]]:
        spelled = _dotted(node.func)
        ipython = spelled.split(".", 1)[1] if spelled.startswith("get_ipython().") else None
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        if ipython in ("system", "getoutput") and args and isinstance(args[0], str):
            command = args[0].strip()
            yield (INSTALL if _INSTALL_COMMAND.match(command) else SHELL), f"!{_short(command)}"
            return
        if ipython in ("run_line_magic", "run_cell_magic") and args and isinstance(args[0], str):
            yield from _magic(ipython, args)
            return
        resolved = self.resolve(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        receiver = self.resolve(node.func.value) if isinstance(node.func, ast.Attribute) else ""
        said = spelled or str(method)
        if resolved and spelled and resolved != spelled and "()" not in resolved:
            said = f"{spelled} = {resolved}"
        if _matches(resolved, SHELL_CALLS):
            yield SHELL, said
        elif _matches(resolved, FILE_CALLS) or method in FILE_METHODS:
            yield FILES, said
        elif _is_path(receiver) and method in PATH_WRITES and method != "open":
            yield FILES, f"{spelled or 'Path(...)'}: pathlib.Path.{method}"
        elif (
            receiver == WRITABLE_FILE
            and method in FILE_HANDLE_WRITES
            and not self._opened_here(node.func)
        ):
            yield FILES, f"{spelled}: a file opened for writing"
        elif _matches(resolved, NETWORK_CALLS) or method in ("push_to_hub",):
            yield NETWORK, said
        elif (_is_open(resolved) or method == "open") and _opens_for_writing(node):
            yield FILES, f"{spelled or 'open'}(..., {_mode(node)!r})"
        elif method in SQL_CALLS or resolved.endswith(".text"):
            statement = self._sql(node)
            if statement is not None:
                yield FILES, f"{said}: SQL {statement.upper()}"
        if any(
            k.arg == "file"
            and self.resolve(k.value) == WRITABLE_FILE
            and not self._opened_here(k.value)
            for k in node.keywords
        ):
            yield FILES, f"{spelled}(..., file=): a file opened for writing"

    def _opened_here(self, node: ast.expr) -> bool:
        """``node`` is ``f`` or ``f.write`` where this cell bound ``f`` (and flagged its open)."""
        base = node.value if isinstance(node, ast.Attribute) else node
        return isinstance(base, ast.Name) and base.id in self.bound_here

    def _sql(self, node: ast.Call) -> str | None:
        """The writing SQL verb of the call's first argument (a string, an f-string, a name
        bound to one, ``text("...")``), if it has one."""
        given = node.args[0] if node.args else None
        if isinstance(given, ast.Call) and given.args:  # sqlalchemy's text("...")
            given = given.args[0]
        text = None
        if isinstance(given, ast.Constant) and isinstance(given.value, str):
            text = given.value
        elif isinstance(given, ast.JoinedStr):
            text = "".join(
                str(v.value) if isinstance(v, ast.Constant) else "x" for v in given.values
            )
        elif isinstance(given, ast.Name):
            text = self.strings.get(given.id)
        match = _SQL_WRITE.match(text) if text is not None else None
        return match.group(1) if match else None


def _magic(ipython: str, args: Sequence[object]) -> Iterable[tuple[str, str]]:
    name = str(args[0])
    line = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
    if name in INSTALL_MAGICS:
        yield INSTALL, f"%{name} {_short(line)}; not run again"
    elif ipython == "run_cell_magic" and name in SHELL_CELL_MAGICS:
        body = args[2] if len(args) > 2 and isinstance(args[2], str) else ""
        yield SHELL, f"%%{name}: {_short(body.strip().splitlines()[0] if body.strip() else '')}"
    elif ipython == "run_cell_magic" and name in ("writefile", "file"):
        yield FILES, f"%%{name} {_short(line)}"
    elif name in SHELL_LINE_MAGICS:
        yield SHELL, f"%{name} {_short(line)}"


def _is_open(resolved: str) -> bool:
    return resolved in ("open", "io.open", "builtins.open", "codecs.open") or any(
        resolved == f"{p}().open" for p in PATH_TYPES
    )


def _is_path(resolved: str) -> bool:
    return resolved in {f"{p}()" for p in PATH_TYPES}


def _matches(dotted: str, table: frozenset[str]) -> bool:
    """``dotted`` is a name of ``table``, or ends with one (``torch.save``, ``os.path`` aside:
    ``np.save`` matches ``np.save`` only, ``urlopen`` any ``*.urlopen``)."""
    return bool(dotted) and (dotted in table or any(dotted.endswith("." + t) for t in table))


def _dotted(func: ast.expr) -> str:
    parts: list[str] = []
    node = func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call) and _dotted(node.func) == "get_ipython":
        parts.append("get_ipython()")
    else:
        return ""
    return ".".join(reversed(parts))


def _mode(node: ast.Call) -> str:
    # open(file, mode) and Path(...).open(mode)
    position = 0 if isinstance(node.func, ast.Attribute) and node.func.attr == "open" else 1
    for keyword in node.keywords:
        if keyword.arg == "mode" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    given = node.args[position] if len(node.args) > position else None
    if isinstance(given, ast.Constant):
        return str(given.value)
    return "r"


def _opens_for_writing(node: ast.Call) -> bool:
    return bool(_WRITE_MODE.search(_mode(node)))


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
