"""What one cell reads and writes in the user namespace, from its source alone (``ast``).

The source is Python as IPython runs it: the glue first applies ``shell.transform_cell``, so a
``%magic`` line is a ``get_ipython().run_line_magic(name, arg)`` call and a ``%%magic`` cell a
``run_cell_magic(name, line, body)`` call; the bodies of the magics that run Python in the user
namespace (``%%time``, ``%%capture``, ``%time``, our ``%%cudacheck``...) are analysed in turn.

Static analysis cannot see everything, so it errs towards running more:

- a *mutation* (``x.attr = ...``, ``x[i] = ...``, ``del x[i]``, a statement ``x.method(...)`` such
  as ``model.to(dev)``, ``opt.step()``, ``lst.append(v)``) is a use and a redefinition of ``x``,
  except for methods that only read (``df.head()``, ``t.sum()``...);
- a call passes its arguments to code that may change them: a plain function (``train(model)``,
  not a builtin that only reads such as ``print`` or ``len``, nor a class being built) or an
  in-place one by PyTorch's naming (``nn.init.zeros_(model.fc.weight)``) changes each argument's
  object; so does a method of an object (``trainer.fit(model)``, ``scaler.step(opt)``,
  ``get_trainer().fit(model)``), unless it only reads what it is handed (``model.to(dev)``,
  ``"-".join(names)``: ``ARGUMENT_READING_METHODS``) or the object is a module (``np.mean(x)``,
  ``F.cross_entropy(out, y)``, ``torch.nn.functional.relu(x)``). Whether a name from an earlier
  cell is a module only the whole notebook says (its imports): the cell records what it hands
  to each such name (``handed``) and the planner decides; ``n += v`` may change ``n`` in place
  (a tensor, a list);
- a name *links* to the names its value was built from (``opt = AdamW(model.parameters())``,
  ``x = model.layer1``, ``loader = DataLoader(ds)``): changing ``x`` may change ``model``. Within a
  cell a change is carried over to what the changed name links to; across cells the planner does
  it (``links``);
- a name *derives* from the names its value was computed from without sharing an object with
  them: through a copy (``n = len(log)``), under an ``if``, a loop, a ``match`` or a ``try`` that
  reads them (``if bad >= 1: stop = True``), or handed to one of its methods
  (``stopper.step(v)``): what differs with them differs with it (``derives``);
- a *store* puts an object into another (``models.append(model)``, ``insert``, ``extend``,
  ``d["m"] = model``, ``d.update(m=model)``, ``setdefault``, ``s.add``, ``q.put``,
  ``holder.net = model``, ``setattr(holder, "net", model)``, ``lst += [model]``, ``models =
  [model]``): the container then *holds* the stored names (``stores``), so a change through it
  (``models[0].train()``, ``d["m"].to(dev)``, ``for m in models: m.half()``, ``train(models)``)
  changes them too. A store itself changes the container, not what it holds (``filled``): a
  second ``models.append(m2)`` leaves ``model`` alone. What cannot be changed through a
  container is not stored: a constant, a copy (``FRESH_CALLS``: ``x.clone()``, ``deepcopy``,
  ``len(x)``...);
- the globals a function or class body reads are needed when it is *called* (``deferred``); what a
  function changes or assigns (``global``) outside itself happens where it is called (``effects``);
- a cell whose effect on names cannot be known (``exec``, ``globals()``, a star import, ``%run``,
  ``%store -r``, an unknown cell magic, a syntax error) is ``opaque``: it may define anything;
- a cell that sets process state the rebuilt values depend on (a random seed, ``%cd``, ``%env``,
  ``os.environ[...] = ...``) is ``setup``; one that draws random numbers (``torch.randn``,
  ``np.random.*``, ``next(iter(loader))``, a layer's initial weights: ``RANDOM_CALLS``) ``draws``;
- what each import comes from (``imported_from``): a module of the notebook's own (a ``.py``
  beside it) is no library, whose functions only read what they are handed.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from .escapes import aimported, ipython_call, string
from .paths import PathEvents, path_events
from .unrepeatable import REPEATABLE, Unrepeatable, unrepeatable

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
        "set_float32_matmul_precision", "seterr", "set_printoptions", "setrecursionlimit",
        "set_option", "setswitchinterval", "simplefilter", "filterwarnings", "resetwarnings",
        "set_num_threads", "set_num_interop_threads", "set_sharing_strategy",
        "set_flush_denormal", "set_warn_always", "enable_flash_sdp", "enable_mem_efficient_sdp",
        "enable_math_sdp", "enable_cudnn_sdp", "set_default_tensor_type", "set_anomaly_enabled",
        "set_detect_anomaly", "setprofile", "settrace", "signal", "setitimer",
    }
)  # fmt: skip
# A library function that sets its library's state, by its name (``set_dir``, ``set_theme``,
# ``use``, ``enable_progress_bar``): setup where called on a module (``analysis.setters``).
_SETTER = re.compile(r"(?:set|enable|disable|use)(?:_\w+)?")


def _setter(name: str) -> bool:
    return name not in SETUP_CALLS and _SETTER.fullmatch(name) is not None


# A statement calling a library's function with constants alone, its result dropped, is made for
# what it does to the library or the process (``tqdm.pandas()``, ``nest_asyncio.apply()``,
# ``socket.setdefaulttimeout(5)``, ``wandb.init(project="x")``, ``logging.basicConfig(level=
# logging.INFO)``): state a new process lacks, which no record of the namespace reads. Not these:
# what only shows or writes something (the files' own rules apply), waits, tidies memory, asks
# (its value displayed), or ends the process.
_FOR_SHOW_OR_ASK = re.compile(
    r"(?:print|pprint|display|show|clear_output|flush|write\w*|debug|info|warning|warn|error"
    r"|critical|exception|log|figure|subplots?|plot|title|suptitle|[xy]label|legend|grid|axis"
    r"|tight_layout|subplots_adjust|savefig|close|imshow|hist|barh?|scatter|[xy]ticks|[xy]lim"
    r"|text|annotate|colorbar|clf|cla|pause|draw|ax[hv]line|fill_between|pie|despine|gc[af]"
    r"|\w+plot|heatmap|sleep|collect|empty_cache|synchronize|reset_peak_memory_stats|ipc_collect"
    r"|makedirs|mkdir|remove|unlink|rmtree|rmdir|copy\w*|move|rename|replace|touch|extract\w*"
    r"|\w*download\w*|\w*retrieve|save\w*|dump\w*|to_\w+|exit|quit|abort|kill|assert\w*"
    r"|get\w*|is\w*|has\w*|read\w*|load\w*|list\w*|\w*count|current\w*|memory\w*|describe"
    r"|summary|version|find\w*|glob|exists|open|cpu_count|check\w*)"
)
# Modules whose calls act on files and processes: the plan's rules for those apply.
_NOT_FOR_SETUP = frozenset({"os", "subprocess", "shutil", "pathlib", "time", "gc"})


def _called_for_effect(statement: ast.expr) -> tuple[str, str] | None:
    """(the module's name, how) for a statement ``root.f(...)`` calling a library's function
    with constants alone (``root`` one of the notebook's imported names: the planner keeps only
    those), called for its effect outside the namespace; else None."""
    call = statement.value if isinstance(statement, ast.Await) else statement
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return None
    name = call.func.attr
    root = _root_name(call.func)
    if root is None or name in SETUP_CALLS or name in RANDOM_CALLS or root in _NOT_FOR_SETUP:
        return None
    if _FOR_SHOW_OR_ASK.fullmatch(name.lstrip("_")):
        return None
    # every call on the way handed constants alone (``logging.getLogger("x").setLevel(...)``):
    # what it is handed otherwise, the record sees change
    node: ast.expr = call
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        if isinstance(node, ast.Call):
            given = [*node.args, *(k.value for k in node.keywords)]
            if not all(_constant(v, root) for v in given):
                return None
            node = node.func
        else:
            node = node.value
    return root, f"calls {ast.unparse(call.func)}()"


def _constant(node: ast.expr, root: str) -> bool:
    """A literal (``5``, ``"x"``, ``(1, 2)``, ``{"a": 1}``, ``-1``) or a name of ``root``'s own
    (``logging.INFO``)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand, root)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_constant(e, root) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _constant(k, root) for k in node.keys) and all(
            _constant(v, root) for v in node.values
        )
    if isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        return dotted is not None and dotted.partition(".")[0] == root
    return False


