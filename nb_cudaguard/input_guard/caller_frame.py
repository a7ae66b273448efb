"""Call an op from a frame compiled as its caller's, so torch's warnings keep the caller's
location (its module, its line, its once-per-location registry).
"""

from __future__ import annotations

from collections.abc import Callable
from types import CodeType, FrameType, FunctionType
from typing import Any

# A warning torch raises inside an op is attributed to the Python frame that called it (TORCH_WARN
# goes through PyErr_WarnEx with stacklevel 1; a Python op's warnings.warn(stacklevel=2) alike):
# the wrapper's, which would make the warning come from nb_cudaguard's files. So the wrapper calls
# the op from a one-line function compiled with the caller's file and line, run in the caller's
# globals: to the warnings machinery it is the caller's frame (its module for
# filterwarnings(module=...), its __warningregistry__ and line for "once per location"). One per
# call site, made once.
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
Call = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
# (id(code), instruction) -> (the call, the code): by id, since hashing a code object hashes its
# constants every time (~0.9 us for a notebook cell's, per checked call); the code kept in the
# value keeps that id from being reused while the entry lives
_CALLERS: dict[tuple[int, int], tuple[Call, CodeType]] = {}
_MAX_CALLERS = 4096


def _direct(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    __tracebackhide__ = True
    return func(*args, **kwargs)


def _as_caller(frame: FrameType | None) -> Call:
    if frame is None:
        return _direct
    own = frame.f_code
    key = (id(own), frame.f_lasti)
    found = _CALLERS.get(key)
    if found is not None:
        return found[0]
    if len(_CALLERS) >= _MAX_CALLERS:
        _CALLERS.clear()
    code = _CALL_CODE.replace(co_filename=own.co_filename, co_firstlineno=frame.f_lineno or 1)
    call = FunctionType(code, frame.f_globals)
    _CALLERS[key] = (call, own)
    return call
