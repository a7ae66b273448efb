"""What one cell reads and writes in the user namespace, from its source alone (``ast``).

The source is Python as IPython runs it: the glue first applies ``shell.transform_cell``, so a
``%magic`` line is a ``get_ipython().run_line_magic(name, arg)`` call and a ``%%magic`` cell a
``run_cell_magic(name, line, body)`` call; the bodies of the magics that run Python in the user
namespace (``%%time``, ``%%capture``, ``%time``, our ``%%cudacheck``...) are analysed in turn.

Static analysis cannot see everything, so it errs towards running more:

- a *mutation* (``x.attr = ...``, ``x[i] = ...``, ``del x[i]``, a statement ``x.method(...)`` such
  as ``model.to(dev)``, ``opt.step()``, ``lst.append(v)``) is a use and a redefinition of ``x``,
  except for methods that only read (``df.head()``, ``t.sum()``...);
- the globals a function or class body reads are needed when it is *called* (``deferred``);
- a cell whose effect on names cannot be known (``exec``, ``globals()``, a star import, ``%run``,
  ``%store -r``, an unknown cell magic, a syntax error) is ``opaque``: it may define anything;
- a cell that sets process state the rebuilt values depend on (a random seed, ``%cd``, ``%env``,
  ``os.environ[...] = ...``) is ``setup``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# Methods that only read their object: a statement calling one displays, it does not mutate.
READ_ONLY_METHODS = frozenset(
    {
        "head", "tail", "describe", "info", "summary", "show", "plot", "hist",
        "sum", "mean", "std", "var", "min", "max", "argmax", "argmin", "item", "tolist",
        "numpy", "keys", "values", "items", "get", "count", "index", "copy", "size", "numel",
        "dim", "state_dict", "parameters", "named_parameters", "modules", "children",
        "__repr__", "__str__", "format", "startswith", "endswith", "isna", "isnull",
        "value_counts", "unique", "nunique", "memory_usage", "to_string", "all", "any",
    }
)  # fmt: skip
# Calls that set process state (which the rebuilt values may depend on), by function name.
SETUP_CALLS = frozenset(
    {
        "manual_seed", "manual_seed_all", "seed", "set_seed", "seed_everything", "chdir",
        "set_default_dtype", "set_default_device", "use_deterministic_algorithms", "putenv",
        "set_float32_matmul_precision",
    }
)  # fmt: skip
# Magics whose body (cell) or argument (line) is Python run in the user namespace.
PYTHON_CELL_MAGICS = frozenset({"time", "capture", "prun", "cudacheck", "cudaguard"})
PYTHON_LINE_MAGICS = frozenset({"time", "prun", "cudacheck"})
# Cell magics that run no Python in the namespace (another language, a file, rich output).
FOREIGN_CELL_MAGICS = frozenset(
    {
        "bash", "sh", "script", "writefile", "html", "HTML", "javascript", "js", "latex",
        "markdown", "svg", "perl", "ruby", "timeit", "file",
    }
)  # fmt: skip
SETUP_LINE_MAGICS = frozenset({"cd", "env", "set_env"})
OPAQUE_LINE_MAGICS = frozenset({"run", "store", "load", "macro", "recall", "rerun"})
OPAQUE_CALLS = frozenset({"exec", "globals", "locals", "vars", "execfile"})

Transform = Callable[[str], str]


@dataclass(frozen=True)
class CellFacts:
    """What a cell needs and changes in the user namespace."""

    defines: frozenset[str] = frozenset()  # bound (assigned, def/class, imported, for/with...)
    uses: frozenset[str] = frozenset()  # read before the cell binds them, when it runs
    mutates: frozenset[str] = frozenset()  # changed in place (also in uses and defines)
    deferred: frozenset[str] = frozenset()  # read by the functions/classes it defines, when called
    deletes: frozenset[str] = frozenset()  # removed by ``del name``
    imports: frozenset[str] = frozenset()  # bound by an import statement
    opaque: str = ""  # why its effect on names cannot be known, or ""
    setup: str = ""  # which process state it sets (a seed, the directory...), or ""


@dataclass
class _Collect:
    defines: set[str] = field(default_factory=set)
    uses: set[str] = field(default_factory=set)
    mutates: set[str] = field(default_factory=set)
    deferred: set[str] = field(default_factory=set)
    deletes: set[str] = field(default_factory=set)
    imports: set[str] = field(default_factory=set)
    assigned: set[str] = field(default_factory=set)
    opaque: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)

    def facts(self) -> CellFacts:
        return CellFacts(
            frozenset(self.defines),
            frozenset(self.uses),
            frozenset(self.mutates - self.assigned),  # its own new object: not a change
            frozenset(self.deferred),
            frozenset(self.deletes),
            frozenset(self.imports),
            "; ".join(dict.fromkeys(self.opaque)),
            "; ".join(dict.fromkeys(self.setup)),
        )


def _root_name(node: ast.expr) -> str | None:
    """``x`` for ``x``, ``x.a.b``, ``x[i].c``, ``x.f(...).g``; None for anything else."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _const_str(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _ipython_call(node: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """(method, args) for ``get_ipython().method(args...)``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    ):
        return node.func.attr, list(node.args)
    return None