# Calls that draw from a random generator (torch's, NumPy's, ``random``'s), by function name: a
# skipped one changes what later draws give after a seed. ``iter``/``next``: a DataLoader draws
# its workers' seed from torch's generator at each ``iter`` (and shuffles); layers draw their
# initial weights.
RANDOM_CALLS = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
        "normal", "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial", "poisson",
        "exponential_", "geometric_", "cauchy_", "log_normal_", "random_", "dropout",
        "shuffle", "permutation", "permuted", "choice", "choices", "sample", "random", "gauss",
        "uniform", "randrange", "getrandbits", "standard_normal", "integers", "binomial",
        "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
        "trunc_normal_", "orthogonal_", "sparse_", "random_split", "iter", "next",
        "train_test_split", "Linear", "Bilinear", "LazyLinear", "Conv1d", "Conv2d", "Conv3d",
        "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "Embedding", "EmbeddingBag",
        "LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "MultiheadAttention",
        "TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer", "from_pretrained",
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
# Line magics that make magics later cells call (IPython/core/magics/osm.py's ``%alias``,
# basic.py's ``%alias_magic``, extension.py's ``%load_ext``), and those that read the whole
# namespace (namespace.py's ``%who_ls``, ``%who``, ``%whos``).
DEFINING_LINE_MAGICS = frozenset({"alias", "alias_magic", "load_ext", "reload_ext"})
NAMESPACE_MAGICS = frozenset({"who_ls", "who", "whos"})
OPAQUE_LINE_MAGICS = frozenset({"run", "store", "load", "macro", "recall", "rerun"})
OPAQUE_CALLS = frozenset({"exec", "globals", "locals", "vars", "execfile"})
# Builtins that change an argument; every other builtin only reads its arguments.
MUTATING_BUILTINS = frozenset({"setattr", "delattr", "next", "exec", "eval", "vars", "iter"})
_READ_ONLY_FUNCTIONS = frozenset(dir(builtins)) - MUTATING_BUILTINS | {"display", "get_ipython"}
# Functions that change an argument in place though their name does not say so.
IN_PLACE_FUNCTIONS = frozenset({"shuffle", "copyto", "put", "place", "putmask", "fill_diagonal",
                                "heappush", "heappop", "heapify", "heapreplace"})  # fmt: skip
# Calls whose result shares nothing with their arguments: no link through them.
FRESH_CALLS = frozenset(
    {
        "copy",
        "clone",
        "deepcopy",
        "astype",
        "item",
        "tolist",
        "len",
        "str",
        "repr",
        "int",
        "float",
        "bool",
        "read",  # a stream's text or bytes: a new str (the stream moves on: STREAM_METHODS)
        "readline",
        "readlines",
    }
)

# Methods that only read what they are handed, whatever they do to their own object
# (``model.to(dev)``, ``model.load_state_dict(sd)``, ``"-".join(names)``, ``ax.plot(x)``):
# any other method of an object that is not a module may change its arguments (see
# ``CellFacts.handed``).
ARGUMENT_READING_METHODS = READ_ONLY_METHODS | {
    "format", "format_map", "join", "split", "rsplit", "splitlines", "strip", "lstrip", "rstrip",
    "replace", "find", "rfind", "rindex", "encode", "decode", "partition", "rpartition",
    "removeprefix", "removesuffix", "ljust", "rjust", "center", "zfill", "translate",
    "union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
    "isdisjoint", "fromkeys", "pop",
    "to", "cuda", "cpu", "type", "type_as", "view", "view_as", "reshape", "reshape_as",
    "expand", "expand_as", "repeat", "permute", "transpose", "squeeze", "unsqueeze", "flatten",
    "narrow", "index_select", "masked_fill", "where", "eq", "ne", "lt", "le", "gt", "ge",
    "equal", "allclose", "isclose", "add", "sub", "mul", "div", "matmul", "mm", "bmm", "dot",
    "pow", "clamp", "clip", "topk", "sort", "argsort", "chunk", "new_zeros", "new_ones",
    "new_full", "new_empty", "new_tensor", "load_state_dict", "forward", "generate",
    "predict", "predict_proba", "transform", "inverse_transform", "score", "evaluate",
    "tokenize", "batch_decode", "convert_tokens_to_ids", "convert_ids_to_tokens",
    "apply_chat_template", "merge", "isin", "groupby", "sort_values", "drop", "rename",
    "fillna", "query", "apply", "map", "agg", "filter", "reindex", "set_index", "assign",
    "sample", "to_csv", "to_parquet", "to_json", "to_numpy", "save", "save_pretrained",
    "savefig", "write", "writelines", "log", "log_dict", "debug", "warning", "error",
    "add_scalar", "add_scalars", "add_histogram", "add_image", "add_figure", "add_text",
    "set_description", "set_postfix", "set_title", "set_xlabel", "set_ylabel", "legend",
    "imshow", "scatter", "bar", "text", "annotate",
} | FRESH_CALLS  # fmt: skip

# Methods that move a stream's position (a file, ``io.StringIO``) in any expression, a result
# used or not (``first = f.readline()``): the object changes, as a generator's draw does.
STREAM_METHODS = frozenset(
    {"read", "readline", "readlines", "readinto", "seek", "truncate", "write", "writelines"}
)
# Calls that write into the file or stream they are handed, by name: where it is among their
# arguments (``torch.save(x, f)``, ``pickle.dump(x, f)``; numpy's: first, ``np.save(f, x)``).
WRITING_CALLS = {"save": 1, "dump": 1, "savetxt": 0, "savez": 0, "savez_compressed": 0,
                 "copyfileobj": 1}  # fmt: skip
# Calls that read the whole namespace when called with no argument.
NAMESPACE_CALLS = frozenset({"globals", "locals", "vars", "dir"})

