"""The data that flows from recognition to rendering: pure, immutable, torch- and IPython-free."""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Stable cause ids (documented in the README). Renderers and users may rely on these strings.
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
