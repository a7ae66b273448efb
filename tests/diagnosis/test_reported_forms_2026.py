"""Forms found in real 2023-2026 reports that earlier releases misread (issue 33).

A HIP `assert` in the user's own kernel file, a device line cut short by an issue title, the
out-of-memory texts of PyTorch's allocators when a memory fraction caps the process, TensorRT's
"Cuda Runtime (...)" wrapper, glog's printed codes in the numbering of the CUDA that printed them,
and the newest PyTorch message. Each text is a report's, verbatim (the source in its comment), or
PyTorch's own format string filled in where no report printed that branch (the source file
named). The near misses beside them are never a CUDA error.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from pytorch_texts import (
    ASSERT_2026_04,
    H100_TORCH_2_11,
    INVALID_ORDINAL_2026,
)

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.assert_lines import parse_assert_lines
from nb_cudaguard.diagnosis.model import ContextState
from nb_cudaguard.diagnosis.rules import RULES
from nb_cudaguard.diagnosis.schema import verdict

# --- an assert in a kernel outside PyTorch ----------------------------------------------------
OWN_KERNELS = {
    # ROCm/hip#3368: assert(0) added to the HIP-Examples vectorAdd kernel, on an MI250X
    "hip assert(0)": "vectoradd_hip.cpp:50: void vectoradd_float(float *__restrict, const float "
    "*__restrict, const float *__restrict, int, int): Device-side assertion `0' failed.",
    # ROCm/hip#2482: the output its author expected from `assert(false)` in a one-line kernel
    "hip assert(false)": "main.cpp:6: void f(): Device-side assertion `false' failed.",
}


@pytest.mark.parametrize("line", OWN_KERNELS.values(), ids=OWN_KERNELS.keys())
def test_an_assert_in_the_users_own_kernel_file_is_that_kernels_not_pytorchs(line: str):
    diagnosis = diagnose(line)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "user-assert"
    assert "outside PyTorch" in diagnosis.title
    assert "not in PyTorch's sources" in diagnosis.explanation


def test_pytorchs_own_kernels_stay_pytorchs_whatever_the_build_path():
    # kousw/stable-diffusion-webui-daam#4 (a Windows wheel's build path) and the H100's line
    windows = (
        "C:\\actions-runner\\_work\\pytorch\\pytorch\\builder\\windows\\pytorch\\aten\\src\\ATen"
        "\\native\\cuda\\IndexKernel.cu:91: block: [26,0,0], thread: [32,0,0] Assertion `index >= "
        '-sizes[i] && index < sizes[i] && "index out of bounds"` failed.'
    )
    assert diagnose(windows).cause == "index-out-of-range"  # type: ignore[union-attr]
    line, cause = H100_TORCH_2_11["cross-entropy-label"]
    assert diagnose(line).cause == cause  # type: ignore[union-attr]


def test_a_cpu_programs_assert_in_a_cpp_file_is_no_cuda_error():
    # glibc's own assert() line has the same file:line: function: shape without "Device-side"
    assert diagnose("main.cpp:6: int main(): Assertion `x > 0' failed.") is None
    assert (
        diagnose(
            "python3: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion "
            "`mutex->__data.__owner == 0' failed."
        )
        is None
    )


# --- device lines cut short --------------------------------------------------------------------
def test_an_issue_title_cut_after_the_file_names_the_files_op():
    # kousw/stable-diffusion-webui-daam#4, the whole title
    diagnosis = diagnose("IndexKernel.cu:91: Assertion")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "index-out-of-range"


# ThetaCursed/clean-ui#4 printed this line (thousands of threads); titles cut it anywhere.
CLEAN_UI = (
    "../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [109,0,0], thread: "
    '[124,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.'
)


@pytest.mark.parametrize("keep", [len(CLEAN_UI) - n for n in (10, 25, 40, 60, 80)])
def test_an_assert_line_cut_mid_condition_keeps_its_cause(keep: int):
    diagnosis = diagnose(CLEAN_UI[:keep])
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "index-out-of-range"


def test_a_line_cut_before_its_condition_is_named_by_its_kernel_function():
    line, cause = H100_TORCH_2_11["cross-entropy-label"]
    cut = line[: line.index("Assertion")]  # "...Loss.cu:245: nll_loss_forward_..._2d: block: ..."
    assert diagnose(cut).cause == cause  # type: ignore[union-attr]
    without_file = cut[cut.index("nll_loss") :]
    assert diagnose(without_file).cause == cause  # type: ignore[union-attr]


@pytest.mark.parametrize("case", sorted(H100_TORCH_2_11))
def test_a_real_device_line_cut_anywhere_never_names_a_wrong_cause(case: str):
    line, cause = H100_TORCH_2_11[case]
    file = parse_assert_lines(line)[0].file
    # a file of generic asserts (torch._assert_async, Triton's device_assert) may say just that
    generic = {r.cause for r in RULES if r.cause == "user-assert" and r.matches_file(file)}
    start = line.index("Assertion")
    for keep in range(start, len(line), 5):
        diagnosis = diagnose(line[:keep])
        assert diagnosis is not None, line[:keep]
        assert diagnosis.cause in {cause, "unknown-assert", *generic}, line[:keep]


def test_text_that_only_looks_like_a_block_is_no_assert():
    assert diagnose("[Server thread/INFO]: block: [stone] placed at 10, 64, -3") is None


# --- out of memory under a memory fraction -----------------------------------------------------
# AIFSH/ComfyUI-ChatTTS#9: the cudaMallocAsync backend prints "would exceed allowed memory" with
# its limit; 17179869184 GiB (16 EiB) is "no fraction set".
ASYNC_OOM_NO_FRACTION = (
    "torch.cuda.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of "
    "memory)\nCurrently allocated     : 6.89 GiB\nRequested               : 320.00 MiB\n"
    "Device limit            : 23.69 GiB\nFree (according to CUDA): 2.94 MiB\nPyTorch limit "
    "(set by user-supplied memory fraction)\n                        : 17179869184.00 GiB"
)
# The same format string (c10/cuda/CUDAMallocAsyncAllocator.cpp) with a fraction of 0.1 set.
ASYNC_OOM_FRACTION = (
    "torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)"
    "\nCurrently allocated     : 7.50 GiB\nRequested               : 1.00 GiB\nDevice limit      "
    "      : 79.10 GiB\nFree (according to CUDA): 70.12 GiB\nPyTorch limit (set by user-supplied "
    "memory fraction)\n                        : 7.91 GiB"
)
# c10/cuda/CUDACachingAllocator.cpp adds "<size> allowed; " when set_per_process_memory_fraction
# was called: the 2.1+ wording, and the 1.8-2.0 one.
CACHING_OOM_FRACTION = {
    "2.1+": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has "
    "a total capacity of 79.10 GiB of which 70.12 GiB is free. Including non-PyTorch memory, this "
    "process has 8.96 GiB memory in use. 7.91 GiB allowed; Of the allocated memory 7.50 GiB is "
    "allocated by PyTorch, and 1.95 MiB is reserved by PyTorch but unallocated.",
    "1.8-2.0": "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB "
    "total capacity; 4.00 GiB already allocated; 10.79 GiB free; 4.00 GiB allowed; 4.00 GiB "
    "reserved in total by PyTorch)",
}


def test_the_cudamallocasync_oom_is_an_oom_that_leaves_the_context_usable():
    diagnosis = diagnose(ASYNC_OOM_NO_FRACTION)
    assert diagnosis is not None and not diagnosis.sticky
    assert diagnosis.error is not None and diagnosis.error.name == "cudaErrorMemoryAllocation"
    assert diagnosis.fixes and "memory fraction" not in diagnosis.fixes[0]
    assert "smaller batch" in diagnosis.fixes[0]


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        (ASYNC_OOM_FRACTION, "7.91 GiB"),
        (CACHING_OOM_FRACTION["2.1+"], "7.91 GiB"),
        (CACHING_OOM_FRACTION["1.8-2.0"], "4.00 GiB"),
    ],
    ids=["cudaMallocAsync", "caching 2.1+", "caching 1.8-2.0"],
)
def test_an_oom_under_a_memory_fraction_says_the_fraction_capped_it(text: str, limit: str):
    diagnosis = diagnose(text)
    assert diagnosis is not None and not diagnosis.sticky
    assert diagnosis.cause == "not-sticky"
    assert limit in diagnosis.fixes[0]
    assert "set_per_process_memory_fraction" in diagnosis.fixes[0]


def test_a_cpu_allocation_failure_is_no_cuda_oom():
    # pytorch/pytorch#5434's title
    assert (
        diagnose(
            "RuntimeError: $ Torch: not enough memory: you tried to allocate 72GB. Buy new RAM!"
        )
        is None
    )


# --- TensorRT's "Cuda Runtime (...)" ----------------------------------------------------------
TENSORRT = {
    # NVIDIA/TensorRT#3469 (title)
    "trt logger": "[11/20/2023-08:42:31] [TRT] [E] 1: [runner.cpp::execute::363] Error Code 1: "
    "Cuda Runtime (invalid argument)",
    # thb1314/tensorrt-onnx-fasterrcnn-fpn-roialign#10 (title)
    "nvinfer": "NVInfer: 1: [runner.cpp::execute::416] Error Code 1: Cuda Runtime (invalid "
    "argument)",
    # NVIDIA-AI-IOT/torch2trt#787
    "cuda driver": "08/06/2022-13:26:57] [TRT] [E] 1: [virtualMemoryBuffer.cpp::nvinfer1::"
    "StdVirtualMemoryBufferImpl::resizePhysical::148] Error Code 1: Cuda Driver (invalid argument)",
}


@pytest.mark.parametrize("text", TENSORRT.values(), ids=TENSORRT.keys())
def test_tensorrts_cuda_runtime_wrapper_is_named_by_the_error_inside(text: str):
    diagnosis = diagnose(text)
    assert diagnosis is not None and not diagnosis.sticky
    assert diagnosis.error is not None and diagnosis.error.name == "cudaErrorInvalidValue"
    assert "invalid argument" in diagnosis.explanation


def test_tensorrts_own_errors_are_no_cuda_errors():
    # shouxieai/infer#26: TensorRT's API usage check, in the same logger format
    assert (
        diagnose(
            "NVInfer: 3: [executionContext.cpp::enqueueInternal::622] Error Code 3: API Usage "
            "Error (Parameter check failed at: runtime/api/executionContext.cpp::"
            "enqueueInternal::622, condition: bindings[x] || nullBindingOK"
        )
        is None
    )


# --- glog's printed codes, in the numbering of their CUDA ---------------------------------------
# NVIDIA/DIGITS#1663's log names its CUDA (8.0); BVLC/caffe#786's line without its text (titles
# and retyped reports keep only the number, as facebookarchive/C3D#81's title does).
NVCC_8 = "Cuda compilation tools, release 8.0, V8.0.61"
CAFFE_4 = (
    "F0725 01:08:55.576004 10039 syncedmem.cpp:55] Check failed: error == cudaSuccess (4 vs. 0)"
)


def test_a_code_only_the_old_numbering_has_is_read_in_it():
    # fyangneil/pavement-crack-detection#16 (title; its body: "driver shutting down", CUDA 8/10.0)
    diagnosis = diagnose("error == cudaSuccess (29 vs. 0)")
    assert diagnosis is not None and not diagnosis.sticky
    assert diagnosis.error is not None and diagnosis.error.name == "cudaErrorCudartUnloading"


def test_a_log_of_cuda_8_reads_its_code_in_the_old_numbering():
    diagnosis = diagnose(f"{NVCC_8}\n{CAFFE_4}")
    assert diagnosis is not None and diagnosis.sticky  # 4 was cudaErrorLaunchFailure
    assert diagnosis.cause == "launch-failure"


def test_a_log_of_a_newer_cuda_reads_its_code_in_todays_numbering():
    for evidence in (
        "Cuda compilation tools, release 11.8, V11.8.89",
        "GPU 0: NVIDIA A100-SXM4-80GB",
    ):
        diagnosis = diagnose(f"{evidence}\n{CAFFE_4}")
        assert diagnosis is not None and not diagnosis.sticky, evidence
        assert diagnosis.error is not None and diagnosis.error.name == "cudaErrorCudartUnloading"


def test_a_code_whose_era_the_log_does_not_show_is_given_both_meanings():
    diagnosis = diagnose(CAFFE_4)
    assert diagnosis is not None and diagnosis.sticky  # the reading that needs the restart
    assert diagnosis.error is not None
    assert "cudaErrorLaunchFailure" in diagnosis.error.message
    assert "cudaErrorCudartUnloading" in diagnosis.error.message


def test_the_driver_apis_codes_were_never_renumbered():
    # fullfanta/multimodal_transfer#2 (title), a CUresult: 4 is CUDA_ERROR_DEINITIALIZED today too
    diagnosis = diagnose(
        "Check failed: CUDA_SUCCESS == dynload::cuCtxSetCurrent(cuda_context->context()) (0 vs. 4)"
    )
    assert diagnosis is not None and not diagnosis.sticky
    assert "before 10.1" not in diagnosis.error.message  # type: ignore[union-attr]


# --- the newest PyTorch message ------------------------------------------------------------------
def test_the_2026_assert_message_is_a_poisoned_context_and_dsa_is_available():
    diagnosis = diagnose(f"torch.AcceleratorError: {ASSERT_2026_04}")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "unknown-assert"
    assert not any("TORCH_USE_CUDA_DSA is a build flag" in fix for fix in diagnosis.fixes)
    assert any("PYTORCH_USE_CUDA_DSA=1" in fix for fix in diagnosis.fixes)


def test_the_2026_message_with_the_gpus_line_names_the_cause():
    line, cause = H100_TORCH_2_11["cross-entropy-label"]
    diagnosis = diagnose(f"{line}\ntorch.AcceleratorError: {ASSERT_2026_04}")
    assert diagnosis is not None and diagnosis.cause == cause


def test_a_2026_error_that_leaves_the_context_usable_points_at_the_drivers_log():
    diagnosis = diagnose(f"torch.AcceleratorError: {INVALID_ORDINAL_2026}")
    assert diagnosis is not None and not diagnosis.sticky
    assert any("CUDA_LOG_FILE=stderr" in fix for fix in diagnosis.fixes)


def test_the_older_messages_keep_the_build_flag_note():
    from pytorch_texts import ASSERT_2_9

    diagnosis = diagnose(f"torch.AcceleratorError: {ASSERT_2_9}")
    assert diagnosis is not None
    assert any("TORCH_USE_CUDA_DSA is a build flag" in fix for fix in diagnosis.fixes)
    assert not any("PYTORCH_USE_CUDA_DSA=1" in fix for fix in diagnosis.fixes)


def test_pytorchs_hint_lines_alone_are_no_error():
    assert diagnose("Device-side assertion tracking was not enabled by user.") is None
    assert diagnose("For more detailed error information, run with CUDA_LOG_FILE=stderr") is None


# --- a condition without its file ------------------------------------------------------------
def test_a_gather_condition_without_its_file_is_gathers_not_advanced_indexings():
    # facebookresearch/fairseq#3507: the threads' lines interleaved, so no condition keeps its
    # file; advanced indexing prints "index out of bounds" too, but only ScatterGatherKernel.cu
    # checks idx_dim against index_size.
    for line in (
        '] Assertion `idx_dim >= 0 && idx_dim < index_size && "index out of bounds",0,0` failed.',
        "operator(): block: [0,0,0], thread: [1,0,0] Assertion `idx_dim >= 0 && idx_dim < "
        'index_size && "index out of bounds"` failed.',
    ):
        found = diagnose(line + "\nRuntimeError: CUDA error: device-side assert triggered")
        assert found is not None and found.cause == "index-out-of-range"
        assert "ScatterGatherKernel.cu" in (found.source or ""), line
    # advanced indexing's own condition stays advanced indexing's
    indexing = diagnose(
        "block: [0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "
        '"index out of bounds"` failed.'
    )
    assert indexing is not None and "IndexKernel.cu" in (indexing.source or "")


# --- where, in the tracebacks of VS Code's notebooks and of launchers ---------------------------
# mrdbourke/pytorch-deep-learning#1290: VS Code prints the places as links to the cell
VS_CODE_TRACEBACK = """\
---------------------------------------------------------------------------
AcceleratorError                          Traceback (most recent call last)
Cell In[11], [line 13](vscode-notebook-cell:?execution_count=11&line=13)
     11 # 2. Calculate loss and accuracy
     12 loss = loss_func(y_logits, y_train)
