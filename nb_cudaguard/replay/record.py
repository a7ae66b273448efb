"""What each cell really did, seen while it ran: the names it bound, changed in place or deleted,
the process settings it changed, and the random state it started from.

A replay plans from this where a cell has it, and from the cell's text only where it has not
(cells run before the extension loaded). Changes are seen by comparing cheap fingerprints taken
at the end of each cell (and, for names re-bound between cells, at its start): a tensor's version
counter and data pointer, an array's buffer address and a sample of its values, a container's
length and the identity of what it holds, an ``nn.Module``'s parameters and buffers, an object's
attributes; up to ``MAX_NODES`` objects per name. ElasticNotebook (VLDB'24) and Kishu (VLDB'25)
detect changed objects by identity graphs the same way; no tracing function runs, so a cell's own
Python code pays nothing. What a fingerprint cannot see (a write through ``.data`` or ``.numpy()``,
an element past the sample of a large array, past ``MAX_NODES`` objects) is covered by the text
analysis, which the plan joins to it, and names not seen whole (too large, or holding state
Python cannot read) are listed as such.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import inspect
import random
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import compress, repeat
from operator import itemgetter, ne, not_
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any, Literal

from ..runtime.namespace import Getter as _Reader
from ..runtime.namespace import NamespaceNames, getter
from .rng import RngReader, drawn_from, encode_rng, random_state
from .settings import (
    SET_WHILE_IMPORTING,
    process_settings,
    set_before_failing,
    settings_changed,
)

_CACHED_FUNCTION = getattr(functools, "_lru_cache_wrapper", None)
MAX_NODES = 2000  # objects visited per name
_SAMPLE = 64  # values read from a large array, evenly spread
_KEEP = 500  # records kept in a long session (as runtime.cells)
_KEEP_RNG = 200  # of which with a random state (a few KiB each)
_IMMUTABLE = frozenset({str, bytes, int, float, complex, bool, type(None), range, type(...)})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_CONTAINER_BASES = (list, tuple, dict, set, frozenset, collections.deque)  # (deque: as a list)
_MAY_CHANGE = dict.fromkeys(_IMMUTABLE, False)
_NOT_MODULES = frozenset({"", "__main__", "builtins", "__mp_main__"})


@dataclass(frozen=True)
class CellRecord:
    """What one cell did to the user namespace and the process, seen when it ran."""

    bound: frozenset[str] = frozenset()  # new, or bound to another object
    changed: frozenset[str] = frozenset()  # the same object, changed in place
    deleted: frozenset[str] = frozenset()
    settings: tuple[str, ...] = ()  # process settings it changed (``torch.backends.cudnn...``)
    drew: tuple[str, ...] = ()  # the generators it drew from (``torch``, ``numpy``, ``random``)
    # names not seen whole (too large, or holding C objects whose state Python cannot read): a
    # change inside them may be missed
    unseen: frozenset[str] = frozenset()
    rng: str = ""  # the generators' state when it began (where it drew, or failed), encoded
    # A cell that failed is not run again: what it set in ``os.environ`` before it raised (key,
    # value; None where it removed the key) and the directory it left, for the replay to set
    # again (settings.set_again). Not kept for a cell that succeeded: running it sets them.
    # (Saved with the cells' text, in the profile's private directory: history.save_cells.)
    environ: tuple[tuple[str, str | None], ...] = ()
    cwd: str = ""
    # A cell that failed: the line (of its text as IPython ran it) of the top-level statement
    # its error escaped from, whose predecessors a replay runs again (prefix.py); 0: unknown
    stopped: int = 0

    @property
    def set_again(self) -> frozenset[str]:
        """The settings whose values this record holds (a failed cell's environment and
        directory), which a replay sets again itself."""
        held = (("os.environ", self.environ), ("os.chdir", self.cwd))
        return frozenset(name for name, value in held if value)

    def to_json(self) -> dict[str, Any]:
        return {
            "bound": sorted(self.bound),
            "changed": sorted(self.changed),
            "deleted": sorted(self.deleted),
            "settings": list(self.settings),
            "drew": list(self.drew),
            "unseen": sorted(self.unseen),
            "rng": self.rng,
            "environ": [list(pair) for pair in self.environ],
            "cwd": self.cwd,
            "stopped": self.stopped,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellRecord:
        def names(key: str) -> frozenset[str]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"record {key} is not a list of names")
            return frozenset(value)

        rng, cwd = data.get("rng", ""), data.get("cwd", "")
        if not isinstance(rng, str) or not isinstance(cwd, str):
            raise TypeError("record rng or cwd is not text")
        stopped = data.get("stopped", 0)
        if type(stopped) is not int or stopped < 0:
            raise TypeError("record stopped is not a line number")
        environ = data.get("environ", [])
        if not isinstance(environ, list) or not all(
            isinstance(pair, list)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and isinstance(pair[1], (str, type(None)))
            for pair in environ
        ):
            raise TypeError("record environ is not a list of [key, value or null]")
        return cls(
            names("bound"),
            names("changed"),
            names("deleted"),
            tuple(sorted(names("settings"))),
            tuple(sorted(names("drew"))),
            names("unseen"),
            rng,
            tuple((key, value) for key, value in environ),
            cwd,
            stopped,
        )


# --- fingerprints ---------------------------------------------------------------------------------


def fingerprint(value: Any, limit: int = MAX_NODES) -> tuple[tuple[Any, ...], bool]:
    """(what changes when ``value`` or what it holds changes in place, whether all of it was
    seen within ``limit`` objects)."""
    tokens: list[Any] = []
    whole = _walk([value], tokens, set(), limit)
    return tuple(tokens), whole


def _walk(stack: list[Any], tokens: list[Any], seen: set[int], limit: int = MAX_NODES) -> bool:
    """Adds to ``tokens`` what the objects on ``stack`` and what they hold give; whether all of
    it was seen within ``limit`` objects."""
    append = tokens.append
    whole = True
    through: dict[type, list[Any]] = {}  # each class's ``_read_through``, once a walk
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    _note_types(torch, numpy)
    while stack:
        obj = stack.pop()
        kind = type(obj)
        if kind in _IMMUTABLE or id(obj) in seen:
            append(id(obj))
            continue
        if len(seen) >= limit:
            return False
        seen.add(id(obj))
        if kind in _TOKENS:  # a plain tensor, parameter or array (first: the bulk of a walk)
            token, all_read = _TOKENS[kind](obj)
            append(token)
            whole = whole and all_read
        elif kind in _CONTAINERS or isinstance(obj, _CONTAINER_BASES):
            if len(obj) > limit:
                append((id(obj), len(obj)))
                return False
            if kind not in _CONTAINERS:  # OrderedDict, Counter, a namedtuple: their attributes
                stack.extend(_plain_attributes(obj) or ())  # (a defaultdict's factory: by id)
                stack.extend(through[kind] if kind in through else _read_through(kind, through))
            if isinstance(obj, dict):
                values = tuple(obj.values())
                append((id(obj), tuple(map(id, obj)), tuple(map(id, values))))
                stack.extend(_mutable(values))
            elif isinstance(obj, set | frozenset):
                append((id(obj), len(obj), sum(map(id, obj))))
            else:
                items = tuple(obj)
                append((id(obj), tuple(map(id, items))))
                stack.extend(_mutable(items))
        elif torch is not None and isinstance(obj, torch.Tensor):
            append(_tensor_token(obj))
        elif torch is not None and isinstance(obj, torch.nn.Module):
            if not _module_tokens(obj, append, seen, stack):
                whole = False
        elif torch is not None and isinstance(obj, torch.optim.Optimizer):
            # Its hooks' dicts (``opt.register_step_post_hook(log)``), each by its count.
            hooks = [len(v) for k, v in vars(obj).items() if k.endswith("_hooks") and v]
            append((id(obj), len(obj.state), *hooks))
            for group in obj.param_groups:  # (settings that are no number: Adam's betas)
                settings = [v for k, v in group.items() if k != "params"]
                # its parameters by identity (``group["params"].append(p)`` adds one)
                tokens.append(tuple(map(id, group["params"])))
                tokens.extend(v if type(v) in _IMMUTABLE else id(v) for v in settings)
                stack.extend(_mutable(settings))
            for state in obj.state.values():
                stack.extend(state.values())
        elif numpy is not None and isinstance(obj, numpy.ndarray):
            token, all_read = _array_seen(obj)
            append(token)
            whole = whole and all_read
        elif _defined_in(obj, kind, "__main__"):
            held = _held_by(obj)
            append((id(obj), tuple(map(id, held))))
            stack.extend(_mutable(held))
            if kind is not FunctionType:  # a class: what it inherits, what its metaclass holds
                stack.extend(_notebook_classes(kind) + _notebook_classes(obj)[1:])
        elif torch is not None and isinstance(obj, torch.Generator):
            # A generator of one's own (``torch.Generator().manual_seed(0)``): where it stands.
            append((id(obj), obj.get_state().numpy().tobytes()))
        elif where := _GENERATORS[kind] if kind in _GENERATORS else _generator(kind):
            # A random generator of one's own (``random.Random(1)``, ``np.random.default_rng()``):
            # where it stands, as the global generators' states are read.
            append((id(obj), where(obj)))
            stack.extend(getattr(obj, "__dict__", {}).values())  # (a subclass's attributes)
        elif kind is _CACHED_FUNCTION:  # functools.lru_cache's: its cache fills as it is called
            append((id(obj), obj.cache_info()))
        elif kind is functools.partial:  # what it was handed (``partial(collect, [])``)
            append(id(obj))
            stack.extend((obj.func, obj.args, obj.keywords))
        elif kind is property:  # a class's (walked with its instances): its functions
            append(id(obj))
            stack.extend((obj.fget, obj.fset, obj.fdel))
        elif kind is staticmethod or kind is classmethod:
            append(id(obj))
            stack.append(obj.__func__)
        elif kind is MethodType or kind is BuiltinFunctionType:
            append(id(obj))  # ``log = Logger().write``, ``add = [].append``: the object it is
            if _bound_state(obj):  # bound to
                stack.append(obj.__self__)
        elif isinstance(obj, type):  # a library's class (an ABC's type is ABCMeta): its
            append(_class_token(obj))  # attributes by identity (``tqdm.monitor_interval = 0``)
        elif isinstance(obj, ModuleType) or (callable(obj) and _function_like(kind)):
            append(id(obj))  # a function, class or module: by identity (modules: apart)
        else:
            append((id(obj), kind))
            attributes = _plain_attributes(obj)
            if attributes is None:
                whole = False  # a change inside it cannot be seen
            else:
                stack.extend(attributes)
            stack.extend(through[kind] if kind in through else _read_through(kind, through))
    return whole


def _read_through(kind: type, known: dict[type, list[Any]]) -> list[Any]:
    """What an instance of ``kind`` reads through its classes (noted in ``known``): their data
    descriptors written in Python, the notebook's classes among them."""
    found = known[kind] = _descriptors(kind) + _notebook_classes(kind)
    return found