def _names_bound(target: ast.AST) -> Iterable[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def _free_names(body: Iterable[ast.AST], bound: set[str]) -> set[str]:
    """Names a function body reads that it does not bind itself (its globals)."""
    nodes = [n for b in body for n in ast.walk(b)]
    local = set(bound)
    declared_global: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            local.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local.add(node.name)
        elif isinstance(node, ast.arg):
            local.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            local.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            local.add(node.name)
    loaded = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - (local - declared_global)


class _CellVisitor(ast.NodeVisitor):
    """Walks a cell's module-level code in execution order (values before targets)."""

    def __init__(self, transform: Transform | None) -> None:
        self.c = _Collect()
        self.bound: set[str] = set()  # bound earlier in this cell
        self.transform = transform

    # --- names ---------------------------------------------------------------------------------
    def _load(self, name: str) -> None:
        if name not in self.bound:
            self.c.uses.add(name)

    def _store(self, name: str) -> None:
        self.bound.add(name)
        self.c.assigned.add(name)
        self.c.defines.add(name)
        self.c.deletes.discard(name)

    def _mutate(self, name: str) -> None:
        self._load(name)
        self.c.mutates.add(name)
        self.c.defines.add(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._load(node.id)
        elif isinstance(node.ctx, ast.Store):
            self._store(node.id)
        else:
            self.bound.discard(node.id)
            self.c.defines.discard(node.id)
            self.c.deletes.add(node.id)

    def _target(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            self.visit(target)  # x.attr = v reads x (and the index)
            root = _root_name(target)
            if root is not None:
                self._mutate(root)
            if isinstance(target, ast.Subscript) and _is_environ(target.value):
                self.c.setup.append("sets an environment variable")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element)
        elif isinstance(target, ast.Starred):
            self._target(target.value)
        else:
            self.visit(target)

    # --- statements ----------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._target(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._target(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self._load(node.target.id)
            self._store(node.target.id)
        else:
            self._target(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._store(node.target.id)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                self._target(target)
            else:
                self.visit(target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._target(node.target)
        for statement in [*node.body, *node.orelse]:
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._target(item.optional_vars)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self._store(node.name)
        for statement in node.body:
            self.visit(statement)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            self._store(name)
            self.c.imports.add(name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.c.opaque.append(f"star import from {node.module}")
                continue
            name = alias.asname or alias.name
            self._store(name)
            self.c.imports.add(name)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)
        body = node.body if isinstance(node.body, list) else [node.body]
        return _free_names(body, _params(args))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.c.deferred.update(self._function(node))
        self._store(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.c.deferred.update(self._function(node))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        methods = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for method in methods:
            self.c.deferred.update(_free_names(method.body, _params(method.args)))
        # The rest of the class body runs now, in the class's own scope.
        rest: list[ast.AST] = [s for s in node.body if s not in methods]
        rest += [d for m in methods for d in [*m.decorator_list, *m.args.defaults]]
        for name in _free_names(rest, {m.name for m in methods}):
            self._load(name)
        self._store(node.name)

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        first, *rest = node.generators
        self.visit(first.iter)  # evaluated in the enclosing scope
        inner = set(_names_bound(ast.Module([ast.Expr(g.target) for g in node.generators], [])))
        parts: list[ast.AST] = [
            *(g.iter for g in rest),
            *(i for g in node.generators for i in g.ifs),
        ]
        parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for name in _free_names(parts, inner):
            self._load(name)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_Expr(self, node: ast.Expr) -> None:
        if self._magic(node.value):
            return
        self.visit(node.value)
        call = node.value
        if isinstance(call, ast.Await):
            call = call.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            root = _root_name(call.func.value)
            if root is not None and call.func.attr not in READ_ONLY_METHODS:
                self._mutate(root)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if isinstance(func, ast.Name) and func.id in OPAQUE_CALLS:
            self.c.opaque.append(f"calls {func.id}()")
        if name in SETUP_CALLS:
            self.c.setup.append(f"calls {name}()")
        if self._magic(node):
            return
        ipython = _ipython_call(node)
        if ipython is not None and ipython[0] in ("push", "run_cell", "ex"):
            self.c.opaque.append(f"get_ipython().{ipython[0]}()")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("user_ns", "user_global_ns"):  # get_ipython().user_ns[...] = ...
            self.c.opaque.append(f"uses .{node.attr}")
        self.generic_visit(node)

    # --- magics --------------------------------------------------------------------------------
    def _magic(self, node: ast.expr) -> bool:
        """A ``%magic`` / ``%%magic`` call: its own rules. True when handled."""
        ipython = _ipython_call(node)
        if ipython is None or ipython[0] not in ("run_line_magic", "run_cell_magic"):
            return False
        method, args = ipython
        name = _const_str(args[0]) if args else None
        line = _const_str(args[1]) if len(args) > 1 else ""
        if name is None or line is None:
            self.c.opaque.append("a magic called with computed arguments")
            return True
        if method == "run_cell_magic":
            body = _const_str(args[2]) if len(args) > 2 else None
            if name in PYTHON_CELL_MAGICS and body is not None:
                if name == "capture" and line.split():
                    self._store(line.split()[-1])
                self._nested(body)
            elif name not in FOREIGN_CELL_MAGICS:
                self.c.opaque.append(f"the cell magic %%{name}")
            return True
        if name in PYTHON_LINE_MAGICS:
            self._nested(line)
        elif name in OPAQUE_LINE_MAGICS and not (name == "store" and "-r" not in line.split()):
            self.c.opaque.append(f"%{name}")
        elif name in SETUP_LINE_MAGICS and (name == "cd" or "=" in line or " " in line.strip()):
            self.c.setup.append(f"%{name} {line}".strip())
        return True

    def _nested(self, source: str) -> None:
        try:
            tree = ast.parse(self.transform(source) if self.transform else source)
        except (SyntaxError, ValueError):
            self.c.opaque.append("a magic's body that does not parse")
            return
        for statement in tree.body:
            self.visit(statement)


def _params(args: ast.arguments) -> set[str]:
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    return names


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def analyse(source: str, transform: Transform | None = None) -> CellFacts:
    """The facts of one cell. ``source`` is Python (IPython's transformed form); ``transform``
    turns a magic's body into Python likewise (``shell.transform_cell``; None: used as it is)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return CellFacts(opaque="its source does not parse")
    return _facts(tree, transform)


def analyse_cell(raw: str, transform: Transform) -> CellFacts:
    """The facts of a cell as typed: plain Python as it is, anything else (``%magic``, ``!cmd``)
    after ``transform``. Most cells are plain Python, and IPython's transform is the slow part
    (about 1 ms a cell)."""
    try:
        tree = ast.parse(raw)
    except (SyntaxError, ValueError):
        try:
            return analyse(transform(raw), transform)
        except Exception:  # IPython could not transform it either
            return CellFacts(opaque="its source does not parse")
    return _facts(tree, transform)


def _facts(tree: ast.Module, transform: Transform | None) -> CellFacts:
    visitor = _CellVisitor(transform)
    for statement in tree.body:
        visitor.visit(statement)
    return visitor.c.facts()


# Lines a replay never runs again: our own commands (a restart, a replay), loading extensions,
# installing packages. They are commented out in place, so line numbers stay true.
_CONTROL = re.compile(
    r"^(?:%(?:cudaguard|load_ext|reload_ext|unload_ext|pip|conda|mamba|micromamba|uv)\b"
    r"|!\s*(?:pip|pip3|conda|mamba|uv)\b)",
    re.MULTILINE,
)
SKIPPED = "# (skipped by nb_cudaguard replay) "


def runnable_source(raw: str) -> str:
    """The cell as typed, with its control lines (``%cudaguard``, ``%load_ext``, ``%pip``...)
    commented out."""
    return _CONTROL.sub(lambda m: SKIPPED + m.group(0), raw)