---> [13](vscode-notebook-cell:?execution_count=11&line=13) acc = accuracy_cal(y_pred, y_train)
     15 # 3. Back propagation

Cell In[8], [line 2](vscode-notebook-cell:?execution_count=8&line=2)
      1 def accuracy_cal(y_pred, y_true):
----> [2](vscode-notebook-cell:?execution_count=8&line=2)     correct = torch.eq(y_true, y_pred).sum().item()
      3     return (correct / len(y_pred))*100

AcceleratorError: CUDA error: device-side assert triggered
"""  # noqa: E501


def test_a_vs_code_notebooks_linked_places_give_the_line():
    found = diagnose(VS_CODE_TRACEBACK)
    assert found is not None and found.where is not None
    assert "correct = torch.eq(y_true, y_pred).sum().item()" in found.where
    assert "cell [8], line 2" in found.where


def test_a_launchers_console_script_is_not_where_the_error_surfaced():
    # torchrun's own traceback after its rank failed (deepspeedai/Megatron-DeepSpeed#207)
    text = (
        "Traceback (most recent call last):\n"
        '  File "/opt/conda/bin/torchrun", line 8, in <module>\n'
        "    sys.exit(main())\n"
        "RuntimeError: CUDA error: device-side assert triggered\n"
    )
    found = diagnose(text)
    assert found is not None and found.where is None
    # a script of the user's own is still where it surfaced
    found = diagnose(text.replace("/opt/conda/bin/torchrun", "/home/me/train.py"))
    assert found is not None and found.where is not None and "train.py" in found.where


# --- an error NVIDIA documents neither as sticky nor as harmless ---------------------------------
def test_an_unknown_internal_error_read_from_a_text_does_not_say_the_context_is_fine():
    # vllm-project/vllm#2682: rank 7's NCCL watchdog ended on cudaErrorUnknown (999)
    text = (
        "[E ProcessGroupNCCL.cpp:916] [Rank 7] NCCL watchdog thread terminated with exception: "
        "CUDA error: unknown error"
    )
    found = diagnose(text)
    assert found is not None and found.error is not None and found.error.code == 999
    assert "no restart is needed" not in found.explanation
    assert "does not say whether the CUDA context survives" in found.explanation
    assert verdict(found).startswith("nb_cudaguard: CUDA context PROBABLY POISONED, restart rec")
    # a probe that found the context answering settles it
    alive = replace(found, context=ContextState.HEALTHY)
    assert verdict(alive).startswith("nb_cudaguard: CUDA context USABLE, restart not needed")
    # other errors the context survives keep their plain answer
    oom = diagnose("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom is not None and "no restart is needed" in oom.explanation
    assert verdict(oom).startswith("nb_cudaguard: CUDA context USABLE")