def _notebook_classes(kind: type) -> list[type]:
    """The notebook's classes among ``kind`` and its bases: an instance reads what they hold
    (``r.tags.append(t)`` with ``tags = []`` on the class; a singleton kept by a metaclass),
    so a change there is a change of the instance."""
    return [base for base in kind.__mro__ if base.__module__ == "__main__"]


def _generator(kind: type) -> Callable[[Any], Any] | Literal[False]:
    """How to read where a random generator of type ``kind`` stands, or False for any other type
    (found once per type)."""
    read: Callable[[Any], Any] | Literal[False] = False
    numpy = sys.modules.get("numpy")
    if issubclass(kind, random.Random):
        if not issubclass(kind, random.SystemRandom):  # (which keeps no state)
            read = random_state
    elif numpy is not None and issubclass(kind, numpy.random.Generator):
        read = _numpy_generator_state
    elif numpy is not None and issubclass(kind, numpy.random.RandomState):
        read = _numpy_legacy_state
    elif numpy is not None and issubclass(kind, numpy.random.BitGenerator):
        read = _bit_generator_state
    if len(_GENERATORS) > 1024:
        _GENERATORS.clear()
    _GENERATORS[kind] = read
    return read


_GENERATORS: dict[type, Callable[[Any], Any] | Literal[False]] = {}


def _numpy_generator_state(generator: Any) -> Any:
    return _frozen(generator.bit_generator.state)  # (PCG64's: 1 us)


def _numpy_legacy_state(legacy: Any) -> Any:
    return _frozen(legacy.get_state(legacy=False))  # (with its cached normal sample)


def _bit_generator_state(bit_generator: Any) -> Any:
    return _frozen(bit_generator.state)


def _frozen(state: Any) -> Any:
    """A generator's state as values ``==`` compares: its dicts as items, its arrays as bytes."""
    if isinstance(state, dict):
        return tuple((k, _frozen(v)) for k, v in state.items())
    tobytes = getattr(state, "tobytes", None)
    return tobytes() if tobytes is not None else state