# Methods that put their arguments into their object (lists, deques, sets, dicts, queues,
# ``nn.ModuleList``/``ModuleDict``, ``nn.Module``'s registries, an optimizer's param groups).
STORING_METHODS = frozenset(
    {
        "append", "appendleft", "extend", "extendleft", "insert", "add", "update", "setdefault",
        "put", "put_nowait", "push", "add_module", "register_module", "register_buffer",
        "register_parameter", "add_param_group", "__setitem__", "__setattr__",
    }
)  # fmt: skip
# Of those, the ones whose first argument is where, not what (``insert(i, v)``,
# ``setdefault(k, v)``, ``add_module(name, m)``).
KEYED_METHODS = frozenset(
    {
        "insert", "setdefault", "__setitem__", "__setattr__", "add_module", "register_module",
        "register_buffer", "register_parameter",
    }
)  # fmt: skip
# Functions that put their other arguments into their first one (``setattr``'s second is a name).
STORING_FUNCTIONS = frozenset({"setattr", "heappush", "heappushpop", "heapreplace"})
# A value built like this is a new container holding what it reads.
_DISPLAYS = (ast.List, ast.Tuple, ast.Set, ast.Dict)

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
    # Each name it binds -> the names (from before the cell) its value was built from.
    links: Mapping[str, frozenset[str]] = field(default_factory=dict)
    calls: frozenset[str] = frozenset()  # plain names it calls (a function's effects land here)
    # Each function it defines -> what calling it does outside the function.
    effects: Mapping[str, Effects] = field(default_factory=dict)
    callables: frozenset[str] = frozenset()  # the functions and classes it defines
    # Each container it stores into -> the names whose objects it now holds (``models.append(
    # model)``): a later change through the container changes them.
    stores: Mapping[str, frozenset[str]] = field(default_factory=dict)
    filled: frozenset[str] = frozenset()  # changed only by storing into them: what they held is not
    # Each name from before the cell whose methods it hands objects to (``trainer.fit(model)``,
    # ``scaler.step(opt)``) -> the names those calls change unless that name is a module
    # (``np.mean(x)``, ``F.cross_entropy(out, y)``: which only the whole notebook tells; the
    # planner decides). Through this cell's links and stores, as ``mutates``.
    handed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Each name it imports -> the top-level module it comes from (``from helpers import
    # trainer``: helpers): the notebook's own modules' functions may change what they are handed.
    imported_from: Mapping[str, str] = field(default_factory=dict)
    draws: str = ""  # how it draws from a random generator (``calls randn()``), or ""
    # Changed through ``.data`` or ``.numpy()`` (``t.numpy()[i] = v``), which a tensor's version
    # counter does not count: the run-time record cannot see the change, so it cannot overrule.
    untracked: frozenset[str] = frozenset()
    # what it reads that a run in a new process cannot read the same (a set's order, the clock)
    unrepeatable: Unrepeatable = REPEATABLE
    paths: PathEvents = ()  # the files it reads and writes, by path (replay/paths.py)
    # The names whose attributes it sets or deletes (``np.float = float``, ``setattr(torch.Tensor,
    # ...)``): where one is a library's module, the change lives in that module, which a new
    # process imports afresh and a restore imports again: only running the cell brings it back.
    patches: frozenset[str] = frozenset()
    # The names whose class it sets attributes on (``type(model).forward = f``,
    # ``model.__class__.f = g``): the class a restored instance comes back with is imported
    # afresh, without the change, which no fingerprint of the instance reads.
    class_patches: frozenset[str] = frozenset()
    # Each name it binds or changes -> the names (from before the cell) its value was computed
    # from without sharing an object with them: through a call that copies (``n = len(log)``,
    # ``c = cfg.copy()``, ``norms.append(g.item())``), or under an ``if``, a loop or a ``match``
    # that reads them (``if bad >= 1: stop = True``, ``for v in log: count += 1``). No link, but
    # the value differs where they differ.
    derives: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Each name whose setter it calls (``torch.hub.set_dir(p)``, ``sns.set_theme()``,
    # ``plt.style.use(s)``, ``transformers.logging.set_verbosity_error()``) -> how: where the
    # name is a library's module, the state it sets lives in the library, which a new process
    # imports afresh (the planner knows which names are modules).
    setters: Mapping[str, str] = field(default_factory=dict)
    # Whether it reads the whole namespace (``globals()``, ``locals()``, ``vars()``, ``dir()``
    # with no argument): then it reads every name, those no other cell names included.
    reads_all: bool = False
    # The names handed to a call as where it writes (``torch.save(sd, buf)``, ``pickle.dump(x,
    # f)``, ``print(s, file=log)``): a path, or a stream (``io.BytesIO``, an open file) that the
    # call writes into. Which one, only the run-time record tells (a stream is not seen whole).
    written: frozenset[str] = frozenset()
    # Each name it imports -> the whole dotted name it stands for (``import numpy as np``:
    # numpy; ``from torch.backends import cudnn``: torch.backends.cudnn), so a setting the record
    # reads under the library's name is named as the notebook spells it.
    imported_as: Mapping[str, str] = field(default_factory=dict)
    # Modules it puts in ``sys.modules`` by name (``sys.modules["stub"] = m``, a stand-in for a
    # missing package) -> what the value reads: a later ``import stub`` binds that object.
    registers: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Effects:
    """What calling a notebook function does to the names outside it."""

    assigns: frozenset[str] = frozenset()  # ``global x; x = ...``
    mutates: frozenset[str] = frozenset()  # ``opt.step()``, ``cache[k] = v``, ``global n; n += 1``
    calls: frozenset[str] = frozenset()  # other functions it calls (their effects too)
    # Each global whose methods it hands outside objects to -> those objects (as a cell's).
    handed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # The globals whose attributes it sets (``F.gelu = g``, ``torch.nn.GELU.forward = f``),
    # and those whose class it sets them on (``type(model).forward = f``): as a cell's.
    patches: frozenset[str] = frozenset()
    class_patches: frozenset[str] = frozenset()
    # Whether it changes what it is handed through ``.data`` or ``.numpy()`` (``m.weight.data
    # *= 0.5`` in ``shrink(m)``), which no version counter counts. (The globals it so changes
    # are among ``mutates``: a cell's calls change them whatever its record says.)
    untracked_handed: bool = False
    # Whether it sets attributes on the class of what it is handed (``def patch(m):
    # type(m).forward = f``): a restored instance comes back with its class imported afresh,
    # without the change, and no fingerprint of the instance reads its class.
    class_handed: bool = False
    setters: Mapping[str, str] = field(default_factory=dict)  # as a cell's
    # A class's: what its methods do that the record cannot see (their patches, changes
    # through ``.data``), for a cell that makes an instance or calls its methods.
    of_class: bool = False

    def unseen_by_record(self) -> bool:
        """Whether it does what no run-time record sees: patches a library or a class, changes
        what it is handed through ``.data``, calls a library's setter."""
        return bool(self.patches or self.untracked_handed or self.class_handed or self.setters)


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
    links: dict[str, set[str]] = field(default_factory=dict)
    calls: set[str] = field(default_factory=set)
    effects: dict[str, Effects] = field(default_factory=dict)
    callables: set[str] = field(default_factory=set)
    stores: dict[str, set[str]] = field(default_factory=dict)
    filled: set[str] = field(default_factory=set)  # changed by a store
    changed: set[str] = field(default_factory=set)  # changed otherwise (what they hold too)
    handed: dict[str, set[str]] = field(default_factory=dict)
    imported_from: dict[str, str] = field(default_factory=dict)
    imported_as: dict[str, str] = field(default_factory=dict)
    registers: dict[str, set[str]] = field(default_factory=dict)
    draws: list[str] = field(default_factory=list)
    untracked: set[str] = field(default_factory=set)
    patches: set[str] = field(default_factory=set)
    class_patches: set[str] = field(default_factory=set)
    derives: dict[str, set[str]] = field(default_factory=dict)
    setters: dict[str, str] = field(default_factory=dict)
    reads_all: bool = False
    written: set[str] = field(default_factory=set)

    def facts(self) -> CellFacts:
        mutates = self.mutates - self.assigned
        return CellFacts(
            frozenset(self.defines),
            frozenset(self.uses),
            frozenset(mutates),  # its own new object: not a change
            frozenset(self.deferred),
            frozenset(self.deletes),
            frozenset(self.imports),
            "; ".join(dict.fromkeys(self.opaque)),
            "; ".join(dict.fromkeys(self.setup)),
            {n: frozenset(r) for n, r in self.links.items() if r and n in self.defines},
            frozenset(self.calls),
            {n: e for n, e in self.effects.items() if n in self.defines},
            frozenset(self.callables & self.defines),
            {
                n: frozenset(r - {n})
                for n, r in self.stores.items()
                if r - {n} and n in self.defines
            },
            frozenset((self.filled - self.changed) & mutates),
            self._handed() if self.handed else {},
            {n: m for n, m in self.imported_from.items() if n in self.imports},
            "; ".join(dict.fromkeys(self.draws)),
            frozenset(self.untracked & mutates),
            patches=frozenset(self.patches),
            class_patches=frozenset(self.class_patches),
            derives={n: frozenset(r - {n}) for n, r in self.derives.items() if r - {n}},
            setters=dict(self.setters),
            reads_all=self.reads_all,
            written=frozenset(self.written),
            imported_as={n: m for n, m in self.imported_as.items() if n in self.imports},
            registers={m: frozenset(r) for m, r in self.registers.items()},
        )

    def _handed(self) -> dict[str, frozenset[str]]:
        handed = {r: frozenset(n - self.assigned) for r, n in self.handed.items()}
        return {r: n for r, n in handed.items() if n}


def _through_attribute(target: ast.expr) -> bool:
    """Whether a target reaches its root through an attribute (``np.float``, ``plt.rcParams[k]``,
    ``sys.modules[k]``), not by items alone (``x[i]``): what a module holds, where it is one."""
    node = target
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) or _is_vars_of(node):
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _root_name(node: ast.expr) -> str | None:
    """``x`` for ``x``, ``x.a.b``, ``x[i].c``, ``x.f(...).g``, ``type(x).g`` (its class, as
    ``x.__class__.g``: ``type(model).forward = f`` patches what ``model`` does); None for
    anything else."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if _is_type_of(node) or _is_vars_of(node):
            node = node.args[0]  # type: ignore[union-attr]
            continue
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_type_of(node: ast.expr) -> bool:
    """``type(x)``: one argument, the builtin's name."""
    return _one_argument_of(node, "type")


def _is_vars_of(node: ast.expr) -> bool:
    """``vars(x)``: ``x``'s own attributes, as ``x.__dict__``."""
    return _one_argument_of(node, "vars")


def _one_argument_of(node: ast.expr, builtin: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == builtin
        and len(node.args) == 1
        and not node.keywords
    )


def _module_imported(value: ast.expr) -> str | None:
    """The module a call imports and returns: ``importlib.import_module("torch.nn.functional")``
    (that module), ``__import__("torch.nn")`` (its top-level package); else None."""
    if not isinstance(value, ast.Call) or len(value.args) != 1 or value.keywords:
        return None
    module = string(value.args[0])
    if module is None:
        return None
    called = _dotted(value.func)
    if called in ("importlib.import_module", "import_module"):
        return module
    return module.partition(".")[0] if called == "__import__" else None


def _attributes_changed(call: ast.Call) -> ast.expr | None:
    """The path whose attributes a method call changes through their dict (``vars(F).update(
    gelu=g)``, ``F.__dict__.setdefault(k, v)``): a patch, as ``F.gelu = g`` is; else None."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr in READ_ONLY_METHODS:
        return None
    owner = func.value
    if _is_vars_of(owner) or (isinstance(owner, ast.Attribute) and owner.attr == "__dict__"):
        return owner
    return None


def _names_bound(target: ast.AST) -> Iterable[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def _scope(nodes: list[ast.AST], bound: set[str]) -> tuple[set[str], set[str]]:
    """(the function's own names, the names it declares ``global``) for its body's nodes."""
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
    return local - declared_global, declared_global


def _free_names(body: Iterable[ast.AST], bound: set[str]) -> set[str]:
    """Names a function body reads that it does not bind itself (its globals)."""
    nodes = [n for b in body for n in ast.walk(b)]
    local, _ = _scope(nodes, bound)
    loaded = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - local


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _changes_arguments(call: ast.Call) -> bool:
    """Whether a call may change the objects it is handed: a plain function (a notebook's
    ``train(model, opt)``, not a builtin that only reads, nor a class being built; one taken
    from a container, ``ops["s"](model)``), or an
    in-place one (PyTorch's trailing underscore: ``nn.init.zeros_``, ``clip_grad_norm_``)."""
    if isinstance(call.func, ast.Subscript):  # a function from a container: ``ops["s"](m)``
        return True
    name = _call_name(call.func)
    if name is None or name in FRESH_CALLS:  # a copy reads its source: ``deepcopy(model)``
        return False
    if (name.endswith("_") and not name.endswith("__")) or name in IN_PLACE_FUNCTIONS:
        return True
    return isinstance(call.func, ast.Name) and not (
        name in _READ_ONLY_FUNCTIONS or name[:1].isupper()
    )


def _argument_roots(call: ast.Call) -> set[str]:
    """The names whose objects a call is handed: ``model`` for ``model``, ``model.fc.weight``,
    ``model.parameters()``; none for ``iter(loader)`` (a new object that a function made)."""
    roots = set()
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        node = arg.value if isinstance(arg, ast.Starred) else arg
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            if isinstance(node, ast.Call) and not isinstance(node.func, ast.Attribute):
                break
            node = node.func if isinstance(node, ast.Call) else node.value
        if isinstance(node, ast.Name):
            roots.add(node.id)
    return roots


def _loaded_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _receiver(call: ast.Call) -> tuple[str, bool] | None:
    """For a method call that may change what it is handed (``trainer.fit(model)``,
    ``scaler.step(opt)``, ``get_trainer().fit(model)``): (its object's root name, whether that
    object may be a module: a plain chain of names, ``np``, ``torch.nn.functional``, not
    ``pl.Trainer().fit``); None for any other call (``model.to(dev)``, ``"-".join(names)``,
    a store: ``models.append(model)``)."""
    func = call.func
    if (
        not isinstance(func, ast.Attribute)
        or func.attr in ARGUMENT_READING_METHODS
        or func.attr in STORING_METHODS
    ):
        return None
    node, chain = func.value, True
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        chain = chain and isinstance(node, ast.Attribute)
        node = node.func if isinstance(node, ast.Call) else node.value
    return (node.id, chain) if isinstance(node, ast.Name) else None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, (ast.Assign, ast.Delete)):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        else:
            flat.append(target.value if isinstance(target, ast.Starred) else target)
    return flat


def _storing(call: ast.Call) -> tuple[ast.expr, list[ast.expr], list[ast.expr]] | None:
    """(the container, the keys or indices, the values put into it) for ``c.append(v)``,
    ``d.update(m=v)``, ``c.insert(i, v)``, ``setattr(c, "a", v)``, ``heappush(c, v)``...;
    None for any other call."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in STORING_METHODS:
        container, keys = func.value, 1 if func.attr in KEYED_METHODS and call.args else 0
    elif isinstance(func, ast.Name) and func.id in STORING_FUNCTIONS and call.args:
        container, keys = call.args[0], 2 if func.id == "setattr" else 1  # the object, the name
    else:
        return None
    values = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
    values += [k.value for k in call.keywords]
    return container, values[:keys], values[keys:]


def _through_class(node: ast.expr) -> bool:
    """Whether a path reaches its root through the root's class: ``type(x).f``, ``x.__class__``
    (and what lies under them)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if _is_type_of(node) or (isinstance(node, ast.Attribute) and node.attr == "__class__"):
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def _untracked_root(node: ast.expr) -> str | None:
    """``t`` for ``t.numpy()[i]``, ``w.data``, ``w.data.mul_``: a path through a view whose
    writes the tensor's version counter does not count; ``model`` for ``type(model).f``,
    ``model.__class__.f``: through its class, which no fingerprint of it reads; None for any
    other."""
    through = False
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if _is_type_of(node):
            through, node = True, node.args[0]  # type: ignore[union-attr]
            continue
        if isinstance(node, ast.Call):
            func = node.func
            through = through or (isinstance(func, ast.Attribute) and func.attr == "numpy")
            node = func
            continue
        through = through or (
            isinstance(node, ast.Attribute) and node.attr in ("data", "__class__")
        )
        node = node.value
    return node.id if through and isinstance(node, ast.Name) else None


def _drawn_from(call: ast.Call) -> str | None:
    """``rng`` for ``rng.random()``, ``r.shuffle(xs)``, ``cfg.rng.integers(9)``: a draw that
    advances the generator object a name holds (or a module's, ``np.random.rand()``: only the
    planner knows which); None for any other call, a class's (``nn.Linear``) included."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in RANDOM_CALLS:
        return None
    if func.attr[:1].isupper() or func.attr in ("from_pretrained", "iter", "next"):
        return None
    node = func.value
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) and node.id[:1].islower() else None


def _method_call_root(node: ast.AST) -> str | None:
    """``x`` for a statement ``x.a.method(...)`` (or awaited) whose method may change ``x``."""
    if not isinstance(node, ast.Expr):
        return None
    call = node.value.value if isinstance(node.value, ast.Await) else node.value
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr not in READ_ONLY_METHODS
    ):
        return _root_name(call.func.value)
    return None


def _lambda_effects(node: ast.Lambda) -> Effects:
    """What calling a lambda does outside it: its body as a function's one statement (so
    ``lambda v: hist.append(v)`` changes ``hist``)."""
    as_def = ast.FunctionDef(
        name="<lambda>", args=node.args, body=[ast.Expr(node.body)], decorator_list=[]
    )
    return _function_summary(as_def)[1]


def _function_summary(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], Effects]:
    """(the globals ``node`` reads, what calling it does outside it: the globals it assigns
    (``global``), the outside objects it changes (``opt.step()``, ``cache[k] = v``,
    ``train(model)``), the functions it calls)."""
    nodes = [n for b in node.body for n in ast.walk(b)]
    local, declared = _scope(nodes, _params(node.args))
    loaded = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assigns: set[str] = set()
    mutates: set[str] = set()
    calls: set[str] = set()
    # A local built from outside objects (``m = model.fc``; ``loss = crit(model(x), y)`` then
    # ``loss.backward()``): changing it changes them.
    built_from: dict[str, set[str]] = {}
    for each in nodes:
        targets: list[ast.expr | None]
        if isinstance(each, ast.Assign):
            value, targets = each.value, list(each.targets)
        elif isinstance(each, ast.AnnAssign) and each.value is not None:
            value, targets = each.value, [each.target]
        elif isinstance(each, (ast.For, ast.AsyncFor)):
            value, targets = each.iter, [each.target]
        elif isinstance(each, ast.withitem):
            value, targets = each.context_expr, [each.optional_vars]
        else:
            continue
        outside = {
            n.id
            for n in ast.walk(value)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local
        }
        for target in targets if outside else ():
            for name in _names_bound(target) if target is not None else ():
                built_from.setdefault(name, set()).update(outside)

    def objects_of(root: str) -> set[str]:
        """The outside names a change of ``root`` changes."""
        return built_from.get(root, set()) if root in local else {root}

    def changed(root: str | None) -> None:
        if root is not None:
            mutates.update(objects_of(root))

    handed: dict[str, set[str]] = {}
    patches: set[str] = set()
    class_patches: set[str] = set()
    untracked_handed = class_handed = False
    setters: dict[str, str] = {}

    def patched(target: ast.expr, through: bool) -> None:
        nonlocal class_handed
        root = _root_name(target)
        if root is None or not through:
            return
        if root not in local:
            patches.add(root)
            if _through_class(target):
                class_patches.add(root)
        elif _through_class(target):
            # ``type(m).forward = f`` on a local: the class of a global it was found in
            # (``for layer in model.modules()``), or of what the function is handed.
            outside = objects_of(root)
            patches.update(outside)
            class_patches.update(outside)
            class_handed |= not outside

    def unseen_change(path: ast.expr) -> None:
        """``path`` changed through a view no version counter counts (``m.weight.data``): of a
        parameter, or of a local that may come from one (``for layer in m.layers``)? (A
        global's change is among ``mutates``.)"""
        nonlocal untracked_handed
        root = _untracked_root(path)
        untracked_handed |= root is not None and root in local

    for each in nodes:
        if (
            isinstance(each, ast.Name)
            and each.id in declared
            and not isinstance(each.ctx, ast.Load)
        ):
            assigns.add(each.id)
        for target in _targets(each):
            root = _root_name(target)
            inplace = isinstance(target, (ast.Attribute, ast.Subscript)) or isinstance(
                each, ast.AugAssign
            )
            if inplace:
                changed(root)
                patched(target, _through_attribute(target))
                unseen_change(target)
        if isinstance(each, ast.Expr) and _method_call_root(each) is not None:
            call = each.value.value if isinstance(each.value, ast.Await) else each.value
            if isinstance(call, ast.Call):  # (``[await] x.a.method(...)``)
                unseen_change(call.func)
        if (
            isinstance(each, ast.Call)
            and isinstance(each.func, ast.Name)
            and each.func.id in ("setattr", "delattr")
            and each.args
        ):
            patched(each.args[0], True)
        if isinstance(each, ast.Call) and (through_dict := _attributes_changed(each)) is not None:
            patched(through_dict, True)
        effect = _called_for_effect(each.value) if isinstance(each, ast.Expr) else None
        if effect is not None and effect[0] not in local:
            setters.setdefault(*effect)
        if isinstance(each, ast.Call) and isinstance(each.func, ast.Attribute):
            dotted = _dotted(each.func)
            root = dotted.partition(".")[0] if dotted is not None else None
            if root is not None and root not in local and _setter(each.func.attr):
                setters.setdefault(root, f"calls {dotted}()")
        changed(_method_call_root(each))
        if isinstance(each, ast.Call):
            if isinstance(each.func, ast.Name):
                calls.add(each.func.id)
            if _changes_arguments(each):
                for root in _argument_roots(each):
                    changed(root)
            elif (receiver := _receiver(each)) is not None:
                # A method of a local object changes what it is handed; of a global, unless
                # that global is a module (the planner knows).
                name, chain = receiver
                for root in _argument_roots(each):
                    if chain and name not in local:
                        handed.setdefault(name, set()).update(objects_of(root))
                    else:
                        changed(root)
    effects = Effects(
        frozenset(assigns - mutates),
        frozenset(mutates),
        frozenset(calls - local),
        {r: frozenset(n) for r, n in handed.items() if n},
        frozenset(patches),
        frozenset(class_patches),
        untracked_handed,
        class_handed,
        setters,
    )
    return loaded - local, effects


class _CellVisitor(ast.NodeVisitor):
    """Walks a cell's module-level code in execution order (values before targets)."""

    def __init__(self, transform: Transform | None) -> None:
        self.c = _Collect()
        self.bound: set[str] = set()  # bound earlier in this cell
        self.reading: set[str] | None = None  # names read by the value being visited
        # names the value being visited reads through a call that copies (not in ``reading``),
        # and those of the last value visited whole (``_visit_reading``)
        self.copying: set[str] | None = None
        self.copied: set[str] = set()
        # names read by the tests of the ifs, loops and matches around the statement visited:
        # what it binds or changes depends on them
        self.control: set[str] = set()
        self.imported: set[str] = set()  # bound by an import, last, earlier in this cell
        self.transform = transform

    # --- names ---------------------------------------------------------------------------------
    def _load(self, name: str) -> None:
        if name not in self.bound:
            self.c.uses.add(name)
        if self.copying is not None and name in self.bound:
            self.copying |= self.c.derives.get(name, set())
        if self.reading is None and self.copying is not None:  # through a copy
            self.copying.add(name)
            if name in self.bound:
                self.copying |= self.c.links.get(name, set())
        if self.reading is not None:
            self.reading.add(name)
            if name in self.bound:  # bound in this cell: what it was built from too
                self.reading |= self.c.links.get(name, set())
            if name in self.c.stores:  # and what it holds (``first = models[0]``)
                self.reading |= self.c.stores[name]

    def _store(self, name: str) -> None:
        self.c.stores.pop(name, None)  # a new object: it holds nothing yet
        if not self.control:  # else it may keep the value it had: what that came from too
            self.c.derives.pop(name, None)
        self.c.effects.pop(name, None)  # a function's, until it is bound again
        self.imported.discard(name)
        self.bound.add(name)
        self.c.assigned.add(name)
        self.c.defines.add(name)
        self.c.deletes.discard(name)

    def _mutate(self, name: str, fill: bool = False) -> None:
        """``name``'s object changes; ``fill``: only by a store into it, which changes neither
        what it held before (``models.append(m2)`` leaves ``models[0]`` alone) nor what is
        stored."""
        if self.control:
            self._derives(name, (), add=True)
        for source in self._sources(name, fill):
            if source in _READ_ONLY_FUNCTIONS and source not in self.bound:
                continue  # (``for pe, p in zip(ema, model)``: made by ``zip``, not held by it)
            self._load(source)
            self.c.mutates.add(source)
            self.c.defines.add(source)
            self.c.changed.add(source)
        self._load(name)
        self.c.mutates.add(name)
        self.c.defines.add(name)
        (self.c.filled if fill else self.c.changed).add(name)

    def _sources(self, name: str, fill: bool = False) -> set[str]:
        """The other names a change of ``name`` changes: those this cell built it from (``x =
        model.layer1`` then ``x.weight.data.fill_(0)`` changes ``model``) and, unless ``fill``,
        what it holds (``models[0].train()`` after ``models.append(model)`` changes ``model``)."""
        sources = set(self.c.links.get(name, ())) if name in self.bound else set()
        if not fill:
            sources |= self.c.stores.get(name, set())
        return sources - {name}

    def _handed(self, call: ast.Call) -> None:
        """A method of an object may change what it is handed (``trainer.fit(model)``); a
        module's function reads it (``np.mean(x)``). Whether a name from an earlier cell is a
        module, only the notebook knows: its changes are left to the planner (``handed``)."""
        found = _receiver(call)
        if found is None:
            return
        root, chain = found
        # Imported in this cell: a module's function, unless the module is the notebook's own
        # (``from helpers import trainer``), which only the planner is told.
        if chain and (root not in self.bound or root in self.imported):
            handed = self.c.handed.setdefault(root, set())
            for argument in _argument_roots(call):
                handed.add(argument)
                if argument in self.bound or argument in self.c.stores:
                    handed |= self._sources(argument)
            return
        for argument in _argument_roots(call):  # bound here otherwise: an object
            self._mutate(argument)

    def _hold(self, container: str, values: set[str]) -> None:
        """``container``'s object now holds the objects of ``values`` (the names a stored value
        was read from, what they hold included: see ``_load``)."""
        held = values - {container}
        if held:
            self.c.stores.setdefault(container, set()).update(held)

    def _store_call(self, call: ast.Call) -> bool:
        """``c.append(v)`` and the like: ``c`` is filled with ``v``. True when handled."""
        found = _storing(call)
        if found is None or ipython_call(call) is not None:
            return False
        container, keys, values = found
        self.visit(call.func)
        for key in keys:  # read, not stored (and setattr's object)
            self.visit(key)
        held: set[str] = set()
        copied: set[str] = set()
        for value in values:
            held |= self._visit_reading(value)
            copied |= self.copied
        root = _root_name(container)
        if root is not None:
            self._derives(root, copied, add=True)
            # Into ``c`` itself: a fill; into a part of it (``d["k"].append(v)``): that part,
            # which may be something ``c`` holds, changes.
            self._mutate(root, fill=isinstance(container, ast.Name))
            self._hold(root, held)
        if isinstance(call.func, ast.Name):
            self.c.calls.add(call.func.id)
        return True

    def _visit_reading(self, node: ast.AST) -> set[str]:
        """Visit an expression; the names (from before this cell) its value may share objects
        with: what it reads, less what goes through a call that copies (``df.copy()``)."""
        outer, self.reading = self.reading, set()
        outer_copying, self.copying = self.copying, set()
        try:
            self.visit(node)
            return self.reading
        finally:
            if outer is not None:
                outer |= self.reading
            if outer_copying is not None:
                outer_copying |= self.copying
            self.copied = self.copying
            self.reading, self.copying = outer, outer_copying

    def _derives(self, name: str, copied: Collection[str], add: bool = False) -> None:
        """``name``'s value is now (``add``: also) computed from ``copied`` through copies, and
        from the tests it is under."""
        if add or self.control:
            self.c.derives.setdefault(name, set()).update(copied, self.control)
        else:
            self.c.derives[name] = set(copied)

    @contextlib.contextmanager
    def _controlled(self, names: set[str]) -> Iterator[None]:
        """What is bound or changed inside depends on ``names`` (the tests around it)."""
        outer = self.control
        self.control = outer | names
        try:
            yield
        finally:
            self.control = outer

    def _built_from(self, names: set[str]) -> set[str]:
        """``names``, and what those bound earlier in this cell were built from."""
        found = set(names)
        for name in names & self.bound:
            found |= self.c.links.get(name, set()) | self.c.derives.get(name, set())
        return found

    def _under(self, test: ast.expr, body: Iterable[ast.stmt]) -> None:
        """Visit ``body``, run or not (or how many times) as ``test``'s value says."""
        reads = self._visit_reading(test)
        with self._controlled(reads | self.copied):
            for statement in body:
                self.visit(statement)

    def visit_If(self, node: ast.If | ast.While) -> None:
        self._under(node.test, [*node.body, *node.orelse])

    visit_While = visit_If

    def _link(self, target: ast.AST, reads: set[str], copied: Collection[str] = ()) -> None:
        for name in _names_bound(target):
            self.c.links[name] = set(reads)
            self._derives(name, copied)

    def _bind(
        self, target: ast.expr, value: ast.expr, reads: set[str], copied: Collection[str] = ()
    ) -> None:
        """After ``target = value``: a new list, tuple, set or dict holds what it reads
        (``models = [model]``); anything else links to it. ``copied``: what it reads through
        copies; an item or attribute target's object now has a value computed from them."""
        if isinstance(target, ast.Name) and isinstance(value, _DISPLAYS):
            self.c.links[target.id] = set()
            self._derives(target.id, copied)
            self._hold(target.id, reads)
        else:
            self._link(target, reads, copied)
        parts = [target]
        while parts:
            part = parts.pop()
            if isinstance(part, (ast.Tuple, ast.List)):
                parts.extend(part.elts)
            elif isinstance(part, ast.Starred):
                parts.append(part.value)
            elif isinstance(part, (ast.Attribute, ast.Subscript)):
                root = _root_name(part)
                if root is not None:
                    self._derives(root, copied, add=True)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._load(node.id)
        elif isinstance(node.ctx, ast.Store):
            self._store(node.id)
        else:
            self.bound.discard(node.id)
            self.c.defines.discard(node.id)
            self.c.deletes.add(node.id)

    def _target(self, target: ast.expr, stored: set[str] | None = None, fill: bool = False) -> None:
        """Bind or change ``target``; ``stored``: what the value assigned reads, which an
        attribute or item target then holds; ``fill``: a plain assignment, which into ``x.a``
        or ``x[i]`` changes ``x`` but not what ``x`` held (``x.a.b = v`` changes ``x.a``)."""
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            self.visit(target)  # x.attr = v reads x (and the index)
            root = _root_name(target)
            if root is not None and _through_attribute(target):
                self.c.patches.add(root)  # ``np.float = v``, ``sys.modules["m"] = v``
                if _through_class(target):
                    self.c.class_patches.add(root)  # ``type(model).forward = f``
            if root is not None:
                self._mutate(root, fill=fill and isinstance(target.value, ast.Name))
                if _untracked_root(target) == root:
                    self.c.untracked.add(root)
                self._hold(root, stored or set())
            if isinstance(target, ast.Subscript) and _dotted(target.value) == "sys.modules":
                registered = string(target.slice)
                if registered is not None:
                    self.c.registers[registered] = set(stored or ())
            if isinstance(target, ast.Subscript) and _is_environ(target.value):
                self.c.setup.append("sets an environment variable, os.environ")
            path = target.value if isinstance(target, ast.Subscript) else target
            if _dotted(path) == "sys.path":
                self.c.setup.append("changes sys.path")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, stored, fill)
        elif isinstance(target, ast.Starred):
            self._target(target.value, stored, fill)
        else:
            self.visit(target)

    # --- statements ----------------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        reads = self._visit_reading(node.value)
        copied = self.copied
        imported = _module_imported(node.value)
        for target in node.targets:
            self._target(target, reads, fill=True)
            self._bind(target, node.value, reads, copied)
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Lambda):
                self.c.effects[target.id] = _lambda_effects(node.value)  # a function all the same
            if isinstance(target, ast.Name) and imported is not None:
                self._imported(target.id, imported, imported)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            reads = self._visit_reading(node.value)
            copied = self.copied
            self._target(node.target, reads, fill=True)
            self._bind(node.target, node.value, reads, copied)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        reads = self._visit_reading(node.value)
        root = _root_name(node.target)
        if root is not None:
            self._derives(root, self.copied, add=True)
        if isinstance(node.target, ast.Name):
            # In place for a tensor, an array, a list: the object may be shared; a list then
            # holds what it was extended with (``lst += [model]``).
            name = node.target.id
            self._mutate(name, fill=True)
            self._hold(name, reads)
            if name not in self.bound:
                self.bound.add(name)
        else:
            # ``x.a += v`` changes ``x.a`` in place (a tensor, a list): what ``x`` holds.
            self._target(node.target, reads)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        reads = self._visit_reading(node.value)
        copied = self.copied
        self._store(node.target.id)
        self._link(node.target, reads, copied)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                self._target(target)
            else:
                self.visit(target)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        reads = self._visit_reading(node.iter)
        copied = self.copied
        self._target(node.target)
        self._link(node.target, reads, copied)
        with self._controlled(reads | copied):  # how many times the body runs
            for statement in [*node.body, *node.orelse]:
                self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            reads = self._visit_reading(item.context_expr)
            copied = self.copied
            if item.optional_vars is not None:
                self._target(item.optional_vars)
                self._link(item.optional_vars, reads, copied)
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_Try(self, node: ast.Try) -> None:
        # Whether, and where, the body raises decides what of it, and which handler, runs.
        read = {
            n.id
            for statement in node.body
            for n in ast.walk(statement)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        with self._controlled(self._built_from(read)):
            self.generic_visit(node)

    visit_TryStar = visit_Try  # 3.11's except*: the same fields

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
            self._imported(name, alias.name, alias.name if alias.asname else name)

    def _imported(self, name: str, module: str, dotted: str) -> None:
        """``name`` bound to ``module`` (``dotted``, as the name stands for it)."""
        self.c.imports.add(name)
        self.imported.add(name)
        self.c.imported_from[name] = module.split(".")[0]
        self.c.imported_as[name] = dotted

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.c.opaque.append(f"star import from {node.module}")
                continue
            name = alias.asname or alias.name
            self._store(name)
            self.c.imports.add(name)
            self.imported.add(name)
            if node.module and not node.level:
                self.c.imported_from[name] = node.module.split(".")[0]
                self.c.imported_as[name] = f"{node.module}.{alias.name}"

    def _defaults(self, args: ast.arguments) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
            if isinstance(decorator, ast.Name):  # ``@register`` calls it with the function
                self.c.calls.add(decorator.id)
        self._defaults(node.args)
        free, effects = _function_summary(node)
        self.c.deferred.update(free)
        self._store(node.name)
        self.c.links.pop(node.name, None)
        self.c.callables.add(node.name)
        self.c.effects[node.name] = effects

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._defaults(node.args)
        self.c.deferred.update(_free_names([node.body], _params(node.args)))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        methods = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for method in methods:
            self.c.deferred.update(_free_names(method.body, _params(method.args)))
        # The rest of the class body runs now, in the class's own scope.
        rest: list[ast.AST] = [s for s in node.body if s not in methods]
        rest += [d for m in methods for d in [*m.decorator_list, *m.args.defaults]]
        free = _free_names(rest, {m.name for m in methods})
        for name in free:
            self._load(name)
        self._store(node.name)
        self.c.links.pop(node.name, None)
        self.c.effects.pop(node.name, None)
        summaries = [_function_summary(m)[1] for m in methods]
        # (and the functions its methods call, which may be the notebook's: ``shrink(m)``)
        if any(e.unseen_by_record() or e.calls for e in summaries):
            self.c.effects[node.name] = Effects(
                calls=frozenset().union(*(e.calls for e in summaries)),
                patches=frozenset().union(*(e.patches for e in summaries)),
                class_patches=frozenset().union(*(e.class_patches for e in summaries)),
                untracked_handed=any(e.untracked_handed for e in summaries),
                class_handed=any(e.class_handed for e in summaries),
                setters={k: v for e in reversed(summaries) for k, v in e.setters.items()},
                of_class=True,
            )
        self.c.callables.add(node.name)
        # Its attributes are computed now from what the body reads (``class CFG: n =
        # len(classes)``), as a function's are not.
        self._derives(node.name, self._built_from(free) - {node.name}, add=bool(self.control))

    def visit_Match(self, node: ast.Match) -> None:
        reads = self._visit_reading(node.subject)
        with self._controlled(reads | self.copied):
            for case in node.cases:
                self.visit(case.pattern)  # class names and values are read; captures bound
                for capture in _captures(case.pattern):
                    self.c.links[capture] = set(reads)
                if case.guard is not None:
                    self.visit(case.guard)
                for statement in case.body:
                    self.visit(statement)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.pattern is not None:
            self.visit(node.pattern)
        if node.name is not None:
            self._store(node.name)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name is not None:
            self._store(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        for key in node.keys:
            self.visit(key)
        for pattern in node.patterns:
            self.visit(pattern)
        if node.rest is not None:
            self._store(node.rest)

    def _comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
    ) -> None:
        first, *rest = node.generators
        reads = self._visit_reading(first.iter)  # evaluated in the enclosing scope
        copied = self.copied
        inner = set(_names_bound(ast.Module([ast.Expr(g.target) for g in node.generators], [])))
        parts: list[ast.AST] = [
            *(g.iter for g in rest),
            *(i for g in node.generators for i in g.ifs),
        ]
        parts += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        free = _free_names(parts, inner)
        for name in free:
            self._load(name)
        for call in (n for part in parts for n in ast.walk(part) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Name):  # called for each item: its effects land here
                self.c.calls.add(call.func.id)
                if call.func.id == "globals" and not call.args:
                    # The module's namespace from inside too (``[n for n in names if n in
                    # globals()]``), as at the top level: read whole, maybe written.
                    self.c.reads_all = True
                    self.c.opaque.append("calls globals()")
        # An assignment expression in a comprehension binds in the enclosing scope (PEP 572):
        # to a value from the items (``[last := m for m in models]``), computed from anything
        # the comprehension reads.
        computed = reads | copied | self._built_from(free)
        for part in parts:
            for walrus in ast.walk(part):
                if isinstance(walrus, ast.NamedExpr):
                    self._store(walrus.target.id)
                    self.c.links[walrus.target.id] = set(reads)
                    self._derives(walrus.target.id, computed - {walrus.target.id})

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def visit_Expr(self, node: ast.Expr) -> None:
        if self._magic(node.value):
            return
        effect = _called_for_effect(node.value)
        if effect is not None:
            self.c.setters.setdefault(*effect)
        reads = self._visit_reading(node.value)
        copied = self.copied
        call = node.value.value if isinstance(node.value, ast.Await) else node.value
        if isinstance(call, ast.Call) and _storing(call) and not ipython_call(call):
            return  # a fill, done by visit_Call
        root = _method_call_root(node)
        if root is not None:
            self._mutate(root)
            # what the method is handed may decide its object's new state, shared or not
            # (``stopper.step(hist[-1])``, ``model.load_state_dict(sd)``)
            self._derives(root, reads | copied, add=True)
            if isinstance(call, ast.Call) and _untracked_root(call.func) == root:
                self.c.untracked.add(root)

    def _attributes_set(self, path: ast.expr) -> None:
        """The attributes of what ``path`` leads to are set by a call (``setattr(F, "gelu",
        g)``, ``vars(F).update(gelu=g)``): a patch of its root, or of its root's class."""
        patched = _root_name(path)
        if patched is not None:
            self.c.patches.add(patched)
            if _untracked_root(path) == patched:  # ``setattr(type(m), "f", g)``
                self.c.untracked.add(patched)
            if _through_class(path):
                self.c.class_patches.add(patched)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in FRESH_CALLS and self.reading is not None:
            outer, self.reading = self.reading, None  # a copy shares nothing with its source
            try:
                self.visit_Call(node)
            finally:
                self.reading = outer
            return
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and node.args:
            self._attributes_set(node.args[0])
        through_dict = _attributes_changed(node)  # ``vars(F).update(gelu=g)``
        if through_dict is not None:
            self._attributes_set(through_dict)
        if isinstance(func, ast.Name) and func.id in OPAQUE_CALLS:
            self.c.opaque.append(f"calls {func.id}()")
        dotted = _dotted(func) if isinstance(func, ast.Attribute) else None
        if dotted is not None and _setter(name or ""):
            self.c.setters.setdefault(dotted.partition(".")[0], f"calls {dotted}()")
        where = WRITING_CALLS.get(name or "")
        if where is not None and name in ("save", "dump"):
            owner = func.value if isinstance(func, ast.Attribute) else None
            where = 0 if isinstance(owner, ast.Name) and owner.id in ("np", "numpy") else where
        target = node.args[where] if where is not None and len(node.args) > where else None
        target = next((k.value for k in node.keywords if k.arg == "file"), target)
        if isinstance(target, ast.Name) and target.id not in self.bound:
            self.c.written.add(target.id)
        if isinstance(func, ast.Name) and func.id in NAMESPACE_CALLS and not node.args:
            self.c.reads_all = True
        if isinstance(func, ast.Attribute) and _dotted(func.value) == "sys.path":
            if func.attr not in READ_ONLY_METHODS:  # ``sys.path.insert(0, repo)``
                self.c.setup.append("changes sys.path")
        elif isinstance(func, ast.Attribute) and func.attr in STREAM_METHODS:
            stream = func.value.id if isinstance(func.value, ast.Name) else None
            # (one the cell opened itself is its own new object: nothing from before moved)
            if stream is not None and stream not in self.imported | self.bound:
                self._mutate(stream)  # ``line = f.readline()``: ``f`` is further on
        if name in SETUP_CALLS:
            # by its dotted name where it has one (``sys.setrecursionlimit()``): the plan's
            # note then names the module whose state the new process lacks
            self.c.setup.append(f"calls {_dotted(func) or name}()")
        if name in RANDOM_CALLS:
            self.c.draws.append(f"calls {name}()")
        drawn = _drawn_from(node)
        if drawn is not None and drawn not in self.bound:
            # A generator held in a name (``rng = np.random.default_rng(0)``) advances with
            # each draw, in any expression; unless the name is a module (``np.random.rand()``).
            self.c.handed.setdefault(drawn, set()).add(drawn)
        elif drawn is not None and drawn not in self.imported:
            self._mutate(drawn)
        if self._magic(node):
            return
        ipython = ipython_call(node)
        if ipython is not None and ipython[0] in ("push", "run_cell", "ex"):
            self.c.opaque.append(f"get_ipython().{ipython[0]}()")
        if ipython is not None and ipython[0] in ("system", "getoutput") and ipython[1]:
            self._expanded(string(ipython[1][0]) or "")  # !cmd $name {expr}
        if self._store_call(node):
            return
        if isinstance(func, ast.Name) and func.id[:1].isupper() and self.reading is not None:
            # An object a class builds (``SGD(...)``) is no part of the class; what calling an
            # object returns may be (``model(x)``: the autograd graph holds ``model``).
            outer, self.reading = self.reading, None
            self.visit(func)
            self.reading = outer
            for child in [*node.args, *node.keywords]:
                self.visit(child)
        else:
            self.generic_visit(node)
        if isinstance(func, ast.Name):
            self.c.calls.add(func.id)
        if _changes_arguments(node):
            # what it leaves in them is computed from all it reads, its object's state included
            # (``r.shuffle(order)``, ``np.copyto(dst, src)``, ``heappush(heap, item)``)
            computed = self._built_from(_loaded_names(node))
            for root in _argument_roots(node):
                self._mutate(root)
                self._derives(root, computed - {root}, add=True)
        elif node.args or node.keywords:
            self._handed(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # IPython's output history read by number (``Out[3]``) is a read of the name that number
        # binds (``_3``: IPython/core/displayhook.py), which the cell that ran as number 3 makes
        # again when replayed.
        if isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name):
            number = node.slice
            if (
                isinstance(number, ast.Constant)
                and type(number.value) is int
                and number.value >= 0
                and node.value.id in _NUMBERED
            ):
                self._load(f"_{number.value}")
                return
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("user_ns", "user_global_ns"):  # get_ipython().user_ns[...] = ...
            self.c.opaque.append(f"uses .{node.attr}")
        self.generic_visit(node)

    # --- magics --------------------------------------------------------------------------------
    def _magic(self, node: ast.expr) -> bool:
        """A ``%magic`` / ``%%magic`` call: its own rules. True when handled."""
        ipython = ipython_call(node)
        if ipython is None or ipython[0] not in ("run_line_magic", "run_cell_magic"):
            return False
        method, args = ipython
        name = string(args[0]) if args else None
        line = string(args[1]) if len(args) > 1 else ""
        if name is None or line is None:
            self.c.opaque.append("a magic called with computed arguments")
            return True
        if method == "run_cell_magic":
            body = string(args[2]) if len(args) > 2 else None
            if name in PYTHON_CELL_MAGICS and body is not None:
                if name == "capture" and line.split():
                    self._store(line.split()[-1])
                self._nested(body)
            elif name not in FOREIGN_CELL_MAGICS:
                self.c.opaque.append(f"the cell magic %%{name}")
            return True
        if name in PYTHON_LINE_MAGICS:
            self._nested(line)
            return True
        if name == "aimport":  # autoreload's: an import of each module
            for module in aimported(line):
                self.visit(ast.Import(names=[ast.alias(name=module)]))
            return True
        self._expanded(line)
        if name in NAMESPACE_MAGICS:  # ``names = %who_ls int``: the namespace as it is then
            self.c.reads_all = True
        if name in DEFINING_LINE_MAGICS and line.split():
            # What later cells call (``%alias mk mkdir -p %s``, then ``%mk d``; ``%load_ext
            # autoreload``, then ``%autoreload 2``) is made by this line: run it again.
            self.c.setup.append(f"%{name} {line.split()[0]}")
        if name in OPAQUE_LINE_MAGICS and not (name == "store" and "-r" not in line.split()):
            self.c.opaque.append(f"%{name}")
        elif name in SETUP_LINE_MAGICS and (name == "cd" or "=" in line or " " in line.strip()):
            # (IPython's %env and %set_env set ``os.environ``: IPython/core/magics/osm.py)
            where = " (os.environ)" if name != "cd" else ""
            self.c.setup.append(f"%{name} {line}".strip() + where)
        return True

    def _expanded(self, text: str) -> None:
        """IPython expands ``$name`` and ``{expr}`` in shell commands and magic lines: reads."""
        for name in _expanded_names(text):
            self._load(name)

    def _nested(self, source: str) -> None:
        tree = parse_cell(source, self.transform)
        if tree is None:
            self.c.opaque.append("a magic's body that does not parse")
            return
        for statement in tree.body:
            self.visit(statement)


_DOLLAR = re.compile(r"(?<!\$)\$([A-Za-z_]\w*)")
_BRACES = re.compile(r"(?<!\{)\{([^{}]+)\}(?!\})")


def _expanded_names(text: str) -> set[str]:
    names = set(_DOLLAR.findall(text))
    for expression in _BRACES.findall(text):
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except (SyntaxError, ValueError):
            continue
        names.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return names


def _captures(pattern: ast.pattern) -> set[str]:
    found = set()
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name is not None:
            found.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest is not None:
            found.add(node.rest)
    return found


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
    return _facts(tree, transform, source)


def analyse_cell(raw: str, transform: Transform) -> CellFacts:
    """The facts of a cell as typed: plain Python as it is, anything else (``%magic``, ``!cmd``)
    after ``transform``. Most cells are plain Python, and IPython's transform is the slow part
    (about 1 ms a cell): the usual escapes are rewritten here first (``quick_transform``)."""
    tree = parse_cell(raw, transform)
    if tree is None:
        return CellFacts(opaque="its source does not parse")
    return _facts(tree, transform, raw)


def _shows_a_value(tree: ast.Module, raw: str) -> bool:
    """Whether the cell ends in an expression whose value IPython shows (and keeps as ``_``):
    not one ended by ``;``, nor a call to ``print`` or ``display``, which return None."""
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return False
    value = tree.body[-1].value
    if isinstance(value, ast.Call):
        func = value.func
        if getattr(func, "id", None) in ("print", "display"):
            return False
        ipython = ipython_call(value)
        if ipython is not None and not _magic_shows_a_value(*ipython):
            return False  # (a magic's value: mostly None, ``%matplotlib``'s)
    return not raw.rstrip().endswith(";")


def _magic_shows_a_value(method: str, args: list[ast.expr]) -> bool:
    """Whether a line magic returns a value IPython shows: ``%time expr`` (the expression's,
    IPython/core/magics/execution.py), ``%timeit -o``, ``%who_ls``, ``%sx``, ``%pwd``;
    ``!!cmd`` (``getoutput``). Others return None, and leave ``_`` as it was."""
    if method == "getoutput":
        return True
    name = string(args[0]) if args else None
    line = (string(args[1]) if len(args) > 1 else "") or ""
    if method != "run_line_magic" or name is None:
        return False
    if name == "time":
        try:
            ast.parse(line, mode="eval")
        except SyntaxError:
            return False  # a statement (``%time y = f()``): None
        return True
    return name in ("who_ls", "sx", "pwd") or (name == "timeit" and "-o" in line.split())


# A line that starts with an escape, or assigns one: most likely IPython syntax.
_LIKELY_ESCAPED = re.compile(r"^[ \t]*(?:[\w., \t]+=[ \t]*)?[%!]", re.MULTILINE)


def parse_cell(raw: str, transform: Transform | None) -> ast.Module | None:
    """The cell's tree: as it is, else after ``quick_transform``, else after IPython's."""
    attempts: list[Callable[[], str | None]] = [
        lambda: raw,
        lambda: quick_transform(raw),
        lambda: transform(raw) if transform else None,
    ]
    if _LIKELY_ESCAPED.search(raw):  # saves a failed parse (parsing is most of the cost)
        attempts[:2] = attempts[1::-1]
    for attempt in attempts:
        try:
            source = attempt()
            if source:
                return ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        except Exception:  # IPython could not transform it either
            return None
    return ast.parse("") if not raw.strip() else None


# The escapes most cells use, as IPython's transformer writes them (inputtransformer2): a cell
# magic on the first line; line magics and shell commands alone on a line or assigned.
_ESCAPED_LINE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<lhs>(?:[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*)?)"
    r"(?P<escape>!!|!|%)(?P<rest>.*)$"
)
_MAGIC_NAME = re.compile(r"^([A-Za-z_][\w.]*)\s*(.*)$", re.DOTALL)


