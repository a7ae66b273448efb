"""The guard: check the inputs of assert-prone torch calls before their kernels launch.

While a guard is active (in any thread), the checked ops' entry points are replaced by thin
wrappers: the ``torch.nn.functional`` and ``torch`` functions and the ``torch.Tensor`` methods
(``x[idx]`` and ``x[idx] = v`` included) that ``ops.py`` names, and nothing else, so every other
torch call costs exactly what it costs bare. The first guard to start installs them, the last to
end puts torch's own objects back (``_Entries``). A wrapper called in a thread that is in no
guard, or from inside a checked call (the ``nll_loss`` inside ``cross_entropy``, the indexing
inside a check), calls the bare op at once.

References taken before the guard started: modules look their functions up at each call
(``nn.CrossEntropyLoss`` calls ``F.cross_entropy``), and the functional losses, embeddings and
``ctc_loss`` are also wrapped at the op they call inside (``torch._C._nn.cross_entropy_loss``,
``torch.embedding``...). Names bound to a checked op in the namespace the guard is given
(``from torch import gather``, ``take = torch.Tensor.take``: the notebook's namespace for
``%%cudacheck``, the caller's globals for ``guard()``, the test module's for the pytest plugin)
name its wrapper while the guard is active and torch's op again after it. Not seen: such a
reference in a function's local variables, or inside a container. Code compiled by TorchScript
or ``torch.compile`` is not checked: both compile torch's own op where they meet its wrapper
(``__prepare_scriptable__``, ``_torchdynamo_inline``), so a compiled model runs as compiled,
without a graph break, and the guard says once that compiled regions are not checked. A
``TorchFunctionMode`` would see every reference, but it is called for every torch call of a
step (~360), at about 1.1 us each: more than the guard's whole budget.

A wrapper of a module's function (``_ModuleOp``) pickles and copies as that function, so objects
built inside a guard can be saved, copied and sent to a spawned worker after it.

Whatever is installed leaves torch as it was, inside the block and after it: the C slots that
setting ``Tensor.__getitem__`` fills (``type_slots.py``), and torch's tables of its own
functions built meanwhile (``torch_caches.py``).

Two modes. ``strict`` reads each checked call's verdict back at once (on a GPU, one host
synchronisation per checked call) and raises before the kernel launches. ``deferred`` never
synchronises for a check: each check leaves a tiny summary on the device, the call itself runs
with its offending values replaced by valid ones (clamped indices, so no kernel can fault; the
output is garbage only where an input was bad), and the summaries are read together at the next
point where it is cheap or necessary: before any ``optimizer.step()`` (a global step pre-hook,
so weights are never updated from a bad batch), at a ``.item()``/``.tolist()`` the user's code
synchronises on anyway, and when the block ends. The first violation is then raised with the
same message as in strict mode.

On host memory there is nothing to defer: in both modes a violation is raised at the call, where
PyTorch's CPU op raises its own error (code that catches it behaves as without the guard), and
the message quotes that error. Where the CPU op rejects every value the CUDA kernel asserts on
(``ops.CPU_CHECKS``), draws no random number and the tensors are below ``HOST_FIRST_LINE``
elements, the call runs first and the rules only run when it raises (``TRUST_HOST_OPS``).

Module import needs torch: ``nb_cudaguard`` imports this lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import itertools
import linecache
import operator
import os
import re
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType, FrameType, FunctionType, ModuleType, TracebackType
from typing import Any

import torch

from ..diagnosis.bounds import (
    VOID_FIX,
    describe_module,
    find_classifier,
    marks_void,
    parameter_owner,
)
from . import torch_caches, type_slots
from .errors import Finding, GuardError, GuardIndexError, Violation
from .ops import NAMES, OpCheck, display_name, entry_points
from .requirements import Requirement, Slot, Summary
from .type_slots import SequenceSlots

MODES = ("strict", "deferred")
# Deferred verdicts waiting to be read; past this many the guard reads them (one transfer), so a
# loop that never synchronises does not keep its inputs alive without bound.
MAX_PENDING = 32

# How often the guard read verdicts back to the host (on a GPU each is a synchronisation: the cost
# the deferred mode removes; on CPU a read of host memory, counted alike).
STATS: Counter[str] = Counter()


@dataclass(frozen=True)
class GuardConfig:
    only: frozenset[str] | None = None  # op names or families; None: all
    skip: frozenset[str] = frozenset()
    deferred: bool = False

    def selects(self, check: OpCheck) -> bool:
        only, skip = self.only, self.skip
        if only is not None and check.name not in only and check.family not in only:
            return False
        return check.name not in skip and check.family not in skip


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
    """Per thread: the wrappers are process-wide, the guard is not (a thread outside any guard
    calls the bare op)."""

    def __init__(self) -> None:
        self.configs: list[GuardConfig] = []
        # inside a checked call (its check or the op itself): torch's own inner calls (the
        # nll_loss inside cross_entropy, indexing inside a check) pass through unchecked
        self.busy = False
        self.pending: list[_Pending] = []


_STATE = _ThreadState()
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state


def _skips() -> bool:
    """While ``torch.jit.trace`` records or ``torch.compile`` captures a graph, the op runs bare:
    the graph holds the user's ops only, never the checks' (their aminmax, resolve_conj...).
    The guard says so once, as it ends (``_note_unchecked``)."""
    if _tracing_state() is not None:
        _TRACED.append(True)
        return True
    return _is_compiling()


_TRACED: list[bool] = []  # checked calls a trace recorded unchecked, until a guard says so


# --- warnings keep the caller's location ------------------------------------------------------
# A warning torch raises inside an op is attributed to the Python frame that called it (TORCH_WARN
# goes through PyErr_WarnEx with stacklevel 1; a Python op's warnings.warn(stacklevel=2) alike):
# the wrapper's, which would make the warning come from this file. So the wrapper calls the op
# from a one-line function compiled with the caller's file and line, run in the caller's globals:
# to the warnings machinery it is the caller's frame (its module for filterwarnings(module=...),
# its __warningregistry__ and line for "once per location"). One per call site, made once.
_CALL_NAME = "<nb_cudaguard: the call>"
_CALL_CODE = next(
    const
    for const in compile(
        "def call(func, args, kwargs): __tracebackhide__ = True; return func(*args, **kwargs)",
        "<nb_cudaguard>",
        "exec",
    ).co_consts
    if isinstance(const, CodeType)
).replace(co_name=_CALL_NAME)
_CALLERS: dict[tuple[CodeType, int], Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]] = {}
_MAX_CALLERS = 4096


def _direct(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    __tracebackhide__ = True
    return func(*args, **kwargs)


def _as_caller(
    frame: FrameType | None,
) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    if frame is None:
        return _direct
    key = (frame.f_code, frame.f_lasti)
    call = _CALLERS.get(key)
    if call is None:
        if len(_CALLERS) >= _MAX_CALLERS:
            _CALLERS.clear()
        code = _CALL_CODE.replace(
            co_filename=frame.f_code.co_filename, co_firstlineno=frame.f_lineno or 1
        )
        call = _CALLERS[key] = FunctionType(code, frame.f_globals)
    return call


def _checked_entry(owner: Any, attr: str, check: OpCheck, func: Any) -> Any:
    """The wrapper installed over one entry point while a guard is active somewhere."""

    name = getattr(func, "__name__", "")
    # x.scatter_(...), x[i] = v: the CPU op may write part of its output before it raises
    trusted = check.cpu_rejects and not (
        name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))
    )

    # the frames between the caller and this wrapper: _ModuleOp.__call__'s for a module's function
    depth = 2 if isinstance(owner, ModuleType) else 1

    def checked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves our frames out of the user's traceback
        state = _STATE
        try:
            caller: FrameType | None = sys._getframe(depth)
        except ValueError:  # called from C with no Python frame above
            caller = None
        if state.busy or not state.configs:
            return _as_caller(caller)(func, args, kwargs)
        if _skips():
            return func(*args, **kwargs)
        return _guarded_call(state, check, func, args, kwargs, trusted, caller)

    if check.nothing_to_check is None:
        return _dressed_as(owner, attr, checked, func)
    plain = check.nothing_to_check

    def indexing(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        state = _STATE
        try:
            caller: FrameType | None = sys._getframe(depth)
        except ValueError:
            caller = None
        if state.busy or not state.configs or plain(args):
            return _as_caller(caller)(func, args, kwargs)
        if _skips():
            return func(*args, **kwargs)
        return _guarded_call(state, check, func, args, kwargs, trusted, caller)

    return _dressed_as(owner, attr, indexing, func)


def _sync_entry(owner: Any, attr: str, func: Any) -> Any:
    """``.item()``/``.tolist()``: the caller synchronises here anyway, so read the verdicts too."""

    def synchronising(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if _STATE.pending and not _STATE.busy and not _skips():
            flush()
        return func(*args, **kwargs)

    return _dressed_as(owner, attr, synchronising, func)


def _dressed_as(owner: Any, attr: str, wrapper: Any, func: Any) -> Any:
    """``wrapper`` looking like torch's op; a function of a module becomes a ``_ModuleOp``, so
    it pickles and copies as torch's op wherever a reference to it ends up."""
    # help(), the name in a message, inspect.signature (through __wrapped__) stay torch's
    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(wrapper, name, getattr(func, name))
    if isinstance(owner, type):
        # a method: pickle finds a function by its module and qualified name, which name the
        # wrapper while it is installed (by name, so torch's method is what gets loaded)
        wrapper.__module__, wrapper.__qualname__ = owner.__module__, f"{owner.__qualname__}.{attr}"
    wrapper.__wrapped__ = func
    # torch.compile traces torch's own op where it meets the wrapper (its way of seeing through
    # its own wrappers): no graph break, and its tables list torch's objects, never ours
    wrapper._torchdynamo_inline = func
    if isinstance(func, FunctionType):
        # torch.jit.script compiles what this returns (F.cross_entropy's own source)
        wrapper.__prepare_scriptable__ = lambda: func
    if isinstance(owner, ModuleType):
        return _ModuleOp(owner.__name__, attr, wrapper, func)
    return wrapper


