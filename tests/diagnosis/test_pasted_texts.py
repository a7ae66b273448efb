"""Recognition holds on text as users really paste it (issue 9, items 1-3).

Each class of text is a table. The texts are built from the sources that print them (cited per
entry): PyTorch's c10/cuda/CUDAException.cpp and c10/util/Exception.cpp, NVIDIA's headers and
CUDA samples' helper_cuda.h, numba's cudadrv/driver.py, CuPy's cupy_backends/cuda/api, NCCL's
checks, Thrust's system_error, Triton's launcher; and from the shapes public issue threads show
(prefixes of torchrun / logging / Ray, titles that flatten a traceback).
"""

from __future__ import annotations

import pytest
import torch
from pytorch_texts import ASSERT_2_0, ASSERT_2_9, H100_TORCH_2_11, HINT_1_10, HINT_2_0, HINT_2_9

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.classify import classify_exception, classify_text, error_for_code
from nb_cudaguard.diagnosis.error_tables import DRIVER, HIP, RUNTIME

LOSS_LINE = H100_TORCH_2_11["cross-entropy-label"][0]
GATHER_LINE = H100_TORCH_2_11["embedding-vectorized-gather"][0]


def _full_width(text: str) -> str:
    """The punctuation as an IME or a machine translation writes it: full-width forms."""
    return "".join(chr(ord(c) + 0xFEE0) if c in ":,[]`()" else c for c in text)


# --- 1. a poisoned context always wins ---------------------------------------------------------
# Follow-on errors raised after an assert (every later call fails, cuBLAS's and cuDNN's included):
# their headline is not the assert's.
FALLOUT = {
    # aten/src/ATen/cuda/CUDABlas.cpp TORCH_CUDABLAS_CHECK
    "cublas not initialized": (
        "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
    ),
    "cublas execution failed": (
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, "
        "opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`"
    ),
    # aten/src/ATen/cudnn/Exceptions.h
    "cudnn": "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
    "cudnn mapping": "cuDNN error: CUDNN_STATUS_MAPPING_ERROR",
    # aten/src/ATen/cuda/CUDAGeneratorImpl / THC: curand MTGP setup after a poisoned context
    "mtgp": "Creating MTGP constants failed.",
}


@pytest.mark.parametrize("headline", FALLOUT.values(), ids=FALLOUT.keys())
def test_a_follow_on_error_with_assert_lines_in_its_text_is_the_assert(headline):
    text = f"{LOSS_LINE}\n{LOSS_LINE}\nTraceback (most recent call last):\nRuntimeError: {headline}"
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "label-out-of-range"
    assert "fallout" in diagnosis.explanation


@pytest.mark.parametrize("headline", FALLOUT.values(), ids=FALLOUT.keys())
def test_a_follow_on_error_with_assert_lines_in_the_scoped_device_output_is_the_assert(headline):
    diagnosis = diagnose(RuntimeError(headline), device_output=GATHER_LINE + "\n")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "index-out-of-range"


@pytest.mark.parametrize("headline", FALLOUT.values(), ids=FALLOUT.keys())
def test_a_follow_on_error_alone_is_not_sticky(headline):
    diagnosis = diagnose(RuntimeError(headline))
    assert diagnosis is not None and not diagnosis.sticky


def test_a_sticky_error_below_a_non_sticky_headline_wins():
    # A cuBLAS error whose message goes on to quote the real error (seen in NCCL and
    # DataParallel wrappers).
    text = (
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`\n"
        "Caused by: CUDA error: an illegal memory access was encountered" + HINT_2_0
    )
    diagnosis = diagnose(RuntimeError(text))
    assert (diagnosis.cause, diagnosis.sticky) == ("illegal-memory-access", True)


def test_nccl_last_error_line_names_the_sticky_error():
    # NCCL's CUDACHECK: "Cuda failure '<cudaGetErrorString>'" under ncclUnhandledCudaError.
    text = (
        "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'an illegal memory access was encountered'"
    )
    diagnosis = diagnose(torch.distributed.DistBackendError(text))
    assert (diagnosis.cause, diagnosis.sticky) == ("illegal-memory-access", True)


def test_a_kernel_file_line_with_an_unreadable_condition_is_an_unknown_assert():
    text = (
        "/pytorch/aten/src/ATen/native/cuda/SomeNewKernel.cu:88: operator(): block: [0,0,0], "
        "thread: [3,0,0] Assertion `<garbled>"
    )
    diagnosis = diagnose(text)
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("unknown-assert", True)


