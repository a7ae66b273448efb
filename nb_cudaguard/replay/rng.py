"""The global random generators' states: read at each cell's start (cheaply: most cells draw
nothing), compared, kept as text with a cell's record and set again before a replayed cell.

``random``'s, numpy's and torch's CPU generator are read through views of their memory, each
checked against the library's own ``getstate()``/``get_state()`` before it is used (another
layout: the library's reader); the library's reader runs again only where the bytes moved.
"""

from __future__ import annotations

import base64
import ctypes
import json
import random
import struct
import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from operator import is_
from typing import Any

_MT_BYTES = 624 * 4 + 4  # numpy's mt19937_state: the key and its position


def rng_states(reader: RngReader | None = None) -> dict[str, Any]:
    """The global generators' states: ``random``'s, numpy's and torch's where imported, CUDA's
    only where CUDA is initialised already (it never initialises CUDA). Read as they are
    compared, cheaply (``random``'s and torch's as bytes); ``encode_rng`` decodes them.
    ``reader``: one kept across cells, which finds where the states lie in memory once."""
    return (reader or RngReader()).read()


# ``random``'s Mersenne Twister as it lies in memory (``Modules/_randommodule.c``: after the
# object header, ``int index; uint32_t state[624]``), read through a view (0.1 us) where
# ``random.getstate()`` builds a 625-number tuple (8 us) and comparing two costs 5 more. The
# view is used only once checked against ``getstate()`` (another layout: ``getstate()``).
_RANDOM_HEAD = object.__basicsize__
_RANDOM_BYTES = 4 + 624 * 4


@dataclass
class RngReader:
    """Reads the global generators' states at each cell's start."""

    _random: Any = None  # random's instance, and a view of its state where the layout is known
    _random_view: Any = None
    _random_state: Any = None
    _numpy: Any = None  # numpy's bit generator, a view of its state, and that state decoded
    _numpy_view: Any = None
    _numpy_legacy: Any = None  # ``np.random``'s RandomState, and a view of its cached sample
    _numpy_gauss: Any = None
    _numpy_raw: Any = None  # (the generator's words, the cached sample) at the last read
    _numpy_state: Any = None
    _torch: Any = None  # torch's default generator, a view of its engine, and its state
    _torch_view: Any = None
    _torch_raw: bytes = b""
    _torch_state: bytes = b""
    _cuda: tuple[Any, list[Any]] | None = None  # (seed and offset per device, their states)

    def read(self) -> dict[str, Any]:
        states: dict[str, Any] = {"random": self._read_random()}
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            states["numpy"] = self._read_numpy(numpy)
        torch = sys.modules.get("torch")
        if torch is not None:
            states["torch"] = self._read_torch(torch.default_generator)
            try:
                if torch.cuda.is_initialized():
                    states["cuda"] = self._read_cuda(torch)
            except Exception:  # a poisoned context: its generators cannot be read
                pass
        return states

    def _read_cuda(self, torch: Any) -> tuple[Any, list[Any]]:
        """(a key, ``get_rng_state_all()``), the states read again only where the key moved. A
        CUDA generator's state is its seed and Philox offset (``CUDAGeneratorImpl::get_state``,
        aten/src/ATen/cuda/CUDAGeneratorImpl.cpp): two calls each, where the states build a
        tensor per device in Python every cell."""
        try:
            generators = torch.cuda.default_generators
            key: Any = tuple((g.initial_seed(), g.get_offset()) for g in generators)
        except Exception:  # an older torch, without get_offset(): the states are the key
            states = torch.cuda.get_rng_state_all()
            return (tuple(bytes(s.numpy().tobytes()) for s in states), states)
        if self._cuda is None or self._cuda[0] != key:
            self._cuda = (key, torch.cuda.get_rng_state_all())
        return self._cuda

    def _read_random(self) -> Any:
        instance: Any = random._inst
        if instance is not self._random:
            self._random, self._random_view = instance, _random_view(instance)
        if self._random_view is None:
            return random.getstate()
        state = (self._random_view.raw, instance.gauss_next)  # gauss() keeps one, undrawn
        if state != self._random_state:
            self._random_state = state
        return self._random_state  # (the same object while it does not move: see drawn_from)

    def _read_numpy(self, numpy: Any) -> Any:
        """numpy's ``get_state()`` (30 us), read again only where its generator's words or its
        cached normal sample moved: most cells never draw from numpy."""
        try:
            legacy = numpy.random.mtrand._rand
            generator = legacy._bit_generator
            if generator is not self._numpy or legacy is not self._numpy_legacy:
                address = generator.ctypes.state_address
                self._numpy_view = (ctypes.c_char * _MT_BYTES).from_address(address)
                self._numpy_gauss = _gauss_view(numpy, legacy)
                self._numpy, self._numpy_legacy, self._numpy_state = generator, legacy, None
            key = (self._numpy_view.raw, self._numpy_gauss and self._numpy_gauss.raw)
        except Exception:  # another numpy layout: read it whole
            return numpy.random.get_state()
        if self._numpy_gauss is None and self._numpy_state is not None and self._numpy_state[3]:
            # A normal sample is cached where this reader cannot see it: taking it moves no
            # word of the generator, so the state is read whole until it is taken.
            self._numpy_state = None
        if key != self._numpy_raw or self._numpy_state is None:
            self._numpy_raw, self._numpy_state = key, numpy.random.get_state()
        return self._numpy_state

    def _read_torch(self, generator: Any) -> bytes:
        """torch's ``get_state()`` (10 us: it allocates a tensor), read again only where the
        generator's engine moved."""
        if generator is not self._torch:
            self._torch, self._torch_view = generator, _torch_view(generator)
        if self._torch_view is None:
            return bytes(generator.get_state().numpy().tobytes())
        raw = self._torch_view.raw
        if raw != self._torch_raw or not self._torch_state:
            self._torch_raw = raw
            self._torch_state = generator.get_state().numpy().tobytes()
        return self._torch_state