class _ModuleOp:
    """A checked function of a module (``torch.gather``, ``F.cross_entropy``): calls the
    wrapper, and pickles, copies and deep-copies as torch's own function, inside a guard and
    after it. A plain function cannot: pickle saves a function by its module and name and
    refuses one that is not what that name holds (after the guard, torch's op again; a model
    built inside a guard with ``self.loss_fn = F.cross_entropy`` could never be saved).
    Pickled, it is ``getattr(importlib.import_module(module), name)``: the reader needs torch
    only, and gets whatever that name holds there (torch's op, outside a guard)."""

    __slots__ = ("__dict__", "__weakref__", "__wrapped__", "_attr", "_call", "_module")

    def __init__(self, module: str, attr: str, call: Any, func: Any) -> None:
        self._call = call
        self.__wrapped__ = func
        self._module = module
        self._attr = attr
        for name in ("__name__", "__qualname__", "__doc__", "__module__", "__signature__"):
            with contextlib.suppress(AttributeError, TypeError):
                self.__dict__[name] = getattr(func, name)
        self.__dict__["_torchdynamo_inline"] = func
        if isinstance(func, FunctionType):
            self.__dict__["__prepare_scriptable__"] = call.__prepare_scriptable__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if _is_compiling():  # torch.compile inlines this: it traces torch's op, never our checks
            return self.__wrapped__(*args, **kwargs)
        return self._call(*args, **kwargs)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # what isinstance() answers, as for torch's Python functions: TorchScript compiles, and
        # torch.compile traces (``_torchdynamo_inline``), torch's op where they meet a function;
        # pickle and copy dispatch on the real type (below)
        return type(self.__wrapped__)

    def __getattr__(self, name: str) -> Any:
        # what a function has and this object lacks (``__code__``, ``__defaults__``,
        # ``__globals__``...), for code that trusts isinstance(op, FunctionType): torch's
        return getattr(self.__wrapped__, name)

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        return getattr, (_Import(self._module), self._attr)

    def __copy__(self) -> _ModuleOp:
        return self  # as copy treats a function: the same object

    def __deepcopy__(self, memo: dict[int, Any]) -> _ModuleOp:
        return self

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


