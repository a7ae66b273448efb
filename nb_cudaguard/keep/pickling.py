"""Serialise values to one file without touching CUDA, each piece of memory once; read them back.

The pickler is cloudpickle's (functions and classes defined in the notebook travel by value),
with these changes:

- **CUDA is refused, never read.** After a sticky error every CUDA call re-raises, ``.cpu()``
  included (NVIDIA's error types, https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html),
  and on a healthy context a copy would still start work on the GPU.
  Any tensor or storage that is not on the CPU raises ``NotOnCpu`` before anything reads it
  (``.device`` and ``.data_ptr()`` are host-side attributes); a module or optimizer with CUDA
  state therefore fails as a whole, with the reason. A ``substitutes`` map may stand in a CPU copy
  for a CUDA tensor (a snapshot taken while the context was good: ``snapshot.py``).
- **Memory is written once, beside the pickle, and comes back shared.** A numpy array (exactly
  ``ndarray``, not of objects) and a CPU tensor's storage are not pickled: the pickle names the
  address range of their memory (a ``_Region``), and the ranges are written after it, overlapping
  ones merged into one block. So a view and its base, ``torch.from_numpy(a)`` and ``a``, a
  tensor and ``t.numpy()`` are written once, and read back as views of the same block. Other
  libraries' pickle protocol 5 buffers go the same way. Nothing is copied in memory on the way.
- **What a library's class holds is not copied.** An instance that its own class holds, as a
  singleton (``cls._instance = self``) or as "shared state" (accelerate's ``PartialState`` and
  ``AcceleratorState``: ``self.__dict__ = self._shared_state``, accelerate/state.py), would come
  back as a copy that the class in the new process does not hold: its state empty, a second
  instance apart from the restored one. Such a value raises ``HeldByItsClass``; it is not
  kept, and a replay builds it again from its cells. Classes defined in the notebook travel by
  value with what they hold, and objects that reduce themselves (an ``Enum``'s members) find
  their class's own again.
- **Notebook functions keep the notebook as their globals.** cloudpickle gives a function defined
  in ``__main__`` a private copy of the globals it names (so ``def step(): model(x)`` would drag a
  copy of ``model`` along, or fail because ``model`` is on the GPU). Here such a function is
  rebuilt with the restoring namespace as its globals, as it was defined.

``KeepPickler.pickle`` pickles values once and says what they hold: the identities of shared
objects and the memory ranges, which the store uses to write together what shares anything, and
the file's exact size; it keeps the pickle itself in memory up to a size, so that a value that
shares nothing is not pickled twice. ``write`` then writes the file.

File layout: ``MAGIC``, the blocks (each at a 64-byte aligned offset), the pickle stream, then a
trailer (each block's address when it was written, its length and offset; the out-of-band
buffers' addresses and lengths; the pickle's offset and length; the trailer's length; ``MAGIC``)
read from the end. Reading maps the file copy-on-write (``mmap``, ``ACCESS_COPY``): arrays and
tensors use the mapped pages as their memory, with no copy and no zero-filled allocation; pages
are read from the page cache on first touch (the file was just written), and stay valid after
the file is removed.
"""

from __future__ import annotations

import bisect
import ctypes
import io
import os
import pickle
import struct
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

MAGIC = b"NBCGKEP3"
ALIGN = 64  # blocks start at aligned offsets, so mapped arrays and tensors are aligned
CHUNK = 64 * 1024**2  # a block is written in pieces this large: the deadline is checked between
_U64 = struct.Struct("<Q")


class NotOnCpu(TypeError):
    """The value holds GPU memory (or another device's): it is not read."""


class HeldByItsClass(TypeError):
    """The value holds an object that a library's class holds too (a singleton kept on the class,
    or a "shared state" object whose ``__dict__`` is the class's): a copy restored apart from
    the class would not be the class's, so the cells that built it run again instead."""


class TooLarge(Exception):
    """Writing went over the size cap."""


class OutOfTime(Exception):
    """Writing went past the deadline, or was cancelled."""


# --- the restoring namespace ---------------------------------------------------------------------

_restore_namespace: list[dict[str, Any]] = []


