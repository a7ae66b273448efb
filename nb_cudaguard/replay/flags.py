"""What a cell does beyond the namespace, for the user's consent before a replay runs it again:
shell commands, installs, writes to files or the network, and a long run time before.

From the cell's tree as IPython runs it (``analysis.parse_cell``: ``!cmd`` is a
``get_ipython().system(...)`` call, ``%%bash`` a ``run_cell_magic``), by the names of the calls:
it can miss what a function defined elsewhere does, and it says what it found, not what is safe.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

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


def cell_flags(raw: str, transform: Transform | None, seconds: float | None) -> tuple[str, ...]:
    """Short phrases for what ``raw`` (a cell as typed) does beyond the namespace, each said
    once: ``runs shell commands (!ls)``, ``installs packages (%pip install x; not run again)``,
    ``writes files (torch.save)``, ``sends over the network (requests.post)``, ``ran 2 min
    5 s before``. ``seconds``: how long it ran in the previous kernel, if known."""
    found: dict[str, list[str]] = {}
    tree = parse_cell(raw, transform)
    for kind, what in _found(tree.body if tree is not None else []):
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


def _found(body: Iterable[ast.stmt]) -> Iterable[tuple[str, str]]:
    for node in (n for statement in body for n in ast.walk(statement)):
        if isinstance(node, ast.Call):
            yield from _call(node)


def _call(node: ast.Call) -> Iterable[tuple[str, str]]:
    dotted = _dotted(node.func)
    ipython = dotted.split(".", 1)[1] if dotted.startswith("get_ipython().") else None
    args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
    if ipython in ("system", "getoutput") and args and isinstance(args[0], str):
        command = args[0].strip()
        yield (INSTALL if _INSTALL_COMMAND.match(command) else SHELL), f"!{_short(command)}"
        return
    if ipython in ("run_line_magic", "run_cell_magic") and args and isinstance(args[0], str):
        name, line = args[0], args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        if name in INSTALL_MAGICS:
            yield INSTALL, f"%{name} {_short(line)}; not run again"
        elif ipython == "run_cell_magic" and name in SHELL_CELL_MAGICS:
            body = args[2] if len(args) > 2 and isinstance(args[2], str) else ""
            yield SHELL, f"%%{name}: {_short(body.strip().splitlines()[0] if body.strip() else '')}"
        elif ipython == "run_cell_magic" and name in ("writefile", "file"):
            yield FILES, f"%%{name} {_short(line)}"
        elif name in SHELL_LINE_MAGICS:
            yield SHELL, f"%{name} {_short(line)}"
        return
    method = node.func.attr if isinstance(node.func, ast.Attribute) else None
    if _matches(dotted, SHELL_CALLS):
        yield SHELL, dotted
    elif _matches(dotted, FILE_CALLS) or method in FILE_METHODS:
        yield FILES, dotted or str(method)
    elif _matches(dotted, NETWORK_CALLS) or method in ("push_to_hub",):
        yield NETWORK, dotted or str(method)
    elif (dotted in ("open", "io.open") or method == "open") and _opens_for_writing(node):
        yield FILES, f"{dotted or 'open'}(..., {_mode(node)!r})"


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
