"""CPU snapshots of GPU objects, taken at the end of each successful cell (``%cudaguard keep``).

After a sticky CUDA error GPU memory cannot be read (NVIDIA's error types,
https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html), so the weights
trained on the GPU are lost unless a copy is already on the CPU. For each named object (a module, an
optimizer, a tensor, anything with ``state_dict()``), its tensors are copied into CPU buffers:

- **one snapshot of all names together** (a model and its optimizer always from the same cell;
  a tensor both hold is copied once);
- **two buffer sets, alternating**: the copy goes into the set that is not the last good one, so
  a failure during a copy (the context broken mid-way) leaves the last good snapshot intact;
- a snapshot **counts as good only once its copy is known complete**: at once on the CPU; on
  CUDA when the event recorded after the copies reports done (asked without waiting, at the end
  of a later cell or at the restart; a broken context raises there, and the copy is dropped);
- **asynchronous on CUDA**: pinned buffers, allocated once and reused, ``non_blocking`` copies on
  a side stream that first waits for the current stream (so it copies what the cell computed);
  ``record_stream`` keeps the caching allocator from reusing a source before the copy read it.
  While a copy is in flight, the next cell skips its snapshot rather than wait;
- **only what changed**: the same tensor object (a weak reference says so: the caching allocator
  reuses freed memory for new tensors, which start at version 0 again) whose version counter
  (``_version``, bumped by every in-place op, the optimizer's included) is the one its buffer
  was copied at is not copied again. Writes
  through ``.data`` do not bump it (PyTorch gives ``.data`` its own counter): code that updates
  ``p.data`` by hand is snapshotted once; use ``with torch.no_grad(): p.add_(...)`` instead.

Tensors are identified by their host-side attributes only (``pickling.tensor_identity``), so that
at the restart the keep's pickler can write the snapshot buffer in place of each CUDA tensor:
the module comes back on the CPU, whole, with the optimizer pointing at its parameters.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .pickling import tensor_identity


class NotSnapshottable(TypeError):
    """The object holds no tensors this module knows how to find."""


def tensors_of(value: Any) -> Iterator[Any]:
    """The tensors whose values make up ``value``'s state, without reading any of them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()
    elif isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:
            yield from group["params"]
        for state in value.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_of(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_of(item)
    elif callable(getattr(value, "state_dict", None)):
        yield from tensors_of(value.state_dict())


@dataclass
class _Slot:
    buffer: Any
    version: int
    owner: Any = None  # a weak reference to the tensor copied: memory is reused, objects are not


def _owner(tensor: Any) -> Any:
    try:
        return weakref.ref(tensor)
    except TypeError:
        return None


class _Done:
    def done(self) -> bool:
        return True


class _CudaDone:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def done(self) -> bool:
        return all(e.query() for e in self.events)  # never waits; raises in a broken context


@dataclass
class _State:
    """The double-buffered copies of every snapshotted name's tensors, taken together (one
    cell's model and optimizer always go together; a tensor two names share is copied once)."""

    sets: tuple[dict[tuple[Any, ...], _Slot], dict[tuple[Any, ...], _Slot]] = field(
        default_factory=lambda: ({}, {})
    )
    good: int | None = None  # the buffer set holding the last complete snapshot
    good_cell: int | None = None
    good_names: tuple[str, ...] = ()
    pending: tuple[int, Any, int | None, tuple[str, ...]] | None = None  # set, completion, ...
    failed: str = ""  # why the last copy was dropped

    def settle(self) -> None:
        """Promote the copy in flight if it is known complete; drop it if asking fails."""
        if self.pending is None:
            return
        target, completion, cell, names = self.pending
        try:
            finished = completion.done()
        except Exception as error:  # a broken context: the previous good snapshot stays
            self.pending = None
            self.failed = _why(error)
            return
        if finished:
            self.pending = None
            self.good, self.good_cell, self.good_names, self.failed = target, cell, names, ""

    def good_buffers(self) -> dict[tuple[Any, ...], Any]:
        if self.good is None:
            return {}
        return {key: slot.buffer for key, slot in self.sets[self.good].items()}


def _why(error: BaseException) -> str:
    text = str(error).splitlines()[0][:120] if str(error) else ""
    return f"{type(error).__name__}: {text}"


class Snapshots:
    """The snapshotted names of one notebook, and what their snapshots cost."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}  # ordered set
        self.state = _State()
        self.costs: deque[float] = deque(maxlen=100)  # seconds of host time per cell
        self.last_bytes = 0
        self.skipped_in_flight = 0
        self.streams: dict[Any, Any] = {}

    def add(self, name: str, value: Any) -> None:
        if not any(True for _ in tensors_of(value)):
            raise NotSnapshottable(
                f"`{name}` ({type(value).__name__}) holds no tensors: keep a module, an "
                "optimizer, a tensor, or a dict/list of them"
            )
        self.names[name] = None

    def remove(self, name: str, namespace: dict[str, Any]) -> None:
        """Stop snapshotting ``name``; the buffers only it used are freed now (with no name
        left, all of them, pinned ones included)."""
        self.names.pop(name, None)
        state = self.state
        if not self.names:
            self.state = _State()
            self.streams.clear()
            self.last_bytes = 0
            return
        state.good_names = tuple(n for n in state.good_names if n in self.names)
        still: set[tuple[Any, ...]] = set()
        for other in self.names:
            with contextlib.suppress(Exception):  # host-side attributes only: safe when poisoned
                still.update(tensor_identity(t) for t in tensors_of(namespace.get(other)))
        first, second = ({k: v for k, v in slots.items() if k in still} for slots in state.sets)
        state.sets = (first, second)

    def held(self) -> int:
        """Bytes of the CPU buffers held (both sets)."""
        return sum(
            slot.buffer.numel() * slot.buffer.element_size()
            for slots in self.state.sets
            for slot in slots.values()
            if slot.buffer is not None
        )

    def after_cell(self, namespace: dict[str, Any], cell: int | None) -> None:
        """Start this cell's copy of every name's tensors; a failure drops this copy only."""
        started = time.perf_counter()
        state = self.state
        self.last_bytes = 0
        try:
            state.settle()
            if state.pending is not None:
                self.skipped_in_flight += 1  # the last copy is still in flight: no waiting here
                return
            names = tuple(n for n in self.names if namespace.get(n) is not None)
            if not names:
                return
            try:
                target, completion, size = self._copy([namespace[n] for n in names])
            except Exception as error:
                state.failed = _why(error)
                return
            self.last_bytes = size
            state.pending = (target, completion, cell, names)
            state.settle()  # CPU copies are complete at once
        finally:
            self.costs.append(time.perf_counter() - started)

    def _copy(self, values: list[Any]) -> tuple[int, Any, int]:
        import torch

        state = self.state
        target = 0 if state.good is None else 1 - state.good
        slots = state.sets[target]
        fresh: dict[tuple[Any, ...], _Slot] = {}
        events: list[Any] = []
        size = 0
        by_device: dict[Any, list[tuple[tuple[Any, ...], Any]]] = {}
        for value in values:
            for tensor in tensors_of(value):
                key = tensor_identity(tensor)
                if key not in fresh:
                    by_device.setdefault(tensor.device, []).append((key, tensor))
                    fresh[key] = _Slot(None, -1)
        for device, pairs in by_device.items():
            on_cuda = device.type == "cuda"
            stream = None
            if on_cuda:
                stream = self.streams.get(device)
                if stream is None:
                    stream = self.streams[device] = torch.cuda.Stream(device)
                stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream) if on_cuda else _nothing(), torch.no_grad():
                for key, tensor in pairs:
                    slot = slots.get(key)
                    version = tensor._version
                    # Same memory, same version and the same tensor object: unchanged. (A new
                    # tensor at a freed one's address starts at version 0 too.)
                    same = slot is not None and slot.owner is not None and slot.owner() is tensor
                    if slot is not None and same and slot.version == version:
                        fresh[key] = slot
                        continue
                    if slot is None:
                        buffer = torch.empty_like(
                            tensor, device="cpu", pin_memory=on_cuda, requires_grad=False
                        )
                        slot = _Slot(buffer, -1)
                    slot.buffer.copy_(tensor.detach(), non_blocking=on_cuda)
                    if on_cuda:
                        tensor.record_stream(stream)
                    slot.version = version
                    slot.owner = _owner(tensor)
                    fresh[key] = slot
                    size += tensor.numel() * tensor.element_size()
            if on_cuda:
                event = torch.cuda.Event()
                event.record(stream)
                events.append(event)
        state.sets = (fresh, state.sets[1]) if target == 0 else (state.sets[0], fresh)
        return target, (_CudaDone(events) if events else _Done()), size

    def for_keep(self) -> tuple[dict[tuple[Any, ...], Any], dict[str, str], dict[str, str]]:
        """At the restart: (CUDA tensor identity -> CPU copy, name -> what it is, name -> why
        there is no snapshot)."""
        state = self.state
        state.settle()
        notes: dict[str, str] = {}
        missing: dict[str, str] = {}
        for name in self.names:
            if state.good is None or name not in state.good_names:
                failed = f" (the copy failed: {state.failed})" if state.failed else ""
                missing[name] = "no complete snapshot yet" + failed
            else:
                cell = f" after cell [{state.good_cell}]" if state.good_cell is not None else ""
                notes[name] = f"snapshot{cell}"
        return state.good_buffers(), notes, missing

    def status(self) -> list[str]:
        if not self.names:
            return []
        state = self.state
        if state.good is None:
            when = "no complete snapshot yet"
        elif state.good_cell is not None:
            when = f"last good after cell [{state.good_cell}]"
        else:
            when = "last good"
        if state.pending is not None:
            when += ", a copy in flight"
        if state.failed:
            when += f", last copy dropped ({state.failed})"
        lines = [f"snapshots (%cudaguard keep): {', '.join(self.names)} ({when})"]
        lines.append(f"snapshot buffers held: {self.held() / 1e6:.1f} MB")
        if self.costs:
            median = statistics.median(self.costs) * 1e3
            lines.append(
                f"snapshot cost per cell: {median:.2f} ms median host time over the last "
                f"{len(self.costs)} cells; {self.last_bytes / 1e6:.1f} MB copied after the last"
                + (
                    f"; {self.skipped_in_flight} cells skipped (a copy still in flight)"
                    if self.skipped_in_flight
                    else ""
                )
            )
        return lines


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None