def _class_token(kind: type) -> tuple[int, int]:
    """A library class by how many times its attributes were seen to change: setting one
    (``tqdm.monitor_interval = 0``) changes no object a walk would reach. Its values are kept
    from the last look and compared as a tuple, which compares the same objects by identity
    alone (a class's hundred attributes: no id built for each, at every cell of a notebook
    that imported ``Trainer``)."""
    values = tuple(vars(kind).values())
    last = _CLASSES.get(id(kind))
    if last is None or last[0] is not kind:
        if len(_CLASSES) > 1024:
            _CLASSES.clear()
        _CLASSES[id(kind)] = (kind, values, 0)
        return (id(kind), 0)
    try:
        same = values == last[1]
    except Exception:  # an attribute replaced by one whose ``==`` raises (an array)
        same = False
    if same:
        return (id(kind), last[2])
    _CLASSES[id(kind)] = (kind, values, last[2] + 1)
    return (id(kind), last[2] + 1)


# id of a class -> (the class, its attributes' values at the last look, changes seen so far)
_CLASSES: dict[int, tuple[type, tuple[Any, ...], int]] = {}


def _module_tokens(
    root: Any, append: Callable[[Any], None], seen: set[int], stack: list[Any]
) -> bool:
    """An ``nn.Module``'s and its submodules' parameters, buffers and own attributes
    (``self.history = []``; ``training``), read from each one's ``__dict__``: torch's
    bookkeeping starts with ``_``. False where a module keeps them elsewhere (not seen whole)."""
    modules = [root]
    for module in modules:  # (grows as children are found)
        state = module.__dict__
        keys = tuple(state)
        readers = _READERS_BY_KEYS.get(keys)
        if readers is None:
            readers = _module_readers(state, keys)
            if readers is None:  # a module that never ran nn.Module.__init__
                return False
        parameters, buffers, children = readers[0](state)
        for tensor in parameters.values():
            if tensor is not None:
                append(_tensor_token(tensor))
        for tensor in buffers.values():
            if tensor is not None:
                append(_tensor_token(tensor))
        hooks = readers[1](state)  # (register_forward_hook): most modules have none
        append(tuple(map(len, hooks)) if any(hooks) else 0)
        own = readers[2](state)
        append(tuple(map(id, own)))
        if not _IMMUTABLE.issuperset(map(type, own)):  # ``self.history = []``: walked
            stack.extend(_mutable(own))
        if type(module).__module__ == "__main__":  # ``type(self).calls += 1`` in ``forward``
            stack.extend(_notebook_classes(type(module)))
        for child in children.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                modules.append(child)
    return True


# A module's ``__dict__`` keys, in order -> readers of its torch parts, of its hooks' dicts and
# of its own values (``training``, ``in_features``, ``self.history``): found once per key
# order (most modules of a model share a few). In order, not as a set: a tuple is cheaper to
# build, and a module whose keys were set in another order only gets readers of its own.
_READERS_BY_KEYS: dict[tuple[str, ...], tuple[_Reader, _Reader, _Reader]] = {}


def _module_readers(
    state: dict[str, Any], keys: tuple[str, ...]
) -> tuple[_Reader, _Reader, _Reader] | None:
    if not {"_parameters", "_buffers", "_modules"} <= state.keys():
        return None
    if len(_READERS_BY_KEYS) > 256:
        _READERS_BY_KEYS.clear()
    # Its hooks' dicts, each by its count: forward and backward, and those of ``state_dict``
    # and ``load_state_dict`` (``_register_state_dict_hook``), whichever this torch has.
    found = [k for k in keys if k[:1] == "_" and k.endswith("hooks")]
    # Own values: its public keys and its private ones that are not torch's own bookkeeping
    # (``self._calls += 1`` in ``forward``).
    public = sorted(k for k in keys if k[:1] != "_" or k not in _TORCH_KEYS)
    readers = (
        itemgetter("_parameters", "_buffers", "_modules"),
        getter(found),
        getter(public),
    )
    _READERS_BY_KEYS[keys] = readers
    return readers


def _note_types(torch: Any, numpy: Any) -> None:
    """torch's, numpy's and pandas' types, once imported: how their values are read (each noted
    once)."""
    if not _PANDAS_NOTED:
        _note_pandas()
    if torch is not None and "torch" not in _NOTED:
        _MODULE[:] = [torch.nn.Module]
        _TORCH_KEYS.update(vars(torch.nn.Module()))
        _TENSORS.update({torch.Tensor, torch.nn.Parameter})
        _TOKENS.update(dict.fromkeys(_TENSORS, _tensor_seen))
        fixed = (torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)
        _FIXED_TYPES.update(fixed)
        _LEAVES.update(_TENSORS)
        _NOTED.add("torch")
    if numpy is not None and "numpy" not in _NOTED:
        _TOKENS[numpy.ndarray] = _array_seen
        _LEAVES.add(numpy.ndarray)
        _NOTED.add("numpy")


_NOTED: set[str] = set()  # "torch", "numpy", once their types are noted
_PANDAS_NOTED: list[bool] = []  # [True] once pandas' types are noted


def _note_pandas() -> None:
    """pandas' block managers and indexes, once pandas is imported (whole: ``DataFrame`` is set
    last in pandas/__init__.py): a frame's manager is a C object (pandas/_libs/internals.pyx),
    which a walk could not see into, and an index fills a ``_cache`` dict as it is read
    (``_engine``, ``is_unique``), which a walk would take for a change."""
    pandas = sys.modules.get("pandas")
    if pandas is None or not hasattr(pandas, "DataFrame"):
        return
    managers = sys.modules.get("pandas.core.internals.managers")
    index = getattr(pandas, "Index", None)
    if managers is None or not isinstance(index, type):
        return
    for name in ("BlockManager", "SingleBlockManager"):
        kind = getattr(managers, name, None)
        if isinstance(kind, type):
            _TOKENS[kind] = _manager_seen
    kinds = [index]
    for kind in kinds:  # pandas' own subclasses (RangeIndex, MultiIndex, DatetimeIndex...)
        _TOKENS[kind] = _index_seen
        kinds += kind.__subclasses__()
    _PANDAS_NOTED.append(True)


def _index_seen(index: Any) -> tuple[tuple[Any, ...], bool]:
    """An index by its identity and names: its values never change in place ("Immutable
    sequence used for indexing and alignment", ``Index.__setitem__`` raises: pandas/core/
    indexes/base.py); ``df.index.name = "id"`` sets a name."""
    return (id(index), tuple(index.names)), True


