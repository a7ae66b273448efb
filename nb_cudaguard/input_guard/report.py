"""The guard's error: where a call was made (frames, the module or classifier to name, the rank),
and the ``Violation`` and ``GuardError`` that report it.
"""

from __future__ import annotations

import dataclasses
import functools
import linecache
import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from ..diagnosis.bounds import (
    VOID_FIX,
    describe_module,
    find_classifier,
    marks_void,
    parameter_owner,
)
from .caller_frame import _CALL_NAME
from .errors import Finding, GuardError, GuardIndexError, Violation
from .ops import FIX_POSITIONS, FIX_TOKEN_TYPES, OpCheck, display_name


@dataclass
class _Where:
    """Where a call was made, kept as plain values: a deferred verdict is read after the
    frames are gone. (filename, line) innermost first; the namespaces to find a module in."""

    lines: list[tuple[str, int]]
    users: list[int] = field(default_factory=list)  # indices into lines outside libraries
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    params: set[int] = field(default_factory=set)


def _capture(
    args: tuple[Any, ...], kwargs: dict[str, Any], keep: bool = False, modules: bool = False
) -> _Where:
    """``keep``: the record outlives the call (deferred), so of a function's locals only its
    modules are kept, never its activations. ``modules``: look for modules even without a
    parameter among the arguments (a loss names its classifier)."""
    frames = _outer_frames()
    lines = [(f.f_code.co_filename, f.f_lineno) for f in frames]
    users = [i for i, (name, _) in enumerate(lines) if not _is_library(name)]
    if not users:  # all of it exec'd without source (`python -c`): its line numbers, at least
        users = [i for i, (name, _) in enumerate(lines) if not _in_library_dir(name)]
    # a plain tensor first: Parameter's metaclass answers isinstance in Python (~0.2 us each)
    params = {
        id(v)
        for v in (*args, *kwargs.values())
        if isinstance(v, torch.Tensor) and isinstance(v, torch.nn.Parameter)
    }
    namespaces: list[dict[str, Any]] = []
    if (
        params or modules
    ):  # outermost namespaces first: the notebook's `model` reads better than `self`
        for frame in reversed(frames):
            local = frame.f_locals
            if keep and local is not frame.f_globals:
                local = {k: v for k, v in local.items() if isinstance(v, torch.nn.Module)}
            namespaces += [frame.f_globals, local]
    return _Where(lines, users, namespaces, params)


def _violation(
    check: OpCheck, func: Any, finding: Finding, where: _Where, deferred: bool = False
) -> Violation:
    user = where.users[0] if where.users else None
    outer = where.users[-1] if where.users else None
    library = 0 if where.lines and user != 0 else None
    modules = [item for scope in where.namespaces for item in list(scope.items())]
    owner = parameter_owner(where.params, modules)
    fix = check.fix
    if check.family == "embedding" and owner is not None:
        finding, fix = _what_the_table_holds(owner, finding, fix)
    if check.family == "loss":
        owner = owner or _classifier(finding.limit, modules)
        if check.name in _IGNORES and marks_void(finding.distinct):
            fix = f"{VOID_FIX} {fix}"
    return Violation(
        op=display_name(check, func),
        finding=finding,
        fix=fix,
        owner=owner,
        line=_describe(where.lines[user]) if user is not None else None,
        entry_line=_describe(where.lines[outer]) if outer is not None and outer != user else None,
        library_line=_describe(where.lines[library]) if library is not None else None,
        rank=_rank(),
        deferred=deferred,
    )


def _what_the_table_holds(owner: str, finding: Finding, fix: str) -> tuple[Finding, str]:
    """An embedding's ids are tokens unless the table's name says otherwise: positions
    (``wpe``, ``position_embeddings``, ``embed_positions``) or token types
    (``token_type_embeddings``), whose bound and fix differ."""
    name = owner.rpartition(" at ")[2].rpartition(".")[2].lower()
    words = set(re.split(r"[_\d]+", name))
    if words & _POSITION_WORDS:
        problem, fix = "position id out of range", FIX_POSITIONS
    elif "token_type" in name or words & _TYPE_WORDS:
        problem, fix = "token type id out of range", FIX_TOKEN_TYPES
    else:
        return finding, fix
    return dataclasses.replace(finding, problem=problem), fix


_POSITION_WORDS = {"pos", "position", "positions", "positional", "wpe"}
_TYPE_WORDS = {"segment", "segments", "tte"}


# the losses that take an ignore_index
_IGNORES = ("cross_entropy", "nll_loss")