class _Import:
    """Pickled as ``importlib.import_module(name)``: the module, without naming our code."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, (self.name,)


def _guarded_call(
    state: _ThreadState,
    check: OpCheck,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trusted: bool,
    caller: FrameType | None,
) -> Any:
    __tracebackhide__ = True
    state.busy = True
    call = _as_caller(caller)
    try:
        config = state.configs[-1]
        if not config.selects(check):
            return call(func, args, kwargs)
        if trusted and TRUST_HOST_OPS and _runs_on_host(check, args, kwargs):
            try:
                return call(func, args, kwargs)
            except TypeError:
                raise  # torch's parser refused the arguments: there is no value to judge
            except Exception as error:
                finding = _inspect(check, args, kwargs)
                if finding is None:
                    raise  # the op's own complaint, about something the guard does not check
                # in both modes: on host memory the op raised here, so the guard does too
                _raise(check, func, finding, args, kwargs, cpu_error=error, replacing=True)
        if not config.deferred:
            finding = _inspect(check, args, kwargs)
            if finding is not None and _accepts(func, args, kwargs):
                _raise(
                    check,
                    func,
                    finding,
                    args,
                    kwargs,
                    cpu_error=_host_error(check, func, args, kwargs),
                )
            return call(func, args, kwargs)
        waiting = len(state.pending)
        args, kwargs = _defer(check, func, args, kwargs)
        try:
            return call(func, args, kwargs)
        except TypeError:
            # torch rejected the arguments themselves: the op never ran, its verdict is moot
            del state.pending[waiting:]
            raise
    finally:
        state.busy = False


# A call whose tensors are all in host memory runs first and is checked only when the op raises,
# where PyTorch's CPU op rejects every value the CUDA kernel asserts on, for each requirement of
# the op (``ops.CPU_CHECKS``): a valid call costs one wrapper, and a bad one still ends in the
# guard's message. Not for in-place calls (an ``out=``, ``x.scatter_``, ``max_norm``): those may
# write before they raise; not for random ops (they would draw first); not past ``HOST_FIRST_LINE``
# elements in one tensor, where the op would compute for long before it raises (an 8192 x 32000
# cross_entropy: 4.8 s) and the rules cost nothing beside it. Tests turn this off to run every
# check itself on CPU, as a GPU's calls do.
TRUST_HOST_OPS = True
HOST_FIRST_LINE = 1 << 20  # elements; benchmarks/bench_host_line.py measures where it sits


def _runs_on_host(check: OpCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if kwargs and ("out" in kwargs or not _on_host(kwargs.values())):
        return False
    if check.writes is not None and check.writes(args, kwargs):
        return False
    return _on_host(args)


def _on_host(values: Iterable[Any]) -> bool:
    """Every tensor in host memory, none of them past HOST_FIRST_LINE elements."""
    for value in values:
        if isinstance(value, torch.Tensor):
            if not _small_on_host(value):
                return False
        elif type(value) is tuple or type(value) is list:  # x[idx, mask], index_put's indices
            for item in value:
                if isinstance(item, torch.Tensor) and not _small_on_host(item):
                    return False
    return True


def _small_on_host(tensor: torch.Tensor) -> bool:
    return tensor.is_cpu and tensor.numel() <= HOST_FIRST_LINE


def _host_error(
    check: OpCheck, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> BaseException | None:
    """On the failing path: PyTorch's own error for these values in host memory, run on copies
    of the tensors (so nothing is written), where that is quick and draws no random number. Its
    words go into the guard's message, so code that matches PyTorch's text still matches."""
    if check.random or not (_on_host(args) and _on_host(kwargs.values())):
        return None
    try:
        func(*_copies(args), **{key: _copies(value) for key, value in kwargs.items()})
    except Exception as error:
        return error
    return None


def _copies(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (list, tuple):
        return type(value)(_copies(v) for v in value)
    return value


def _accepts(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """On the failing path only: would torch take these arguments at all? The wrapper runs
    before torch parses them, and a bare call with a wrong argument raises a TypeError first
    (``x.bernoulli(out=y)``), so the guard must not answer for it."""
    if isinstance(func, FunctionType):  # torch.nn.functional's Python functions
        try:
            inspect.signature(func).bind(*args, **kwargs)
        except TypeError:
            return False
        except ValueError:  # no signature to bind against
            return True
        return True
    try:  # a builtin: let torch's parser judge the call, run on shapes alone
        func(*_on_meta(args), **{k: _on_meta(v) for k, v in kwargs.items()})
    except TypeError:
        return False
    except Exception:
        pass  # the parser took the arguments; what failed later is not our business here
    return True


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta")
    if type(value) in (list, tuple):
        return type(value)(_on_meta(v) for v in value)
    return value


# (owner, attribute, check or None for a sync point, torch's object) -> the wrapper to install
MakeWrapper = Callable[[Any, str, "OpCheck | None", Any], Any]


class _OwnerEntries:
    """One owner's entry points (``torch``, ``F``, ``torch.Tensor``...) and our wrappers for
    them, resolved once: made again only where torch's object is not the one they wrap (another
    library replaced it between guards), so a guard's start is little more than the setattrs."""

    def __init__(self, owner: Any, rows: list[tuple[str, OpCheck | None]]) -> None:
        self.owner = owner
        self.space = vars(owner)  # live: a type's mappingproxy follows its dict
        # setattr and getattr on a plain module are a store into and a read of its __dict__
        self.plain_module = type(owner) is ModuleType
        self.attrs = tuple(attr for attr, _ in rows)
        self.checks = tuple(check for _, check in rows)
        self.funcs: tuple[Any, ...] = ()  # torch's objects the wrappers wrap
        self.wrappers: tuple[Any, ...] = ()
        self.found: tuple[Any, ...] = ()  # the owner's own entries as found; _ABSENT: inherited
        self.placed = 0  # how many wrappers are in place (the first ones)

    def resolve(self, make: MakeWrapper) -> bool:
        """Torch's objects as they are now, and whether a wrapper had to be made for one (the
        first time, or for an op replaced since)."""
        owner, attrs = self.owner, self.attrs
        self.found = found = tuple(map(self.space.get, attrs, itertools.repeat(_ABSENT)))
        if self.plain_module and id(_ABSENT) not in map(id, found):
            funcs = found
        else:
            funcs = tuple(map(getattr, itertools.repeat(owner), attrs))
        known = self.funcs
        if len(known) == len(funcs) and all(map(operator.is_, funcs, known)):
            return False
        # the same wrapper for the same op every time: a reference taken inside one guard is
        # the wrapper of the next
        rows = enumerate(zip(attrs, self.checks, funcs, strict=True))
        self.wrappers = tuple(
            self.wrappers[i] if known and known[i] is func else make(owner, attr, check, func)
            for i, (attr, check, func) in rows
        )
        self.funcs = funcs
        return True

    def put_in(self) -> None:
        """The wrappers in place of the objects ``resolve`` found."""
        owner, attrs = self.owner, self.attrs
        if self.plain_module:
            self.space.update(zip(attrs, self.wrappers, strict=True))
            self.placed = len(attrs)
            return
        placed = 0
        try:
            for attr, wrapper in zip(attrs, self.wrappers, strict=True):
                setattr(owner, attr, wrapper)
                placed += 1
        finally:
            self.placed = placed

    def take_out(self) -> None:
        """Each attribute as found; one someone replaced meanwhile is left to them."""
        owner, space = self.owner, self.space
        placed, self.placed = self.placed, 0
        attrs, found, wrappers = self.attrs[:placed], self.found[:placed], self.wrappers[:placed]
        if not all(map(operator.is_, map(space.get, attrs), wrappers)):
            self._take_out_each(attrs, found, wrappers)
        elif self.plain_module and id(_ABSENT) not in map(id, found):
            space.update(zip(attrs, found, strict=True))
        else:
            for attr, own in zip(attrs, found, strict=True):
                if own is _ABSENT:
                    delattr(owner, attr)
                else:
                    setattr(owner, attr, own)

    def _take_out_each(
        self, attrs: tuple[str, ...], found: tuple[Any, ...], wrappers: tuple[Any, ...]
    ) -> None:
        owner, space = self.owner, self.space
        for attr, own, wrapper in zip(attrs, found, wrappers, strict=True):
            if space.get(attr) is not wrapper:
                _left_replaced(owner, attr)
            elif own is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)