def quick_transform(raw: str) -> str | None:
    """What ``shell.transform_cell`` makes of a cell whose IPython syntax is only the usual
    escapes (``%%cell``, ``%line``, ``!cmd``, ``x = !cmd``, ``x = %line``), in a fraction of
    its time (it tokenizes the whole cell); None for anything else (help ``?``, continued
    lines, ``,``/``;``/``/`` calls): then the real transform runs. The names it yields are
    checked against the real transform's by the tests."""
    if raw.startswith("%%"):
        first, _, body = raw.partition("\n")
        found = _MAGIC_NAME.match(first[2:])
        if found is None:
            return None
        name, line = found.group(1), found.group(2).strip()
        body = body if body.endswith("\n") or not body else body + "\n"
        return f"get_ipython().run_cell_magic({name!r}, {line!r}, {body!r})\n"
    out = []
    for line in raw.splitlines():
        stripped = line.strip()
        if stripped.endswith(("?", "\\")) or stripped[:1] in ("?", ",", ";", "/"):
            return None
        found = _ESCAPED_LINE.match(line) if stripped[:1] in "!%" or "=" in line else None
        if found is None or (not found.group("lhs") and stripped[:1] not in "!%"):
            out.append(line)
            continue
        indent, lhs, escape, rest = found.group("indent", "lhs", "escape", "rest")
        if escape == "%":
            magic = _MAGIC_NAME.match(rest)
            if magic is None:
                return None
            call = f"run_line_magic({magic.group(1)!r}, {magic.group(2).strip()!r})"
        elif escape == "!!" or lhs:
            call = f"getoutput({rest!r})"
        else:
            call = f"system({rest!r})"
        out.append(f"{indent}{lhs}get_ipython().{call}")
    return "\n".join(out) + "\n"