@pytest.mark.parametrize(
    "text",
    [
        "../aten/src/ATen/native/cuda/Loss.cu:242: Assertion ... failed (log truncated)",
        "got an Assertion failed in Indexing.cu and then the kernel died",
        "Loss.cu Assertion `t >= 0 && t < n_cl... failed",
    ],
)
def test_a_cut_off_line_of_a_known_kernel_is_still_a_sticky_assert(text):
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.sticky


@pytest.mark.parametrize(
    ("code", "name", "sticky"),
    [
        (710, "cudaErrorAssert", True),
        (700, "cudaErrorIllegalAddress", True),
        (719, "cudaErrorLaunchFailure", True),
        (2, "cudaErrorMemoryAllocation", False),
        (209, "cudaErrorNoKernelImageForDevice", False),
    ],
)
def test_accelerator_error_is_classified_by_its_error_code_first(code, name, sticky):
    # torch.AcceleratorError from C++ carries the cudaError_t (pytorch#152023); the message may
    # be a wrapper's that names nothing.
    error = torch.AcceleratorError("CUDA call failed lazily during the step")
    error.error_code = code
    found = classify_exception(error)
    assert found is not None
    assert (found.name, found.code, found.sticky) == (name, code, sticky)


def test_a_sticky_text_beats_a_non_sticky_error_code():
    error = torch.AcceleratorError("CUDA error: device-side assert triggered" + HINT_2_9)
    error.error_code = 1
    assert classify_exception(error).sticky


# --- 2. every spelling of every sticky error ---------------------------------------------------
STICKY_RUNTIME = [entry for entry in RUNTIME if entry[4]]


def test_the_tables_hold_every_sticky_error_nvidia_documents():
    # driver_types.h (CUDA 13.0): the 13 errors that need the process relaunched.
    assert {e[1] for e in STICKY_RUNTIME} == {
        226,
        700,
        702,
        710,
        714,
        715,
        716,
        717,
        718,
        719,
        721,
        810,
        911,
    }
    assert len(RUNTIME) > 120 and len(DRIVER) > 90 and len(HIP) > 70


@pytest.mark.parametrize("entry", STICKY_RUNTIME, ids=[e[0] for e in STICKY_RUNTIME])
def test_every_sticky_error_in_every_spelling_is_sticky(entry):
    name, code, _legacy, text, _sticky = entry
    driver = [d for d, c in DRIVER if c == code]
    spellings = [
        f"CUDA error: {text}" + HINT_2_9,  # PyTorch
        f"{name}: {text}",  # CuPy's CUDARuntimeError, Thrust's what()
        f"cupy.cuda.runtime.CUDARuntimeError: {name}: {text}",
        f"CUDA Error: {text} ({code})",  # custom extensions
        f'CUDA error at kernel.cu:45 code={code}({name}) "cudaDeviceSynchronize()"',  # samples
        f"Triton Error [CUDA]: {text}",
        f"GPUassert: {text} kernel.cu 45",
        *(f"cuda.bindings.driver.CUresult.{d}" for d in driver),  # cuda-python
        *(f"CUDA_ERROR: {d}: {text}" for d in driver),  # CuPy's CUDADriverError
        *(
            f"numba.cuda.cudadrv.driver.CudaAPIError: [{code}] Call to cuCtxSynchronize "
            f"results in {d}"
            for d in driver
        ),
        f"numba.cuda.cudadrv.driver.CudaAPIError: [{code}] Call to cuMemcpyDtoH results in "
        "UNKNOWN_CUDA_ERROR",
        f"terminate called after throwing an instance of 'thrust::system::system_error'\n"
        f"  what():  parallel_for failed: {name}: {text}",
    ]
    for spelling in spellings:
        found = classify_text(spelling)
        assert found is not None, spelling
        assert (found.name, found.sticky) == (name, True), spelling


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("HIP error: hipErrorAssert", "cudaErrorAssert"),
        ("HIP error: device-side assert triggered", "cudaErrorAssert"),
        (
            "hipErrorIllegalAddress: an illegal memory access was encountered",
            "cudaErrorIllegalAddress",
        ),
        ("RuntimeError: HIP error: hipErrorLaunchFailure", "cudaErrorLaunchFailure"),
        ("hip error 1006: hipErrorLaunchTimeOut", "cudaErrorLaunchTimeout"),
        (
            "Memory access fault by GPU node-2: HIP error: an illegal memory access was "
            "encountered",
            "cudaErrorIllegalAddress",
        ),
    ],
)
def test_hip_names_are_the_cuda_errors_they_mirror(text, name):
    found = classify_text(text)
    assert (found.name, found.sticky) == (name, True)