class _NotebookGlobals:
    """Pickled in place of the notebook's namespace: unpickled as the namespace restoring it."""

    def __reduce__(self) -> tuple[Callable[[], dict[str, Any]], tuple[()]]:
        return _current_namespace, ()


_NOTEBOOK_GLOBALS = _NotebookGlobals()


def _current_namespace() -> dict[str, Any]:
    if _restore_namespace:
        return _restore_namespace[-1]
    import __main__

    namespace: dict[str, Any] = __main__.__dict__
    return namespace


class _EmptyCell:
    """Stands for a closure cell not yet assigned (a name the function will see later)."""

    def __reduce__(self) -> str:
        return "_EMPTY_CELL"


_EMPTY_CELL = _EmptyCell()


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _make_function(
    code: types.CodeType,
    namespace: dict[str, Any],
    name: str,
    defaults: tuple[Any, ...] | None,
    closure_values: tuple[Any, ...] | None,
    state: dict[str, Any],
) -> types.FunctionType:
    closure = None
    if closure_values is not None:
        closure = tuple(
            types.CellType() if v is _EMPTY_CELL else types.CellType(v) for v in closure_values
        )
    function = types.FunctionType(code, namespace, name, defaults, closure)
    for attribute, value in state.items():
        setattr(function, attribute, value)
    return function


# --- memory written beside the pickle ------------------------------------------------------------


class _Region:
    """A range of memory, pickled as its address and length and read back as a view of the block
    that holds it."""

    __slots__ = ("length", "start")

    def __init__(self, start: int, length: int) -> None:
        self.start, self.length = start, length

    def __reduce__(self) -> tuple[Any, ...]:
        return _region, (self.start, self.length)


class _Blocks:
    """The blocks of the file being read: (address when written, length, its mapped bytes)."""

    def __init__(self, blocks: list[tuple[int, int, memoryview]]) -> None:
        self.blocks = sorted(blocks, key=lambda b: b[0])
        self.starts = [b[0] for b in self.blocks]

    def view(self, start: int, length: int) -> memoryview:
        index = bisect.bisect_right(self.starts, start) - 1
        if index >= 0:
            begin, size, data = self.blocks[index]
            if start + length <= begin + size:
                return data[start - begin : start - begin + length]
        raise BadFile(f"no block holds {length} bytes at {start:#x}")


_loading: list[_Blocks] = []


def _region(start: int, length: int) -> memoryview:
    if not length:
        return memoryview(bytearray())
    if not _loading:
        raise BadFile("a region outside a keep file")
    return _loading[-1].view(start, length)


def _merge(regions: dict[int, int]) -> list[tuple[int, int]]:
    """Overlapping or touching ranges joined: (start, end) blocks, in address order."""
    blocks: list[tuple[int, int]] = []
    for start, end in sorted(regions.items()):
        if blocks and start <= blocks[-1][1]:
            blocks[-1] = (blocks[-1][0], max(blocks[-1][1], end))
        else:
            blocks.append((start, end))
    return blocks


def _bounds(array: Any) -> tuple[int, int, int]:
    """(lowest address, highest address + 1, address of the first element) of an array's
    memory, from its data pointer, shape and strides (numpy's ``byte_bounds``)."""
    data = int(array.__array_interface__["data"][0])
    low = high = data
    for size, stride in zip(array.shape, array.strides, strict=True):
        if stride < 0:
            low += (size - 1) * stride
        else:
            high += (size - 1) * stride
    return low, high + array.itemsize, data


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python


def _reduced_by_default(kind: type) -> bool:
    """Whether ``kind`` pickles its instances by object's own reduction (their class and
    ``__dict__``), not by a reduction of its own that may find the class's instance again."""
    return (
        getattr(kind, "__reduce_ex__", None) is object.__reduce_ex__
        and getattr(kind, "__reduce__", None) is object.__reduce__
    )