# IPython's output history by number: ``Out[n]`` is ``_n``. (``In[n]`` stays a read of ``In``: a
# replay binds ``_in`` again, but cannot put the previous kernel's inputs into this one's list.)
_NUMBERED = ("Out", "_oh")


def _facts(tree: ast.Module, transform: Transform | None, text: str) -> CellFacts:
    visitor = _CellVisitor(transform)
    for statement in tree.body:
        visitor.visit(statement)
    facts = visitor.c.facts()
    defines = facts.defines
    if _shows_a_value(tree, text):  # IPython's displayhook binds ``_`` to what it shows
        defines = defines | {"_"}
    return replace(
        facts,
        defines=defines,
        unrepeatable=unrepeatable(tree, text),
        paths=path_events(tree, text),
    )


# Lines a replay never runs again: our own commands (a restart, a replay), loading extensions,
# installing packages. They are commented out in place, so line numbers stay true.
# Another extension's ``%load_ext`` runs again: the cells after it call its magics
# (``%load_ext autoreload``, then ``%autoreload 2``: "Line magic function not found" otherwise).
_CONTROL = re.compile(
    r"^(?:%(?:cudaguard|pip|conda|mamba|micromamba|uv)\b"
    r"|%(?:load_ext|reload_ext|unload_ext)[ \t]+nb_cudaguard\b"
    r"|!\s*(?:pip|pip3|conda|mamba|uv)\b)",
    re.MULTILINE,
)
SKIPPED = "# (skipped by nb_cudaguard replay) "


def runnable_source(raw: str) -> str:
    """The cell as typed, with its control lines (``%cudaguard``, ``%load_ext``, ``%pip``...)
    commented out."""
    return _CONTROL.sub(lambda m: SKIPPED + m.group(0), raw)
