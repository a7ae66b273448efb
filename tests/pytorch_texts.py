"""Exact texts PyTorch prints for a device-side assert, per era.

Built by c10/cuda/CUDAException.cpp (c10_cuda_check_implementation: "CUDA error: ", the error's
text, then get_cuda_error_help, the async suffix and the device-side assertion line) and
c10/cuda/CUDAMiscFunctions.cpp (older releases: c10/cuda/CUDAFunctions.cpp); the device lines are
what a GPU printed (below).

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

# The newest era (PyTorch main, April 2026): builds compiled with TORCH_USE_CUDA_DSA, so no
# "Compile with" line but c10_retrieve_device_side_assertion_info()'s "Device-side assertion
# tracking was not enabled by user." (c10/cuda/CUDADeviceAssertionHost.cpp); the async hint only
# for a kernel's errors, "run with CUDA_LOG_FILE=stderr" for the others
# (get_cuda_async_error_suffix, c10/cuda/CUDAMiscFunctions.cpp).
DSA_OFF = "\nDevice-side assertion tracking was not enabled by user."
HINT_2026_04 = (
    "\nSearch for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\nCUDA kernel errors might be asynchronously "
    "reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging "
    "consider passing CUDA_LAUNCH_BLOCKING=1" + DSA_OFF
)
DRIVER_LOG_HINT = "\nFor more detailed error information, run with CUDA_LOG_FILE=stderr"

ASSERT_2_0 = HEADLINE + HINT_2_0  # RuntimeError (2.0-2.7) or torch.AcceleratorError (2.8)
ASSERT_2_9 = HEADLINE + HINT_2_9  # torch.AcceleratorError, 2.9 to early 2026
ASSERT_2026_04 = HEADLINE + HINT_2026_04  # torch.AcceleratorError, PyTorch main since April 2026
# A non-sticky error of the same era, as a 2026 report printed it (torch.AcceleratorError on
# `model.to("cuda:1")` with one GPU): get_cuda_error_help's own line, then the driver-log hint.
INVALID_ORDINAL_2026 = (
    "CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?"
    + DRIVER_LOG_HINT
    + DSA_OFF
)

# A cell that fails as a current PyTorch does after a device-side assert.
RAISE_ASSERT = f"import torch\nraise torch.AcceleratorError({ASSERT_2_9!r})"

# Device lines as a real GPU printed them (NVIDIA H100, driver 580.159.04, torch 2.11.0+cu130,
# 2026-11-23; tests/notebook/test_gpu_catalogue.py), the first of each case, with the cause the
# panel must name. Kept here so CPU CI holds the diagnosis to what the hardware really says.
H100_TORCH_2_11: dict[str, tuple[str, str]] = {
    "cross-entropy-label": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        "label-out-of-range",
    ),
    "segmentation-void-255": (
        "/pytorch/aten/src/ATen/native/cuda/NLLLoss2d.cu:106: nll_loss2d_forward_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.",
        "label-out-of-range",
    ),
    "multi-margin-label": (
        "/pytorch/aten/src/ATen/native/cuda/MultiMarginLoss.cu:33: MultiMarginLoss_forward_kernel: "
        "block: [1,0,0], thread: [0,0,0] Assertion `target_k >= 0 && target_k < dim && "
        '"target index is out of bounds"` failed.',
        "label-out-of-range",
    ),
    "embedding-bag": (
        "/pytorch/aten/src/ATen/native/cuda/EmbeddingBag.cu:149: "
        "EmbeddingBag_updateOutputKernel_sum_mean: block: [0,0,0], thread: [0,0,0] Assertion "
        '`!has_invalid_index && "Invalid input index in EmbeddingBag: index out of range '
        '[0, numRows)"` failed.',
        "index-out-of-range",
    ),
    "embedding-16-ids-or-fewer": (
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: "
        "block: [0,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
        "index-out-of-range",
    ),
    "embedding-vectorized-gather": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        "block: [197,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_size && "
        '"vectorized gather kernel index out of bounds"` failed.',
        "index-out-of-range",
    ),
    "bce-input": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:90: operator(): block: [0,0,0], "
        "thread: [1,0,0] Assertion `input_val >= zero && input_val <= one` failed.",
        "probability-out-of-range",
    ),
    "bce-target": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:91: operator(): block: [0,0,0], "
        "thread: [1,0,0] Assertion `target_val >= zero && target_val <= one` failed.",
        "probability-out-of-range",
    ),
    "multinomial": (
        "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `probability tensor contains either `inf`, "
        "`nan` or element < 0` failed.",
        "probability-out-of-range",
    ),
    # torch._assert_async(cond) without a message: the condition is printed empty.
    "assert-async": (
        "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:109: _assert_async_cuda_kernel: "
        "block: [0,0,0], thread: [0,0,0] Assertion `` failed.",
        "user-assert",
    ),
    "gather-scatter": (
        "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:163: operator(): "
        "block: [0,0,0], thread: [1,0,0] Assertion `idx_dim >= 0 && idx_dim < index_size && "
        '"scatter gather kernel index out of bounds"` failed.',
        "index-out-of-range",
    ),
    "bernoulli": (
        "/pytorch/aten/src/ATen/native/cuda/DistributionTemplates.h:634: operator(): "
        "block: [0,0,0], thread: [0,0,0] Assertion `0 <= p2 && p2 <= 1` failed.",
        "probability-out-of-range",
    ),
    "index-add": (
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1021: indexFuncSmallIndex: "
        "block: [0,0,0], thread: [0,0,0] Assertion `dstIndex < dstAddDimSize` failed.",
        "index-out-of-range",
    ),
    "advanced-indexing": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], "
        'thread: [1,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of '
        'bounds"` failed.',
        "index-out-of-range",
    ),
    "take": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:339: operator(): block: [0,0,0], "
        "thread: [1,0,0] Assertion `idx < numel && idx >= -numel && "
        '"cuda_take_put_kernel() index out of bounds"` failed.',
        "index-out-of-range",
    ),
    "inductor-embedding": (
        "/tmp/torchinductor_root/do/cdonlvpn6wkzkvwvozaifr3x2crndzfukedzjcpvvcv4b7uf6i4w.py:31: "
        "unknown: block: [0,0,0], thread: [8,0,0] Assertion `index out of bounds: 0 <= tmp4 < 10` "
        "failed.",
        "index-out-of-range",
    ),
}
# The exception text of a sticky illegal address on the same machine (a CuPy kernel's null write).
ILLEGAL_ADDRESS_2_11 = (
    "CUDA error: an illegal memory access was encountered\nSearch for `cudaErrorIllegalAddress' "
    "in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
    "information." + HINT_2_0
)
