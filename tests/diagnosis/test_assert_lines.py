"""Device assert lines in every print format become AssertLines (file, function, condition)."""

from __future__ import annotations

import pytest

from nb_cudaguard.diagnosis.assert_lines import parse_assert_lines

LINUX = (
    "/pytorch/aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: "
    "block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed."
)
WINDOWS = (
    "C:\\actions-runner\\_work\\pytorch\\pytorch\\pytorch\\aten\\src\\ATen\\native\\cuda\\"
    "IndexKernelUtils.cu:16: block: [0,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < "
    'ind_dim_size && "vectorized gather kernel index out of bounds"` failed.'
)
OLD_THC = (
    "/opt/conda/conda-bld/pytorch_1556653099582/work/aten/src/THCUNN/ClassNLLCriterion.cu:105: "
    "void cunn_ClassNLLCriterion_updateOutput_kernel(Dtype *, Dtype *, Dtype *, long *, Dtype *, "
    "int, int, int, int, long) [with Dtype = float, Acctype = float]: block: [0,0,0], thread: "
    "[4,0,0] Assertion `t >= 0 && t < n_classes` failed."
)
INDUCTOR = (
    "/tmp/torchinductor_root/ab/cabcdefxyz.py:18: unknown: block: [0,0,0], thread: [0,0,0] "
    "Assertion `index out of bounds: 0 <= tmp4 < 50257` failed."
)
ASSERT_MSG = (
    "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:112: _assert_async_cuda_kernel: block: "
    "[0,0,0], thread: [0,0,0] Assertion `probability tensor contains either `inf`, `nan` or "
    "element < 0` failed."
)
HIP = (
    "/long/path/pytorch/aten/src/ATen/native/hip/Loss.hip:250: nll_loss_forward_reduce_cuda_"
    "kernel_2d: Device-side assertion `t >= 0 && t < n_classes' failed."
)
DSA = (
    "CUDA error: device-side assert triggered\n"
    "Device-side assertion tracking was enabled. Assertions found:\n"
    "Assertion failure 0\n"
    "  GPU assertion failure message = t >= 0 && t < n_classes\n"
    "  File containing assertion = /src/pytorch/aten/src/ATen/native/cuda/Loss.cu:250\n"
    "  Device function containing assertion = nll_loss_forward_reduce_cuda_kernel_2d\n"
    "  Thread ID that failed assertion = [5,0,0]\n"
    "  Block ID that failed assertion = [0,0,0]\n"
)


@pytest.mark.parametrize(
    ("text", "file", "function", "condition"),
    [
        (LINUX, "Loss.cu", "nll_loss_forward_reduce_cuda_kernel_2d", "t >= 0 && t < n_classes"),
        (
            WINDOWS,
            "IndexKernelUtils.cu",
            None,
            'ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"',
        ),
        (OLD_THC, "ClassNLLCriterion.cu", None, "t >= 0 && t < n_classes"),
        (INDUCTOR, "cabcdefxyz.py", "unknown", "index out of bounds: 0 <= tmp4 < 50257"),
        (
            ASSERT_MSG,
            "TensorCompare.cu",
            "_assert_async_cuda_kernel",
            "probability tensor contains either `inf`, `nan` or element < 0",
        ),
        (HIP, "Loss.hip", "nll_loss_forward_reduce_cuda_kernel_2d", "t >= 0 && t < n_classes"),
        (DSA, "Loss.cu", "nll_loss_forward_reduce_cuda_kernel_2d", "t >= 0 && t < n_classes"),
    ],
    ids=["linux", "windows", "old-thc", "inductor", "assert-msg", "hip", "dsa"],
)
def test_each_print_format_gives_file_function_and_condition(text, file, function, condition):
    (line,) = parse_assert_lines(text)
    assert line.file == file
    assert line.condition == condition
    if function is not None:
        assert line.function == function


def test_old_pretty_signature_is_kept_whole_as_the_function():
    (line,) = parse_assert_lines(OLD_THC)
    assert line.function is not None
    assert line.function.startswith("void cunn_ClassNLLCriterion_updateOutput_kernel(")
    assert line.function.endswith("[with Dtype = float, Acctype = float]")


def test_windows_line_has_no_function():
    (line,) = parse_assert_lines(WINDOWS)
    assert line.function is None


def test_hundreds_of_thread_lines_fold_into_one_with_a_count():
    text = "\n".join(LINUX.replace("thread: [5,0,0]", f"thread: [{i},0,0]") for i in range(384))
    (line,) = parse_assert_lines(text)
    assert line.count == 384


def test_interleaved_sites_keep_their_first_appearance_order():
    bce = (
        "../aten/src/ATen/native/cuda/Loss.cu:94: operator(): block: [1,0,0], thread: [7,0,0] "
        "Assertion `input_val >= zero && input_val <= one` failed."
    )
    lines = parse_assert_lines("\n".join([bce, LINUX, bce, LINUX, bce]))
    assert [(line.condition.split()[0], line.count) for line in lines] == [
        ("input_val", 3),
        ("t", 2),
    ]


def test_lines_glued_without_newline_are_both_found():
    # Threads print concurrently; two lines can share one physical line.
    (line,) = parse_assert_lines(LINUX + LINUX.replace("[5,0,0]", "[6,0,0]"))
    assert line.count == 2


def test_verbose_printf_detail_glued_before_the_path_does_not_hide_the_file():
    text = "Expected 0 <= idx_dim < index_size (3), but got idx_dim = 5" + (
        "/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu:367: operator(): block: "
        '[0,0,0], thread: [0,0,0] Assertion `idx_dim >= 0 && idx_dim < index_size && "index '
        'out of bounds"` failed.'
    )
    (line,) = parse_assert_lines(text)
    assert line.file == "ScatterGatherKernel.cu"


def test_path_prefix_and_line_number_do_not_change_the_site():
    a = LINUX
    b = LINUX.replace("/pytorch/aten", "/__w/pytorch/pytorch/aten").replace(":250:", ":263:")
    (line,) = parse_assert_lines(a + "\n" + b)
    assert line.count == 2


def test_text_without_assert_lines_gives_nothing():
    assert parse_assert_lines("RuntimeError: CUDA error: device-side assert triggered\n") == ()


def test_printf_assert_line_and_the_runtime_line_fold_into_one_site():
    # CUDA_KERNEL_ASSERT_PRINTF (c10 Macros.h) prints its own line, then __assert_fail's.
    text = (
        "[CUDA_KERNEL_ASSERT] /pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: "
        "vectorized_gather_kernel: block: [3,0,0], thread: [0,0,0]: Assertion failed: "
        '`ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"`: '
        "Expected 0 <= index < ind_dim_size(10), but got index = 12\n"
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        "block: [3,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_size && "
        '"vectorized gather kernel index out of bounds"` failed.\n'
    )
    (line,) = parse_assert_lines(text)
    assert (line.file, line.function, line.count) == (
        "IndexKernelUtils.cu",
        "vectorized_gather_kernel",
        2,
    )
    assert line.condition.startswith("ind >=0 && ind < ind_dim_size")


@pytest.mark.parametrize(
    "text",
    [
        # glibc's own assert has the same shape as a device line without block/thread
        "python: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion "
        "`mutex->__data.__owner == 0' failed.",
        "See aten/src/ATen/native/cuda/Loss.cu for the nll_loss kernel.",
    ],
)
def test_texts_that_only_look_like_device_lines_give_none(text):
    assert parse_assert_lines(text) == ()
