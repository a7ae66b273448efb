"""A notebook namespace's names and their values, read at every cell in one C call, at a cost
that does not grow with the session.

IPython binds ``_i<N>`` (and ``_i``, ``_ii``, ``_iii``) to each cell's text as it runs it
(IPython/core/history.py, ``HistoryManager.store_inputs``), and ``_<N>`` to what a cell shows
(IPython/core/displayhook.py, ``update_user_ns``): one or two more names at every cell, most of
a long session's names. Only the keys added since the last look are read (a dict keeps
insertion order: they are its last ones), and all of them again where the count does not add
up (a ``del``). Who reads says which names it wants: the replay's record the user's
(``replay/record.py``), a guard every one that may hold an op (``input_guard/entries.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, KeysView, Mapping
from operator import itemgetter
from typing import Any, cast

Getter = Callable[[Mapping[str, Any]], tuple[Any, ...]]

_HISTORY = re.compile(r"_i(?:\d+|i{0,2})|_\d+")


def not_history(name: str) -> bool:
    """Any name but IPython's numbered history (``_i3``, ``_ii``, ``_3``)."""
    return not _HISTORY.fullmatch(name)


class NamespaceNames:
    """The names of a growing namespace that ``wanted`` keeps, in the namespace's order, and
    their values."""

    def __init__(self, wanted: Callable[[str], bool]) -> None:
        self.wanted = wanted
        self.renamed = True  # the names changed since the reader last set this False
        self._seen: set[str] = set()  # every key looked at, wanted or not
        self._names: dict[str, None] = {}  # the wanted ones, in order
        self._read: Getter | None = None  # their values in one call (None: to be made)

    def names(self, namespace: Mapping[str, Any]) -> KeysView[str]:
        seen, added = self._seen, []
        ordered = cast("dict[str, Any]", namespace)  # (a dict: its keys in insertion order)
        for name in reversed(ordered):
            if name in seen:
                break
            added.append(name)
        if len(namespace) != len(seen) + len(added):
            self.forget()
            added = list(reversed(ordered))
        if added:
            seen.update(added)
            new = [name for name in reversed(added) if self.wanted(name)]
            if new:
                self._names.update(dict.fromkeys(new))
                self.renamed, self._read = True, None
        return self._names.keys()

    def values(self, namespace: Mapping[str, Any]) -> tuple[Any, ...]:
        """The values of ``names(namespace)``. KeyError where keys went and others came in a way
        the count cannot tell (the last key and another deleted, then one added): ``forget()``,
        then ask again."""
        self.names(namespace)
        if self._read is None:
            self._read = getter(list(self._names))
        return self._read(namespace)

    def read(self, namespace: Mapping[str, Any]) -> tuple[KeysView[str], tuple[Any, ...]]:
        """``names`` and ``values``, every key read again where the count could not tell. A
        read that another thread's change stopped (the dict's RuntimeError) raises, and the
        next one reads every key again."""
        try:
            try:
                return self._names.keys(), self.values(namespace)
            except KeyError:
                self.forget()
                return self._names.keys(), self.values(namespace)
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        """The next look reads every key again."""
        self._seen.clear()
        self._names.clear()
        self.renamed, self._read = True, None


def getter(keys: list[str]) -> Getter:
    """A mapping's values at ``keys``, always as a tuple and in one C call (``itemgetter`` of
    one key gives the bare value, and takes no empty list)."""
    if len(keys) > 1:
        return itemgetter(*keys)
    if keys:
        key = keys[0]
        return lambda mapping: (mapping[key],)
    return lambda mapping: ()
