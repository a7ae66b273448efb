"""Serialise one value to a file without touching CUDA, and read it back.

The pickler is cloudpickle's (functions and classes defined in the notebook travel by value),
with three changes:

- **CUDA is refused, never read.** After a sticky error every CUDA call re-raises, ``.cpu()``
  included (FIELD_NOTES §2), and on a healthy context a copy would still start work on the GPU.
  Any tensor or storage that is not on the CPU raises ``NotOnCpu`` before anything reads it
  (``.device`` and ``.data_ptr()`` are host-side attributes); a module or optimizer with CUDA
  state therefore fails as a whole, with the reason. A ``substitutes`` map may stand in a CPU copy
  for a CUDA tensor (a snapshot taken while the context was good: ``snapshot.py``).
- **Large buffers are written straight to the file.** Pickle protocol 5 hands contiguous numpy
  arrays out of band (``PickleBuffer``); CPU tensors are reduced to a byte view of their storage
  the same way, so neither is copied in memory on the way to the disk. Reading back fills one
  ``bytearray`` per buffer that the array or tensor then uses as its memory.
- **Notebook functions keep the notebook as their globals.** cloudpickle gives a function defined
  in ``__main__`` a private copy of the globals it names (so ``def step(): model(x)`` would drag a
  copy of ``model`` along, or fail because ``model`` is on the GPU). Here such a function is
  rebuilt with the restoring namespace as its globals, as it was defined.

File layout: ``MAGIC``, the out-of-band buffers (each at a 64-byte aligned offset), the pickle
stream, then a trailer (each buffer's offset and length, the pickle's, the trailer's length,
``MAGIC``) read from the end. Reading maps the file copy-on-write (``mmap``, ``ACCESS_COPY``):
arrays and tensors use the mapped pages as their memory, with no copy and no zero-filled
allocation; pages are read from the page cache on first touch (the file was just written), and
stay valid after the file is removed.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import types
from collections.abc import Callable
from typing import Any, BinaryIO

MAGIC = b"NBCGKEEP"
ALIGN = 64  # buffers start at aligned offsets, so mapped arrays and tensors are aligned
_U64 = struct.Struct("<Q")


class NotOnCpu(TypeError):
    """The value holds GPU memory (or another device's): it is not read."""


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


# --- tensors -------------------------------------------------------------------------------------


def _storage_from_buffer(buffer: Any) -> Any:
    import torch

    if len(memoryview(buffer)) == 0:
        return torch.empty(0, dtype=torch.uint8).untyped_storage()
    return torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage()


def _rebuild_tensor(
    storage: Any,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: Any,
    requires_grad: bool,
) -> Any:
    import torch

    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


class _StorageBytes:
    """One CPU storage as bytes; the same storage seen twice is one object (pickle's memo)."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def reduce(self) -> tuple[Any, ...]:
        import torch

        raw = torch.empty(0, dtype=torch.uint8).set_(self.storage).numpy()  # a view, no copy
        return _storage_from_buffer, (pickle.PickleBuffer(raw),)  # type: ignore[arg-type]


def _device_of(value: Any) -> str | None:
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    return str(device) if isinstance(kind, str) and kind not in ("cpu", "meta") else None


class KeepPickler:
    """Pickles values one file at a time; see the module docstring.

    ``substitutes`` maps a CUDA tensor's identity (``tensor_identity``) to a CPU tensor to write
    instead. ``seen`` collects what identifies shared state (storages, mutable objects), so that
    the caller can keep variables that share it together.
    """

    def __init__(
        self,
        namespace: dict[str, Any] | None,
        substitutes: dict[tuple[Any, ...], Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.substitutes = substitutes or {}

    def dump(
        self, value: Any, out: BinaryIO, *, check: Callable[[int], None] | None = None
    ) -> tuple[int, set[tuple[str, int]], list[Any]]:
        """Write ``value`` to ``out``; ``check(total bytes so far)`` may raise to stop. Returns
        (bytes written, identities of shared state, objects to keep alive while those ids are
        compared)."""
        import cloudpickle

        torch = sys.modules.get("torch")
        numpy = sys.modules.get("numpy")
        tensor_type = getattr(torch, "Tensor", None)
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
        written = [0]
        storages: dict[int, _StorageBytes] = {}
        identities: set[tuple[str, int]] = set()
        alive: list[Any] = []
        out.write(MAGIC)
        written[0] += len(MAGIC)
        spans: list[tuple[int, int]] = []

        def write(data: Any) -> None:
            view = memoryview(data)
            out.write(view)
            written[0] += view.nbytes
            if check is not None:
                check(written[0])

        def buffer_callback(buffer: pickle.PickleBuffer) -> bool:
            try:
                raw = buffer.raw()
            except BufferError:  # not contiguous: in band
                return True
            padding = -written[0] % ALIGN
            if padding:
                write(bytes(padding))
            spans.append((written[0], raw.nbytes))
            write(raw)
            return False

        class _InBand(io.BytesIO):
            """The pickle stream; held in memory until the buffers are out, so the size cap and
            the deadline are checked as it grows, not only once it is whole."""

            def write(self, data: Any) -> int:
                count = super().write(data)
                if check is not None:
                    check(written[0] + self.tell())
                return count

        stream = _InBand()

        class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
            def reducer_override(self, obj: Any) -> Any:
                kind = type(obj)
                if tensor_type is not None and isinstance(obj, tensor_type):
                    return _reduce_tensor(obj)
                if storage_types and isinstance(obj, storage_types):
                    device = _device_of(obj)
                    if device is not None:
                        raise NotOnCpu(f"holds GPU memory (a storage on {device})")
                if kind is _StorageBytes:
                    return obj.reduce()
                if ndarray is not None and isinstance(obj, ndarray):
                    root = obj
                    while isinstance(getattr(root, "base", None), ndarray):
                        root = root.base
                    identities.add(("obj", id(root)))
                    alive.append(root)
                elif str(getattr(kind, "__module__", "")).startswith("torch.cuda"):
                    raise NotOnCpu(f"a CUDA object ({kind.__module__}.{kind.__qualname__})")
                elif (
                    kind is types.FunctionType
                    and namespace is not None
                    and obj.__globals__ is namespace
                ):
                    return _reduce_notebook_function(obj)
                return super().reducer_override(obj)

        def _reduce_tensor(tensor: Any) -> Any:
            requires_grad = bool(tensor.requires_grad)
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
            if type(tensor) is not tensor_type or numpy is None:
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
                pointer = storage.data_ptr()
            except Exception:  # functional / fake / older torch: torch's own way (a copy)
                return NotImplemented
            holder = storages.get(pointer)
            if holder is None:
                holder = storages[pointer] = _StorageBytes(storage)
                identities.add(("storage", pointer))
            alive.append(tensor)
            return _rebuild_tensor, (
                holder,
                tensor.storage_offset(),
                tuple(tensor.shape),
                tuple(tensor.stride()),
                tensor.dtype,
                requires_grad,
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

        pickler = _Pickler(stream, protocol=5, buffer_callback=buffer_callback)
        pickler.dump(value)
        _collect_identities(pickler.memo.copy(), identities, alive)
        data = stream.getbuffer()
        start = written[0]
        write(data)
        numbers = [len(spans), *(n for span in spans for n in span), start, data.nbytes]
        trailer = b"".join(_U64.pack(n) for n in numbers)
        write(trailer + _U64.pack(len(trailer)) + MAGIC)
        return written[0], identities, alive


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
            obj, (*_BY_NAME, enum.Enum, _StorageBytes, _NotebookGlobals)
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


def load(path: Any, namespace: dict[str, Any] | None = None) -> Any:
    """Read a value written by ``KeepPickler.dump``; notebook functions get ``namespace`` as their
    globals. The file must have been checked as ours first: unpickling runs code."""
    import mmap

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < len(MAGIC) * 2 + 32:
            raise BadFile("too short")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    if view[: len(MAGIC)] != MAGIC or view[size - len(MAGIC) :] != MAGIC:
        raise BadFile("not a keep file")
    trailer_length = _U64.unpack_from(view, size - len(MAGIC) - 8)[0]
    trailer_start = size - len(MAGIC) - 8 - trailer_length
    if trailer_start < len(MAGIC):
        raise BadFile("bad trailer")
    numbers = [_U64.unpack_from(view, trailer_start + 8 * i)[0] for i in range(trailer_length // 8)]
    count = numbers[0]
    if len(numbers) != 2 * count + 3:
        raise BadFile("bad trailer")
    spans = [(numbers[1 + 2 * i], numbers[2 + 2 * i]) for i in range(count)]
    start, length = numbers[-2], numbers[-1]
    if any(o + n > trailer_start for o, n in [*spans, (start, length)]):
        raise BadFile("bad trailer")
    buffers = [view[o : o + n] for o, n in spans]
    _restore_namespace.append(namespace if namespace is not None else _current_namespace())
    try:
        return pickle.loads(view[start : start + length], buffers=buffers)
    finally:
        _restore_namespace.pop()
