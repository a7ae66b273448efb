"""Installing the wrappers over torch's entry points and taking them out again, leaving torch
exactly as found: its attributes, the tensor type's C slots, its tables of its own functions.
"""

from __future__ import annotations

import itertools
import operator
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ..runtime.namespace import NamespaceNames, not_history
from . import torch_caches, type_slots
from .ops import OpCheck
from .type_slots import SequenceSlots

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
        # bind_early's readers, by id(namespace) (the namespace held: its id stays its own)
        self.namespaces: dict[int, tuple[dict[str, Any], NamespaceNames]] = {}

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

    def _values_of(self, namespace: dict[str, Any]) -> tuple[Any, ...]:
        """What may hold an op in ``namespace``: every value but IPython's numbered history
        (never an op bound by the user, and most of a long session's names), read in one C
        call at a cost that does not grow with the session (runtime/namespace.py)."""
        held = self.namespaces.get(id(namespace))
        if held is None or held[0] is not namespace:
            if len(self.namespaces) >= 64:  # (the pytest plugin's: one per test module)
                self.namespaces.clear()
            held = self.namespaces[id(namespace)] = (namespace, NamespaceNames(not_history))
        try:
            return held[1].read(namespace)[1]
        except Exception:  # another thread changed the namespace as it was read: all of it
            return tuple(namespace.values())  # (one C call: no thread runs meanwhile)

    def bind_early(self, namespace: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """Names in ``namespace`` bound to torch's own op before the guard started (``from
        torch import gather``) now name its wrapper; returns (name, op, wrapper) to undo."""
        wrappers = self.by_op
        # one pass at C speed over what may be a notebook's thousand names
        if wrappers.keys().isdisjoint(map(id, self._values_of(namespace))):
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
        if ours.isdisjoint(map(id, self._values_of(namespace))):
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