# torch's CPU generator (``aten/src/ATen/CPUGeneratorImpl.h``): an ``at::mt19937`` engine
# (``ATen/core/MT19937RNGEngine.h``: ``uint64_t seed_; int left_; bool seeded_; uint32_t next_;
# std::array<uint32_t, 624> state_``, 2520 bytes) followed by the normal samples it caches
# (``optional<float>``, ``optional<double>``: 24 bytes). Every draw moves ``left_`` and
# ``next_``, or takes or leaves a cached sample. The Python object holds a pointer to it right
# after its header (``torch/csrc/Generator.h``).
_ENGINE_BYTES = 2520
_TORCH_BYTES = _ENGINE_BYTES + 24
_STATE_AT = 20  # ``state_`` in the engine
_SCAN = 1024  # how far into the generator the engine is looked for
_TORCH_LAYOUT: list[tuple[Any, int | None]] = []  # (torch, the engine's offset), found once


def _torch_view(generator: Any) -> Any:
    """A view of ``generator``'s engine and cached samples, or None where a generator is not
    laid out as read here (checked against ``get_state()`` on this one and on a private one
    that draws a cached sample)."""
    torch = sys.modules["torch"]
    if not _TORCH_LAYOUT or _TORCH_LAYOUT[0][0] is not torch:
        _TORCH_LAYOUT[:] = [(torch, _engine_offset(torch))]
    offset = _TORCH_LAYOUT[0][1]
    try:
        if offset is None or generator.device.type != "cpu":
            return None
        view = (ctypes.c_char * _TORCH_BYTES).from_address(_impl(generator) + offset)
        return view if _engine_matches(view.raw, generator) else None
    except Exception:
        return None


def _impl(generator: Any) -> int:
    address = ctypes.c_void_p.from_address(id(generator) + object.__basicsize__).value
    if not address:
        raise ValueError("no generator behind this object")
    return int(address)


