"""Recognition of CUDA errors by their headline, in the texts of every PyTorch era.

tests/pytorch_texts.py holds the texts, with the PyTorch sources that print them.
"""

from __future__ import annotations

import pytest
import torch
from pytorch_texts import ASSERT_2_0, ASSERT_2_9, HEADLINE, HINT_1_10, HINT_2_0, HINT_2_9

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.classify import classify_exception, classify_text

# The device-side assert as each era prints it.
ASSERT_TEXTS = {
    "1.0 THC cuda runtime error": (
        "cuda runtime error (59) : device-side assert triggered at "
        "/pytorch/aten/src/THC/generic/THCTensorMath.cu:26"
    ),
    "1.4 cuda runtime error 710": (
        "cuda runtime error (710) : device-side assert triggered at "
        "/pytorch/aten/src/THC/THCCachingHostAllocator.cpp:278"
    ),
    "THCudaCheck FAIL": (
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=383 error=59 : "
        "device-side assert triggered"
    ),
    "reduce failed to synchronize": "reduce failed to synchronize: device-side assert triggered",
    "thrust failed to synchronize": (
        "merge_sort: failed to synchronize: cudaErrorAssert: device-side assert triggered"
    ),
    "1.5 CUDA error": HEADLINE,
    "1.10 with hint": HEADLINE + HINT_1_10,
    "2.0 with DSA hint": ASSERT_2_0,
    "2.9 AcceleratorError": ASSERT_2_9,
    "CUDA 13 driver log": (
        ASSERT_2_9
        + "The CUDA driver logged these messages, most recent last:\n  kernel assert hit\n"
    ),
    "C++ what()": (
        "terminate called after throwing an instance of 'c10::AcceleratorError'\n"
        f"  what():  {ASSERT_2_0}"
    ),
    "C++ what() old c10::Error": (
        "terminate called after throwing an instance of 'c10::Error'\n"
        f"  what():  {HEADLINE}{HINT_1_10}"
    ),
    "NCCL watchdog": (
        "[PG 3 Rank 0] Process group watchdog thread terminated with exception: " + ASSERT_2_0
    ),
    "HIP build": (
        "HIP error: device-side assert triggered\n"
        "HIP kernel errors might be asynchronously reported"
    ),
    "driver API": "CUDA driver error: device-side assert triggered",
    "Triton launcher": "Triton Error [CUDA]: device-side assert triggered",
}


@pytest.mark.parametrize("text", ASSERT_TEXTS.values(), ids=ASSERT_TEXTS.keys())
def test_every_era_of_the_device_side_assert_is_a_sticky_assert(text):
    error = classify_text(text)
    assert error is not None
    assert (error.name, error.sticky) == ("cudaErrorAssert", True)


@pytest.mark.parametrize("text", ASSERT_TEXTS.values(), ids=ASSERT_TEXTS.keys())
def test_device_side_assert_without_known_condition_is_unknown_assert(text):
    diagnosis = diagnose(RuntimeError(text))
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("unknown-assert", True)


STICKY = [
    (
        "an illegal memory access was encountered",
        "cudaErrorIllegalAddress",
        "illegal-memory-access",
    ),
    ("unspecified launch failure", "cudaErrorLaunchFailure", "launch-failure"),
    ("misaligned address", "cudaErrorMisalignedAddress", "misaligned-address"),
    ("an illegal instruction was encountered", "cudaErrorIllegalInstruction", "other-sticky"),
    ("hardware stack error", "cudaErrorHardwareStackError", "other-sticky"),
    (
        "operation not supported on global/shared address space",
        "cudaErrorInvalidAddressSpace",
        "other-sticky",
    ),
    ("invalid program counter", "cudaErrorInvalidPc", "other-sticky"),
    ("the launch timed out and was terminated", "cudaErrorLaunchTimeout", "other-sticky"),
    ("tensor memory not completely freed", "cudaErrorTensorMemoryLeak", "other-sticky"),
    (
        "Invalid access of peer GPU memory over nvlink or a hardware error",
        "cudaErrorContained",
        "other-sticky",
    ),
    (
        "an async error has occured in external entity outside of CUDA",
        "cudaErrorExternalDevice",
        "other-sticky",
    ),
    (
        "the MPS client has been terminated by the server",
        "cudaErrorMpsClientTerminated",
        "other-sticky",
    ),
]


@pytest.mark.parametrize(("text", "name", "cause"), STICKY, ids=[s[1] for s in STICKY])
def test_other_sticky_codes_are_sticky_with_their_cause(text, name, cause):
    diagnosis = diagnose(torch.AcceleratorError(f"CUDA error: {text}" + HINT_2_0))
    assert diagnosis is not None
    assert (diagnosis.error.name, diagnosis.sticky, diagnosis.cause) == (name, True, cause)


def test_legacy_illegal_address_code_77_is_sticky():
    text = (
        "cuda runtime error (77) : an illegal memory access was encountered at "
        "/opt/conda/conda-bld/pytorch_1556653099582/work/aten/src/THC/THCCachingHostAllocator.cpp:265"
    )
    diagnosis = diagnose(RuntimeError(text))
    assert (diagnosis.cause, diagnosis.sticky) == ("illegal-memory-access", True)


