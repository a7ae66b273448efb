"""Recognise CUDA errors in exception texts of every PyTorch era (FIELD_NOTES §1, §2).

Classification reads the *headline* of an error, never PyTorch's boilerplate hint: until recently
"CUDA kernel errors might be asynchronously reported ..." was appended to every CUDA error, out of
memory included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from .model import CudaError

# cudaGetErrorString texts (driver_types.h), lower case:
# (name, code, legacy code before CUDA 10.1, text, sticky)
_RUNTIME_ERRORS: tuple[tuple[str, int, int | None, str, bool], ...] = (
    # Sticky: NVIDIA documents that the process "must be terminated and relaunched".
    ("cudaErrorAssert", 710, 59, "device-side assert triggered", True),
    ("cudaErrorIllegalAddress", 700, 77, "an illegal memory access was encountered", True),
    ("cudaErrorLaunchFailure", 719, 4, "unspecified launch failure", True),
    ("cudaErrorMisalignedAddress", 716, 74, "misaligned address", True),
    ("cudaErrorIllegalInstruction", 715, 73, "an illegal instruction was encountered", True),
    ("cudaErrorHardwareStackError", 714, 72, "hardware stack error", True),
    (
        "cudaErrorInvalidAddressSpace",
        717,
        75,
        "operation not supported on global/shared address space",
        True,
    ),
    ("cudaErrorInvalidPc", 718, 76, "invalid program counter", True),
    ("cudaErrorLaunchTimeout", 702, 6, "the launch timed out and was terminated", True),
    ("cudaErrorTensorMemoryLeak", 721, None, "tensor memory not completely freed", True),
    (
        "cudaErrorContained",
        226,
        None,
        "invalid access of peer gpu memory over nvlink or a hardware error",
        True,
    ),
    (
        "cudaErrorExternalDevice",
        911,
        None,
        "an async error has occured in external entity outside of cuda",
        True,
    ),
    (
        "cudaErrorMpsClientTerminated",
        810,
        None,
        "the mps client has been terminated by the server",
        True,
    ),
    # Not sticky: the process can go on.
    ("cudaErrorMemoryAllocation", 2, None, "out of memory", False),
    ("cudaErrorInvalidValue", 1, 11, "invalid argument", False),
    ("cudaErrorInvalidConfiguration", 9, None, "invalid configuration argument", False),
    ("cudaErrorInvalidDevice", 101, 10, "invalid device ordinal", False),
    (
        "cudaErrorNoKernelImageForDevice",
        209,
        48,
        "no kernel image is available for execution on the device",
        False,
    ),
    (
        "cudaErrorInsufficientDriver",
        35,
        None,
        "cuda driver version is insufficient for cuda runtime version",
        False,
    ),
    ("cudaErrorNoDevice", 100, 38, "no cuda-capable device is detected", False),
    ("cudaErrorInitializationError", 3, None, "initialization error", False),
    ("cudaErrorInvalidDeviceFunction", 98, 8, "invalid device function", False),
    ("cudaErrorLaunchOutOfResources", 701, 7, "too many resources requested for launch", False),
    (
        "cudaErrorStreamCaptureUnsupported",
        900,
        None,
        "operation not permitted when stream is capturing",
        False,
    ),
    (
        "cudaErrorDevicesUnavailable",
        46,
        None,
        "cuda-capable device(s) is/are busy or unavailable",
        False,
    ),
    (
        "cudaErrorDevicesUnavailable",
        46,
        None,
        "all cuda-capable devices are busy or unavailable",
        False,
    ),
    (
        "cudaErrorUnsupportedPtxVersion",
        222,
        None,
        "the provided ptx was compiled with an unsupported toolchain",
        False,
    ),
    ("cudaErrorNotSupported", 801, None, "operation not supported", False),
    ("cudaErrorInvalidResourceHandle", 400, 33, "invalid resource handle", False),
    (
        "cudaErrorPeerAccessUnsupported",
        217,
        None,
        "peer access is not supported between these two devices",
        False,
    ),
    ("cudaErrorUnknown", 999, 30, "unknown error", False),
)
_BY_NAME = {
    name: (name, code, legacy, text, sticky) for name, code, legacy, text, sticky in _RUNTIME_ERRORS
}


def error_for_code(code: int) -> CudaError | None:
    """The runtime error with this current code (the driver API's ``CUresult`` shares the codes
    of the sticky errors: CUDA_ERROR_ASSERT is 710, CUDA_ERROR_ILLEGAL_ADDRESS 700, ...)."""
    for name, ecode, _legacy, text, sticky in _RUNTIME_ERRORS:
        if ecode == code:
            return CudaError(name, ecode, sticky, text)
    return None


# Lines PyTorch appends to CUDA errors. They mention CUDA but say nothing about which error it was.
_BOILERPLATE = re.compile(
    r"CUDA kernel errors might be asynchronously reported"
    r"|consider passing CUDA_LAUNCH_BLOCKING"
    r"|Compile with `TORCH_USE_CUDA_DSA`"
    r"|^\s*Search for `cuda\w+'"
    r"|The CUDA driver logged these messages"
    r"|Device-side assertion tracking was not enabled"
    r"|Device-side assertions were explicitly omitted",
    re.IGNORECASE,
)

# Headline forms, newest first. Each captures the cudaGetErrorString text as `text`.
_HEADLINES: tuple[re.Pattern[str], ...] = (
    # 1.5+ (and HIP builds, and the CUDA driver API, and wrappers: what():, NCCL watchdog, Triton).
    re.compile(
        r"\b(?:CUDA|HIP)(?: driver)? error: (?:(?P<name>(?:cuda|hip)Error\w+): )?(?P<text>.+)"
    ),
    re.compile(r"Triton Error \[(?:CUDA|HIP)\]: (?P<text>.+)"),
    # <= 1.4: "cuda runtime error (59) : device-side assert triggered at /pytorch/aten/...cu:26"
    re.compile(
        r"\bcuda runtime error \((?P<code>\d+)\) : (?P<text>.+?)(?: at \S+:\d+)?$", re.IGNORECASE
    ),
    # THC: "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=59 : ..."
    re.compile(r"\bTHCudaCheck FAIL file=\S+ line=\d+ error=(?P<code>\d+) : (?P<text>.+)"),
    # Thrust/CUB: "reduce failed to synchronize: device-side assert triggered",
    # "merge_sort: failed to synchronize: cudaErrorIllegalAddress: an illegal memory access ..."
    re.compile(r"\bfailed to synchronize: (?:(?P<name>cudaError\w+): )?(?P<text>.+)"),
    # PyTorch's own allocator message for OOM: "CUDA out of memory. Tried to allocate 2.00 GiB ..."
    re.compile(r"\b(?:CUDA|HIP) (?P<text>out of memory)\b"),
)

# Sticky texts distinctive enough to trust without a "CUDA error:" prefix (custom wrappers).
_BARE_STICKY = re.compile(
    r"(device-side assert triggered|an illegal memory access was encountered"
    r"|unspecified launch failure)",
    re.IGNORECASE,
)

# Library errors that follow a poisoned context (FIELD_NOTES §2) or stand on their own.
_LIBRARY = re.compile(
    r"\b(?P<text>(?:CUBLAS|CUSOLVER|CUSPARSE|CUFFT|CURAND|CUDNN|NCCL)_STATUS_\w+"
    r"|cuDNN error: \w+|Creating MTGP constants failed|NCCL error\b.*)"
)


def _lookup(text: str, name: str | None, code: int | None) -> CudaError:
    lowered = text.strip().lower()
    if name and name in _BY_NAME:
        entry = _BY_NAME[name]
        return CudaError(entry[0], entry[1], entry[4], text.strip())
    for ename, ecode, _legacy, etext, sticky in _RUNTIME_ERRORS:
        if lowered.startswith(etext):
            return CudaError(ename, ecode, sticky, text.strip())
    for ename, ecode, legacy, _etext, sticky in _RUNTIME_ERRORS:
        if code is not None and code in (ecode, legacy):
            return CudaError(ename, ecode, sticky, text.strip())
    library = _LIBRARY.search(text)
    if library:
        return CudaError(library.group("text").split(":")[0].strip(), code, False, text.strip())
    return CudaError(name or "cudaError", code, False, text.strip())


def classify_line(line: str) -> CudaError | None:
    """The CUDA error a single line announces, or None."""
    if _BOILERPLATE.search(line):
        return None
    for pattern in _HEADLINES:
        match = pattern.search(line)
        if match:
            groups = match.groupdict()
            code = int(groups["code"]) if groups.get("code") else None
            error = _lookup(groups["text"], groups.get("name"), code)
            return CudaError(error.name, error.code, error.sticky, line.strip())
    bare = _BARE_STICKY.search(line)
    if bare:
        error = _lookup(bare.group(1), None, None)
        return CudaError(error.name, error.code, error.sticky, line.strip())
    library = _LIBRARY.search(line)
    if library:
        return CudaError(library.group("text").split(":")[0].strip(), None, False, line.strip())
    return None


def _headline_candidates(text: str) -> Iterator[str]:
    for line in text.splitlines():
        if line.strip():
            yield line


def _embedded_headlines(text: str) -> list[str]:
    """The exception lines of tracebacks quoted inside a message.

    Errors re-raised from another thread or process quote the original traceback:
    ``nn.DataParallel`` ("Caught RuntimeError in replica 0 on device 0.\nOriginal Traceback ..."),
    DataLoader workers, ``torch.multiprocessing.spawn`` ("-- Process 0 terminated with the
    following error:\nTraceback ..."), Ray. The original error is the first unindented line
    after the frames; its continuation lines follow it.
    """
    headlines: list[str] = []
    for quoted in text.split("Traceback (most recent call last):")[1:]:
        lines = [line for line in quoted.splitlines() if line.strip()]
        for index, line in enumerate(lines):
            if not line[0].isspace():
                headlines.extend(lines[index : index + 2])
                break
    return headlines


def classify_text(text: str, *, first_line_only: bool = False) -> CudaError | None:
    """Classify an error text.

    With ``first_line_only`` (an exception's message), only its first non-blank line counts, plus
    the ``what():`` line of a C++ ``terminate called ...`` wrapper and the exception line of a
    traceback quoted in the message. For a log, every line counts. Either way the first sticky
    error wins over a non-sticky one.
    """
    lines = list(_headline_candidates(text))
    if first_line_only and lines:
        wrapped = lines[0].startswith("terminate called after throwing")
        lines = (lines[:2] if wrapped else lines[:1]) + _embedded_headlines(text)
    first: CudaError | None = None
    for line in lines:
        error = classify_line(line)
        if error is None:
            continue
        if error.sticky:
            return error
        first = first or error
    return first


def exception_chain(error: BaseException) -> Iterable[BaseException]:
    """The exception, then its causes and contexts, without cycles."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify_exception(error: BaseException) -> CudaError | None:
    """The CUDA error behind an exception or anything it was raised from."""
    found: CudaError | None = None
    for link in exception_chain(error):
        try:
            message = str(link)
        except Exception:  # a broken __str__ is the user's, not a CUDA error
            continue
        result = classify_text(message, first_line_only=True)
        if result is None and type(link).__name__ == "OutOfMemoryError":
            result = CudaError("cudaErrorMemoryAllocation", 2, False, message.strip()[:200])
        if result is None:
            continue
        code = getattr(link, "error_code", None)
        if isinstance(code, int) and result.code is None:
            result = CudaError(result.name, code, result.sticky, result.message)
        if result.sticky:
            return result
        found = found or result
    return found