def test_error_codes_of_hip_and_cuda_agree():
    assert error_for_code(710).name == "cudaErrorAssert"
    assert error_for_code(1004).name == "cudaErrorLaunchFailure"  # old HIP numbering
    assert error_for_code(123456) is None


@pytest.mark.parametrize(
    "text",
    [
        "CUDA error: unspecified launch failure in prior launch",  # 53: deprecated, not sticky
        "CUDA error: no kernel image is available for execution on the device" + HINT_2_0,
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!",
        "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version",
    ],
)
def test_non_sticky_spellings_stay_non_sticky(text):
    found = classify_text(text)
    assert found is not None and not found.sticky


# --- 3. text as people paste it ----------------------------------------------------------------
PASTED = {
    # An issue title or a dialog: the headline and the boilerplate on one line.
    "flattened 2.0": "RuntimeError: " + ASSERT_2_0.replace("\n", " "),
    "flattened 2.9": "torch.AcceleratorError: " + ASSERT_2_9.replace("\n", " "),
    "flattened 1.10": "RuntimeError: CUDA error: device-side assert triggered"
    + HINT_1_10.replace("\n", " "),
    "flattened traceback": (
        'Traceback (most recent call last): File "train.py", line 41, in <module> '
        "loss.backward() RuntimeError: CUDA error: device-side assert triggered CUDA kernel "
        "errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect."
    ),
    "torchrun prefixes": "\n".join(
        f"[rank3]: {line}"
        for line in (
            "Traceback (most recent call last):",
            '  File "train.py", line 9, in <module>',
            "    loss.item()",
            *("torch.AcceleratorError: " + ASSERT_2_9).splitlines(),
        )
    ),
    "default prefixes": "[default0]:RuntimeError: CUDA error: device-side assert triggered",
    "timestamps and logger": (
        "2024-05-02 10:11:12,345 - ERROR - trainer - step failed\n"
        "2024-05-02 10:11:12,346 ERROR:root:CUDA error: device-side assert triggered"
    ),
    "glog": "E0502 10:11:12.345678 12345 ProcessGroupNCCL.cpp:1500] CUDA error: device-side "
    "assert triggered",
    "ray worker": (
        "(RayTrainWorker pid=4242) RuntimeError: CUDA error: device-side assert triggered"
    ),
    "changed quotes": "RuntimeError: CUDA error: device-side assert triggered\n"
    "Compile with \u2018TORCH_USE_CUDA_DSA\u2019 to enable device-side assertions.",
    "full width": _full_width("RuntimeError: CUDA error: device-side assert triggered"),
    "chinese": "RuntimeError: CUDA 错误\uff1a触发了设备端断言",
    "japanese": "RuntimeError: CUDA エラー: デバイス側のアサートがトリガーされました",
    "german": "RuntimeError: CUDA-Fehler: geräteseitige Assertion ausgelöst",
    "french": "RuntimeError : erreur CUDA : assertion côté périphérique déclenchée",
    "spanish": "RuntimeError: error de CUDA: se activó la aserción del lado del dispositivo",
    "russian": "RuntimeError: ошибка CUDA: сработало утверждение на стороне устройства",
    "korean": "RuntimeError: CUDA 오류: 장치 측 어설션이 트리거되었습니다",
    # nbformat keeps a traceback's colours (ipykernel's `traceback` field), so do terminal pastes
    "ansi colours": "\x1b[0;31mRuntimeError\x1b[0m: CUDA error: device-side assert triggered",
    "issue title, no hyphen": "CUDA device side assert triggered when fine-tuning on my dataset",
    "only the search hint survived": "...\nSearch for `cudaErrorAssert' in "
    "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.",
}


@pytest.mark.parametrize("text", PASTED.values(), ids=PASTED.keys())
def test_pasted_device_side_asserts_are_sticky_asserts(text):
    diagnosis = diagnose(text)
    assert diagnosis is not None, text
    assert (diagnosis.sticky, diagnosis.error.name) == (True, "cudaErrorAssert")


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("RuntimeError: CUDA error: illegal memory access", "cudaErrorIllegalAddress"),
        ("[BUG] CUDA illegal memory access in flash attention backward", "cudaErrorIllegalAddress"),
        ("CUDA error: unspecified launch failure (core dumped)", "cudaErrorLaunchFailure"),
        ("GPU kernel launch timed out after 2 s (display watchdog)", "cudaErrorLaunchTimeout"),
    ],
)
def test_abridged_sticky_texts_are_sticky(text, name):
    found = classify_text(text)
    assert found is not None and (found.name, found.sticky) == (name, True)