def _classifier(classes: int | None, modules: list[tuple[str, Any]]) -> str | None:
    """'the classifier nn.Linear(768, 3) at model.classifier; config.num_labels = 3': the layer
    whose outputs are the classes a loss's targets are checked against (as the panel says)."""
    head = find_classifier(modules, classes) if classes is not None else None
    if head is None:
        return None
    text = f"the classifier {describe_module(head.module)} at {head.path}"
    if head.num_labels is not None:
        text += f"; config.num_labels = {head.num_labels}"
    return text


def _raise(
    check: OpCheck,
    func: Any,
    finding: Finding,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    cpu_error: BaseException | None = None,
    replacing: bool = False,
) -> None:
    """``cpu_error``: PyTorch's own error for these values on CPU, quoted in the message.
    ``replacing``: the CPU op raised first, and the guard's error stands in for its own
    (which is then not shown beside it); an error the user's code was handling stays shown."""
    __tracebackhide__ = True
    where = _capture(args, kwargs, modules=check.family == "loss")
    violation = _violation(check, func, finding, where)
    if cpu_error is not None:
        violation = dataclasses.replace(violation, cpu_error=str(cpu_error).strip())
    error = _dressed(_error(check)(violation))
    if replacing:
        raise error from None
    raise error


def _error(check: OpCheck) -> type[GuardError]:
    """The CPU op's own class for the same input: IndexError where PyTorch raises one."""
    return GuardIndexError if check.index_error else GuardError


def _dressed(error: GuardError) -> GuardError:
    error.describe = _describe
    error.is_internal = _is_internal
    return error


def _is_internal(filename: str) -> bool:
    """torch's, ours, and IPython's cell runner: nothing the user wrote or can change."""
    return (
        filename.startswith(_TORCH_DIR)
        or filename.startswith(_OWN_DIR)
        or f"{os.sep}IPython{os.sep}" in filename
    )


# --- where: frames, modules, rank -------------------------------------------------------------
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # all of nb_cudaguard
_INTERNAL_DIRS = (_TORCH_DIR, _OWN_DIR)
_LIBRARY_DIRS = tuple(
    {p for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(key))}
)


def _outer_frames() -> list[FrameType]:
    """The calling frames outside torch and nb_cudaguard, innermost first. A deferred check
    walks them at every call: kept to one test per frame."""
    frames = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        name = code.co_filename
        if code.co_name == "run_code" and "IPython" in name:
            break  # IPython's cell runner: beyond lies the cell that ran this one (%%cudacheck's)
        if not name.startswith(_INTERNAL_DIRS) and code.co_name != _CALL_NAME:
            frames.append(frame)
        frame = frame.f_back
    return frames


def _is_library(filename: str) -> bool:
    """Not a line of the user's: a library's, or code without source (``<string>`` of an
    ``exec``, as a test runner's worker starts with), which no message could quote, where a line
    with source exists. A notebook's cells have source: IPython registers it with linecache."""
    if _in_library_dir(filename):  # cached: <frozen ...> among them
        return True
    return (
        filename.startswith("<")
        and not filename.startswith("<ipython-input-")
        and not linecache.getline(filename, 1)
    )


@functools.lru_cache(maxsize=4096)  # asked for every frame of every deferred call
def _in_library_dir(filename: str) -> bool:
    return (
        filename.startswith(_LIBRARY_DIRS)
        or filename.startswith("<frozen")
        or "site-packages" in filename
    )


def _describe(place: tuple[str, int]) -> str:
    filename, lineno = place
    source = linecache.getline(filename, lineno).strip()
    where = f"{_cell_name(filename) or filename}, line {lineno}"
    return f"{where}: {source}" if source else where


def _cell_name(filename: str) -> str | None:
    """IPython's own name for a cell's code ("Cell In[3]"), where IPython is running."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    format_code_name = getattr(shell.compile, "format_code_name", None)
    if format_code_name is None:  # IPython < 8 names cells <ipython-input-N-hash>
        match = _OLD_CELL_NAME.fullmatch(filename)
        return f"Cell In[{match.group(1)}]" if match else None
    try:
        name = format_code_name(filename)
    except Exception:
        return None
    return f"{name[0]} {name[1]}" if name else None


_OLD_CELL_NAME = re.compile(r"<ipython-input-(\d+)-[0-9a-f]+>")


def _rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def _changed_since(finding: Finding) -> Finding:
    from dataclasses import replace

    note = "values as they are now: the tensor was modified in place after the call"
    return replace(finding, source=f"{finding.source}; {note}" if finding.source else note)
