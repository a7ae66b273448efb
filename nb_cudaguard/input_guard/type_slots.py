"""Keep a type's C sequence slots as they were while the guard sets and deletes its dunders.

Setting a Python function as ``torch.Tensor.__getitem__`` makes CPython fill the type's
``tp_as_sequence->sq_item`` with its generic slot function (``__setitem__`` fills
``sq_ass_item``), for the type and for every subclass that inherits the method. Deleting the
attribute does not empty them again: the inherited ``TensorBase.__getitem__`` wraps
``mp_subscript``, not ``sq_item``, so CPython's ``update_one_slot`` keeps the generic function.
A tensor then passes ``PySequence_Check``, and ``torch.tensor([torch.tensor(1.5)])`` asks a
0-d tensor for its ``len()`` (issue 25: 7 of PyTorch Geometric's tests failed under
``pytest --cudaguard``). Subclasses created while the method is set get the same slots.

So the guard takes the slots' values of the type and its subclasses before it sets anything
(``SequenceSlots.take``) and writes them back after every change (``put_back``); a subclass
created in between gets the value its nearest recorded base had, as CPython would have given it.
Only where the attribute is inherited from the type the guard patches: a class with its own
``__getitem__`` keeps what CPython gave it.

The layout of ``PyTypeObject`` is read with ctypes and verified against the type's own
``__name__``, ``__basicsize__`` and ``__itemsize__`` first; where it does not match (another
Python implementation), ``supported()`` is false and the guard leaves these dunders alone.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Iterator
from typing import Any

_POINTER = ctypes.sizeof(ctypes.c_void_p)
# PyTypeObject after its PyObject_VAR_HEAD, one pointer-sized field each: tp_name, tp_basicsize,
# tp_itemsize, tp_dealloc, tp_vectorcall_offset, tp_getattr, tp_setattr, tp_as_async, tp_repr,
# tp_as_number, tp_as_sequence
_HEAD = object.__basicsize__ + ctypes.sizeof(ctypes.c_ssize_t)
_TP_NAME, _TP_BASICSIZE, _TP_ITEMSIZE, _TP_AS_SEQUENCE = (
    _HEAD + field * _POINTER for field in (0, 1, 2, 10)
)
# PySequenceMethods: sq_length, sq_concat, sq_repeat, sq_item, was_sq_slice, sq_ass_item, ...
SQ_ITEM, SQ_ASS_ITEM = 3 * _POINTER, 5 * _POINTER
# which dunders CPython maps onto each slot (typeobject.c's slotdefs)
_NAMES = {SQ_ITEM: ("__getitem__",), SQ_ASS_ITEM: ("__setitem__", "__delitem__")}
DUNDERS = frozenset(name for names in _NAMES.values() for name in names)

Values = dict[int, int]  # slot offset -> function pointer (0: empty)


def _word(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def _sequence_methods(cls: type) -> int:
    return _word(id(cls) + _TP_AS_SEQUENCE)


def _read(cls: type) -> Values:
    table = _sequence_methods(cls)
    return {slot: _word(table + slot) if table else 0 for slot in _NAMES}


def _layout_matches(cls: type) -> bool:
    address = id(cls)
    name = ctypes.c_char_p.from_address(address + _TP_NAME).value or b""
    table = _sequence_methods(cls)
    return (
        name.decode(errors="replace").rsplit(".", 1)[-1] == cls.__name__
        and ctypes.c_ssize_t.from_address(address + _TP_BASICSIZE).value == cls.__basicsize__
        and ctypes.c_ssize_t.from_address(address + _TP_ITEMSIZE).value == cls.__itemsize__
        # a heap type's table is part of the type object itself (PyHeapTypeObject.as_sequence)
        and address < table < address + getattr(type(cls), "__basicsize__", 0)
    )


class _Probe:
    def __getitem__(self, key: object) -> None: ...

    def __setitem__(self, key: object, value: object) -> None: ...


def _generic() -> Values | None:
    """CPython's generic slot functions (slot_sq_item, slot_sq_ass_item), read from a class that
    defines the dunders in Python, or None where the layout is not the one expected."""
    if sys.implementation.name != "cpython" or not hasattr(ctypes, "pythonapi"):
        return None
    if not _layout_matches(_Probe):
        return None
    values = _read(_Probe)
    return values if all(values.values()) else None


_GENERIC = _generic()


def supported() -> bool:
    return _GENERIC is not None


def _subclasses(cls: type) -> Iterator[type]:
    seen: set[type] = set()
    stack = [cls]
    while stack:
        subclasses: list[type] = type.__subclasses__(stack.pop())
        for sub in subclasses:
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _owner(cls: type, names: tuple[str, ...]) -> type | None:
    for klass in cls.__mro__:
        if any(name in klass.__dict__ for name in names):
            return klass
    return None


class SequenceSlots:
    """The sequence slots of ``root`` and its subclasses, as found by ``take``."""

    def __init__(self, root: type) -> None:
        self.root = root
        self.found: weakref.WeakKeyDictionary[type, Values] = weakref.WeakKeyDictionary()

    def take(self) -> None:
        self.found.clear()
        if _GENERIC is None or not _layout_matches(self.root):
            return
        for cls in (self.root, *_subclasses(self.root)):
            self.found[cls] = _read(cls)

    def put_back(self) -> None:
        """Every slot CPython filled because of the root's patched dunders, as it was."""
        if _GENERIC is None or not self.found:
            return
        for cls in (self.root, *_subclasses(self.root)):
            self.put_back_one(cls)

    def put_back_one(self, cls: type) -> None:
        if _GENERIC is None or not self.found:
            return
        table = _sequence_methods(cls)
        if not table:
            return
        wanted = self.found.get(cls) or self._inherited(cls)
        changed = False
        for slot, names in _NAMES.items():
            owner = _owner(cls, names)
            # a class's own dunder (or a user class's in between) keeps CPython's slot
            if owner is not None and owner is not self.root and owner.__flags__ & _HEAPTYPE:
                continue
            place = ctypes.c_void_p.from_address(table + slot)
            if (place.value or 0) != wanted[slot]:
                place.value = wanted[slot] or None
                changed = True
        if changed:
            _type_modified(cls)

    def _inherited(self, cls: type) -> Values:
        """What CPython gives a new class that inherits the dunders: the generic function where
        its base's slot is filled, none where it is empty."""
        for base in cls.__mro__[1:]:
            values = self.found.get(base)
            if values is not None and _GENERIC is not None:
                return {slot: _GENERIC[slot] if value else 0 for slot, value in values.items()}
        return dict.fromkeys(_NAMES, 0)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def _type_modified(cls: type) -> None:
    """Nothing cached from the type's previous slots survives (what CPython itself does after
    any change of a type's attributes)."""
    if _PYTYPE_MODIFIED is not None:
        _PYTYPE_MODIFIED(cls)


def _api_function(name: str) -> Any:
    """A function of the C API with its own prototype (``ctypes.pythonapi``'s are shared by
    every user in the process: setting their argtypes there would change them for others)."""
    api = getattr(ctypes, "pythonapi", None)
    if api is None:
        return None
    own = ctypes.PyDLL(api._name, handle=api._handle)
    function = getattr(own, name)
    function.argtypes = [ctypes.py_object]
    function.restype = None
    return function


_PYTYPE_MODIFIED = _api_function("PyType_Modified") if _GENERIC is not None else None
