"""Exact texts PyTorch prints for a device-side assert, per era (FIELD_NOTES §1).

Tests simulate CUDA failures on CPU only with these: the exception type PyTorch raises
(`RuntimeError`, `torch.AcceleratorError` from 2.8) and its exact message.
"""

from __future__ import annotations

HEADLINE = "CUDA error: device-side assert triggered"

# The boilerplate appended to every CUDA error message (until recently, out of memory included).
HINT_1_10 = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call,so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1."
)
HINT_2_0 = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
HINT_2_9 = (
    "\nSearch for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information." + HINT_2_0
)

ASSERT_2_0 = HEADLINE + HINT_2_0  # RuntimeError (2.0-2.7) or torch.AcceleratorError (2.8)
ASSERT_2_9 = HEADLINE + HINT_2_9  # torch.AcceleratorError, current releases

# A cell that fails as a current PyTorch does after a device-side assert.
RAISE_ASSERT = f"import torch\nraise torch.AcceleratorError({ASSERT_2_9!r})"