def test_interleaved_lines_of_two_processes_still_name_the_assert():
    text = (
        "[rank0]: /pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda"
        "_kernel_2d: block: [0,0,0], thread: [1,0,0] Assertion `t >= 0 && [rank1]: Epoch 3: "
        "100%|##########| t < n_classes` failed.\n"
        "[rank1]: torch.AcceleratorError: CUDA error: device-side assert triggered"
    )
    diagnosis = diagnose(text)
    assert (diagnosis.cause, diagnosis.sticky) == ("label-out-of-range", True)


DEVICE_LINES_AS_PASTED = {
    "no path": (
        "nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [1,0,0] Assertion "
        "`t >= 0 && t < n_classes` failed.",
        "label-out-of-range",
    ),
    "abridged brackets": (
        ".../Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [...], thread: [...] "
        "Assertion `t >= 0 && t < n_classes` failed.",
        "label-out-of-range",
    ),
    "re-quoted": (
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515: indexSelectSmallIndex: "
        "block: [0,0,0], thread: [0,0,0] Assertion \u2018srcIndex < srcSelectDimSize\u2019 failed.",
        "index-out-of-range",
    ),
    "quotes lost (markdown)": (
        "/pytorch/aten/src/ATen/native/cuda/Loss.cu:90: operator(): block: [0,0,0], thread: "
        "[1,0,0] Assertion input_val >= zero && input_val <= one failed.",
        "probability-out-of-range",
    ),
    "condition cut off, function known": (
        "/pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: "
        "block: [197,0,0], thread: [0,0,0] Assertion `ind >=0 && ind < ind_dim_s...` failed.",
        "index-out-of-range",
    ),
    "full width": (
        _full_width(
            "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
            "thread: [1,0,0] Assertion `t >= 0 && t < n_classes` failed."
        ),
        "label-out-of-range",
    ),
    "html escapes (copied from a web page)": (
        "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [1,0,0] "
        "Assertion `t &gt;= 0 &amp;&amp; t &lt; n_classes` failed.",
        "label-out-of-range",
    ),
    "ansi colours": (
        "\x1b[1;31mLoss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: "
        "[1,0,0] Assertion `t >= 0 && t < n_classes` failed.\x1b[0m",
        "label-out-of-range",
    ),
    "triton unknown file": (
        "unknown:0: unknown: block: [0,0,0], thread: [0,0,0] Assertion `index out of bounds: "
        "0 <= tmp4 < 50257` failed.",
        "index-out-of-range",
    ),
}


@pytest.mark.parametrize(
    ("text", "cause"), DEVICE_LINES_AS_PASTED.values(), ids=DEVICE_LINES_AS_PASTED.keys()
)
def test_device_lines_as_pasted_name_their_cause(text, cause):
    diagnosis = diagnose(text + "\nRuntimeError: CUDA error: device-side assert triggered")
    assert (diagnosis.cause, diagnosis.sticky) == (cause, True)


# --- hard negatives: never a poisoned context --------------------------------------------------
NEGATIVES = {
    "cpu index error": "IndexError: Target 3 is out of bounds.",
    "cpu embedding": "IndexError: index out of range in self",
    "cpu bce": "RuntimeError: all elements of input should be between 0 and 1",
    "driver too old": (
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). "
        "Please update your GPU driver by downloading and installing a new version from the URL: "
        "http://www.nvidia.com/Download/index.aspx"
    ),
    "nccl timeout": (
        "[rank1]:[E502 10:11:12.345678 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=15, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600019 milliseconds before timing out."
    ),
    "host TORCH_CHECK": (
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu! (when checking argument for argument index in method "
        "wrapper_CUDA__index_select)"
    ),
    "one_hot host check": "RuntimeError: Class values must be smaller than num_classes.",
    "glibc assert": (
        "python: ../nptl/pthread_mutex_lock.c:81: __pthread_mutex_lock: Assertion "
        "`mutex->__data.__owner == 0' failed."
    ),
    "mentions the words": (
        "Tip: export CUDA_LAUNCH_BLOCKING=1 to debug device-side assertions.\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
        "See aten/src/ATen/native/cuda/Loss.cu for the nll_loss kernel."
    ),
    "cpu sigbus": "Bus error (core dumped): misaligned address at 0x7f00",
    "python illegal instruction": "Illegal instruction (core dumped)",
    "download failed": "Download failed: connection reset by peer",
    "a log line about checking": "INFO checking for cuda error: none found after 100 steps",
    "quoted source line": (
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
        '    raise ValueError("CUDA error: device-side assert triggered")\nValueError: x'
    ),
}