def _left_replaced(owner: Any, attr: str) -> None:
    print(
        f"nb_cudaguard: {getattr(owner, '__name__', owner)}.{attr} was replaced "
        "while the guard was active; leaving the replacement in place",
        file=sys.stderr,
    )


class _Entries:
    """The wrappers over torch's entry points: installed when the first guard (in any thread)
    starts, removed when the last one ends, so torch is exactly as it was between guards.

    Each attribute is put back as it was found: torch's own object where the owner had one in its
    ``__dict__``, deleted where it was inherited (``torch.Tensor`` methods live on
    ``torch._C.TensorBase``). An attribute someone else replaced meanwhile is left to them.
    """

    def __init__(
        self,
        plan: Callable[[], list[tuple[Any, str, OpCheck | None]]],
        make: MakeWrapper,
        tables: bool = True,
    ) -> None:
        self.plan = plan
        self.make = make
        self.keeps_tables = tables  # whether to keep torch's tables free of these wrappers
        self.lock = threading.Lock()
        self.users = 0
        self.owners: list[_OwnerEntries] | None = None  # planned once per process
        self.dunders = False  # whether any is a dunder of torch.Tensor's C slots
        self.installed: list[_OwnerEntries] = []
        # what the wrappers, as last resolved, are known by
        self.ops: dict[int, Any] = {}  # id(torch's op) -> its wrapper
        self.ours: set[int] = set()  # id(wrapper)
        self.op_ids: tuple[int, ...] = ()  # id(torch's op), id(wrapper), in the same order
        self.wrapper_ids: tuple[int, ...] = ()
        # TorchScript's names for torch's ops as last seen, and our rows for them
        self.builtin_names: tuple[str | None, ...] = ()
        self.builtin_rows: dict[int, str] = {}
        self.builtin_ids: dict[int, str] = {}  # our entries in TorchScript's table, while in it
        self.by_op: dict[int, Any] = {}  # id(torch's op) -> its wrapper, while installed
        self.wrapper_set: set[int] = set()  # id(wrapper), while installed
        # x[idx]: torch.Tensor's C slots as found (type_slots.py), torch's tables as found
        self.slots = SequenceSlots(torch.Tensor)
        self.tables: frozenset[tuple[str, str]] = frozenset()
        self.subclass_hook: tuple[Any, Any] | None = None  # (torch's own, ours)
        self.patched: list[tuple[Any, str, Any, Any]] = []  # (owner, attr, as found, ours)

    def acquire(self) -> None:
        with self.lock:
            if self.users == 0:
                self._install()
            self.users += 1

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                self._uninstall()

    def _planned(self) -> list[_OwnerEntries]:
        if self.owners is None:  # what torch has does not change: planned once per process
            rows: dict[int, tuple[Any, list[tuple[str, OpCheck | None]]]] = {}
            planned = self.plan()
            for owner, attr, check in planned:
                rows.setdefault(id(owner), (owner, []))[1].append((attr, check))
            self.owners = [_OwnerEntries(owner, attrs) for owner, attrs in rows.values()]
            self.dunders = any(attr in type_slots.DUNDERS for _, attr, _ in planned)
        return self.owners

    def _install(self) -> None:
        owners = self._planned()
        if self.keeps_tables:
            torch_caches.build_builtin_table()
            self.tables = torch_caches.built()
        try:
            if any([entries.resolve(self.make) for entries in owners]):
                self._index(owners)
            if self.dunders:
                self.slots.take()
                self._patch(torch.Tensor, "__init_subclass__", self._subclass_hook())
            for entries in owners:
                self.installed.append(entries)
                entries.put_in()
            self.by_op, self.wrapper_set = self.ops, self.ours
            self._as_builtins()
        except BaseException:
            self._uninstall()
            raise
        finally:
            if self.dunders:
                self.slots.put_back()

    def _index(self, owners: list[_OwnerEntries]) -> None:
        funcs = [func for entries in owners for func in entries.funcs]
        wrappers = [wrapper for entries in owners for wrapper in entries.wrappers]
        self.op_ids = tuple(map(id, funcs))
        self.wrapper_ids = tuple(map(id, wrappers))
        self.ops = dict(zip(self.op_ids, wrappers, strict=True))
        self.ours = set(self.wrapper_ids)
        self.builtin_names = ()

    def bind_early(self, namespace: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """Names in ``namespace`` bound to torch's own op before the guard started (``from
        torch import gather``) now name its wrapper; returns (name, op, wrapper) to undo."""
        wrappers = self.by_op
        # one pass at C speed over what may be a notebook's thousand names
        if wrappers.keys().isdisjoint(map(id, namespace.values())):
            return []
        found = [(name, value) for name, value in namespace.items() if id(value) in wrappers]
        renamed = []
        for name, value in found:
            wrapper = wrappers[id(value)]
            if wrapper.__wrapped__ is value:
                namespace[name] = wrapper
                renamed.append((name, value, wrapper))
        return renamed

    def unbind_all(self, namespace: dict[str, Any]) -> None:
        """Names bound to a wrapper inside the block (``from torch import gather`` in a guarded
        cell) name torch's op again, as they would have without the guard."""
        ours = self.wrapper_set
        if ours.isdisjoint(map(id, namespace.values())):
            return
        found = [(name, value) for name, value in namespace.items() if id(value) in ours]
        for name, value in found:
            namespace[name] = value.__wrapped__

    def _subclass_hook(self) -> Any:
        own = torch.Tensor.__dict__.get("__init_subclass__", _ABSENT)
        if self.subclass_hook is None or self.subclass_hook[0] is not own:
            self.subclass_hook = (own, _new_subclass_hook(self.slots))
        return self.subclass_hook[1]

    def _patch(self, owner: Any, attr: str, new: Any) -> None:
        own = owner.__dict__.get(attr, _ABSENT)
        setattr(owner, attr, new)
        self.patched.append((owner, attr, own, new))

    def _as_builtins(self) -> None:
        """TorchScript compiles ``torch.gather`` as the aten op it is: it finds it by identity
        in a table (built on first use), which must know the wrapper as that op too."""
        jit = sys.modules.get("torch.jit._builtins")
        table = getattr(jit, "_builtin_table", None)
        if not isinstance(table, dict):
            return
        names = tuple(map(table.get, self.op_ids))
        if names != self.builtin_names:
            self.builtin_names = names
            self.builtin_rows = {
                wrapper: name
                for wrapper, name in zip(self.wrapper_ids, names, strict=True)
                if name is not None
            }
        rows = self.builtin_rows
        if not table.keys().isdisjoint(rows):  # an entry already there is not ours to add
            rows = {wrapper: name for wrapper, name in rows.items() if wrapper not in table}
        table.update(rows)
        self.builtin_ids = rows

    def _uninstall(self) -> None:
        jit = sys.modules.get("torch.jit._builtins")
        table = getattr(jit, "_builtin_table", None)
        if isinstance(table, dict):
            for key in self.builtin_ids:
                table.pop(key, None)
        self.builtin_ids = {}
        self.by_op, self.wrapper_set = {}, set()
        installed, self.installed = self.installed, []
        for entries in reversed(installed):
            entries.take_out()
        patched, self.patched = self.patched, []
        for owner, attr, own, ours in reversed(patched):
            if owner.__dict__.get(attr) is not ours:
                _left_replaced(owner, attr)
            elif own is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)
        # CPython leaves sq_item filled after the delattr (type_slots.py); torch's tables built
        # meanwhile may hold our wrappers (torch_caches.py)
        self.slots.put_back()
        self.slots.forget()
        if self.keeps_tables:
            torch_caches.forget_built_since(self.tables)