def _manager_seen(manager: Any) -> tuple[tuple[Any, ...], bool]:
    """A frame's or series' block manager (pandas/core/internals/managers.py): its axes, its
    blocks, where each block's columns go (``mgr_locs``) and each block's values, read as an
    array's are. A new, dropped or renamed column, a new index or dtype gives other blocks or
    axes; a write in place (``df.loc[m, "c"] = v``, ``fillna(inplace=True)``) changes a block's
    values."""
    tokens: list[Any] = [id(manager)]
    tokens += [_index_seen(axis)[0] for axis in manager.axes]
    whole = True
    for block in manager.blocks:
        token, all_read = _block_values_seen(block.values)
        tokens.append((id(block), id(block.mgr_locs), token))
        whole = whole and all_read
    return tuple(tokens), whole


def _block_values_seen(values: Any) -> tuple[Any, bool]:
    """A block's values: a numpy array; an extension array over one (``Categorical``'s codes,
    datetimes, the python-backed ``str`` dtype: ``_ndarray``, pandas/_libs/arrays.pyx), over
    values and a mask (``Int64``: ``_data``, ``_mask``, pandas/core/arrays/masked.py), or over
    an Arrow array, which never changes in place (``_pa_array``, replaced by a write:
    pandas/core/arrays/arrow/array.py). Any other: not seen whole."""
    numpy = sys.modules["numpy"]
    if type(values) is numpy.ndarray:
        return _array_seen(values)
    inner = getattr(values, "_ndarray", None)
    if isinstance(inner, numpy.ndarray):
        token, whole = _array_seen(inner)
        return (id(values), id(values.dtype), token), whole
    data, mask = getattr(values, "_data", None), getattr(values, "_mask", None)
    if isinstance(data, numpy.ndarray) and isinstance(mask, numpy.ndarray):
        (data_token, data_whole), (mask_token, mask_whole) = _array_seen(data), _array_seen(mask)
        return (id(values), data_token, mask_token), data_whole and mask_whole
    arrow = getattr(values, "_pa_array", None)
    if arrow is not None:
        return (id(values), id(arrow)), True
    return (id(values), type(values)), False


def _called_in_python(kind: type) -> bool:
    """Whether ``kind``'s instances are called through a ``__call__`` written in Python (an
    early stopper ``stopper(val_loss)``, a transform, a metric): objects with state, walked like
    any other; a function, a class or a C callable is seen by identity."""
    found = _CALLED_IN_PYTHON.get(kind)
    if found is None:
        if len(_CALLED_IN_PYTHON) > 256:  # (classes defined again and again in a long session)
            _CALLED_IN_PYTHON.clear()
        # (the class's attribute, not ``callable()``: a C-level ``__call__`` is a slot wrapper)
        call = inspect.getattr_static(kind, "__call__", None)
        found = _CALLED_IN_PYTHON[kind] = isinstance(call, FunctionType)
    return found


_CALLED_IN_PYTHON: dict[type, bool] = {}


def _function_like(kind: type) -> bool:
    """Whether ``kind``'s callables are functions, seen by identity: not called through a
    Python ``__call__``, and a function's type (builtins', numpy's ufuncs, a Cython function
    with its ``__code__``, operator's getters). A C callable that keeps state of its own is
    not: ``sqlite3.connect(':memory:')`` holds a database an INSERT changes, a ctypes
    function pointer its ``restype``; walked as any other C object (not seen whole)."""
    found = _FUNCTION_LIKE.get(kind)
    if found is None:
        if len(_FUNCTION_LIKE) > 256:
            _FUNCTION_LIKE.clear()
        module = kind.__module__.partition(".")[0]
        found = _FUNCTION_LIKE[kind] = not _called_in_python(kind) and (
            module in _FUNCTION_MODULES
            or module in _FIXED_MODULES
            or inspect.getattr_static(kind, "__code__", None) is not None
        )
    return found


_FUNCTION_LIKE: dict[type, bool] = {}
# Modules whose C callables hold no state a cell changes: functions, descriptors, a
# ``weakref.ref`` (what it refers to is walked where a name holds it), ``itemgetter(1)``,
# torch's compiled functions (its stateful objects have branches of their own in the walk).
_FUNCTION_MODULES = frozenset(
    {"builtins", "operator", "_operator", "functools", "weakref", "torch"}
)


def _held_by(definition: Any) -> list[Any]:
    """The state a notebook function or class holds: a function's closure (a counter ``tick()``
    advances), defaults (``def collect(x, seen=[])``) and attributes (``log_step.n += 1``, a
    decorator's ``wrapper.calls += 1``: by name, so a new one counts); a class's own attributes
    (``Registry.items``), not its methods' code."""
    if isinstance(definition, type):
        return [v for k, v in vars(definition).items() if k[:2] != "__"]
    closure = [_cell_contents(c) for c in definition.__closure__ or ()]
    defaults = definition.__defaults__ or ()
    held = [*closure, *defaults, *(definition.__kwdefaults__ or {}).values()]
    attributes = definition.__dict__
    if attributes:  # (most functions have none: no tuple built for them)
        held += [*attributes, *attributes.values()]  # (its keys: the dict's own strings)
    return held


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a closure variable not bound yet
        return None


def _mutable(items: Iterable[Any]) -> Iterable[Any]:
    """The items that may change in place (a C-level filter: no Python call per item)."""
    items = tuple(items)
    if _IMMUTABLE.issuperset(map(type, items)):  # numbers, strings: nothing to walk
        return ()
    return compress(items, map(_MAY_CHANGE.get, map(type, items), repeat(True)))


def _tensor_token(tensor: Any) -> tuple[Any, ...]:
    try:
        pointer = tensor.data_ptr()
    except Exception:  # sparse, meta, or a tensor subclass without storage
        pointer = None
    # What moves no version counter: ``requires_grad`` (``p.requires_grad_(False)`` freezes a
    # layer), hooks (``w.register_hook(clip)``, and ``register_post_accumulate_grad_hook``'s,
    # kept apart: torch >= 2.1), attributes (``p.no_decay = True``).
    requires_grad = tensor.requires_grad
    hooks, own = tensor._backward_hooks, tensor.__dict__
    if requires_grad:  # (hooks, grads and retain_grad() need it: the rest reads nothing more)
        after = getattr(tensor, "_post_accumulate_grad_hooks", None)
        if after:
            hooks = (*(hooks or ()), *after)
        # A leaf's grad, and a non-leaf's where ``h.retain_grad()`` asked torch to fill it
        # (reading another non-leaf's .grad makes torch warn: it is never filled).
        leaf = tensor.is_leaf
        retains = not leaf and tensor.retains_grad
        grad = tensor.grad if leaf or retains else None
        if grad is not None:
            token: tuple[Any, ...] = (id(tensor), tensor._version, pointer, id(grad), grad._version)
        else:
            token = (id(tensor), tensor._version, pointer, True, retains)
    else:
        token = (id(tensor), tensor._version, pointer, False)
    if hooks or own:  # (most tensors have neither: no tuple built for them)
        return (*token, hooks and tuple(hooks), own and (tuple(own), tuple(map(id, own.values()))))
    return token