def _engine_offset(torch: Any) -> int | None:
    """Where the engine lies in a CPU generator, found in a private one: its state's first
    words looked for, the whole engine compared, then a normal sample drawn and its cache
    found where the layout says."""
    try:
        if type(torch.default_generator).__basicsize__ < object.__basicsize__ + 8:
            return None  # not a header and a pointer
        generator = torch.Generator(device="cpu")
        generator.manual_seed(0x5EED)
        impl = _impl(generator)
        words = _state_words(generator.get_state().numpy().tobytes())
        for at in range(_STATE_AT, _SCAN, 4):  # 16-byte reads, all inside the generator
            if ctypes.string_at(impl + at, 16) == words[:16]:
                break
        else:
            return None
        offset = at - _STATE_AT
        view = (ctypes.c_char * _TORCH_BYTES).from_address(impl + offset)
        if not _engine_matches(view.raw, generator):
            return None
        torch.randn(1, dtype=torch.float64, device="cpu", generator=generator)  # caches one
        state = generator.get_state().numpy().tobytes()
        normal_y, valid = struct.unpack_from("=8xd8xi", state, 24 + 624 * 8)
        cached, has = struct.unpack_from("=d?", view.raw, _ENGINE_BYTES + 8)
        if not (valid and has and cached == normal_y and _engine_matches(view.raw, generator)):
            return None
        return offset
    except Exception:
        return None


# numpy's legacy RandomState (``numpy/random/_mtrand.pyx``) keeps the second of each pair of
# normal samples in ``_aug_state`` (``aug_bitgen_t``: ``int has_gauss; double gauss``, in
# ``numpy/random/src/legacy/legacy-distributions.h``); the next ``randn()`` returns it and moves
# no word of the generator. Where it lies in the object is found once per numpy.
_GAUSS_LAYOUT: list[tuple[Any, int | None]] = []  # (numpy, the offset of ``has_gauss``)
_GAUSS_BYTES = 16  # has_gauss, padding, gauss


def _gauss_view(numpy: Any, legacy: Any) -> Any:
    """A view of ``legacy``'s cached normal sample, or None where it is not laid out as read
    here (checked against its ``get_state()``)."""
    if not _GAUSS_LAYOUT or _GAUSS_LAYOUT[0][0] is not numpy:
        _GAUSS_LAYOUT[:] = [(numpy, _gauss_offset(numpy))]
    offset = _GAUSS_LAYOUT[0][1]
    try:
        if offset is None or type(legacy) is not numpy.random.RandomState:
            return None
        view = (ctypes.c_char * _GAUSS_BYTES).from_address(id(legacy) + offset)
        has, cached = struct.unpack("=i4xd", view.raw)
        state = legacy.get_state()
        return view if (has, cached) == (state[3], state[4]) else None
    except Exception:
        return None


def _gauss_offset(numpy: Any) -> int | None:
    """Where a RandomState keeps ``has_gauss`` and ``gauss``, found in a private one: a sample
    cached, looked for, then taken and seen to clear the flag."""
    try:
        private = numpy.random.RandomState(0x5EED)
        size = type(private).__basicsize__
        private.standard_normal()  # draws two, returns one, caches the other
        has, cached = private.get_state()[3:5]
        memory = ctypes.string_at(id(private), size)
        for at in range(object.__basicsize__, size - _GAUSS_BYTES + 1, 4):
            if has == 1 and struct.unpack_from("=i4xd", memory, at) == (1, cached):
                break
        else:
            return None
        private.standard_normal()  # takes the cached one
        taken = struct.unpack("=i", ctypes.string_at(id(private) + at, 4))[0]
        return at if taken == 0 and private.get_state()[3] == 0 else None
    except Exception:
        return None


def _state_words(state: bytes) -> bytes:
    """The 624 words of a CPU generator's ``get_state()`` (kept there as 64-bit numbers) as the
    engine holds them."""
    return struct.pack("=624I", *struct.unpack_from("=624Q", state, 24))