_ABSENT = object()


def _new_subclass_hook(slots: SequenceSlots) -> classmethod[Any, Any, None]:
    """``torch.Tensor.__init_subclass__`` while the guard is active: a subclass created then
    (a module imported inside the block) gets the sequence slots it would get without the guard,
    at once (CPython filled them because ``__getitem__`` was a Python function at its creation)."""
    own = torch.Tensor.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type[torch.Tensor], /, **kwargs: Any) -> None:
        if own is not None:
            own.__get__(None, cls)(**kwargs)
        else:
            super(torch.Tensor, cls).__init_subclass__(**kwargs)
        slots.put_back_one(cls)

    return classmethod(__init_subclass__)


def _make_wrapper(owner: Any, attr: str, check: OpCheck | None, func: Any) -> Any:
    if check is None:
        return _sync_entry(owner, attr, func)
    return _checked_entry(owner, attr, check, func)


_SYNC_POINTS = ("item", "tolist")
# The checked ops, while any guard is active; .item()/.tolist(), while a deferred one is (only
# it leaves verdicts to read there; an optimizer calls .item() once per parameter).
_ENTRIES = _Entries(lambda: _plan(entry_points()), _make_wrapper)
# installed only while _ENTRIES is, whose own start and end keep torch's tables
_SYNC_ENTRIES = _Entries(
    lambda: [(torch.Tensor, attr, None) for attr in _SYNC_POINTS], _make_wrapper, False
)


