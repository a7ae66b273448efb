"""The guard: check the inputs of assert-prone torch calls before their kernels launch.

It is a ``torch.overrides.TorchFunctionMode``, not a set of patched attributes: one mode sees
functional calls, tensor methods and ``Tensor.__getitem__``/``__setitem__`` alike, also from inside
``nn.Module.forward``, sees only the outermost call (the mode is off while it runs, so the
``nll_loss`` inside ``cross_entropy`` is not checked twice), and leaving the ``with`` block takes
it off torch's stack again whatever happened inside. Nothing in torch is modified.

Module import needs torch: ``nb_cudaguard`` imports this lazily.
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .errors import Finding, GuardError, GuardIndexError, Violation
from .ops import NAMES, OpCheck, display_name, table
from .requirements import Requirement

# How often the guard read values back from the device: the cost a non-blocking mode would remove.
STATS: Counter[str] = Counter()


@dataclass(frozen=True)
class GuardConfig:
    only: frozenset[str] | None = None  # op names or families; None: all
    skip: frozenset[str] = frozenset()

    def selects(self, check: OpCheck) -> bool:
        names = {check.name, check.family}
        if self.only is not None and not names & self.only:
            return False
        return not names & self.skip


def parse_names(names: Iterable[str] | str | None) -> frozenset[str] | None:
    """'loss,embedding' or ['loss'] -> frozenset; unknown names raise ValueError."""
    if names is None:
        return None
    if isinstance(names, str):
        names = [n for n in names.replace(",", " ").split() if n]
    chosen = frozenset(n.strip() for n in names)
    unknown = sorted(chosen - NAMES)
    if unknown:
        raise ValueError(
            f"unknown check(s) {', '.join(unknown)}; choose from: {', '.join(sorted(NAMES))}"
        )
    return chosen


class _ThreadState(threading.local):
    # TorchFunctionMode stacks are per thread, and so is ours
    def __init__(self) -> None:
        self.configs: list[GuardConfig] = []
        self.mode: _CheckMode | None = None


_STATE = _ThreadState()
_TABLE: dict[Any, OpCheck] | None = None


class _CheckMode(TorchFunctionMode):
    def __init__(self, checks: dict[Any, OpCheck]) -> None:
        super().__init__()
        self._checks = checks

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        __tracebackhide__ = True  # IPython leaves our frames out of the user's traceback
        if kwargs is None:
            kwargs = {}
        check = self._checks.get(func)
        if check is not None and _STATE.configs and _STATE.configs[-1].selects(check):
            finding = _inspect(check, args, kwargs)
            if finding is not None:
                _raise(check, func, finding, args, kwargs)
        return func(*args, **kwargs)


def _inspect(check: OpCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Finding | None:
    try:
        requirements = check.extract(args, kwargs)
        return first_violation(requirements)
    except Exception:  # a check must never break a call PyTorch itself would accept
        STATS["check_failed"] += 1
        return None


def first_violation(requirements: list[Requirement]) -> Finding | None:
    """One fused reduction per requirement, one host transfer for all of them."""
    if not requirements:
        return None
    STATS["calls"] += 1
    live = [r for r in requirements if not r.trivially_holds()]
    if not live:
        STATS["skipped"] += 1
        return None
    summaries = [r.summary() for r in live]
    STATS["transfers"] += 1
    if len({s.dtype for s in summaries}) == 1:
        flat: list[Any] = torch.cat(summaries).tolist()
    else:  # int and float requirements in one call: no op here has both, keep it exact anyway
        flat = [v for s in summaries for v in s.tolist()]
    start = 0
    for requirement, summary in zip(live, summaries, strict=True):
        values = flat[start : start + summary.numel()]
        start += summary.numel()
        if not requirement.holds(values):
            return requirement.explain()
    return None


def _raise(
    check: OpCheck, func: Any, finding: Finding, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    __tracebackhide__ = True
    frames = _outer_frames()
    users = [f for f in frames if not _is_library(f.f_code.co_filename)]
    user, outer = (users[0], users[-1]) if users else (None, None)
    library = frames[0] if frames and frames[0] is not user else None
    violation = Violation(
        op=display_name(check, func),
        finding=finding,
        fix=check.fix,
        owner=_owner([*args, *kwargs.values()], frames),
        line=_describe(user),
        entry_line=_describe(outer) if outer is not user else None,
        library_line=_describe(library),
        rank=_rank(),
    )
    error = GuardIndexError if check.index_error else GuardError
    raise error(violation)


# --- where: frames, modules, rank -------------------------------------------------------------
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # all of nb_cudaguard
_LIBRARY_DIRS = tuple(
    {p for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(key))}
)


def _outer_frames() -> list[FrameType]:
    """The calling frames outside torch and nb_cudaguard, innermost first."""
    frames = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if _is_cell_runner(frame):
            break  # beyond lies the cell that ran this one (%%cudacheck's own line)
        if not (name.startswith(_TORCH_DIR) or name.startswith(_OWN_DIR)):
            frames.append(frame)
        frame = frame.f_back
    return frames


def _is_cell_runner(frame: FrameType) -> bool:
    return frame.f_code.co_name == "run_code" and "IPython" in frame.f_code.co_filename


def _is_library(filename: str) -> bool:
    return (
        filename.startswith(_LIBRARY_DIRS)
        or filename.startswith("<frozen")
        or "site-packages" in filename
    )


def _describe(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    source = linecache.getline(filename, lineno).strip()
    where = f"{_cell_name(filename) or filename}, line {lineno}"
    return f"{where}: {source}" if source else where


def _cell_name(filename: str) -> str | None:
    """IPython's own name for a cell's code ("Cell In[3]"), where IPython is running."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    try:
        name = shell.compile.format_code_name(filename)
    except Exception:
        return None
    return f"{name[0]} {name[1]}" if name else None


