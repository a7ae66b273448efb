"""The demos' one switch: the real GPU where CUDA is present, PyTorch's exact texts where not.

With CUDA, ``gpu_failure`` does nothing: the demo's cell triggers the real device-side assert.
Without it, the same bad input makes PyTorch's CPU kernel raise its readable error
(aten/src/ATen/native/LossNLL.cpp: ``IndexError: Target 3 is out of bounds.``); ``gpu_failure``
turns exactly that error into what CUDA reports instead: the device line written to file descriptor
2 (as an NVIDIA H100 printed it with torch 2.11.0+cu130; tests/pytorch_texts.py keeps the same
lines, and CI checks they match) and the exception PyTorch raises (``torch.AcceleratorError`` with
its exact text), raised from the user's line that made the failing call, as a GPU run with
``CUDA_LAUNCH_BLOCKING=1`` reports it, with the user's frames only (no frame of this file's, nor
torch's). Any other error passes through unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, handle_torch_function

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
        # said where the error shows: without blocking launches a GPU reports it at a later call
        return (
            "cpu: no CUDA here, so the GPU failure is simulated with PyTorch's exact texts, "
            "raised at the line that launched the kernel (as with CUDA_LAUNCH_BLOCKING=1)"
        )
    return f"cuda: {torch.cuda.get_device_name()}, the device-side assert is real"


class _Simulated(TorchFunctionMode):
    """Every torch call in the block passes through ``__torch_function__``: the CPU error is
    replaced where it is raised, below the user's frames (an exception raised by a context
    manager's ``__exit__`` would point at the ``with`` line, above contextlib's frames and ours)."""

    def __init__(self, line: str, cpu_text: str) -> None:
        super().__init__()
        self.line, self.cpu_text = line, cpu_text
        self.raised: BaseException | None = None

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return func(*args, **(kwargs or {}))
        except (IndexError, RuntimeError) as cpu_error:
            if not re.search(self.cpu_text, str(cpu_error)):
                raise
            os.write(2, (self.line + "\n").encode())
            self.raised = _ACCELERATOR_ERROR(CUDA_ASSERT)
            raise self.raised from None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        super().__exit__(kind, error, tb)
        if tb is not None:
            _unlink_frames(tb, simulated=error is self.raised)


_ACCELERATOR_ERROR: type[Exception] = getattr(torch, "AcceleratorError", RuntimeError)
_TORCH = os.path.dirname(torch.__file__) + os.sep
_OURS = _Simulated.__torch_function__.__code__
_DISPATCH = handle_torch_function.__code__


def _unlink_frames(tb: TracebackType, *, simulated: bool) -> None:
    """Unlink frames from the traceback, in place (it is what IPython shows and nb_cudaguard
    reads); ``tb``, the user's frame that ran the block, stays first. The simulated error keeps
    the user's frames only, which end at the line that made the failing call: its own frames
    are ours and torch's (the call passed through ``torch.overrides``, which a GPU run's does
    not). Any other error loses only what the mode added: our frame, ``handle_torch_function``'s,
    and the torch function's that handed the call to it (its real frame follows below ours)."""
    entries: list[TracebackType] = []
    entry: TracebackType | None = tb
    while entry is not None:
        entries.append(entry)
        entry = entry.tb_next
    codes = [e.tb_frame.f_code for e in entries]

    def added(i: int) -> bool:
        if simulated:
            return codes[i].co_filename.startswith(_TORCH) or codes[i] is _OURS
        return any(c is _DISPATCH for c in codes[i : i + 2]) or codes[i] is _OURS

    kept = [entries[0], *(e for i, e in enumerate(entries) if i and not added(i))]
    for upper, lower in zip(kept, [*kept[1:], None], strict=True):
        upper.tb_next = lower


def gpu_failure(case: str) -> contextlib.AbstractContextManager[Any]:
    """Where CUDA is present: nothing. Where not: PyTorch's readable CPU error for ``case``
    becomes the device line on fd 2 and the exception CUDA gives for the same input."""
    line, cpu_text = CASES[case]
    return _Simulated(line, cpu_text) if SIMULATED else contextlib.nullcontext()
