"""Keep a type's C sequence slots as they were while the guard sets and deletes its dunders.

Setting a Python function as ``torch.Tensor.__getitem__`` makes CPython fill the type's
``tp_as_sequence->sq_item`` with its generic slot function (``__setitem__`` fills
``sq_ass_item``), for the type and for every subclass that inherits the method. Deleting the
attribute does not empty them again: the inherited ``TensorBase.__getitem__`` wraps
``mp_subscript``, not ``sq_item``, so CPython's ``update_one_slot`` keeps the generic function.
A tensor then passes ``PySequence_Check``, and ``torch.tensor([torch.tensor(1.5)])`` asks a
0-d tensor for its ``len()`` (issue 25: 7 of PyTorch Geometric's tests failed under
``pytest --cudaguard``). Subclasses created while the method is set get the same slots.

So the guard reads the type's slots before it sets anything (``SequenceSlots.take``) and after
every change writes them back, and into every subclass that inherits the dunders the value
CPython derives from them (empty where the type's is empty); a subclass created in between is
given it as it is created (the guard's ``__init_subclass__``). A class with its own
``__getitem__`` keeps what CPython gave it. Per guard, each subclass's two slots
are read twice and written twice (13 subclasses of ``torch.Tensor`` in a plain torch 2.13
process, 20 once ``torch.optim`` is imported).

The layout of ``PyTypeObject`` is read with ctypes and verified against the type's own
``__name__``, ``__basicsize__`` and ``__itemsize__`` first; where it does not match (another
Python implementation), ``supported()`` is false and the guard leaves these dunders alone.
"""

from __future__ import annotations

import ctypes
import operator
import sys
import weakref
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
# sq_item, was_sq_slice, sq_ass_item: one view reads or writes both slots in one call
_Span = ctypes.c_void_p * 3
_BOTH = slice(0, 3, 2)  # sq_item and sq_ass_item in a _Span
Pair = list[int | None]  # [sq_item, sq_ass_item] as a _Span reads them (None: empty)


def _word(address: int) -> int:
    return ctypes.c_void_p.from_address(address).value or 0


def _sequence_methods(cls: type) -> int:
    return _word(id(cls) + _TP_AS_SEQUENCE)


def _read(cls: type) -> Values:
    table = _sequence_methods(cls)
    return {slot: _word(table + slot) for slot in _NAMES}


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


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    seen: set[type] = set()
    stack = [cls]
    while stack:
        subclasses: list[type] = type.__subclasses__(stack.pop())
        for sub in subclasses:
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                found.append(sub)
    return found


def _dunders(cls: type) -> tuple[Any, ...]:
    try:
        found: tuple[Any, ...] = _READ_DUNDERS(cls)  # one call: read for every class, twice a guard
    except AttributeError:
        return tuple(getattr(cls, name, None) for name in _DUNDER_ORDER)
    return found


_DUNDER_ORDER = tuple(sorted(DUNDERS))
_READ_DUNDERS = operator.attrgetter(*_DUNDER_ORDER)


class SequenceSlots:
    """The sequence slots of ``root`` as found by ``take``, and those CPython gives its
    subclasses from them."""

    def __init__(self, root: type) -> None:
        self.root = root
        self.found: Pair | None = None  # the root's, while a guard holds the dunders
        self.inherited: Pair = []  # what CPython derives from them for a subclass
        # each class's slots, read and written in place (its table is part of the type object,
        # so the addresses hold as long as the class lives); keyed weakly, by the class
        self.spans: dict[weakref.ref[type], Any] = {}
        self.usable = _GENERIC is not None and _layout_matches(root)

    def _span(self, cls: type) -> Any:
        span = self.spans.get(weakref.ref(cls))
        if span is None:
            span = _Span.from_address(_sequence_methods(cls) + SQ_ITEM)
            # a dead class's entry goes with it (a dead reference hashes as it did alive)
            self.spans[weakref.ref(cls, self._forget_class)] = span
        return span

    def _forget_class(self, key: weakref.ref[type]) -> None:
        self.spans.pop(key, None)

    def take(self) -> None:
        self.forget()
        if self.usable:
            found: Pair = self._span(self.root)[_BOTH]
            generic = _GENERIC or {}
            # what CPython gives a class that inherits the dunders: the generic function where
            # the root's slot is filled, none where it is empty
            self.inherited = [
                (generic.get(slot) or None) if value else None
                for slot, value in zip((SQ_ITEM, SQ_ASS_ITEM), found, strict=True)
            ]
            self.found = found

    def forget(self) -> None:
        self.found = None
        self.inherited = []

    def put_back(self) -> None:
        """The root's slots as found, and each subclass's as CPython derives them from the
        root's where it inherits the dunders (only those that differ are written)."""
        if self.found is None:
            return
        root = self.root
        changed = self._write(root, self.found, ())
        inherited, dunders = self.inherited, _dunders(root)
        spans, key = self.spans, weakref.ref
        # once per subclass, twice a guard: kept to the few calls below
        for cls in _subclasses(root):
            span = spans.get(key(cls))
            if span is None:
                span = self._span(cls)
            if span[_BOTH] == inherited:
                continue
            if all(map(operator.is_, _dunders(cls), dunders)):
                span[_BOTH] = inherited
                changed = True
            else:  # a class's own dunder (or a user class's in between) keeps CPython's slot
                changed = self._write_inherited(cls, span, span[_BOTH], inherited) or changed
        if changed:
            # CPython invalidates the subclasses with the root (PyType_Modified recurses)
            _type_modified(root)

    def put_back_one(self, cls: type) -> None:
        if self.found is None:
            return
        if cls is self.root:
            changed = self._write(cls, self.found, ())
        else:
            changed = self._write(cls, self.inherited, _dunders(self.root))
        if changed:
            _type_modified(cls)

    def _write(self, cls: type, wanted: Pair, root_dunders: tuple[Any, ...]) -> bool:
        """``root_dunders``: the root's dunders, for a subclass (empty for the root itself).
        Whether anything was written."""
        span = self._span(cls)
        now: Pair = span[_BOTH]
        if now == wanted:
            return False
        if root_dunders and not all(map(operator.is_, _dunders(cls), root_dunders)):
            # a class's own dunder (or a user class's in between) keeps CPython's slot
            return self._write_inherited(cls, span, now, wanted)
        span[_BOTH] = wanted
        return True

    def _write_inherited(self, cls: type, span: Any, now: Pair, wanted: Pair) -> bool:
        changed = False
        for index, slot in enumerate((SQ_ITEM, SQ_ASS_ITEM)):
            if now[index] == wanted[index] or any(
                getattr(cls, name, None) is not getattr(self.root, name, None)
                for name in _NAMES[slot]
            ):
                continue
            span[2 * index] = wanted[index]
            changed = True
        return changed


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