@pytest.mark.parametrize("text", NEGATIVES.values(), ids=NEGATIVES.keys())
def test_hard_negatives_are_never_a_cuda_error(text):
    assert diagnose(text) is None


NOT_STICKY_NEGATIVES = {
    "oom with boilerplate": "torch.OutOfMemoryError: CUDA error: out of memory" + HINT_2_9,
    "oom flattened": "RuntimeError: CUDA error: out of memory" + HINT_2_0.replace("\n", " "),
    "allocator oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.11 GiB of which 1.02 GiB is free.",
    "no kernel image": (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device"
        + HINT_1_10
    ),
    "driver insufficient": "RuntimeError: CUDA error: CUDA driver version is insufficient for "
    "CUDA runtime version",
}


@pytest.mark.parametrize("text", NOT_STICKY_NEGATIVES.values(), ids=NOT_STICKY_NEGATIVES.keys())
def test_non_sticky_cuda_errors_in_pastes_stay_not_sticky(text):
    diagnosis = diagnose(text)
    assert diagnosis is not None and not diagnosis.sticky


def test_the_assert_at_the_end_of_a_long_pasted_log_is_found():
    noise = "2024-05-02 10:11:12 INFO step 1200 loss=0.4312 lr=3e-05 grad_norm=1.2\n" * 10_000
    text = noise + LOSS_LINE + "\n" + "RuntimeError: " + ASSERT_2_9
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.cause == "label-out-of-range"


# Shapes seen in public write-ups of real failures (issue threads, READMEs, code comments).
SEEN_IN_WRITE_UPS = {
    "function and condition only, quotes changed": (
        "_assert_async_cuda_kernel: ... Assertion 'probability tensor contains either 'inf', "
        "'nan' or element < 0' failed.\n"
        "torch.AcceleratorError: CUDA error: device-side assert triggered"
    ),
    "no colon after the line number, backticks lost": (
        "TensorCompare.cu:109 _assert_async_cuda_kernel: Assertion `probability tensor contains "
        "either inf, nan or element < 0` failed\n-> torch.AcceleratorError: CUDA error: "
        "device-side assert triggered"
    ),
    "wrapped after the function": (
        "/pytorch/aten/src/ATen/native/cuda/TensorCompare.cu:112: _assert_async_cuda_kernel:\n"
        "Assertion `probability tensor contains either `inf`, `nan` or element < 0` failed.\n"
    ),
    "condition wrapped over two lines": (
        "    TensorCompare.cu:109 _assert_async_cuda_kernel: Assertion `probability\n"
        "    tensor contains either inf, nan or element < 0` failed\n"
    ),
}


@pytest.mark.parametrize("text", SEEN_IN_WRITE_UPS.values(), ids=SEEN_IN_WRITE_UPS.keys())
def test_device_lines_as_written_up_name_the_sampling_cause(text):
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "probability-out-of-range"


# Device lines through a machine translation: the words change, the condition (code) does not.
TRANSLATED_DEVICE_LINES = {
    "chinese": "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: 块: [0,0,0], 线程: [1,0,0] "
    "断言 `t >= 0 && t < n_classes` 失败。",
    "japanese": "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: ブロック: [0,0,0], スレッド: "
    "[1,0,0] アサーション `t >= 0 && t < n_classes` が失敗しました。",
    "german": "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: Block: [0,0,0], Thread: "
    "[1,0,0] Behauptung `t >= 0 && t < n_classes` fehlgeschlagen.",
    "russian": "Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: блок: [0,0,0], поток: "
    "[1,0,0] Утверждение `t >= 0 && t < n_classes` не выполнено.",
}


@pytest.mark.parametrize(
    "text", TRANSLATED_DEVICE_LINES.values(), ids=TRANSLATED_DEVICE_LINES.keys()
)
def test_translated_device_lines_name_their_cause(text):
    diagnosis = diagnose(text)
    assert diagnosis is not None
    assert (diagnosis.cause, diagnosis.sticky) == ("label-out-of-range", True)
