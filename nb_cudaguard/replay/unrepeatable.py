"""What a cell makes that running it again in a new process cannot make the same: values that
follow a set's order, and values read from the clock, the process or the OS's randomness.

A set of strings (or bytes, or objects hashed by identity) is laid out by its items' hashes, and
CPython salts string hashes with a secret drawn at every start unless ``PYTHONHASHSEED`` fixes
it (https://docs.python.org/3/reference/datamodel.html#object.__hash__). So
``chars = list(set(data))`` in a new kernel comes out in another order than it did in the old
one, and so does everything indexed by it (min-char-rnn's ``char_to_ix``). ``time.time()``,
``uuid4()``, ``os.getpid()``, ``id(obj)`` differ by nature, and so does what a thread or an
asyncio task a cell started changes while later cells run (the record sees it at whichever
cell's end comes next; how much it did depends on how long the cells and the user took). A
replay cannot bring these back; it can say which names may differ. Read from the cell's text
(the sets are mostly temporaries, which a run-time record never sees).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .escapes import ipython_call, strings

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
    **dict.fromkeys(("uuid1", "uuid4", "urandom", "token_hex", "token_bytes", "token_urlsafe",
                     "randbelow", "randbits", "choice"),  # (the last three: secrets' only)
                    "the OS's randomness"),
    **dict.fromkeys(("getpid", "getppid"), "the process's id"),
    **dict.fromkeys(("mkdtemp", "mkstemp", "mktemp"), "a temporary path"),
}  # fmt: skip
ADDRESS = "an object's address in this process"
# Calls that start work which runs on beside the cells (a thread, a timer, a pool's job, an
# asyncio task in the kernel's loop, which ipykernel keeps running between cells): what it
# changes, and when, depends on how long the cells and the user took, not on the cells alone.
CONCURRENT_CALLS = frozenset(
    {"Thread", "Timer", "start_new_thread", "submit", "run_in_executor", "ensure_future",
     "create_task", "call_later", "call_soon", "call_soon_threadsafe",
     "run_coroutine_threadsafe", "apply_async", "map_async"}
)  # fmt: skip
# Generators made with no seed: seeded from the OS's entropy, anew in every process.
# (``random.SystemRandom()`` draws from the OS's randomness at every call, as ``secrets`` does.)
_UNSEEDED = frozenset(
    {"default_rng", "SeedSequence", "RandomState", "Random", "PCG64", "Philox", "SystemRandom"}
)
# Generators seeded again with no seed (or None): from the OS's entropy or the clock, anew in
# every process (``torch.seed()``, ``Generator.seed()``, ``torch.cuda.seed_all()``,
# ``random.seed()``, ``np.random.seed()``).
_RESEEDS = frozenset({"seed", "seed_all"})
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
    # The names it binds or changes from those reads (``t0 = time.time()``, ``log.append(
    # time.time())``), or from names so bound: not the model a timed cell trains.
    differs: frozenset[str] = frozenset()
    # What the functions and classes it defines read of either kind, when called (``def
    # vocab_of(text): return list(set(text))``): what their callers make may differ.
    builds_when_called: str = ""
    varying_when_called: str = ""
    # The same for sets held in attributes (``self.vocab = set()``, then ``list(tok.vocab)``),
    # by the attribute's name: those it binds to a set, those it reads in order (at the top
    # level, and in its functions' bodies).
    attribute_sets: frozenset[str] = frozenset()
    attributes_iterated: frozenset[str] = frozenset()
    attributes_iterated_when_called: frozenset[str] = frozenset()
    # How it starts work that runs on beside the cells (``threading.Thread(...)``), at the top
    # level and in its functions' bodies, or "": what that work changes may differ.
    concurrent: str = ""
    concurrent_when_called: str = ""
    # False where the walk was spared (no set, hash or varying call in the text): the names and
    # attributes it reads in order are then not known; ``unrepeatable(tree)`` finds them where
    # a plan needs them (some cell holds a set).
    complete: bool = True


REPEATABLE = Unrepeatable()
UNWALKED = Unrepeatable(complete=False)
# A cell that may build a set, hash a string or read the clock, the OS or the process.
_MAY_MATTER = re.compile(
    r"set\b|\{|\bhash\b|\bid\s*\(|\.pop\b|\b(?:"
    + "|".join(sorted(VARYING_CALLS.keys() | _UNSEEDED | _RESEEDS | CONCURRENT_CALLS | {"timeit"}))
    + r")\b"
)


def unrepeatable(tree: ast.AST, source: str | None = None) -> Unrepeatable:
    """What the cell reads that a new process cannot read the same. ``source``, its text,
    where given, spares the walk of a cell that names none of it (most cells): ``UNWALKED``."""
    if source is not None and not _MAY_MATTER.search(source):
        return UNWALKED
    finder = _Finder()
    finder.visit(tree)
    found = (finder.builds, finder.iterated, finder.sets, finder.varying, finder.inner_builds)
    more = (finder.inner_varying, finder.attribute_sets, *finder.attributes, *finder.concurrent)
    if not any(found) and not any(more):
        return REPEATABLE  # a shared value, which a plan skips at once
    return Unrepeatable(
        "; ".join(dict.fromkeys(finder.builds)),
        frozenset(finder.iterated),
        frozenset(finder.sets),
        "; ".join(dict.fromkeys(finder.varying)),
        frozenset(finder.differs),
        "; ".join(dict.fromkeys(finder.inner_builds)),
        "; ".join(dict.fromkeys(finder.inner_varying)),
        frozenset(finder.attribute_sets),
        frozenset(finder.attributes[0]),
        frozenset(finder.attributes[1]),
        "; ".join(dict.fromkeys(finder.concurrent[0])),
        "; ".join(dict.fromkeys(finder.concurrent[1])),
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
        self.differs: set[str] = set()
        self.inner_builds: list[str] = []  # the same in its functions' and classes' bodies
        self.inner_varying: list[str] = []
        self.depth = 0  # in how many function or class bodies the visit is
        self.attribute_sets: set[str] = set()
        self.attributes: tuple[set[str], set[str]] = (set(), set())  # (top level, in bodies)
        self.concurrent: tuple[list[str], list[str]] = ([], [])  # (top level, in bodies)

    def _ordered(self, node: ast.AST) -> None:
        """``node`` is read in order: where it is a set built here, or a name, note it."""
        if _is_set(node):
            read = f"reads {ast.unparse(node)[:40]} in order"
            (self.inner_builds if self.depth else self.builds).append(read)
        elif isinstance(node, ast.Attribute):
            self.attributes[bool(self.depth)].add(node.attr)
        elif self.depth:
            return  # a name in a function's body: its own local, or a global: not known here
        elif isinstance(node, ast.Name):
            self.iterated.add(node.id)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _SET_METHODS
            and isinstance(node.func.value, ast.Name)
        ):
            self.iterated.add(node.func.value.id)  # ``vocab.union(x)`` read in order

    def _bound_from_varying(self, targets: list[ast.expr], value: ast.AST, before: int) -> None:
        """At the top level: ``targets`` bind a value read by a varying call since ``before``
        (``len(self.varying)`` when the statement began), or built from a name that did."""
        if self.depth:
            return
        built = len(self.varying) > before or any(
            isinstance(n, ast.Name) and n.id in self.differs for n in ast.walk(value)
        )
        while built and targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets += target.elts
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            else:
                while isinstance(target, ast.Attribute | ast.Subscript):
                    target = target.value  # ``stats["t"] = time.time()`` changes ``stats``
                if isinstance(target, ast.Name):
                    self.differs.add(target.id)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        before = len(self.varying)
        self.generic_visit(node)
        self._bound_from_varying([node.target], node.value, before)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        before = len(self.varying)
        self.generic_visit(node)
        self._bound_from_varying([node.target], node.value, before)

    def visit_Expr(self, node: ast.Expr) -> None:
        before = len(self.varying)
        self.generic_visit(node)
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            self._bound_from_varying([call.func.value], call, before)  # ``log.append(time())``

    def visit_FunctionDef(
        self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
    ) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_set(node.value):
            if not self.depth:
                self.sets.update(t.id for t in node.targets if isinstance(t, ast.Name))
            self.attribute_sets.update(t.attr for t in node.targets if isinstance(t, ast.Attribute))
        before = len(self.varying)
        self.generic_visit(node)
        self._bound_from_varying(list(node.targets), node.value, before)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        target = node.target
        if node.value is not None and _is_set(node.value):
            if isinstance(target, ast.Name) and not self.depth:
                self.sets.add(target.id)
            elif isinstance(target, ast.Attribute):
                self.attribute_sets.add(target.attr)
        before = len(self.varying)
        self.generic_visit(node)
        if node.value is not None:
            self._bound_from_varying([target], node.value, before)

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
        name = func.id if isinstance(func, ast.Name) else None
        if name == "hash" and node.args:  # a string's hash is salted as a set's order is
            text = f"{ast.unparse(node)[:40]} follows string hashing"
            (self.inner_builds if self.depth else self.builds).append(text)
        read = _varying(func)
        called = name or (func.attr if isinstance(func, ast.Attribute) else None)
        timed = _timed(node)
        if name == "id" and len(node.args) == 1:
            # An object's id is its address in this process (CPython: "the address of the
            # object in memory", https://docs.python.org/3/library/functions.html#id): the
            # same objects made again in a new process have other ids.
            read = ADDRESS
        if read is None and not node.args and not node.keywords:
            read = "fresh entropy" if called in _UNSEEDED | _RESEEDS else None
        elif read is None and called in _RESEEDS and _only_none(node):
            read = "fresh entropy"
        if timed is not None:
            read, spelled = "the clock", timed
        else:
            spelled = f"{ast.unparse(func)}()"
        if read is not None:
            varying = f"{spelled} reads {read}"
            (self.inner_varying if self.depth else self.varying).append(varying)
        if called in CONCURRENT_CALLS:
            started = f"starts {ast.unparse(func)[:40]}(...), which runs on beside the cells"
            self.concurrent[bool(self.depth)].append(started)
        unordered = name in _UNORDERED_READERS
        if isinstance(func, ast.Attribute):
            # A set from sets: the question moves to where it is read.
            from_sets = func.attr in _SET_METHODS and _is_set(func.value)
            unordered = func.attr in _SET_TESTS or from_sets
            if func.attr == "pop" and not node.args:
                self._ordered(func.value)  # ``s.pop()``: which item depends on the order
        if not unordered:
            for argument in node.args:
                self._ordered(argument)
            for keyword in node.keywords:
                self._ordered(keyword.value)
        self.generic_visit(node)


def _only_none(node: ast.Call) -> bool:
    """``seed(None)``, ``seed(seed=None)``: as with no argument."""
    values = [*node.args, *(k.value for k in node.keywords)]
    return len(values) == 1 and isinstance(values[0], ast.Constant) and values[0].value is None


def _timed(node: ast.Call) -> str | None:
    """``%timeit -o`` where ``node`` is one (``res = %timeit -o stmt``): its ``TimeitResult``
    holds times measured now (IPython/core/magics/execution.py, ``-o``: "return a
    TimeitResult"), the clock's reading."""
    ipython = ipython_call(node)
    if ipython is None or ipython[0] not in ("run_line_magic", "run_cell_magic"):
        return None
    name, line = [*strings(ipython[1]), None, None][:2]
    if name == "timeit" and line is not None and "-o" in line.split():
        return "%timeit -o"
    return None


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