def _held_by_class(kind: type) -> dict[int, str]:
    """The ids of the values ``kind`` and its bases hold as class attributes, with their names:
    an instance held there (a singleton) or whose ``__dict__`` is held there (shared state)."""
    held: dict[int, str] = {}
    for base in kind.__mro__[:-1]:  # (not ``object``)
        for name, value in vars(base).items():
            if not isinstance(value, (types.FunctionType, property, staticmethod, classmethod)):
                held.setdefault(id(value), f"{base.__qualname__}.{name}")
    return held


def _rebuild_array(
    region: memoryview,
    dtype: Any,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    offset: int,
    writeable: bool,
) -> Any:
    import numpy

    array = numpy.ndarray(shape, dtype, buffer=region, offset=offset, strides=strides)
    if not writeable:
        array.flags.writeable = False
    return array


def _reduce_memoryview(view: memoryview) -> tuple[Any, ...]:
    """A view of a whole object as a view of that object (pickled once with the rest, so
    ``view[0] = 7`` writes into the restored ``frame`` again). cloudpickle writes a memoryview as
    the ``bytes`` it shows: another type, read-only, viewing nothing. A slice or a cast is not
    kept (the replay builds it again), nor is a released view."""
    try:
        base = view.obj
        whole = memoryview(base) if base is not None else None
    except (ValueError, TypeError) as error:  # released, or a base that no longer exports
        raise pickle.PicklingError(f"a memoryview that cannot be kept ({error})") from error
    layout = (view.format, view.shape, view.strides, view.readonly)
    if whole is None or (whole.format, whole.shape, whole.strides, whole.readonly) != layout:
        raise pickle.PicklingError("a memoryview of part of an object, or cast: not kept")
    return memoryview, (base,)


def _memory_at(start: int, length: int) -> memoryview:
    """``length`` bytes at ``start``, without a copy. Only ever called for ranges that arrays
    and storages kept alive by the caller span."""
    return memoryview((ctypes.c_char * length).from_address(start)).cast("B")


def _buffer_address(raw: memoryview) -> int | None:
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    return int(numpy.frombuffer(raw, dtype=numpy.uint8).__array_interface__["data"][0])


# --- tensors -------------------------------------------------------------------------------------


def _storage_from_region(region: memoryview, shared: bool = False) -> Any:
    import torch

    if len(region) == 0:
        storage = torch.empty(0, dtype=torch.uint8).untyped_storage()
    else:
        storage = torch.frombuffer(region, dtype=torch.uint8).untyped_storage()
    if shared:
        # ``t.share_memory_()`` (for workers started later: Hogwild, a ``multiprocessing``
        # queue) moved it to shared memory; the mapped file is private, so it moves again, in
        # place: every tensor rebuilt on this storage is shared, as before.
        storage.share_memory_()
    return storage


