"""The demos' one switch: the real GPU where CUDA is present, PyTorch's exact texts where not.

With CUDA, ``gpu_failure`` does nothing: the demo's cell triggers the real device-side assert.
Without it, the same bad input makes PyTorch's CPU kernel raise its readable error (FIELD_NOTES §3:
``IndexError: Target 3 is out of bounds.``); ``gpu_failure`` turns exactly that error into what
CUDA reports instead: the device line written to file descriptor 2 (as an NVIDIA H100 printed it
with torch 2.11.0+cu130; tests/pytorch_texts.py keeps the same lines, and CI checks they match) and
the exception PyTorch raises (``torch.AcceleratorError`` with its exact text). Any other error
passes through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SIMULATED = DEVICE.type != "cuda"

# The exception text of a device-side assert in current releases (torch >= 2.9).
CUDA_ASSERT = (
    "CUDA error: device-side assert triggered\n"
    "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)

# case -> (the device line an H100 printed, the CPU error the same input raises)
CASES: dict[str, tuple[str, str]] = {
    "cross-entropy-label": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        r"^Target -?\d+ is out of bounds\.$",
    ),
    "segmentation-void-255": (
        "/pytorch/aten/src/ATen/native/cuda/NLLLoss2d.cu:106: nll_loss2d_forward_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        r"^Target -?\d+ is out of bounds\.$",
    ),
    "embedding-vectorized-gather": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        "block: [197,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_size && "
        '"vectorized gather kernel index out of bounds"` failed.',
        r"^index out of range in self$",
    ),
    "bce-input": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:90: operator(): block: [0,0,0], "
        "thread: [1,0,0] Assertion `input_val >= zero && input_val <= one` failed.",
        r"^all elements of input should be between 0 and 1$",
    ),
    "multinomial": (
        "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `probability tensor contains either `inf`, "
        "`nan` or element < 0` failed.",
        r"^probability tensor contains either `inf`, `nan` or element < 0$",
    ),
    "gather-scatter": (
        "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:163: operator(): "
        "block: [0,0,0], thread: [1,0,0] Assertion `idx_dim >= 0 && idx_dim < index_size && "
        '"scatter gather kernel index out of bounds"` failed.',
        r"^index -?\d+ is out of bounds for dimension \d+ with size \d+$",
    ),
}


def where() -> str:
    if SIMULATED:
        return "cpu: no CUDA here, so the GPU failure is simulated with PyTorch's exact texts"
    return f"cuda: {torch.cuda.get_device_name()}, the device-side assert is real"


@contextlib.contextmanager
def gpu_failure(case: str) -> Iterator[None]:
    """Where CUDA is present: nothing. Where not: PyTorch's readable CPU error for ``case``
    becomes the device line on fd 2 and the exception CUDA gives for the same input."""
    line, cpu_text = CASES[case]
    if not SIMULATED:
        yield
        return
    try:
        yield
    except (IndexError, RuntimeError) as cpu_error:
        if not re.search(cpu_text, str(cpu_error)):
            raise
        os.write(2, (line + "\n").encode())
        raise getattr(torch, "AcceleratorError", RuntimeError)(CUDA_ASSERT) from None
