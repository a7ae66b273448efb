"""What an error text says beyond its error's name: this build's device-side assertion
tracking, the driver's own log, and the memory limit an out-of-memory error ran into.

PyTorch appends these to its CUDA errors (c10/cuda/CUDAException.cpp, CUDAMiscFunctions.cpp,
CUDADeviceAssertionHost.cpp) and to its allocators' out-of-memory errors
(c10/cuda/CUDACachingAllocator.cpp, CUDAMallocAsyncAllocator.cpp); each changes what the next
step is, so each adjusts the diagnosis's words, never its cause or stickiness.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .model import Diagnosis

# c10_retrieve_device_side_assertion_info() in a build compiled with TORCH_USE_CUDA_DSA, where
# PYTORCH_USE_CUDA_DSA was not set when the process started (CUDADeviceAssertionHost.cpp).
_DSA_COMPILED = re.compile(
    r"Device-side assertion tracking was not enabled by user"
    r"|Device-side assertions disabled because not all devices support managed memory"
)
DSA_AVAILABLE = (
    'This PyTorch build can track device-side assertions (its message says tracking "was not '
    'enabled by user"): start the next process with `PYTORCH_USE_CUDA_DSA=1` and kernels '
    "launched through PyTorch's assertion launcher name their failing assert in the exception."
)
# get_cuda_async_error_suffix(), for errors that are not a kernel's (CUDAMiscFunctions.cpp).
_DRIVER_LOG_HINT = "CUDA_LOG_FILE=stderr"
DRIVER_LOG = (
    "The driver can say why the call failed: run again with `CUDA_LOG_FILE=stderr` set before "
    "the process starts, and read the driver's own lines printed before the error."
)

# The memory-fraction limit: CUDACachingAllocator.cpp prints "<size> allowed;" when
# set_per_process_memory_fraction() was called; CUDAMallocAsyncAllocator.cpp always prints
# "PyTorch limit (set by user-supplied memory fraction)" with the limit (16 EiB when none was set).
_ALLOWED = re.compile(r"(\d[\d.]*\s*[KMGTPE]?i?B) allowed;")
_ASYNC_LIMIT = re.compile(
    r"would exceed allowed memory[\s\S]*?Device limit\s*:\s*"
    r"(?P<device>\d[\d.]*)\s*(?P<du>[KMGTPE]?i?B)[\s\S]*?"
    r"set by user-supplied memory fraction\)\s*:\s*(?P<limit>\d[\d.]*)\s*(?P<lu>[KMGTPE]?i?B)",
)
_UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5, "EiB": 6}
FRACTION_FIX = (
    "This process's memory fraction capped it at {limit}: "
    "`torch.cuda.set_per_process_memory_fraction(f, device)` was called (by your code or a "
    "library). Raise the fraction if the GPU has room for it, or use less memory: a smaller "
    "batch, `torch.autocast` to half precision, gradient checkpointing."
)
OOM_FIX = (
    "Use less memory (a smaller batch, `torch.autocast` to half precision, gradient "
    "checkpointing), or free what this process still holds (`del` tensors you no longer need, "
    "then `torch.cuda.empty_cache()`); the kernel and its variables stay usable."
)


def _bytes(number: str, unit: str) -> float:
    return float(number) * 1024.0 ** _UNITS.get(unit, 0)


def _fraction_limit(text: str) -> str | None:
    """The limit a memory fraction set, as printed, or None where no fraction limited it."""
    allowed = _ALLOWED.search(text)
    if allowed is not None:
        return allowed.group(1)
    limit = _ASYNC_LIMIT.search(text)
    if limit is None:
        return None
    device = _bytes(limit.group("device"), limit.group("du"))
    capped = _bytes(limit.group("limit"), limit.group("lu"))
    return f"{limit.group('limit')} {limit.group('lu')}" if capped < device else None


def with_text_hints(diagnosis: Diagnosis, text: str) -> Diagnosis:
    """The diagnosis with the next steps the error text's own hints call for."""
    fixes = list(diagnosis.fixes)
    if _DSA_COMPILED.search(text):
        # The build has the flag: "setting it does nothing" would be wrong here.
        fixes = [fix for fix in fixes if "TORCH_USE_CUDA_DSA is a build flag" not in fix]
        if diagnosis.sticky:
            fixes.append(DSA_AVAILABLE)
    if _DRIVER_LOG_HINT in text and not diagnosis.sticky:
        fixes.append(DRIVER_LOG)
    error = diagnosis.error
    if error is not None and error.name == "cudaErrorMemoryAllocation" and not diagnosis.sticky:
        limit = _fraction_limit(text)
        fixes.insert(0, FRACTION_FIX.format(limit=limit) if limit is not None else OOM_FIX)
    if fixes == list(diagnosis.fixes):
        return diagnosis
    return replace(diagnosis, fixes=tuple(fixes))