def _engine_matches(raw: bytes, generator: Any) -> bool:
    state = generator.get_state().numpy().tobytes()
    seed, left, seeded, following = struct.unpack_from("=QiiQ", state)
    head = struct.unpack_from("=Qi?3xI", raw)
    words = raw[_STATE_AT : _STATE_AT + 624 * 4]
    return head == (seed, left, bool(seeded), following) and words == _state_words(state)


def _random_view(instance: Any) -> Any:
    """A view of ``random``'s state in ``instance``'s memory, or None where it is not laid out
    as read here (checked against ``getstate()``)."""
    try:
        view = (ctypes.c_char * _RANDOM_BYTES).from_address(id(instance) + _RANDOM_HEAD)
        if _random_decoded(view.raw, None)[1] == instance.getstate()[1]:
            return view
    except Exception:
        pass
    return None


def random_state(instance: Any) -> Any:
    """Where a ``random.Random`` of one's own stands (``rng = random.Random(1)``): its state read
    through its memory where ``random``'s is laid out as read here (checked once, on a private
    one), else ``getstate()`` (8 us)."""
    if not _RANDOM_LAYOUT:
        _RANDOM_LAYOUT.append(_random_view(random.Random(0x5EED)) is not None)
    if not _RANDOM_LAYOUT[0]:
        return instance.getstate()
    view = (ctypes.c_char * _RANDOM_BYTES).from_address(id(instance) + _RANDOM_HEAD)
    return (view.raw, instance.gauss_next)


_RANDOM_LAYOUT: list[bool] = []  # whether ``random_state`` reads memory, found once


def _random_decoded(raw: bytes, gauss: Any) -> tuple[int, tuple[int, ...], Any]:
    """``random.getstate()``'s tuple from the raw state: (version, 624 words + index, gauss)."""
    (index,) = struct.unpack_from("=i", raw)
    return (3, (*struct.unpack_from("=624I", raw, 4), index), gauss)


def drawn_from(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    """The generators whose state moved between ``before`` and ``after``."""
    # A state that did not move is the very object read before (each read keeps the last).
    if before.keys() == after.keys() and all(map(is_, before.values(), after.values())):
        return ()
    moved = [n for n, state in before.items() if not _same_state(n, state, after.get(n))]
    return tuple(sorted(moved))


def _same_state(name: str, a: Any, b: Any) -> bool:
    if a is b:  # numpy's, read again only where it moved
        return True
    if b is None:
        return False
    if name == "numpy":  # (kind, keys array, position, has_gauss, cached)
        return bool(a[1].tobytes() == b[1].tobytes() and a[2:] == b[2:])
    if name == "cuda":  # (key, a tensor per device): the keys say it
        return bool(a[0] == b[0])
    return bool(a == b)  # bytes, random's (raw, gauss) or its tuple of ints: compared in C


def encode_rng(states: Mapping[str, Any]) -> str:
    """The states as text (JSON, compressed): kept with the cells for the next process."""
    plain: dict[str, Any] = {}
    for name, state in states.items():
        if name == "random":
            if isinstance(state[0], bytes):
                state = _random_decoded(*state)
            version, internal, gauss = state
            plain[name] = [version, list(internal), gauss]
        elif name == "numpy":
            kind, keys, pos, has_gauss, cached = state
            plain[name] = [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
        elif name == "torch":
            plain[name] = list(state)
        elif name == "cuda":
            plain[name] = [s.tolist() for s in state[1]]
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
        # On the CPU, whatever the default device a cell set (``set_default_device("cuda")``):
        # set_rng_state takes a CPU ByteTensor only.
        cpu = {"dtype": torch.uint8, "device": "cpu"}
        torch.random.set_rng_state(torch.tensor(plain["torch"], **cpu))
        done.append("torch")
        try:
            if "cuda" in plain and torch.cuda.is_initialized():
                states = [torch.tensor(s, **cpu) for s in plain["cuda"]]
                torch.cuda.set_rng_state_all(states)
                done.append("cuda")
        except Exception:
            pass
    return tuple(done)