def _owner(values: list[Any], frames: list[FrameType]) -> str | None:
    """'nn.Embedding(30522, 768) at model.bert.embeddings.word_embeddings', for a parameter."""
    params = {id(v) for v in values if isinstance(v, torch.nn.Parameter)}
    if not params:
        return None
    seen: set[int] = set()
    # outermost namespaces first: the notebook's `model` reads better than a forward's `self`
    for frame in reversed(frames):
        for scope in (frame.f_globals, frame.f_locals):
            for var, value in list(scope.items()):
                if not isinstance(value, torch.nn.Module) or id(value) in seen:
                    continue
                seen.add(id(value))
                for path, module in value.named_modules():
                    if any(id(p) in params for p in module._parameters.values()):
                        return f"{_module_repr(module)} at {'.'.join(filter(None, (var, path)))}"
    return None


def _module_repr(module: torch.nn.Module) -> str:
    cls = type(module)
    prefix = "nn." if cls.__module__.startswith("torch.nn") else ""
    return f"{prefix}{cls.__name__}({module.extra_repr()})"


def _rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


# --- the public context manager ---------------------------------------------------------------
class Guard:
    """``with guard():`` checks every assert-prone call in the block; nested guards are safe.

    Only the outermost guard puts a mode on torch's stack; an inner one narrows or widens the
    selection of checks until it ends. Both are undone in ``__exit__``, on exceptions and on
    KeyboardInterrupt alike.
    """

    def __init__(self, config: GuardConfig, sync: bool = False) -> None:
        self.config = config
        self.sync = sync
        self._entered = False

    def __enter__(self) -> Guard:
        global _TABLE
        if self._entered:
            raise RuntimeError("this guard is already active; create a new one with guard()")
        if _TABLE is None:
            _TABLE = table()
        _STATE.configs.append(self.config)
        self._entered = True
        if _STATE.mode is None:
            mode = _CheckMode(_TABLE)
            try:
                mode.__enter__()
            except BaseException:
                _STATE.configs.pop()
                self._entered = False
                raise
            _STATE.mode = mode
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._entered:
            return
        self._entered = False
        try:
            if self.sync and exc_type is None:
                _synchronize()
        finally:
            _STATE.configs.pop()
            if not _STATE.configs and _STATE.mode is not None:
                mode, _STATE.mode = _STATE.mode, None
                _leave(mode)


def _leave(mode: _CheckMode) -> None:
    from torch.overrides import _get_current_function_mode

    if _get_current_function_mode() is mode:
        mode.__exit__(None, None, None)
    else:  # someone pushed a mode inside our block and left it: popping would remove theirs
        print(
            "nb_cudaguard: another TorchFunctionMode is still active above the guard; "
            "the guard stays on until that one is exited.",
            file=sys.stderr,
        )


def _synchronize() -> None:
    """Surface an asynchronous CUDA error of this block here, not in a later cell."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def guard(
    only: Iterable[str] | str | None = None,
    skip: Iterable[str] | str | None = None,
    sync: bool = False,
) -> Guard:
    """Check the inputs of assert-prone torch calls in a ``with`` block before they run.

    ``only``/``skip``: op names (``"cross_entropy"``, ``"getitem"``) or families (``"loss"``,
    ``"embedding"``, ``"sampling"``, ``"gather_scatter"``, ``"index"``, ``"one_hot"``,
    ``"repeat_interleave"``, ``"unpool"``). ``sync``: synchronise CUDA when the block ends
    without an error, so an asynchronous error from an unchecked op is reported there.
    A bad input raises :class:`nb_cudaguard.GuardError` before its kernel runs.
    """
    config = GuardConfig(only=parse_names(only), skip=parse_names(skip) or frozenset())
    return Guard(config, sync=sync)


def active() -> bool:
    return bool(_STATE.configs)
