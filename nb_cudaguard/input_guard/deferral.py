"""The deferred mode: each checked call leaves its verdict on the device and runs on values that
cannot fault; ``flush`` reads the verdicts together and raises the first violation.

Reading a CUDA tensor waits for everything queued on its stream. Before ``optimizer.step()`` that
is the whole backward pass, and the GPU would then idle while the host queues the step and the
next forward. So each deferred call marks its stream with an event right after its summaries, and
``flush`` reads them on a side stream that waits for those events only (``behind``): the
summaries were queued in the forward pass, long before. At ``.item()`` the caller waits for the
stream anyway, and the read is the plain one.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .errors import GuardError
from .judge import STATS, _accepts, _host_error, _judged_on_host, _live, _read, first_violation
from .ops import OpCheck
from .report import _capture, _changed_since, _dressed, _error, _raise, _violation
from .requirements import Requirement, Slot, transforms_active, unwrapped
from .state import _STATE, _Pending

# Deferred verdicts waiting to be read; past this many the guard reads them (one transfer), so a
# loop that never synchronises does not keep its inputs alive without bound.
MAX_PENDING = 32


# Tensors in host memory are judged at the call itself, and a violation is raised there: reading
# them is no synchronisation, and the CPU op would raise its own error at that very call (code
# that catches it, ``except IndexError``, behaves as without the guard). Tests turn this off to
# run the device path on CPU.
HOST_VERDICTS_AT_ONCE = True


def _writes_into_a_checked_tensor(
    func: Any, args: tuple[Any, ...], live: list[Requirement]
) -> bool:
    """An in-place call whose checked tensor shares memory with the tensor it writes
    (``t.scatter_(0, t, v)``, ``t[t] = v``): PyTorch refuses that overlap itself, which a safe
    copy of the checked tensor would hide."""
    name = getattr(func, "__name__", "")
    if not (name.endswith("_") or name == "__setitem__") or not args:
        return False
    target = args[0]
    if not isinstance(target, torch.Tensor):
        return False
    try:
        written = target.untyped_storage().data_ptr()
        return any(r.tensor.untyped_storage().data_ptr() == written for r in live)
    except Exception:  # a tensor with no storage of its own (a subclass, a functorch wrapper)
        return False


def _defer(
    check: OpCheck, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Record the call's verdict on the device and return arguments that cannot fault."""
    __tracebackhide__ = True
    try:
        requirements = check.extract(args, kwargs)
        if transforms_active():  # inside torch.func.vmap / grad: read the plain tensors
            requirements = unwrapped(requirements)
        live, on_host = _live(requirements)
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
        replaced_all = not _writes_into_a_checked_tensor(func, args, live)
        for r in live if replaced_all else ():
            replaced = _with_safe(r, safe_args, safe_kwargs)
            if replaced is None:
                replaced_all = False
                break
            safe_args, safe_kwargs = replaced
        if replaced_all:
            where = _capture(args, kwargs, keep=True, modules=check.family == "loss")
            summaries = [r.summary() for r in live]
            versions = [_version(r.tensor) for r in live]
            ready = _marked(summaries[0][0]) if _STATE.marking and READ_BEHIND else None
            _STATE.pending.append(_Pending(check, func, live, summaries, versions, where, ready))
            if len(_STATE.pending) >= MAX_PENDING:
                flush()
            return safe_args, safe_kwargs
    except GuardError:
        raise
    except Exception:  # a check must never break a call PyTorch itself would accept
        STATS["check_failed"] += 1
        return args, kwargs
    # a value no replacement can make valid (an index into an empty dimension), or a checked
    # tensor the call writes into: check at once
    finding = first_violation(live)
    if finding is not None:
        _raise(check, func, finding, args, kwargs)
    return args, kwargs


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter, to tell at the read whether it was written since the call;
    None for a tensor made under ``torch.inference_mode()``, which has no counter (asking raises,
    and the guard would have dropped the check)."""
    return None if tensor.is_inference() else tensor._version


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


# Off: every flush reads on the summaries' own stream, waiting for all the work queued there
# (the benchmark compares both).
READ_BEHIND = True
# Marks cost the host microseconds a call, and the read after them tens (H200, 2026-11-27), and
# pay only where the GPU is behind the host. So a thread marks only after a plain read waited
# longer than this (its GPU was behind), and stops once a read behind finds the stream idle.
WAITED_S = 0.0005


def _marked(part: torch.Tensor) -> Any:
    """The event of ``part``'s stream, recorded again right after the work that computes it (None
    off a GPU, or while a CUDA graph is captured, where the host cannot wait for an event). One
    event per stream, reused: a flush waits for the latest record, which covers the calls before
    it on that stream, and no event is created and destroyed per call."""
    if not part.is_cuda or torch.cuda.is_current_stream_capturing():
        return None
    # (stream id, device index, device type): torch.cuda.current_stream() builds a Stream
    # object from the same tuple, at five times the cost
    key = torch._C._cuda_getCurrentStream(part.device.index)
    marks = _STATE.events.get(key)
    if marks is None:
        stream = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
        marks = _STATE.events[key] = (stream, torch.cuda.Event())
    stream, event = marks
    event.record(stream)
    return event


def _read_behind(entries: list[_Pending], summaries: list[Any]) -> list[list[Any]]:
    """The summaries' values, waiting for the events their calls recorded, not for their streams.
    Falls back to the plain read where a call has no event or the summaries span devices, and
    turns the marks on or off by what the reads found (``WAITED_S``)."""
    device = summaries[0][0].device
    if any(e.ready is None for e in entries) or any(
        part.device != device for summary in summaries for part in summary
    ):
        start = time.perf_counter()
        values = _read(summaries)
        if READ_BEHIND and device.type == "cuda" and time.perf_counter() - start > WAITED_S:
            _STATE.marking = True
        return values
    side = _STATE.side_streams.get(device)
    if side is None:
        side = _STATE.side_streams[device] = torch.cuda.Stream(device)
    for event in {id(entry.ready): entry.ready for entry in entries}.values():
        side.wait_event(event)
    # the parts stay referenced until this returns, and the read below waits for the side
    # stream: their memory is not handed back to their own stream while it is still read
    with torch.cuda.stream(side):
        values = _read(summaries)
    if torch.cuda.current_stream(device).query():  # nothing queued after: the plain read is as good
        _STATE.marking = False
    return values


def pending() -> int:
    """How many deferred verdicts this thread has not read yet."""
    return len(_STATE.pending)


def flush(behind: bool = True) -> None:
    """Read every deferred verdict of this thread (one transfer per dtype) and raise the first
    violation. Called before ``optimizer.step()``, at ``.item()``, and when a block ends.
    ``behind``: wait only for the summaries, not for the work queued after them (the module's
    doc); False where the caller waits for the whole stream anyway."""
    __tracebackhide__ = True
    entries, _STATE.pending = _STATE.pending, []
    if not entries:
        return
    busy, _STATE.busy = _STATE.busy, True  # the message's own tensor work is not checked
    try:
        _raise_first(entries, behind)
    finally:
        _STATE.busy = busy


def _raise_first(entries: list[_Pending], behind: bool) -> None:
    __tracebackhide__ = True
    summaries = [s for e in entries for s in e.summaries]
    if not summaries:
        return
    values = iter(_read_behind(entries, summaries) if behind else _read(summaries))
    for entry in entries:
        for requirement, version in zip(entry.requirements, entry.versions, strict=True):
            if requirement.holds(next(values)):
                continue
            finding = requirement.explain()
            if finding.count == 0 or _version(requirement.tensor) != version:
                finding = _changed_since(finding)
            violation = _violation(entry.check, entry.func, finding, entry.where, deferred=True)
            raise _dressed(_error(entry.check)(violation))


def flush_after_cell(value: Any = None) -> Any:
    """The end of a ``%cudacheck on --deferred`` cell: read the verdicts, hand ``value`` back
    (so the cell's displayed result is unchanged). A violation raises inside the cell itself."""
    __tracebackhide__ = True
    flush()
    return value