def _plan(entries: list[tuple[Any, str, OpCheck]]) -> list[tuple[Any, str, OpCheck | None]]:
    """Every entry point, less ``x[idx]`` where the slots it changes cannot be put back."""
    if type_slots.supported():
        return [*entries]
    print(
        "nb_cudaguard: x[index] and x[index] = value are not checked on this Python "
        f"({sys.implementation.name}): the guard cannot restore what wrapping them changes",
        file=sys.stderr,
    )
    return [e for e in entries if e[1] not in type_slots.DUNDERS]


def _inspect(check: OpCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Finding | None:
    try:
        requirements = check.extract(args, kwargs)
        return first_violation(requirements)
    except Exception:  # a check must never break a call PyTorch itself would accept
        STATS["check_failed"] += 1
        return None


def first_violation(requirements: list[Requirement]) -> Finding | None:
    """One fused reduction per requirement, one host read for all of them (a GPU's summaries
    travel together; a CPU tensor's values are read where they are)."""
    if not requirements:
        return None
    STATS["calls"] += 1
    live, on_host = _live(requirements)
    if not live:
        STATS["skipped"] += 1
        return None
    if on_host:
        STATS["transfers"] += 1
        return _judged_on_host(live)
    for requirement, values in zip(live, _read([r.summary() for r in live]), strict=True):
        if not requirement.holds(values):
            return requirement.explain()
    return None


def _live(requirements: list[Requirement]) -> tuple[list[Requirement], bool]:
    """The requirements whose values must be read, and whether all of them are in host memory."""
    live = []
    on_host = True
    for requirement in requirements:
        if not requirement.trivially_holds():
            live.append(requirement)
            on_host = on_host and requirement.tensor.is_cpu
    return live, on_host


def _judged_on_host(live: list[Requirement]) -> Finding | None:
    for requirement in live:
        if not requirement.holds_now():
            return requirement.explain()
    return None


def _read(summaries: list[Summary]) -> list[list[Any]]:
    """Every summary's values, with one stack and one host transfer per dtype (each read in its
    own dtype, so a float64 bound is compared exactly). ``summaries`` is not empty."""
    parts = [part for summary in summaries for part in summary]
    dtype = parts[0].dtype
    if all(part.dtype == dtype for part in parts):  # the usual case: one dtype, one transfer
        STATS["transfers"] += 1
        flat: list[Any] = torch.stack(parts).tolist()
    else:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, part in enumerate(parts):
            by_dtype.setdefault(part.dtype, []).append(i)
        flat = [None] * len(parts)
        for places in by_dtype.values():
            STATS["transfers"] += 1
            values = torch.stack([parts[i] for i in places]).tolist()
            for i, value in zip(places, values, strict=True):
                flat[i] = value
    out = []
    start = 0
    for summary in summaries:
        out.append(flat[start : start + len(summary)])
        start += len(summary)
    return out


# --- deferred mode ----------------------------------------------------------------------------
@dataclass
class _Pending:
    """One deferred call: its summaries (on the device) and what the message needs later."""

    check: OpCheck
    func: Any
    requirements: list[Requirement]
    summaries: list[Summary]
    versions: list[int]
    where: _Where


# Tensors in host memory are judged at the call itself, and a violation is raised there: reading
# them is no synchronisation, and the CPU op would raise its own error at that very call (code
# that catches it, ``except IndexError``, behaves as without the guard). Tests turn this off to
# run the device path on CPU.
HOST_VERDICTS_AT_ONCE = True


def _defer(
    check: OpCheck, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Record the call's verdict on the device and return arguments that cannot fault."""
    __tracebackhide__ = True
    try:
        live, on_host = _live(check.extract(args, kwargs))
        if not live:
            return args, kwargs
        STATS["calls"] += 1
        if HOST_VERDICTS_AT_ONCE and on_host:
            finding = _judged_on_host(live)
            if finding is not None and _accepts(func, args, kwargs):
                error = _host_error(check, func, args, kwargs)
                _raise(check, func, finding, args, kwargs, cpu_error=error)
            return args, kwargs
        safe_args, safe_kwargs = args, kwargs
        for r in live:
            replaced = _with_safe(r, safe_args, safe_kwargs)
            if replaced is None:
                break
            safe_args, safe_kwargs = replaced
        else:
            where = _capture(args, kwargs, keep=True, modules=check.family == "loss")
            summaries = [r.summary() for r in live]
            versions = [r.tensor._version for r in live]
            _STATE.pending.append(_Pending(check, func, live, summaries, versions, where))
            if len(_STATE.pending) >= MAX_PENDING:
                flush()
            return safe_args, safe_kwargs
    except GuardError:
        raise
    except Exception:  # a check must never break a call PyTorch itself would accept
        STATS["check_failed"] += 1
        return args, kwargs
    # a value no replacement can make valid (an index into an empty dimension): check at once
    finding = first_violation(live)
    if finding is not None:
        _raise(check, func, finding, args, kwargs)
    return args, kwargs


def _with_safe(
    r: Requirement, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    if r.slot is None:
        return None
    current = _get_slot(args, kwargs, r.slot)
    safe = r.safe(current)
    if safe is None:
        return None
    return _put_slot(args, kwargs, r.slot, safe)


def _get_slot(args: tuple[Any, ...], kwargs: dict[str, Any], slot: Slot) -> Any:
    position, keyword, item = slot
    value: Any = args[position] if len(args) > position else kwargs.get(keyword or "")
    return value if item is None else value[item]


def _put_slot(
    args: tuple[Any, ...], kwargs: dict[str, Any], slot: Slot, new: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    position, keyword, item = slot
    in_args = len(args) > position
    old = args[position] if in_args else kwargs[keyword or ""]
    if item is not None:
        items = list(old)
        items[item] = new
        new = type(old)(items) if isinstance(old, tuple) else items
    if in_args:
        return (*args[:position], new, *args[position + 1 :]), kwargs
    return args, {**kwargs, keyword or "": new}


def pending() -> int:
    """How many deferred verdicts this thread has not read yet."""
    return len(_STATE.pending)


def flush() -> None:
    """Read every deferred verdict of this thread (one transfer per dtype) and raise the first
    violation. Called before ``optimizer.step()``, at ``.item()``, and when a block ends."""
    __tracebackhide__ = True
    entries, _STATE.pending = _STATE.pending, []
    if not entries:
        return
    busy, _STATE.busy = _STATE.busy, True  # the message's own tensor work is not checked
    try:
        _raise_first(entries)
    finally:
        _STATE.busy = busy


def _raise_first(entries: list[_Pending]) -> None:
    __tracebackhide__ = True
    summaries = [s for e in entries for s in e.summaries]
    values = iter(_read(summaries) if summaries else [])
    for entry in entries:
        for requirement, version in zip(entry.requirements, entry.versions, strict=True):
            if requirement.holds(next(values)):
                continue
            finding = requirement.explain()
            if finding.count == 0 or requirement.tensor._version != version:
                finding = _changed_since(finding)
            violation = _violation(entry.check, entry.func, finding, entry.where, deferred=True)
            raise _dressed(_error(entry.check)(violation))


def flush_after_cell(value: Any = None) -> Any:
    """The end of a ``%cudacheck on --deferred`` cell: read the verdicts, hand ``value`` back
    (so the cell's displayed result is unchanged). A violation raises inside the cell itself."""
    __tracebackhide__ = True
    flush()
    return value


def _changed_since(finding: Finding) -> Finding:
    from dataclasses import replace

    note = "values as they are now: the tensor was modified in place after the call"
    return replace(finding, source=f"{finding.source}; {note}" if finding.source else note)


_HOOK_LOCK = threading.Lock()
_HOOK: dict[str, Any] = {"users": 0, "handle": None}


def _step_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    __tracebackhide__ = True
    if _STATE.pending:
        flush()  # raises: the step never runs, the weights stay as they were


def _hook_on() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    with _HOOK_LOCK:
        if _HOOK["users"] == 0:
            _HOOK["handle"] = register_optimizer_step_pre_hook(_step_pre_hook)
        _HOOK["users"] += 1
    try:
        _SYNC_ENTRIES.acquire()
    except BaseException:
        _hook_off(entries=False)
        raise


def _hook_off(entries: bool = True) -> None:
    try:
        with _HOOK_LOCK:
            _HOOK["users"] -= 1
            if _HOOK["users"] == 0 and _HOOK["handle"] is not None:
                _HOOK["handle"].remove()
                _HOOK["handle"] = None
    finally:
        if entries:
            _SYNC_ENTRIES.release()


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


@functools.lru_cache(maxsize=4096)  # asked for every frame of every deferred call
def _is_library(filename: str) -> bool:
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


# --- the public context manager ---------------------------------------------------------------
class Guard:
    """``with guard():`` checks every assert-prone call in the block; nested guards are safe.

    The outermost guard (of any thread) installs the wrappers over the checked ops' entry points,
    the last one to end removes them; an inner guard narrows or widens the selection of checks
    (and the mode) until it ends. All of it is undone in ``__exit__``, on exceptions and on
    KeyboardInterrupt alike, and for a guard inside a generator left open, when the generator is
    closed or collected.
    """

    def __init__(
        self, config: GuardConfig, sync: bool = False, namespace: dict[str, Any] | None = None
    ) -> None:
        self.config = config
        self.sync = sync
        self.namespace = namespace  # where early references to torch's ops are seen too
        self._entered = False
        self._configs: list[GuardConfig] = []
        self._thread = 0
        self._renamed: list[tuple[str, Any, Any]] = []  # (name, torch's op, our wrapper)

    def __enter__(self) -> Guard:
        if self._entered:
            raise RuntimeError("this guard is already active; create a new one with guard()")
        _ENTRIES.acquire()
        try:
            if self.config.deferred:
                _hook_on()
        except BaseException:
            _ENTRIES.release()
            raise
        if self.namespace is not None:
            self._renamed = _ENTRIES.bind_early(self.namespace)
        # the list itself: a generator's guard may be closed from another thread
        self._configs = _STATE.configs
        self._thread = threading.get_ident()
        self._configs.append(self.config)
        self._entered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        __tracebackhide__ = True
        if not self._entered:
            return
        self._entered = False
        configs = self._configs
        here = self._thread == threading.get_ident()
        try:
            if self.sync and exc_type is None:
                _synchronize()
            # The block's deferred verdicts are read as it ends: after another error too (a bad
            # input is the likelier cause of what followed), but not on Ctrl-C or an exit.
            if not here:
                pass  # closed from another thread (a collected generator): not its verdicts
            elif exc_type is None or issubclass(exc_type, Exception):
                # a strict guard inside a deferred one leaves the outer one's verdicts to it
                if self.config.deferred or not any(
                    c.deferred for c in configs if c is not self.config
                ):
                    flush()
            else:
                _STATE.pending.clear()
        finally:
            # by identity, not the top: guards in generators end out of order
            for index in range(len(configs) - 1, -1, -1):
                if configs[index] is self.config:
                    del configs[index]
                    break
            if not configs and here:
                _STATE.pending.clear()
            if self.namespace is not None:
                _unbind_early(self.namespace, self._renamed)
                self._renamed = []
                if not configs and here:  # the last guard of this thread: no wrapper stays
                    _ENTRIES.unbind_all(self.namespace)
            _note_unchecked()
            try:
                if self.config.deferred:
                    _hook_off()
            finally:
                _ENTRIES.release()


_NOTED: set[str] = set()


def _note_unchecked() -> None:
    _note_traced()
    _note_compiled_regions()


def _note_traced() -> None:
    """Once per process where torch.jit.trace recorded a checked op inside a guard."""
    if not _TRACED:
        return
    _TRACED.clear()
    if "traced" not in _NOTED:
        _NOTED.add("traced")
        print(
            "nb_cudaguard: torch.jit.trace ran checked ops unchecked (a trace records them as "
            "torch runs them); its example inputs were not checked, and the traced function "
            "runs unchecked.",
            file=sys.stderr,
        )


def _note_compiled_regions() -> None:
    """Once per process where torch.compile has compiled something: its regions run unchecked."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if "compiled" in _NOTED or not isinstance(counters, dict):
        return
    if counters.get("stats", {}).get("unique_graphs", 0):
        _NOTED.add("compiled")
        print(
            "nb_cudaguard: code compiled by torch.compile is not checked by the guard (it runs "
            "torch's ops as compiled); to check its inputs, run it uncompiled once.",
            file=sys.stderr,
        )


def _unbind_early(namespace: dict[str, Any], renamed: list[tuple[str, Any, Any]]) -> None:
    """Each name back to torch's own op, where it still names our wrapper (one the user bound
    to something else meanwhile is theirs)."""
    for name, op, wrapper in renamed:
        if namespace.get(name) is wrapper:
            namespace[name] = op


def _synchronize() -> None:
    """Surface an asynchronous CUDA error of this block here, not in a later cell."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def guard(
    only: Iterable[str] | str | None = None,
    skip: Iterable[str] | str | None = None,
    sync: bool = False,
    mode: str = "strict",
    namespace: dict[str, Any] | None = None,
) -> Guard:
    """Check the inputs of assert-prone torch calls in a ``with`` block before they run.

    ``mode="strict"`` (default): each checked call's verdict is read at once, and a bad input
    raises before its kernel launches (on a GPU: one synchronisation per checked call).
    ``mode="deferred"``: no synchronisation per call; the call runs on clamped (safe) values and
    the first violation is raised before the next ``optimizer.step()``, at the next ``.item()``
    or ``.tolist()``, or when the block ends, whichever comes first (tensors in host memory:
    at the bad call, as PyTorch's CPU op raises there).

    ``only``/``skip``: op names (``"cross_entropy"``, ``"getitem"``) or families (``"loss"``,
    ``"embedding"``, ``"sampling"``, ``"gather_scatter"``, ``"index"``, ``"one_hot"``,
    ``"repeat_interleave"``, ``"unpool"``). ``sync``: synchronise CUDA when the block ends
    without an error, so an asynchronous error from an unchecked op is reported there.
    A bad input raises :class:`nb_cudaguard.GuardError` before its kernel runs.

    ``namespace``: where names bound to torch's ops before the block (``from torch import
    gather``) are checked too, and put back as the block ends; default: the caller's globals.
    """
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    config = GuardConfig(
        only=parse_names(only),
        skip=parse_names(skip) or frozenset(),
        deferred=mode == "deferred",
    )
    return Guard(config, sync=sync, namespace=namespace)


def active() -> bool:
    return bool(_STATE.configs)
