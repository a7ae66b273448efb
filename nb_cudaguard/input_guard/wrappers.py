"""The wrappers installed over torch's entry points: a checked call judged (strict) or deferred
before it runs, and ``.item()``/``.tolist()`` reading the deferred verdicts.
"""

from __future__ import annotations

import contextlib
import importlib
from sys import _getframe
from types import FrameType, FunctionType, ModuleType
from typing import Any

from . import judge
from .caller_frame import _CALLERS, Call, _as_caller
from .deferral import _defer, flush
from .judge import _accepts, _host_error, _inspect, _runs_on_host
from .ops import OpCheck
from .report import _raise
from .state import _STATE, GuardConfig, _skips, _ThreadState


def _checked_entry(owner: Any, attr: str, check: OpCheck, func: Any) -> Any:
    """The wrapper installed over one entry point while a guard is active somewhere.

    One Python frame between the caller and the op's own: a module's function is a
    ``_ModuleOp`` whose type calls this function as its ``__call__`` (a staticmethod, so CPython
    calls it straight from C, with no bound method and no second frame; issue 30: the two layers
    cost ~3.3 us a checked call, the nested ``torch.embedding`` inside ``F.embedding`` included).
    """

    name = getattr(func, "__name__", "")
    # x.scatter_(...), x[i] = v: the CPU op may write part of its output before it raises
    trusted = check.cpu_rejects and not (
        name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))
    )
    plain = check.nothing_to_check
    # the innermost guard's config and whether it selects this check, as last seen: a guard's
    # config is frozen, so the answer holds while the very same config is the innermost
    last: list[tuple[GuardConfig | None, bool]] = [(None, False)]

    def checked(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves our frames out of the user's traceback
        state = _STATE
        configs = state.configs
        try:
            caller: FrameType | None = _getframe(1)
        except ValueError:  # called from C with no Python frame above
            caller = None
        if state.busy or not configs or (plain is not None and plain(args)):
            # torch's own inner call (the torch.embedding inside F.embedding), a thread in no
            # guard, x[0]: straight to the op, from a frame that reads as the caller's
            if caller is None:
                return func(*args, **kwargs)
            found = _CALLERS.get((id(caller.f_code), caller.f_lasti))  # _as_caller, inlined
            call = _as_caller(caller) if found is None else found[0]
            return call(func, args, kwargs)
        config = configs[-1]
        seen, chosen = last[0]
        if seen is not config:
            chosen = config.selects(check)
            last[0] = (config, chosen)
        if _skips():
            return func(*args, **kwargs)
        if not chosen:  # torch's inner calls still pass through, as in any checked call
            return _unchecked_call(state, func, args, kwargs, _as_caller(caller))
        return _guarded_call(state, config, check, func, args, kwargs, trusted, _as_caller(caller))

    return _dressed_as(owner, attr, checked, func)


def _sync_entry(owner: Any, attr: str, func: Any) -> Any:
    """``.item()``/``.tolist()``: the caller synchronises here anyway, so read the verdicts too."""

    def synchronising(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if _STATE.pending and not _STATE.busy and not _skips():
            flush(behind=False)  # the call waits for the stream itself
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
        # a type of its own whose __call__ is the wrapper: called from C, no frame in between
        body = {"__slots__": (), "__call__": staticmethod(wrapper)}
        kind = type(_ModuleOp.__name__, (_ModuleOp,), body)
        return kind(owner.__name__, attr, wrapper, func)
    return wrapper


class _ModuleOp:
    """A checked function of a module (``torch.gather``, ``F.cross_entropy``): calls the
    wrapper (each op's own subclass has it as its ``__call__``), and pickles, copies and
    deep-copies as torch's own function, inside a guard and after it. A plain function cannot:
    pickle saves a function by its module and name and refuses one that is not what that name
    holds (after the guard, torch's op again; a model built inside a guard with
    ``self.loss_fn = F.cross_entropy`` could never be saved). Pickled, it is
    ``getattr(importlib.import_module(module), name)``: the reader needs torch only, and gets
    whatever that name holds there (torch's op, outside a guard)."""

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

    # __call__: the wrapper, set on each op's own subclass (``_dressed_as``); torch.compile
    # never calls it (it traces ``_torchdynamo_inline``), and a graph it runs calls torch's op

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


def _unchecked_call(
    state: _ThreadState,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    call: Call,
) -> Any:
    __tracebackhide__ = True
    state.busy = True
    try:
        return call(func, args, kwargs)
    finally:
        state.busy = False


def _guarded_call(
    state: _ThreadState,
    config: GuardConfig,
    check: OpCheck,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    trusted: bool,
    call: Call,
) -> Any:
    """A checked call judged (strict) or deferred, then run by ``call``, from the caller's frame."""
    __tracebackhide__ = True
    state.busy = True
    try:
        if trusted and judge.TRUST_HOST_OPS and _runs_on_host(check, args, kwargs):
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


def make_wrapper(owner: Any, attr: str, check: OpCheck | None, func: Any) -> Any:
    if check is None:
        return _sync_entry(owner, attr, func)
    return _checked_entry(owner, attr, check, func)
