"""The data that flows from recognition to rendering: pure, immutable, torch- and IPython-free."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Stable cause ids (documented in docs/panel.md, whose table tests/test_docs.py holds to these).
# Renderers and users may rely on these strings.
CAUSES: tuple[str, ...] = (
    "label-out-of-range",
    "index-out-of-range",
    "probability-out-of-range",
    "nan-detected",
    "size-mismatch",
    "sparse-invariant",
    "user-assert",
    "pytorch-internal",
    "unknown-assert",
    "illegal-memory-access",
    "launch-failure",
    "misaligned-address",
    "other-sticky",
    # Not sticky: the kernel can go on.
    "not-sticky",
)


class ContextState(str, enum.Enum):
    """What a probe of this process's CUDA context found."""

    POISONED = "poisoned"
    HEALTHY = "healthy"
    NO_CUDA = "no-cuda"  # torch not imported, or CUDA never initialised in this process
    UNKNOWN = "unknown"  # not probed, or the probe could not tell (timed out, odd error)


@dataclass(frozen=True)
class AssertLine:
    """One device-side assert site, folded over the GPU threads that printed it."""

    file: str  # the kernel's source file name, e.g. "Loss.cu" (no path: it differs per build)
    condition: str  # the asserted condition, or the message of a CUDA_KERNEL_ASSERT_MSG site
    function: str | None = None  # absent on Windows builds
    count: int = 1  # how many threads printed this site
    raw: str = ""  # the first line as printed

    def __str__(self) -> str:
        times = f" (x{self.count} threads)" if self.count > 1 else ""
        where = f"{self.file} ({self.function})" if self.function else self.file
        return f"{where}: Assertion `{self.condition}` failed.{times}"


# cudaErrorUnknown, CUDA_ERROR_UNKNOWN and hipErrorUnknown alike: "an unknown internal error",
# which NVIDIA documents neither as sticky nor as leaving the context usable.
UNKNOWN_CODE = 999


@dataclass(frozen=True)
class CudaError:
    """A recognised CUDA runtime error: the cudaError_t behind an exception's first line."""

    name: str  # "cudaErrorAssert", or a descriptive name for non-runtime errors ("out of memory")
    code: int | None  # cudaError_t value where known (710 for an assert on CUDA >= 10.1)
    sticky: bool  # the context is corrupted and the process must be restarted
    message: str  # the line the error was recognised in, stripped


@dataclass(frozen=True)
class Diagnosis:
    """What went wrong, why, and what to do: the one thing every renderer draws."""

    cause: str  # one of CAUSES
    sticky: bool
    title: str
    explanation: str
    fixes: tuple[str, ...] = ()
    assert_lines: tuple[AssertLine, ...] = ()
    error: CudaError | None = None
    likely_causes: tuple[str, ...] = ()  # ranked, most likely first
    evidence: tuple[str, ...] = ()  # sentences read from Python objects and CPU tensors
    where: str | None = None  # where the error surfaced and where it was most likely launched
    source: str | None = None  # the PyTorch source file of the matched assert rule
    context: ContextState = ContextState.UNKNOWN
    device: int | None = None  # the CUDA device the context state is about, where known

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data: nested records as objects, tuples as lists, enums as their values.
        Every field is included (new ones too), so ``from_dict(to_dict())`` is the same object."""
        data = _to_json(self)
        assert isinstance(data, dict)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Diagnosis:
        """The inverse of ``to_dict``. Keys it does not know are ignored (a newer writer), and
        missing optional fields take their defaults (an older one)."""
        return _from_json_record(cls, data)


# --- JSON round trip, driven by the dataclass fields and their type hints ----------------------
def _to_json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
    if isinstance(value, (tuple, list)):
        return [_to_json(item) for item in value]
    return value


def _from_json(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _from_json(options[0], value) if len(options) == 1 else value
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_from_json(item, v) for v in value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _from_json_record(hint, value)
    return value


_Record = typing.TypeVar("_Record")


def _from_json_record(cls: type[_Record], data: Mapping[str, Any]) -> _Record:
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {
        f.name: _from_json(hints[f.name], data[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init and f.name in data
    }
    return cls(**kwargs)