def _array_seen(array: Any) -> tuple[tuple[Any, ...], bool]:
    """An array's token and whether it read every value: a small array's values all (in any
    layout), a large one's spread evenly (a change between the samples may be missed; a
    tensor's version counter always sees one); an object array's items are not read."""
    size, dtype = array.size, array.dtype
    whole = False
    if dtype.hasobject:
        sample: Any = None
    elif size <= _SAMPLE:
        sample, whole = array.tobytes(), True
    elif array.ndim == 1:  # (the same values as ``ravel()`` gives, one view fewer)
        sample = array[:: size // _SAMPLE].tobytes()
    elif array.flags.c_contiguous:
        sample = array.ravel()[:: size // _SAMPLE].tobytes()
    else:
        sample = array.flat[:: size // _SAMPLE].tobytes()
    return (id(array), array.shape, dtype.num, sample), whole


def _tensor_seen(tensor: Any) -> tuple[tuple[Any, ...], bool]:
    return _tensor_token(tensor), True


def _plain_attributes(obj: Any) -> list[Any] | None:
    """An object's attributes, or None where its state is not all in them (a C object without
    a ``__dict__``, ``__slots__``): not seen whole. Types whose values never change are seen
    whole by what they are (``torch.device``, a numpy scalar, a path, a date)."""
    kind = type(obj)
    if kind.__module__ in _FIXED_MODULES or kind in _FIXED_TYPES:
        return []
    slots = _slots(kind)
    if slots is not None:  # ``__slots__`` of Python classes (``@dataclass(slots=True)``)
        values: list[Any] = [getattr(obj, name, _UNSET) for name in slots]
        values += vars(obj).values() if hasattr(obj, "__dict__") else ()
        return values
    try:
        attributes = vars(obj)
    except TypeError:
        return None
    if not isinstance(attributes, dict) or _c_state(kind):
        return None
    if "_cache" in attributes and kind.__module__.startswith("pandas."):
        # pandas' ``cache_readonly`` memo (pandas/_libs/properties.pyx, ``CachedProperty``):
        # filled as the object is read (a groupby's grouper, ``gb.size()``), never a change.
        return [value for key, value in attributes.items() if key != "_cache"]
    return list(attributes.values())


def _descriptors(kind: type) -> list[Any]:
    """The data descriptors written in Python on ``kind``'s classes: ``obj.lr = 0.5`` through
    one's ``__set__`` may keep the value in the descriptor (a ``WeakKeyDictionary`` keyed by
    the instance), not in the instance, so the instance's state includes what they hold.
    (``property`` and slots' descriptors are written in C and keep nothing of their own.)"""
    bases = kind.__mro__[:-1]
    sizes = tuple(len(vars(base)) for base in bases)  # a class given an attribute: look again
    found = _DESCRIPTORS.get(kind)
    if found is not None and found[0] == sizes:
        return found[1]
    descriptors = [
        value
        for base in bases
        for value in vars(base).values()
        if type(value).__flags__ & _HEAP_TYPE and _sets_in_python(type(value))
    ]
    if len(_DESCRIPTORS) > 256:
        _DESCRIPTORS.clear()
    _DESCRIPTORS[kind] = (sizes, descriptors)
    return descriptors


def _sets_in_python(kind: type) -> bool:
    """Whether ``kind``'s ``__set__`` or ``__delete__`` is Python code (one of Cython, as
    pandas' ``AxisProperty``, keeps nothing of its own but C fields)."""
    for base in kind.__mro__:
        for name in ("__set__", "__delete__"):
            if isinstance(vars(base).get(name), FunctionType):
                return True
    return False


# a class -> (its classes' attribute counts when looked at, its data descriptors then)
_DESCRIPTORS: dict[type, tuple[tuple[int, ...], list[Any]]] = {}


def _c_state(kind: type) -> bool:
    """Whether instances of ``kind`` may hold state outside their ``__dict__``: ``__slots__``,
    or a base written in C with fields of its own (``random.Random``'s generator state): then
    an instance is larger than one of a plain class."""
    return bool(kind.__basicsize__ > _PLAIN_SIZE)


def _slots(kind: type) -> tuple[str, ...] | None:
    """The slot names of a class whose instances hold all their state in ``__slots__`` (and
    maybe a ``__dict__``): every class of its MRO but ``object`` written in Python. None for
    any other class (no slots, or a base written in C: its state Python cannot read)."""
    found = _SLOTS.get(kind, False)
    if found is not False:
        return found  # type: ignore[return-value]
    bases = kind.__mro__[:-1]
    names: list[str] = []
    if all(base.__flags__ & _HEAP_TYPE for base in bases):
        for base in bases:
            declared = vars(base).get("__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if name in ("__dict__", "__weakref__"):
                    continue
                private = name[:2] == "__" and name[-2:] != "__"
                names.append(f"_{base.__name__.lstrip('_')}{name}" if private else name)
    result = tuple(names) if names else None
    if len(_SLOTS) > 256:
        _SLOTS.clear()
    _SLOTS[kind] = result
    return result


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class written in Python
_SLOTS: dict[type, tuple[str, ...] | None] = {}
_UNSET = ...  # a slot not set yet (a value that needs no walk)


class _Plain:
    pass


_PLAIN_SIZE = _Plain.__basicsize__


# Modules whose C types' values never change in place, and such types of torch's and numpy's
# (noted by ``fingerprint`` once imported).
_FIXED_MODULES = frozenset(
    {"datetime", "decimal", "fractions", "re", "uuid", "pathlib", "ipaddress", "numpy"}
)  # numpy: its scalars and dtypes (an array is read apart; numpy.random's generators are not here)
_FIXED_TYPES: set[type] = set()


# --- the recorder ---------------------------------------------------------------------------------


_Seen = tuple[int, tuple[Any, ...], bool]  # (id of the value, its fingerprint, seen whole)
_FIRST = itemgetter(0)
_THIRD = itemgetter(2)
_AT_ONCE = 64  # names from which a cell's end compares them in C
_NONE: frozenset[str] = frozenset()


@dataclass
class Recorder:
    """Fingerprints the namespace at the end of each cell and says what the cell did.

    ``hidden``: names that are not the user's (IPython's own); ``own_modules``: which of the
    given top-level module names are the notebook's own (their globals count as its state).
    The random state is read once per cell, at its start: whether a cell drew is known when the
    next one starts (or at ``settle``), and its start state is kept only then.
    """

    hidden: Collection[str] = frozenset()
    own_modules: Callable[[Collection[str]], Collection[str]] = lambda names: ()
    records: dict[int, CellRecord] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _modules: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _own: dict[str, bool] = field(default_factory=dict)  # module name -> the notebook's own
    _origin: dict[str, str] = field(default_factory=dict)  # name -> its value's module
    _own_used: list[str] | None = None  # the own modules among them (None: to be found)
    _settings: tuple[Any, ...] = ()  # process_settings()
    _rng: dict[str, Any] = field(default_factory=dict)  # at the start of the last cell
    _reader: RngReader = field(default_factory=RngReader)
    _rng_cell: int | None = None  # that cell, once it finished
    _rng_kept: list[int] = field(default_factory=list)  # cells whose record holds a state
    _space: NamespaceNames = field(init=False)  # the user's names (``renamed``: since ``_ids``)
    _ids: tuple[int, ...] = ()  # the user's values' ids at the last cell's end, in order
    _depth: int = 0
    _primed: bool = False
    _put_back: dict[str, _Seen] = field(default_factory=dict)  # restored names, as restored
    _quiet: CellRecord = CellRecord()  # the last record of a cell that changed nothing
    _loaded: int = 0  # how many modules were loaded when the last cell began

    def __post_init__(self) -> None:
        self._space = NamespaceNames(self._users)

    def _users(self, name: str) -> bool:
        return name[:1] != "_" and name not in self.hidden

    def put_back(self, names: Iterable[str], namespace: Mapping[str, Any]) -> None:
        """``names`` were put into ``namespace`` just now (a restore, a replay's rebuild): what
        they hold now is the baseline of ``changed_since_put_back``."""
        for name in names:
            if name in namespace:
                self._put_back[name] = _see(namespace[name])

    @property
    def put_back_names(self) -> frozenset[str]:
        return frozenset(self._put_back)

    def changed_since_put_back(self, namespace: Mapping[str, Any]) -> tuple[str, ...]:
        """The names put back that the user re-bound, changed in place or deleted since."""
        changed = []
        for name, seen in self._put_back.items():
            if name not in namespace:
                changed.append(name)
                continue
            now = _see(namespace[name])
            if now[0] != seen[0] or now[1] != seen[1]:
                changed.append(name)
        return tuple(sorted(changed))

    def prime(self, namespace: Mapping[str, Any]) -> None:
        """Take the namespace as it is now as the state before the next cell."""
        names, values = self._space.read(namespace)
        self._seen = dict(zip(names, map(_see, values), strict=True))
        self._ids, self._space.renamed = tuple(map(_FIRST, self._seen.values())), False
        self._origin = dict(zip(names, map(_module_of, values), strict=True))
        self._own_used = None
        self._modules = self._see_modules()
        self._settings = process_settings()
        self._primed = True

    def start(self, namespace: Mapping[str, Any]) -> None:
        """At a cell's start: its random state; names re-bound since the last cell ended (a
        restore, a widget's callback) are taken as they are now: the cell did not bind them."""
        self._depth += 1
        if self._depth > 1:
            return  # a replay's nested cells: the outer cell's record covers them
        if not self._primed:
            self.prime(namespace)
        else:
            # Between cells the namespace rarely changes: one pass in C over the values' ids
            # tells whether any name must be looked at (for the same names only: a freed
            # value's id is often the next one's).
            try:
                ids = tuple(map(id, self._space.values(namespace)))
            except KeyError:  # (names went in a way the count cannot tell: read again below)
                ids = ()
            if self._space.renamed or ids != self._ids:
                (names, values), seen = self._space.read(namespace), self._seen
                for name, value in zip(names, values, strict=True):
                    before = seen.get(name)
                    if before is None or before[0] != id(value):
                        seen[name] = _see(value)
                        self._note_origin(name, value)
                if len(seen) != len(names):  # (every name is in it now: what is left went)
                    for name in seen.keys() - names:
                        del seen[name]
                        self._forget_origin(name)
        self._rng = self._settle_rng(self._reader.read())
        self._loaded = len(sys.modules)

    def finish(
        self, namespace: Mapping[str, Any], cell: int | None, failed: bool, stopped: int = 0
    ) -> None:
        """At a cell's end: what it did, kept by its execution count (``None``: not kept);
        ``stopped``: where a failed cell raised (``CellRecord.stopped``)."""
        if self._depth > 1 or not self._primed:
            self._depth = max(0, self._depth - 1)
            return
        self._depth = 0
        # The fingerprints are thousands of small tuples on a large namespace: without a pause,
        # CPython's collector runs every 700 of them and walks every tracked object of the
        # process now and then (a sixth of the time). They make no cycles; the collector runs
        # once afterwards as usual. Paused only where the user has not turned it off.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            self._finish(namespace, cell, failed, stopped)
        finally:
            if collecting:
                gc.enable()

    def _finish(
        self, namespace: Mapping[str, Any], cell: int | None, failed: bool, stopped: int
    ) -> None:
        previous = self._seen
        names, values = self._space.read(namespace)
        moved: Iterable[str]
        if len(names) > _AT_ONCE:
            # Most names do not move between cells: the ones that did are found in C, and only
            # they are looked at one by one.
            fingerprints = list(map(_see, values))
            now = dict(zip(names, fingerprints, strict=True))
            if not self._space.renamed and len(previous) == len(fingerprints):
                # the same names in the same order as at the last look: compared in place
                moved = compress(names, map(ne, fingerprints, previous.values()))
            else:
                moved = compress(names, map(ne, fingerprints, map(previous.get, names)))
            unseen = list(compress(names, map(not_, map(_THIRD, fingerprints))))
        else:  # a few names: one pass in Python costs less than setting up the passes in C
            now, moved, unseen = {}, [], []
            for name, value in zip(names, values, strict=True):
                now[name] = seen = _see(value)
                if seen != previous.get(name):
                    moved.append(name)
                if not seen[2]:
                    unseen.append(name)
        bound, changed = [], []
        fresh = 0
        for name in moved:
            seen, before = now[name], previous.get(name)
            if before is None or before[0] != seen[0]:
                bound.append(name)
                self._note_origin(name, namespace[name])
                fresh += before is None
            elif before[1] != seen[1]:
                changed.append(name)
        # Only where the count says some went: a set difference costs a pass over the names.
        deleted = previous.keys() - now.keys() if len(previous) + fresh != len(now) else set()
        for name in deleted:
            self._forget_origin(name)
        modules = self._see_modules()
        if modules != self._modules:  # a module's global re-bound (``cfg.LR = 0.5``)
            shifted = {m for m, v in modules.items() if self._modules.get(m, v) != v}
            changed += [n for n, m in self._origin.items() if m in shifted and n not in bound]
        settings = process_settings()
        changed_settings: tuple[str, ...] = ()
        all_moved: tuple[str, ...] = ()
        if settings != self._settings:
            changed_settings = all_moved = settings_changed(self._settings, settings)
            if len(sys.modules) != self._loaded:
                # Modules loaded during the cell set these as they load (numpy and torch add
                # warnings filters, some libraries environment variables): a new process's
                # imports set them again. A cell's own ``os.environ[k] = v``, ``sys.path.
                # insert(...)``, ``warnings.filterwarnings(...)`` still count by its text.
                changed_settings = tuple(
                    n for n in changed_settings if n not in SET_WHILE_IMPORTING
                )
        # (all it moved: what an import set too, the same values a new process's import sets;
        # a failed cell's traceback itself may be what imported modules)
        environ, cwd = set_before_failing(self._settings, settings, all_moved, failed)
        self._seen, self._modules, self._settings = now, modules, settings
        self._ids, self._space.renamed = tuple(map(_FIRST, now.values())), False
        self._rng_cell = cell
        if cell is None:
            return
        hidden_from_view = frozenset(unseen) if unseen else _NONE
        stopped = stopped if failed else 0
        if bound or changed or deleted or changed_settings or stopped or (failed and self._rng):
            record = CellRecord(
                frozenset(bound) if bound else _NONE,
                frozenset(changed) if changed else _NONE,
                frozenset(deleted) if deleted else _NONE,
                changed_settings,
                (),
                hidden_from_view,
                encode_rng(self._rng) if failed and self._rng else "",
                environ,
                cwd,
                stopped,
            )
        else:  # most cells change nothing: one record, immutable, shared while the same
            record = self._quiet
            if record.unseen != hidden_from_view:
                record = self._quiet = CellRecord(unseen=hidden_from_view)
        self.records[cell] = record
        if failed and self._rng:
            self._rng_kept.append(cell)
        if len(self.records) > 2 * _KEEP or len(self._rng_kept) > _KEEP_RNG:
            self._forget_old()

    def settle(self) -> dict[int, CellRecord]:
        """The records, the last cell's draws included (known at the next cell's start)."""
        self._settle_rng(self._reader.read())
        return self.records

    def _settle_rng(self, now: dict[str, Any]) -> dict[str, Any]:
        """The last finished cell drew where the state moved since it began: its record says
        so, and keeps the state it began with."""
        cell, self._rng_cell = self._rng_cell, None
        record = self.records.get(cell) if cell is not None else None
        if record is not None and self._rng:
            drew = drawn_from(self._rng, now)
            if drew:
                rng = record.rng or encode_rng(self._rng)
                self.records[cell] = replace(record, drew=drew, rng=rng)  # type: ignore[index]
                if not record.rng:
                    self._rng_kept.append(cell)  # type: ignore[arg-type]
        return now

    def _forget_old(self) -> None:
        if len(self.records) > 2 * _KEEP:
            for old in sorted(self.records)[:-_KEEP]:
                del self.records[old]
        while len(self._rng_kept) > _KEEP_RNG:
            old = self._rng_kept.pop(0)
            if old in self.records:
                self.records[old] = replace(self.records[old], rng="")

    def _note_origin(self, name: str, value: Any) -> None:
        module = _module_of(value)
        if self._origin.get(name) != module:
            self._origin[name] = module
            self._own_used = None

    def _forget_origin(self, name: str) -> None:
        if self._origin.pop(name, None) is not None:
            self._own_used = None

    def _see_modules(self) -> dict[str, tuple[Any, ...]]:
        """The notebook's own modules' globals, for the modules the namespace uses."""
        # Not the namespace itself (IPython's __main__ module) nor builtins: not imported code.
        if self._own_used is None:  # the names' modules changed since the last look
            names = set(self._origin.values()) - _NOT_MODULES
            unknown = [n for n in names if n not in self._own]
            if unknown:
                own = set(self.own_modules(unknown))
                self._own.update((n, n in own) for n in unknown)
            self._own_used = sorted(n for n in names if self._own[n])
        found = {}
        for name in self._own_used:
            module = sys.modules.get(name)
            if module is not None:
                found[name] = tuple(
                    (k, _see_global(v, name))
                    for k, v in sorted(vars(module).items())
                    if k[:2] != "__"
                )
        return found


# torch.Tensor, nn.Parameter and numpy.ndarray, once imported (noted by ``fingerprint``): the
# function giving their token.
_TOKENS: dict[type, Callable[[Any], tuple[tuple[Any, ...], bool]]] = {}
_MODULE: list[type] = []  # torch.nn.Module, once imported
_TORCH_KEYS: set[str] = set()  # the ``__dict__`` keys of a bare nn.Module, once imported


# Seen by identity alone, without walking them: a module, a library's function or a class
# holds no state of the namespace's (an own module's globals are seen apart, in
# ``_see_modules``; a notebook function's or class's own state is walked, ``_held_by``).
_BY_IDENTITY = frozenset({ModuleType, BuiltinFunctionType, *_IMMUTABLE})


def _see(value: Any) -> _Seen:
    kind = type(value)
    see = _SEE_BY_KIND.get(kind)
    if see is None:
        see = _seer(kind)
    try:
        return see(value)
    except Exception:  # an object whose attributes raise: seen by identity only
        return (id(value), (id(value),), False)


def _seer(kind: type) -> Callable[[Any], _Seen]:
    """How a value of ``kind`` is seen, found once per type rather than asked of each name's
    value at every cell's end."""
    # Tensors and arrays noted as leaves first, as the walk does: else the first look at a list
    # of tensors walks it and the next reads it as a leaf list, in another order, which reads as
    # a change that never happened.
    _note_types(sys.modules.get("torch"), sys.modules.get("numpy"))
    see: Callable[[Any], _Seen]
    if kind in _TENSORS:
        see = _see_tensor
    elif kind in _TOKENS:  # an array
        see = _see_leaf
    elif kind is BuiltinFunctionType:
        see = _see_builtin
    elif kind in _BY_IDENTITY:  # a third of a notebook's names: no walk
        see = _see_identity
    elif kind is FunctionType:
        see = _see_function
    elif kind in _PLAIN:
        see = _see_plain
    elif _MODULE and issubclass(kind, _MODULE[0]):
        see = _see_module
    elif issubclass(kind, type):  # a class (ABCMeta's, torch's)
        see = _see_class
    else:
        see = _see_walked
    if len(_SEE_BY_KIND) > 1024:  # (classes defined again and again in a long session)
        _SEE_BY_KIND.clear()
    _SEE_BY_KIND[kind] = see
    return see


_SEE_BY_KIND: dict[type, Callable[[Any], _Seen]] = {}
_TENSORS: set[type] = set()  # torch.Tensor and nn.Parameter, once imported


def _see_tensor(value: Any) -> _Seen:
    # A plain tensor, the bulk of a large namespace: its token at once, as the walk gives it.
    return (id(value), (_tensor_token(value),), True)


def _see_leaf(value: Any) -> _Seen:
    token, whole = _TOKENS[type(value)](value)
    return (id(value), (token,), whole)


def _see_identity(value: Any) -> _Seen:
    return (id(value), (id(value),), True)


def _see_function(value: Any) -> _Seen:
    if value.__module__ != "__main__":  # a library's: by identity
        return (id(value), (id(value),), True)
    return _see_walked(value)  # the notebook's: with the state it holds


def _see_builtin(value: Any) -> _Seen:
    if _bound_state(value):  # ``add = [].append``: walked, for the object it is bound to
        return _see_walked(value)
    return (id(value), (id(value),), True)


def _see_plain(value: Any) -> _Seen:
    if len(_NOTED) < 2:  # (torch or numpy imported since: their leaves noted)
        _note_types(sys.modules.get("torch"), sys.modules.get("numpy"))
    plain = _plain_tokens(value, type(value))
    if plain is not None:
        return (id(value), *plain)
    return _see_walked(value)


def _see_module(value: Any) -> _Seen:
    # A model: no walk unless it holds more than torch's parts and plain values.
    found: list[Any] = []
    seen, rest = {id(value)}, list[Any]()
    whole = _module_tokens(value, found.append, seen, rest)
    if rest:
        whole = _walk(rest, found, seen) and whole
    return (id(value), tuple(found), whole)


def _see_class(value: Any) -> _Seen:
    if value.__module__ != "__main__":
        return (id(value), (_class_token(value),), True)
    return _see_walked(value)  # the notebook's: with the state it holds


def _see_walked(value: Any) -> _Seen:
    tokens, whole = fingerprint(value)
    return (id(value), tokens, whole)


def _bound_state(function: Any) -> bool:
    """Whether a method is bound to an object with state of the namespace's (``[].append``); not
    to a module (``math.sqrt``) nor to a global generator, whose state the record reads
    apart (``from random import random``, ``np.random.rand``)."""
    bound = function.__self__
    if bound is None or isinstance(bound, ModuleType) or bound is getattr(random, "_inst", None):
        return False
    return bound is not getattr(sys.modules.get("numpy.random.mtrand"), "_rand", None)


def _defined_in(value: Any, kind: type, module: str) -> bool:
    """Whether ``value`` is a function or class defined in ``module`` (the notebook's, or one
    of its own modules): walked with the state it holds (``_held_by``)."""
    return (kind is FunctionType or isinstance(value, type)) and value.__module__ == module


def _see_global(value: Any, module: str) -> tuple[Any, ...]:
    """A notebook module's global: as any value, but its own classes and functions with the
    state they hold (``class Registry: items = []`` filled by ``Registry.add(x)``), as the
    notebook's own are."""
    if _defined_in(value, type(value), module):
        tokens: list[Any] = [id(value)]
        with contextlib.suppress(Exception):  # an attribute that raises: what was read
            _walk(_held_by(value), tokens, {id(value)})
        return tuple(tokens)
    return _see(value)[1]


_PLAIN = frozenset({list, tuple, dict})


def _plain_tokens(value: Any, kind: type) -> tuple[tuple[Any, ...], bool] | None:
    """What the walk would give a list, tuple or dict of numbers, names, tensors and arrays, or
    of lists, tuples and dicts of numbers and names (a training history ``{"loss": [...]}``, a
    config, a batch), without its setup; None for anything else."""
    items = tuple(value.values()) if kind is dict else tuple(value)
    if len(items) > MAX_NODES:
        return None
    types = set(map(type, items))
    simple = types <= _IMMUTABLE
    if not simple and not types <= _PLAIN_OR_IMMUTABLE and not types <= _LEAVES:
        return None
    tokens: list[Any]
    if kind is dict:
        tokens = [(id(value), tuple(map(id, value)), tuple(map(id, items)))]
    else:
        tokens = [(id(value), tuple(map(id, items)))]
    whole = True
    if simple:
        return tuple(tokens), whole
    for item in items:  # (one held twice gives its token twice: the same each time)
        inner = type(item)
        if inner in _IMMUTABLE:
            continue
        read = _TOKENS.get(inner)
        if read is not None:
            token, all_read = read(item)
            tokens.append(token)
            whole = whole and all_read
            continue
        values = tuple(item.values()) if inner is dict else tuple(item)
        if len(values) > MAX_NODES or not _IMMUTABLE.issuperset(map(type, values)):
            return None
        if inner is dict:
            tokens.append((id(item), tuple(map(id, item)), tuple(map(id, values))))
        else:
            tokens.append((id(item), tuple(map(id, values))))
    return tuple(tokens), whole


_PLAIN_OR_IMMUTABLE = _PLAIN | _IMMUTABLE
_LEAVES: set[Any] = set(_IMMUTABLE)  # and, once imported, tensors and arrays (_TOKENS)


def _module_of(value: Any) -> str:
    """The top-level module a value comes from (itself, for a module), or ""."""
    if isinstance(value, ModuleType):
        return value.__name__.partition(".")[0]
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(value), "__module__", "")
    return module.partition(".")[0] if isinstance(module, str) else ""
