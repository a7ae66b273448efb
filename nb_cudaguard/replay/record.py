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
analysis, which the plan joins to it, and names too large to see whole are listed as such.
"""

from __future__ import annotations

import base64
import json
import random
import sys
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 2000  # objects visited per name
_SAMPLE = 64  # values read from a large array, evenly spread
_KEEP = 500  # records kept in a long session (as runtime.cells)
_KEEP_RNG = 200  # of which with a random state (a few KiB each)
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), range, frozenset)


@dataclass(frozen=True)
class CellRecord:
    """What one cell did to the user namespace and the process, seen when it ran."""

    bound: frozenset[str] = frozenset()  # new, or bound to another object
    changed: frozenset[str] = frozenset()  # the same object, changed in place
    deleted: frozenset[str] = frozenset()
    settings: tuple[str, ...] = ()  # process settings it changed (``torch.backends.cudnn...``)
    drew: tuple[str, ...] = ()  # the generators it drew from (``torch``, ``numpy``, ``random``)
    unseen: frozenset[str] = frozenset()  # names too large to see whole: a change may be missed
    rng: str = ""  # the generators' state when it began (where it drew, or failed), encoded

    def to_json(self) -> dict[str, Any]:
        return {
            "bound": sorted(self.bound),
            "changed": sorted(self.changed),
            "deleted": sorted(self.deleted),
            "settings": list(self.settings),
            "drew": list(self.drew),
            "unseen": sorted(self.unseen),
            "rng": self.rng,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CellRecord:
        def names(key: str) -> frozenset[str]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"record {key} is not a list of names")
            return frozenset(value)

        rng = data.get("rng", "")
        if not isinstance(rng, str):
            raise TypeError("record rng is not text")
        return cls(
            names("bound"),
            names("changed"),
            names("deleted"),
            tuple(sorted(names("settings"))),
            tuple(sorted(names("drew"))),
            names("unseen"),
            rng,
        )


# --- fingerprints ---------------------------------------------------------------------------------


def fingerprint(value: Any, limit: int = MAX_NODES) -> tuple[tuple[Any, ...], bool]:
    """(what changes when ``value`` or what it holds changes in place, whether all of it was
    seen within ``limit`` objects)."""
    tokens: list[Any] = []
    seen: set[int] = set()
    stack = [value]
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    while stack:
        obj = stack.pop()
        if isinstance(obj, _IMMUTABLE) or id(obj) in seen:
            tokens.append(id(obj))
            continue
        if len(seen) >= limit:
            return tuple(tokens), False
        seen.add(id(obj))
        if torch is not None and isinstance(obj, torch.Tensor):
            tokens.append(_tensor_token(obj))
        elif torch is not None and isinstance(obj, torch.nn.Module):
            tokens.append((id(obj), obj.training))
            for module in obj.modules():
                tokens.append(module.training)
                for tensor in (*module._parameters.values(), *module._buffers.values()):
                    if tensor is not None:
                        tokens.append(_tensor_token(tensor))
                        seen.add(id(tensor))
            stack.extend(_plain_attributes(obj))
        elif torch is not None and isinstance(obj, torch.optim.Optimizer):
            tokens.append((id(obj), len(obj.state)))
            for group in obj.param_groups:
                tokens.extend((k, v) for k, v in group.items() if isinstance(v, _IMMUTABLE))
                tokens.append(len(group.get("params", ())))
            for state in obj.state.values():
                stack.extend(state.values())
        elif numpy is not None and isinstance(obj, numpy.ndarray):
            tokens.append(_array_token(obj))
        elif isinstance(obj, (list, tuple, set, frozenset, dict)):
            tokens.append((id(obj), len(obj)))
            if isinstance(obj, (set, frozenset)):
                tokens.append(sum(map(id, obj)) if len(obj) <= limit else None)
                continue
            if len(obj) > limit:
                return tuple(tokens), False
            if isinstance(obj, dict):
                tokens.extend(map(id, obj))  # keys: strings, mostly; by identity
                stack.extend(obj.values())
            else:
                stack.extend(obj)
        elif callable(obj) or isinstance(obj, type(sys)):
            tokens.append(id(obj))  # a function, class or module: by identity (modules: apart)
        else:
            tokens.append((id(obj), type(obj).__name__))
            stack.extend(_plain_attributes(obj))
    return tuple(tokens), True


def _tensor_token(tensor: Any) -> tuple[Any, ...]:
    try:
        pointer = tensor.data_ptr()
    except Exception:  # sparse, meta, or a tensor subclass without storage
        pointer = None
    grad = tensor.grad if tensor.is_leaf and tensor.requires_grad else None
    return (
        id(tensor),
        tensor._version,
        pointer,
        tuple(tensor.shape),
        None if grad is None else (id(grad), grad._version),
    )


def _array_token(array: Any) -> tuple[Any, ...]:
    address = array.__array_interface__["data"][0]
    flat = array.reshape(-1) if array.flags.c_contiguous else None
    if flat is None or flat.size == 0 or array.dtype.hasobject:
        sample: Any = None
    else:
        step = max(1, flat.size // _SAMPLE)
        sample = flat[::step].tobytes()  # every value of a small array; spread over a large one
    return (id(array), address, array.shape, str(array.dtype), sample)


def _plain_attributes(obj: Any) -> list[Any]:
    try:
        attributes = vars(obj)
    except TypeError:
        return []
    return list(attributes.values()) if isinstance(attributes, dict) else []


# --- process state --------------------------------------------------------------------------------


def torch_settings() -> tuple[tuple[str, Any], ...]:
    """torch's process-wide settings a cell may change (only where torch is imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    readers: list[tuple[str, Callable[[], Any]]] = [
        ("torch.set_grad_enabled", torch.is_grad_enabled),
        ("torch.set_default_dtype", torch.get_default_dtype),
        ("torch.use_deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
        ("torch.set_float32_matmul_precision", torch.get_float32_matmul_precision),
        ("torch.backends.cudnn.deterministic", lambda: torch.backends.cudnn.deterministic),
        ("torch.backends.cudnn.benchmark", lambda: torch.backends.cudnn.benchmark),
        ("torch.backends.cudnn.enabled", lambda: torch.backends.cudnn.enabled),
        ("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
        ("torch.set_num_threads", torch.get_num_threads),
    ]
    found = []
    for name, read in readers:
        try:
            found.append((name, read()))
        except Exception:
            continue
    return tuple(found)


def rng_states() -> dict[str, Any]:
    """The global generators' states: ``random``'s, numpy's and torch's where imported, CUDA's
    only where CUDA is initialised already (it never initialises CUDA)."""
    states: dict[str, Any] = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.random.get_rng_state()
        try:
            if torch.cuda.is_initialized():
                states["cuda"] = torch.cuda.get_rng_state_all()
        except Exception:  # a poisoned context: its generators cannot be read
            pass
    return states


def drawn_from(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    """The generators whose state moved between ``before`` and ``after``."""
    moved = []
    for name, state in before.items():
        other = after.get(name)
        if other is None or not _same_state(state, other):
            moved.append(name)
    return tuple(sorted(moved))


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and len(a) == 5 and hasattr(a[1], "tobytes"):  # numpy's
        return bool(a[1].tobytes() == b[1].tobytes() and a[2:] == b[2:])
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        return bool(torch.equal(a, b))
    if isinstance(a, list):  # CUDA's, a tensor per device
        return len(a) == len(b) and all(map(_same_state, a, b))
    return bool(a == b)  # random's: a tuple of ints, compared in C


def encode_rng(states: Mapping[str, Any]) -> str:
    """The states as text (JSON, compressed): kept with the cells for the next process."""
    plain: dict[str, Any] = {}
    for name, state in states.items():
        if name == "random":
            version, internal, gauss = state
            plain[name] = [version, list(internal), gauss]
        elif name == "numpy":
            kind, keys, pos, has_gauss, cached = state
            plain[name] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
        elif name == "torch":
            plain[name] = state.tolist()
        elif name == "cuda":
            plain[name] = [s.tolist() for s in state]
    raw = zlib.compress(json.dumps(plain).encode("utf-8"))
    return base64.b64encode(raw).decode("ascii")


def restore_rng(encoded: str) -> tuple[str, ...]:
    """Set the global generators to ``encoded`` (``encode_rng``); returns those set. torch's and
    numpy's only where imported; CUDA's only where CUDA is initialised (the cell that needs it
    initialises it; its draws then differ, and the plan says which cells draw)."""
    if not encoded:
        return ()
    plain = json.loads(zlib.decompress(base64.b64decode(encoded)).decode("utf-8"))
    done = []
    if "random" in plain:
        version, internal, gauss = plain["random"]
        random.setstate((version, tuple(internal), gauss))
        done.append("random")
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in plain:
        kind, keys, pos, has_gauss, cached = plain["numpy"]
        keys = numpy.array(keys, dtype=numpy.uint32)
        numpy.random.set_state((kind, keys, pos, has_gauss, cached))
        done.append("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and "torch" in plain:
        torch.random.set_rng_state(torch.tensor(plain["torch"], dtype=torch.uint8))
        done.append("torch")
        try:
            if "cuda" in plain and torch.cuda.is_initialized():
                states = [torch.tensor(s, dtype=torch.uint8) for s in plain["cuda"]]
                torch.cuda.set_rng_state_all(states)
                done.append("cuda")
        except Exception:
            pass
    return tuple(done)


# --- the recorder ---------------------------------------------------------------------------------


@dataclass
class _Seen:
    value_id: int
    print: tuple[Any, ...]
    whole: bool


@dataclass
class Recorder:
    """Fingerprints the namespace at the end of each cell and says what the cell did.

    ``hidden``: names that are not the user's (IPython's own); ``own_modules``: which of the
    given top-level module names are the notebook's own (their globals count as its state).
    """

    hidden: Collection[str] = frozenset()
    own_modules: Callable[[Collection[str]], Collection[str]] = lambda names: ()
    records: dict[int, CellRecord] = field(default_factory=dict)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _modules: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _own: dict[str, bool] = field(default_factory=dict)  # module name -> the notebook's own
    _settings: tuple[tuple[str, Any], ...] = ()
    _rng: dict[str, Any] = field(default_factory=dict)  # at the start of the running cell
    _depth: int = 0
    _primed: bool = False

    def prime(self, namespace: Mapping[str, Any]) -> None:
        """Take the namespace as it is now as the state before the next cell."""
        self._seen = {n: self._see(v) for n, v in self._user_items(namespace)}
        self._modules = self._see_modules(namespace)
        self._settings = torch_settings()
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
            user = dict(self._user_items(namespace))
            for name in self._seen.keys() - user.keys():
                del self._seen[name]
            for name, value in user.items():
                seen = self._seen.get(name)
                if seen is None or seen.value_id != id(value):
                    self._seen[name] = self._see(value)
        self._rng = rng_states()

    def finish(self, namespace: Mapping[str, Any], cell: int | None, failed: bool) -> None:
        """At a cell's end: what it did, kept by its execution count (``None``: not kept)."""
        self._depth = max(0, self._depth - 1)
        if self._depth or not self._primed:
            return
        now = {n: self._see(v) for n, v in self._user_items(namespace)}
        bound, changed, unseen = set(), set(), set()
        for name, seen in now.items():
            before = self._seen.get(name)
            if before is None or before.value_id != seen.value_id:
                bound.add(name)
            elif before.print != seen.print:
                changed.add(name)
            if not seen.whole:
                unseen.add(name)
        deleted = self._seen.keys() - now.keys()
        modules = self._see_modules(namespace)
        moved = {m for m, s in modules.items() if m in self._modules and self._modules[m] != s}
        if moved:  # a module's global re-bound (``cfg.LR = 0.5``): its names in the namespace
            changed |= {n for n, v in self._user_items(namespace) if _module_of(v) in moved}
            changed -= bound
        settings = torch_settings()
        before_settings = dict(self._settings)
        changed_settings = tuple(
            sorted(n for n, v in settings if n in before_settings and before_settings[n] != v)
        )
        rng_after = rng_states()
        drew = drawn_from(self._rng, rng_after) if self._rng else ()
        keep_rng = bool(drew or failed) and cell is not None
        record = CellRecord(
            frozenset(bound),
            frozenset(changed),
            frozenset(deleted),
            changed_settings,
            drew,
            frozenset(unseen),
            encode_rng(self._rng) if keep_rng and self._rng else "",
        )
        self._seen, self._modules, self._settings = now, modules, settings
        if cell is None:
            return
        self.records[cell] = record
        self._forget_old()

    def _forget_old(self) -> None:
        if len(self.records) > 2 * _KEEP:
            for old in sorted(self.records)[:-_KEEP]:
                del self.records[old]
        with_rng = [c for c, r in self.records.items() if r.rng]
        for old in sorted(with_rng)[:-_KEEP_RNG]:
            record = self.records[old]
            self.records[old] = CellRecord(**{**record.__dict__, "rng": ""})

    def _user_items(self, namespace: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
        hidden = self.hidden
        return ((n, v) for n, v in namespace.items() if n[:1] != "_" and n not in hidden)

    @staticmethod
    def _see(value: Any) -> _Seen:
        try:
            tokens, whole = fingerprint(value)
        except Exception:  # an object whose attributes raise: seen by identity only
            tokens, whole = (id(value),), False
        return _Seen(id(value), tokens, whole)

    def _see_modules(self, namespace: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
        """The notebook's own modules' globals, for the modules the namespace uses."""
        names = {_module_of(v) for _, v in self._user_items(namespace)} - {""}
        unknown = [n for n in names if n not in self._own]
        if unknown:
            own = set(self.own_modules(unknown))
            self._own.update((n, n in own) for n in unknown)
        found = {}
        for name in sorted(n for n in names if self._own.get(n)):
            module = sys.modules.get(name)
            if module is not None:
                found[name] = tuple(
                    (k, self._see(v).print)
                    for k, v in sorted(vars(module).items())
                    if not k.startswith("__")
                )
        return found


def _module_of(value: Any) -> str:
    """The top-level module a value comes from (itself, for a module), or ""."""
    if isinstance(value, type(sys)):
        return value.__name__.partition(".")[0]
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(value), "__module__", "")
    return module.partition(".")[0] if isinstance(module, str) else ""