def _rebuild_tensor(
    storage: Any,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: Any,
    requires_grad: bool,
    inference: bool = False,
) -> Any:
    import torch

    if inference:  # made under ``torch.inference_mode()``: one again (what autograd allows)
        with torch.inference_mode():
            return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _set_leaf_state(tensor: Any, state: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> None:
    grad, hooks, attributes = state
    if grad is not None:
        tensor.grad = grad
    for hook in hooks:
        tensor.register_hook(hook)
    tensor.__dict__.update(attributes)


def _rebuild_view(base: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> Any:
    return base.as_strided(size, stride, offset)


class _StorageBytes:
    """One CPU storage as a region; the same storage seen twice is one object (pickle's memo)."""

    def __init__(self, region: _Region, shared: bool = False) -> None:
        self.region = region
        self.shared = shared

    def __reduce__(self) -> tuple[Any, ...]:
        return _storage_from_region, (self.region, self.shared)


def _device_of(value: Any) -> str | None:
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    return str(device) if isinstance(kind, str) and kind not in ("cpu", "meta") else None


# --- pickling ------------------------------------------------------------------------------------


@dataclass
class Pickled:
    """What pickling some values found, and their pickle where it was kept."""

    stream: bytes | None  # None: not kept (over the size given to ``pickle``)
    stream_size: int
    regions: dict[int, int] = field(default_factory=dict)  # start -> end, of memory to write
    buffers: list[tuple[int, int]] = field(default_factory=list)  # out-of-band, in order
    identities: set[tuple[str, int]] = field(default_factory=set)  # of shared state
    alive: list[Any] = field(default_factory=list)  # ids are compared while these live
    # A tensor autograd computed (``loss = out.sum()``) was among them: it comes back a leaf,
    # without the graph that reached the model (``loss.backward()`` would reach nothing).
    graph: bool = False

    def layout(self) -> tuple[list[tuple[int, int, int]], int]:
        """The blocks as (start, length, offset in the file), and where the pickle starts."""
        offset = len(MAGIC)
        placed = []
        for start, end in _merge(self.regions):
            offset += -offset % ALIGN
            placed.append((start, end - start, offset))
            offset += end - start
        return placed, offset

    def trailer(self, blocks: list[tuple[int, int, int]], stream_at: int) -> bytes:
        numbers = [len(blocks), *(n for b in blocks for n in b), len(self.buffers)]
        numbers += [*(n for b in self.buffers for n in b), stream_at, self.stream_size]
        trailer = b"".join(_U64.pack(n) for n in numbers)
        return trailer + _U64.pack(len(trailer)) + MAGIC

    @property
    def size(self) -> int:
        """The bytes of the file ``write`` makes."""
        blocks, stream_at = self.layout()
        return stream_at + self.stream_size + len(self.trailer(blocks, stream_at))

    def memory(self) -> int:
        """The bytes of memory written beside the pickle."""
        return sum(end - start for start, end in _merge(self.regions))


class _Sink(io.RawIOBase):
    """Where the pickle goes: kept in memory up to ``keep`` bytes, counted beyond; ``check``
    is told the running total (memory so far included), so the size cap and the deadline are
    checked as the pickle grows, not only once it is whole."""

    def __init__(self, keep: int, check: Callable[[int], None] | None, memory: list[int]) -> None:
        self.kept: io.BytesIO | None = io.BytesIO()
        self.keep, self.check, self.memory, self.size = keep, check, memory, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        count = memoryview(data).nbytes
        self.size += count
        if self.kept is not None:
            if self.size <= self.keep:
                self.kept.write(data)
            else:
                self.kept = None
        if self.check is not None:
            self.check(self.size + self.memory[0])
        return count


class KeepPickler:
    """Pickles values, one file at a time; see the module docstring.

    ``substitutes`` maps a CUDA tensor's identity (``tensor_identity``) to a CPU tensor to write
    instead.
    """

    def __init__(
        self,
        namespace: dict[str, Any] | None,
        substitutes: dict[tuple[Any, ...], Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.substitutes = substitutes or {}

    def pickle(
        self, value: Any, *, keep: int = -1, check: Callable[[int], None] | None = None
    ) -> Pickled:
        """Pickle ``value``, keeping the pickle in memory if it is at most ``keep`` bytes (-1:
        whatever its size); ``check(bytes so far)`` may raise to stop."""
        import cloudpickle

        torch = sys.modules.get("torch")
        numpy = sys.modules.get("numpy")
        tensor_type = getattr(torch, "Tensor", None)
        parameter_type = getattr(getattr(torch, "nn", None), "Parameter", None)
        storage_types = tuple(
            t
            for t in (
                getattr(getattr(torch, "storage", None), "TypedStorage", None),
                getattr(getattr(torch, "storage", None), "UntypedStorage", None),
                getattr(torch, "UntypedStorage", None),
            )
            if isinstance(t, type)
        )
        ndarray = getattr(numpy, "ndarray", None)
        namespace = self.namespace
        substitutes = self.substitutes
        found = Pickled(None, 0)
        memory = [0]  # bytes of the regions so far (overlaps counted twice: an upper bound)
        storages: dict[int, _StorageBytes] = {}

        def add_region(start: int, length: int, owner: Any) -> _Region:
            end = start + length
            if found.regions.get(start, -1) < end:
                memory[0] += end - max(start, found.regions.get(start, start))
                found.regions[start] = end
            found.alive.append(owner)
            return _Region(start, length)

        def buffer_callback(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:  # not contiguous: in band
                return True
            start = _buffer_address(raw) if raw.nbytes else None
            if start is None:
                return True
            add_region(start, raw.nbytes, buffer)
            found.buffers.append((start, raw.nbytes))
            return False

        sink = _Sink(sys.maxsize if keep < 0 else keep, check, memory)

        class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
            def reducer_override(self, obj: Any) -> Any:
                kind = type(obj)
                if tensor_type is not None and isinstance(obj, tensor_type):
                    return _reduce_tensor(obj)
                if storage_types and isinstance(obj, storage_types):
                    device = _device_of(obj)
                    if device is not None:
                        raise NotOnCpu(f"holds GPU memory (a storage on {device})")
                if ndarray is not None and isinstance(obj, ndarray):
                    root = obj
                    while isinstance(getattr(root, "base", None), ndarray):
                        root = root.base
                    found.identities.add(("obj", id(root)))
                    found.alive.append(root)
                    if kind is ndarray and obj.size and not obj.dtype.hasobject:
                        return _reduce_array(obj)
                elif str(getattr(kind, "__module__", "")).startswith("torch.cuda"):
                    raise NotOnCpu(f"a CUDA object ({kind.__module__}.{kind.__qualname__})")
                elif (
                    kind is types.FunctionType
                    and namespace is not None
                    and obj.__globals__ is namespace
                ):
                    return _reduce_notebook_function(obj)
                elif kind is memoryview:
                    return _reduce_memoryview(obj)
                elif kind.__flags__ & _HEAP_TYPE and kind.__module__ != "__main__":
                    _refuse_what_its_class_holds(obj, kind)
                return super().reducer_override(obj)

        held_by_classes: dict[type, dict[int, str]] = {}

        def _refuse_what_its_class_holds(obj: Any, kind: type) -> None:
            if isinstance(obj, type) or not _reduced_by_default(kind):
                return
            held = held_by_classes.get(kind)
            if held is None:
                held = held_by_classes[kind] = _held_by_class(kind)
            try:
                state = object.__getattribute__(obj, "__dict__")
            except AttributeError:  # (slots only)
                state = None
            where = held.get(id(obj)) or (held.get(id(state)) if state is not None else None)
            if where is not None:
                raise HeldByItsClass(
                    f"holds an object of {kind.__module__}.{kind.__qualname__} that its class "
                    f"keeps ({where})"
                )

        def _reduce_array(array: Any) -> Any:
            low, high, data = _bounds(array)
            return _rebuild_array, (
                add_region(low, high - low, array),
                array.dtype,
                array.shape,
                array.strides,
                data - low,
                bool(array.flags.writeable),
            )

        def _reduce_tensor(tensor: Any) -> Any:
            reduced = _reduce_tensor_data(tensor)
            if tensor.grad_fn is not None and not (
                isinstance(reduced, tuple) and reduced[0] is _rebuild_view
            ):  # (a view of a leaf is rebuilt as a view of it: its graph comes back)
                found.graph = True
            state = _leaf_state(tensor)
            if state is None:
                return reduced
            if reduced is NotImplemented:
                if type(tensor) is not parameter_type:
                    return NotImplemented  # a subclass's own reduction: what it keeps
                reduced = tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)  # (its attributes too)
            # What a tensor holds beside its data is set once it is rebuilt (pickle's state
            # setter): a leaf's gradient (``loss.backward()`` without a step), its hooks
            # (``w.register_hook(clip)``), a plain tensor's attributes; the gradient is written
            # as any tensor is, so one that shares memory comes back sharing it.
            return (*reduced[:2], state, None, None, _set_leaf_state)

        def _leaf_state(tensor: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
            """(the leaf's ``.grad`` where it can be written: on the CPU, or a CUDA one with a
            snapshot; its hooks; a plain tensor's ``__dict__``), or None where all are empty."""
            grad = None
            # A leaf's, or a non-leaf's that ``retain_grad()`` fills (another's .grad warns):
            # the non-leaf comes back as a leaf, which holds one.
            if tensor.requires_grad and (tensor.is_leaf or tensor.retains_grad):
                grad = tensor.grad
                if (
                    grad is not None
                    and _device_of(grad) is not None
                    and tensor_identity(grad) not in substitutes
                ):
                    grad = None  # never copied off the GPU: left, as before
            hooks = tensor._backward_hooks
            hooks = tuple(hooks.values()) if hooks else ()
            attributes = tensor.__dict__ if type(tensor) is tensor_type else None
            if grad is None and not hooks and not attributes:
                return None
            return grad, hooks, dict(attributes or {})

        def _reduce_tensor_data(tensor: Any) -> Any:
            requires_grad = bool(tensor.requires_grad)
            inference = bool(tensor.is_inference())
            device = _device_of(tensor)
            if device is not None:
                substitute = substitutes.get(tensor_identity(tensor))
                if substitute is None:
                    raise NotOnCpu(
                        f"holds GPU memory (a tensor on {device}, shape {list(tensor.shape)})"
                    )
                if type(tensor) is not tensor_type:
                    return NotImplemented  # a Parameter: its reduction reaches .data, here
                tensor = substitute
            if type(tensor) is not tensor_type:
                return NotImplemented  # Parameter & co.: their own reduction reaches .data here
            try:
                if (
                    tensor.layout is not torch.strided  # type: ignore[union-attr]
                    or tensor.is_quantized
                    or tensor.is_conj()
                    or tensor.is_neg()
                    or tensor.device.type != "cpu"
                ):
                    return NotImplemented
                storage = tensor.untyped_storage()
                pointer, length = storage.data_ptr(), storage.nbytes()
            except Exception:  # functional / fake / older torch: torch's own way (a copy)
                return NotImplemented
            base = tensor._base
            if (
                base is not None
                and type(base) in (tensor_type, parameter_type)
                and base.dtype == tensor.dtype
                and (base.requires_grad or not requires_grad)  # as a view of it would be
            ):
                # A view (``view = base[1:]``, ``row = lin.weight[0]``) comes back as a view of
                # the same base object, not a tensor that only shares its storage: ``view._base
                # is base`` still holds, and a view of a leaf that requires grad still reaches it.
                found.alive.append(tensor)
                return _rebuild_view, (
                    base,
                    tensor.storage_offset(),
                    tuple(tensor.shape),
                    tuple(tensor.stride()),
                )
            holder = storages.get(pointer) if length else None
            if holder is None:
                holder = _StorageBytes(
                    add_region(pointer, length, tensor) if length else _Region(0, 0),
                    bool(storage.is_shared()),
                )
                if length:
                    storages[pointer] = holder
            found.alive.append(tensor)
            return _rebuild_tensor, (
                holder,
                tensor.storage_offset(),
                tuple(tensor.shape),
                tuple(tensor.stride()),
                tensor.dtype,
                requires_grad,
                *((True,) if inference else ()),
            )

        def _reduce_notebook_function(function: types.FunctionType) -> Any:
            closure = function.__closure__
            values = None if closure is None else tuple(_cell_value(c) for c in closure)
            state = {
                "__qualname__": function.__qualname__,
                "__module__": function.__module__,
                "__doc__": function.__doc__,
                "__kwdefaults__": function.__kwdefaults__,
                "__annotations__": function.__annotations__,
                "__dict__": function.__dict__,
            }
            return _make_function, (
                function.__code__,
                _NOTEBOOK_GLOBALS,
                function.__name__,
                function.__defaults__,
                values,
                state,
            )

        pickler = _Pickler(sink, protocol=5, buffer_callback=buffer_callback)
        pickler.dump(value)
        _collect_identities(pickler.memo.copy(), found.identities, found.alive)
        found.stream_size = sink.size
        found.stream = None if sink.kept is None else sink.kept.getvalue()
        return found

    def write(
        self,
        pickled: Pickled,
        out: BinaryIO,
        *,
        check: Callable[[int], None] | None = None,
    ) -> int:
        """Write the file of ``pickled`` (its pickle kept) to ``out``: the memory of its regions,
        read where it lies, then the pickle and the trailer. Returns the bytes written."""
        if pickled.stream is None:
            raise ValueError("the pickle was not kept")
        written = 0

        def put(data: Any) -> None:
            nonlocal written
            written += out.write(data) or 0
            if check is not None:
                check(written)

        blocks, stream_at = pickled.layout()
        put(MAGIC)
        for start, length, offset in blocks:
            put(bytes(offset - written))
            for piece in range(0, length, CHUNK):
                put(_memory_at(start + piece, min(CHUNK, length - piece)))
        put(bytes(stream_at - written))
        put(pickled.stream)
        put(pickled.trailer(blocks, stream_at))
        return written

    def dump(
        self, value: Any, out: BinaryIO, *, check: Callable[[int], None] | None = None
    ) -> Pickled:
        """Pickle ``value`` and write its file to ``out``; returns what was found."""
        pickled = self.pickle(value, check=check)
        self.write(pickled, out, check=check)
        return pickled


_CONTAINERS = (dict, list, set, bytearray)
_BY_NAME = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
    types.MethodType,
    types.CodeType,
)


def _collect_identities(
    memo: dict[int, tuple[int, Any]], identities: set[tuple[str, int]], alive: list[Any]
) -> None:
    """Mutable objects the pickle holds: two variables that hold the same one must be restored
    together, or each gets its own copy (an optimizer would update a model that is not ours).
    Values pickled by name (dtypes, devices, enum members, classes, functions) are shared by
    everything and say nothing: they are left out, or every array would join every other."""
    import enum

    for key, (_, obj) in memo.items():
        if isinstance(obj, _CONTAINERS):
            pass
        elif not hasattr(obj, "__dict__") or isinstance(
            obj, (*_BY_NAME, enum.Enum, _StorageBytes, _Region, _NotebookGlobals)
        ):
            continue
        identities.add(("obj", key))
        alive.append(obj)


def tensor_identity(tensor: Any) -> tuple[Any, ...]:
    """What identifies a tensor's memory without reading it (host-side attributes only)."""
    return (
        tensor.data_ptr(),
        str(tensor.dtype),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        str(tensor.device),
    )


# --- reading -------------------------------------------------------------------------------------


class BadFile(ValueError):
    """Not a file this module wrote (or a truncated one)."""


def load(handle: BinaryIO, namespace: dict[str, Any] | None = None) -> Any:
    """Read a value written by ``KeepPickler.write`` from ``handle`` (open for reading);
    notebook functions get ``namespace`` as their globals. The file must have been checked as
    ours first (``files.private.open_private``): unpickling runs code."""
    import mmap

    size = os.fstat(handle.fileno()).st_size
    if size < len(MAGIC) * 2 + 32:
        raise BadFile("too short")
    mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    if view[: len(MAGIC)] != MAGIC or view[size - len(MAGIC) :] != MAGIC:
        raise BadFile("not a keep file of this version")
    trailer_length = _U64.unpack_from(view, size - len(MAGIC) - 8)[0]
    trailer_start = size - len(MAGIC) - 8 - trailer_length
    if trailer_start < len(MAGIC) or trailer_length % 8:
        raise BadFile("bad trailer")
    numbers = [_U64.unpack_from(view, trailer_start + 8 * i)[0] for i in range(trailer_length // 8)]
    try:
        count = numbers[0]
        blocks = [tuple(numbers[1 + 3 * i : 4 + 3 * i]) for i in range(count)]
        rest = numbers[1 + 3 * count :]
        buffer_count = rest[0]
        buffers = [(rest[1 + 2 * i], rest[2 + 2 * i]) for i in range(buffer_count)]
        start, length = rest[1 + 2 * buffer_count :]
    except (IndexError, ValueError):
        raise BadFile("bad trailer") from None
    spans = [(offset, length_) for _, length_, offset in blocks] + [(start, length)]
    if any(len(b) != 3 for b in blocks) or any(o + n > trailer_start for o, n in spans):
        raise BadFile("bad trailer")
    found = _Blocks([(b, n, view[o : o + n]) for b, n, o in blocks])
    _loading.append(found)
    _restore_namespace.append(namespace if namespace is not None else _current_namespace())
    try:
        oob = [found.view(b, n) for b, n in buffers]
        return pickle.loads(view[start : start + length], buffers=oob)
    finally:
        _restore_namespace.pop()
        _loading.pop()