NOT_STICKY = {
    "out of memory, runtime": "CUDA error: out of memory" + HINT_1_10,
    "out of memory, allocator": (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.63 GiB already allocated; 4.75 MiB free; 14.70 GiB reserved in total by PyTorch)"
    ),
    "invalid device ordinal": "CUDA error: invalid device ordinal" + HINT_2_0,
    "no kernel image": "CUDA error: no kernel image is available for execution on the device"
    + HINT_2_0,
    "invalid argument": "CUDA error: invalid argument" + HINT_2_0,
    "invalid configuration": "CUDA error: invalid configuration argument" + HINT_2_0,
    "old driver": (
        "CUDA error: CUDA driver version is insufficient for CUDA runtime version" + HINT_2_0
    ),
    "stream capture": "CUDA error: operation not permitted when stream is capturing" + HINT_2_0,
    "cuBLAS": ("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"),
    "cuDNN": "cuDNN error: CUDNN_STATUS_MAPPING_ERROR",
}


@pytest.mark.parametrize("text", NOT_STICKY.values(), ids=NOT_STICKY.keys())
def test_non_sticky_cuda_errors_are_cuda_errors_but_not_sticky(text):
    diagnosis = diagnose(RuntimeError(text))
    assert diagnosis is not None
    assert (diagnosis.sticky, diagnosis.cause) == (False, "not-sticky")


def test_out_of_memory_error_type_is_not_sticky():
    error = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB"
    )
    diagnosis = diagnose(error)
    assert diagnosis is not None and not diagnosis.sticky


def test_boilerplate_hint_alone_does_not_make_out_of_memory_an_assert():
    # Until recently every CUDA error got the hint, which mentions device-side assertions.
    diagnosis = diagnose(RuntimeError("CUDA error: out of memory" + HINT_2_9))
    assert diagnosis is not None and not diagnosis.sticky


NOT_CUDA = [
    ZeroDivisionError("division by zero"),
    IndexError("Target 3 is out of bounds."),
    IndexError("index out of range in self"),
    RuntimeError("all elements of input should be between 0 and 1"),
    RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        "cuda:0 and cpu!"
    ),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)"),
    ValueError("Torch not compiled with CUDA enabled"),
    AssertionError("Torch not compiled with CUDA enabled"),
    RuntimeError("Found no NVIDIA driver on your system."),
    KeyError("cuda"),
    RuntimeError(
        "user message\nCUDA kernel errors might be asynchronously reported at some other API call"
    ),
]


@pytest.mark.parametrize("error", NOT_CUDA, ids=[repr(e)[:60] for e in NOT_CUDA])
def test_non_cuda_errors_give_no_diagnosis(error):
    assert diagnose(error) is None


def test_a_user_error_raised_from_a_sticky_error_is_recognised_through_its_cause():
    try:
        try:
            raise torch.AcceleratorError(ASSERT_2_0)
        except RuntimeError as inner:
            raise ValueError("training step failed") from inner
    except ValueError as outer:
        error = classify_exception(outer)
    assert error is not None and error.sticky


def test_error_code_attribute_fills_a_missing_code():
    error = torch.AcceleratorError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling gemm")
    error.error_code = 13  # set by C++ on raise
    assert classify_exception(error).code == 13


def test_text_with_device_lines_and_exception_finds_the_assert_and_its_lines():
    text = (
        "../aten/src/ATen/native/cuda/Loss.cu:242: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
        'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
        "    print(loss.item())\ntorch.AcceleratorError: CUDA error: device-side assert triggered"
        + HINT_2_9
    )
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.sticky
    assert [line.file for line in diagnosis.assert_lines] == ["Loss.cu"]


def test_plain_text_without_cuda_error_gives_none():
    assert diagnose("Traceback (most recent call last):\nValueError: bad") is None


# Errors re-raised from a replica, a worker or a child process quote the original traceback.
DATA_PARALLEL = (
    "Caught RuntimeError in replica 0 on device 0.\n"
    "Original Traceback (most recent call last):\n"
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/parallel_apply.py", '
    "line 64, in _worker\n"
    "    output = module(*input, **kwargs)\n"
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/sparse.py", line 162, '
    "in forward\n"
    "    return F.embedding(\n"
    f"RuntimeError: {ASSERT_2_0}"
)
SPAWN = (
    "\n\n-- Process 1 terminated with the following error:\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/dist-packages/torch/multiprocessing/spawn.py", line 90, in _wrap\n'
    "    fn(i, *args)\n"
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered" + HINT_2_9
)


def test_data_parallel_replica_error_is_recognised_through_the_quoted_traceback():
    diagnosis = diagnose(RuntimeError(DATA_PARALLEL))
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("unknown-assert", True)


def test_spawned_process_error_is_recognised_through_the_quoted_traceback():
    diagnosis = diagnose(RuntimeError(SPAWN))
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("illegal-memory-access", True)


def test_cuda_text_in_a_quoted_traceback_frame_is_not_the_error():
    # Source lines of frames are indented: only the quoted exception line counts.
    text = (
        "Caught ValueError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "data.py", line 3, in __getitem__\n'
        "    log('CUDA error: device-side assert triggered')\n"
        "ValueError: bad sample"
    )
    assert diagnose(ValueError(text)) is None


def test_device_assert_lines_alone_are_a_device_side_assert():
    text = (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
    )
    diagnosis = diagnose(text)
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("label-out-of-range", True)


def test_captured_assert_lines_do_not_turn_a_non_cuda_error_into_one():
    earlier = (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
    )
    assert diagnose(ZeroDivisionError("division by zero"), device_output=earlier) is None


def test_diagnose_rejects_what_is_neither_an_exception_nor_a_text():
    with pytest.raises(TypeError, match="an exception or a text, not int"):
        diagnose(710)
