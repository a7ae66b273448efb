"""What a cell makes that running it again in a new process cannot make the same: values that
follow a set's order, and values read from the clock, the process or the OS's randomness.

A set of strings (or bytes, or objects hashed by identity) is laid out by its items' hashes, and
CPython salts string hashes with a secret drawn at every start unless ``PYTHONHASHSEED`` fixes
it (https://docs.python.org/3/reference/datamodel.html#object.__hash__). So
``chars = list(set(data))`` in a new kernel comes out in another order than it did in the old
one, and so does everything indexed by it (min-char-rnn's ``char_to_ix``). ``time.time()``,
``uuid4()``, ``os.getpid()`` differ by nature. A replay cannot bring these back; it can say which
names may differ. Read from the cell's text (the sets are mostly temporaries, which a run-time
record never sees).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# Builtins whose result does not depend on the order they read their argument in.
# (``print`` and ``display`` show it in another order: no state of the notebook's changes.)
_UNORDERED_READERS = frozenset(
    {"sorted", "len", "min", "max", "any", "all", "set", "frozenset", "bool", "isinstance"}
    | {"print", "display"}
)
# Set methods and operators that give a set back (their order is the same question, later).
_SET_METHODS = frozenset({"union", "intersection", "difference", "symmetric_difference", "copy"})
_SET_TESTS = frozenset({"issubset", "issuperset", "isdisjoint"})
_SET_OPERATORS = (ast.BitOr, ast.BitAnd, ast.Sub, ast.BitXor)


# Calls whose value differs from process to process or from run to run, by the name they are
# called by (``time.time()``, ``datetime.now()``, ``uuid.uuid4()``), and what they read.
VARYING_CALLS = {
    **dict.fromkeys(
        ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
         "process_time", "process_time_ns", "ctime", "now", "utcnow", "today"),
        "the clock",
    ),
    **dict.fromkeys(("uuid1", "uuid4", "urandom", "token_hex", "token_bytes", "token_urlsafe"),
                    "the OS's randomness"),
    **dict.fromkeys(("getpid", "getppid"), "the process's id"),
    **dict.fromkeys(("mkdtemp", "mkstemp", "mktemp"), "a temporary path"),
}  # fmt: skip
# Called by these alone they are someone else's (``model.time()``): only through these modules.
_VARYING_OWNERS = frozenset({"time", "datetime", "date", "uuid", "os", "secrets", "tempfile"})


@dataclass(frozen=True)
class Unrepeatable:
    """What a cell reads that a run in a new process cannot read the same."""

    builds: str = ""  # how it reads a set it builds itself in order (``list(set(...))``), or ""
    # Names it reads in order (a ``for`` loop, a comprehension, ``list()``, ``enumerate()``, an
    # unknown call): where one holds a set, what the cell makes follows the set's order.
    iterated: frozenset[str] = frozenset()
    sets: frozenset[str] = frozenset()  # names it binds to a set
    varying: str = ""  # what it reads that differs by nature (``time.time()``: the clock)


def unrepeatable(tree: ast.AST) -> Unrepeatable:
    finder = _Finder()
    finder.visit(tree)
    return Unrepeatable(
        "; ".join(dict.fromkeys(finder.builds)),
        frozenset(finder.iterated),
        frozenset(finder.sets),
        "; ".join(dict.fromkeys(finder.varying)),
    )


def _is_set(node: ast.AST) -> bool:
    """A set built here: ``set(...)``, ``frozenset(...)``, ``{a, b}`` (not of numbers alone,
    whose order does not change), ``{x for ...}``, a set method or operator on one."""
    if isinstance(node, ast.SetComp):
        return True
    if isinstance(node, ast.Set):
        return not all(
            isinstance(e, ast.Constant) and type(e.value) in (int, float, bool) for e in node.elts
        )
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("set", "frozenset"):
            return True  # ``vocab = set()``, then ``vocab.add(w)``: a set all the same
        if isinstance(func, ast.Attribute) and func.attr in _SET_METHODS:
            return _is_set(func.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, _SET_OPERATORS):
        return _is_set(node.left) or _is_set(node.right)
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.builds: list[str] = []
        self.iterated: set[str] = set()
        self.sets: set[str] = set()
        self.varying: list[str] = []

    def _ordered(self, node: ast.AST) -> None:
        """``node`` is read in order: where it is a set built here, or a name, note it."""
        if _is_set(node):
            self.builds.append(f"reads {ast.unparse(node)[:40]} in order")
        elif isinstance(node, ast.Name):
            self.iterated.add(node.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _SET_METHODS
            and isinstance(node.func.value, ast.Name)
        ):
            self.iterated.add(node.func.value.id)  # ``vocab.union(x)`` read in order

    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_set(node.value):
            self.sets.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None and _is_set(node.value) and isinstance(node.target, ast.Name):
            self.sets.add(node.target.id)
        self.generic_visit(node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._ordered(node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._ordered(node.iter)
        self.generic_visit(node)

    def visit_SetComp(self, node: ast.SetComp) -> None:
        # A set built from a set: no order is kept, whatever it reads.
        for generator in node.generators:
            for condition in generator.ifs:
                self.visit(condition)
        self.visit(node.elt)

    def visit_Starred(self, node: ast.Starred) -> None:
        self._ordered(node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        read = _varying(func)
        if read is not None:
            self.varying.append(f"{ast.unparse(func)}() reads {read}")
        name = func.id if isinstance(func, ast.Name) else None
        unordered = name in _UNORDERED_READERS
        if isinstance(func, ast.Attribute):
            # A set from sets: the question moves to where it is read.
            from_sets = func.attr in _SET_METHODS and _is_set(func.value)
            unordered = func.attr in _SET_TESTS or from_sets
            if func.attr == "pop" and not node.args and isinstance(func.value, ast.Name):
                self._ordered(func.value)  # ``s.pop()``: which item depends on the order
        if not unordered:
            for argument in node.args:
                self._ordered(argument)
            for keyword in node.keywords:
                self._ordered(keyword.value)
        self.generic_visit(node)


def _varying(func: ast.expr) -> str | None:
    """What ``func`` reads, where it is one of ``VARYING_CALLS`` called through its module
    (``time.time``, ``datetime.datetime.now``, ``os.getpid``) or imported from it by name."""
    if isinstance(func, ast.Attribute):
        owner = func.value
        while isinstance(owner, ast.Attribute):
            owner = owner.value
        if isinstance(owner, ast.Name) and owner.id in _VARYING_OWNERS:
            return VARYING_CALLS.get(func.attr)
        return None
    if isinstance(func, ast.Name) and func.id in ("perf_counter", "uuid4", "urandom", "getpid"):
        return VARYING_CALLS[func.id]  # ``from time import perf_counter``
    return None
