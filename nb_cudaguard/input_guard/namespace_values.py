"""What a guard looks at in a namespace for torch's ops bound by name (``from torch import
gather``, as ``entries.bind_early`` and ``unbind_all`` do at each guard's start and end): every
value but IPython's numbered history, read in one C call.

IPython binds ``_i<N>`` (and ``_i``, ``_ii``, ``_iii``) to each cell's text as it runs it
(IPython/core/history.py, ``HistoryManager.store_inputs``), and ``_<N>`` to what a cell shows
(IPython/core/displayhook.py, ``update_user_ns``; ``Out[N]`` too, which no pass reads either):
one or two more names at every cell, never an op bound by the user, and most of a long
session's names. With ``%cudacheck on`` a guard starts and ends at every cell, so a pass over all
of them would grow with the session (7,000 names: ~0.36 ms a cell). Only the keys added since
the last look are read (a dict keeps insertion order: they are its last ones), and all of them
again where the count does not add up (a ``del``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any

_HISTORY = re.compile(r"_i(?:\d+|i{0,2})|_\d+")


class NamespaceValues:
    """The values of one namespace's names, less its numbered history, kept up to date."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace  # (held: its id keys the guard's table of these)
        self._seen: set[str] = set()  # every key looked at, history included
        self._names: list[str] = []  # the keys whose values are read, in order
        self._read: Callable[[dict[str, Any]], Any] | None = None

    def __call__(self) -> tuple[Any, ...]:
        try:
            try:
                return self._values()
            except KeyError:  # keys went and others came in a way the count cannot tell
                self._forget()
                return self._values()
        except BaseException:  # (another thread's change mid-read): read whole next time
            self._forget()
            raise

    def _values(self) -> tuple[Any, ...]:
        namespace, seen = self.namespace, self._seen
        added = []
        for name in reversed(namespace):
            if name in seen:
                break
            added.append(name)
        if len(namespace) != len(seen) + len(added):
            self._forget()
            added = list(reversed(namespace))
        if added:
            seen.update(added)
            new = [name for name in reversed(added) if not _HISTORY.fullmatch(name)]
            if new:
                self._names += new
                self._read = None
        if self._read is None:
            self._read = _getter(self._names)
        found: tuple[Any, ...] = self._read(namespace)
        return found

    def _forget(self) -> None:
        self._seen.clear()
        self._names.clear()
        self._read = None


def _getter(names: list[str]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A C call returning the values of ``names`` as a tuple (itemgetter's own result is the
    bare value for one name, and it takes no empty list)."""
    if not names:
        return lambda namespace: ()
    if len(names) == 1:
        one = itemgetter(names[0])
        return lambda namespace: (one(namespace),)
    many: Callable[[dict[str, Any]], tuple[Any, ...]] = itemgetter(*names)
    return many
