"""Every user-triggerable PyTorch CUDA assert maps to its cause id, in every print format.

The conditions are the texts in PyTorch's sources (CUDA_KERNEL_ASSERT stringifies its argument;
CUDA_KERNEL_ASSERT_MSG prints the message), several releases where they changed.
"""

from __future__ import annotations

import pytest
from pytorch_texts import ASSERT_2_0 as HEADLINE
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

import nb_cudaguard
from nb_cudaguard import CAUSES, diagnose
from nb_cudaguard.diagnosis.rules import RULES

# (file, condition or message, cause)
CASES: list[tuple[str, str, str]] = [
    # nll_loss / cross_entropy 1d, 2d, no-reduce, forward and backward; nll_loss2d; THCUNN
    ("Loss.cu", "t >= 0 && t < n_classes", "label-out-of-range"),
    ("Loss.cu", "cur_target >= 0 && cur_target < n_classes", "label-out-of-range"),
    ("Loss.cu", "cur_target < n_classes", "label-out-of-range"),  # uint8 targets
    ("NLLLoss2d.cu", "cur_target >= 0 && cur_target < n_classes", "label-out-of-range"),
    ("ClassNLLCriterion.cu", "t >= 0 && t < n_classes", "label-out-of-range"),
    ("SpatialClassNLLCriterion.cu", "t >= 0 && t < n_classes", "label-out-of-range"),
    ("ClassNLLCriterion.cu", "cur_target  >= 0 && cur_target  < n_classes", "label-out-of-range"),
    # THCUNN BCE (< 1.8) dereferences its pointers
    ("BCECriterion.cu", "*input >= 0. && *input <= 1.", "probability-out-of-range"),
    # masked_scatter_size_check (plain assert(); older and current wordings)
    ("IndexKernel.cu", "totalElements <= srcSize", "size-mismatch"),
    ("IndexKernel.cu", "selected <= source_size", "size-mismatch"),
    # take / put
    (
        "IndexKernel.cu",
        'idx < numel && idx >= -numel && "cuda_take_put_kernel() index out of bounds"',
        "index-out-of-range",
    ),
    # EmbeddingBag forward (sum/mean and max kernels)
    ("EmbeddingBag.cu", "input[emb] < numRows", "index-out-of-range"),
    # multi_margin_loss
    (
        "MultiMarginLoss.cu",
        'target_k >= 0 && target_k < dim && "target index is out of bounds"',
        "label-out-of-range",
    ),
    # BCE input and target
    ("Loss.cu", "input_val >= zero && input_val <= one", "probability-out-of-range"),
    ("Loss.cu", "target_val >= zero && target_val <= one", "probability-out-of-range"),
    # embedding / index_select / vectorized gather / EmbeddingBag
    ("Indexing.cu", "srcIndex < srcSelectDimSize", "index-out-of-range"),
    ("THCTensorIndex.cu", "srcIndex < srcSelectDimSize", "index-out-of-range"),
    (
        "IndexKernelUtils.cu",
        'ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"',
        "index-out-of-range",
    ),
    ("EmbeddingBag.cu", "input_idx < numRows", "index-out-of-range"),
    # index_add / index_copy / index_fill / index_reduce
    ("Indexing.cu", "dstIndex < dstAddDimSize", "index-out-of-range"),
    ("THCTensorIndex.cu", "dstIndex < dstCopyDimSize", "index-out-of-range"),
    ("THCTensorIndex.cu", "dstIndex < dstFillDimSize", "index-out-of-range"),
    (
        "IndexKernel.cu",
        'idx >= 0 && idx < self_dim_size && "index_copy_(): index out of bounds"',
        "index-out-of-range",
    ),
    (
        "IndexKernel.cu",
        'idx >= -self_dim_size && idx < self_dim_size && "index out of bounds"',
        "index-out-of-range",
    ),
    # advanced indexing, take, put
    (
        "IndexKernel.cu",
        '-sizes[i] <= index && index < sizes[i] && "index out of bounds"',
        "index-out-of-range",
    ),
    ("IndexKernel.cu", 'idx >= -numel && idx < numel && "out of range"', "index-out-of-range"),
    # masked_scatter
    ("IndexKernel.cu", "maskPrefixSum < srcSize", "size-mismatch"),
    # gather / scatter / scatter_add, both wordings, and THC
    (
        "ScatterGatherKernel.cu",
        'idx_dim >= 0 && idx_dim < index_size && "index out of bounds"',
        "index-out-of-range",
    ),
    (
        "ScatterGatherKernel.cu",
        'idx_dim >= 0 && idx_dim < index_size && "scatter gather kernel index out of bounds"',
        "index-out-of-range",
    ),
    (
        "THCTensorScatterGather.cu",
        "indexValue >= 0 && indexValue < src.sizes[dim]",
        "index-out-of-range",
    ),
    (
        "THCTensorScatterGather.cu",
        "indexValue >= 0 && indexValue < tensor.sizes[dim]",
        "index-out-of-range",
    ),
    # multinomial, all its conditions, current and THC
    ("MultinomialKernel.cu", "!at::_isnan(val)", "nan-detected"),
    ("MultinomialKernel.cu", "!_isinf(val)", "nan-detected"),
    ("MultinomialKernel.cu", "!(val < zero)", "probability-out-of-range"),
    ("MultinomialKernel.cu", "val >= zero", "probability-out-of-range"),
    ("MultinomialKernel.cu", "sum > accZero", "probability-out-of-range"),
    (
        "MultinomialKernel.cu",
        "cumdist[size - 1] > static_cast<scalar_t>(0)",
        "probability-out-of-range",
    ),
    ("THCTensorRandom.cuh", "THCNumerics<T>::ge(val, zero)", "probability-out-of-range"),
    ("THCTensorRandom.cuh", "!THCNumerics<T>::isnan(val)", "nan-detected"),
    (
        "TensorCompare.cu",
        "probability tensor contains either `inf`, `nan` or element < 0",
        "probability-out-of-range",
    ),
    # bernoulli, poisson
    ("DistributionTemplates.h", "0 <= p1 && p1 <= 1", "probability-out-of-range"),
    ("Distributions.cu", "0 <= p4 && p4 <= 1", "probability-out-of-range"),
    (
        "Distributions.cu",
        'lambda >= 0 && "invalid Poisson rate, expected rate to be non-negative"',
        "probability-out-of-range",
    ),
    # _assert_async
    ("TensorCompare.cu", "input[0] != 0", "user-assert"),
    ("TensorCompare.cu", "input[0] != c10::complex<float>(0, 0)", "user-assert"),
    ("TensorCompare.cu", "my own check failed", "user-assert"),
    # repeat_interleave, segment_reduce, max_unpool, fractional max pool
    ("Repeat.cu", "result_size == cumsum_ptr[size - 1]", "size-mismatch"),
    ("SegmentReduce.cu", "lengths_data[i] >= 0", "size-mismatch"),
    ("MaxUnpooling.cu", "maxind >= 0 && maxind < outputImageSize", "index-out-of-range"),
    ("FractionalMaxPool2d.cu", "maxIndex != -1", "nan-detected"),
    (
        "FractionalMaxPool3d.cu",
        "maxVal != at::numeric_limits<scalar_t>::lower_bound()",
        "nan-detected",
    ),
    # grouped GEMM offsets
    (
        "GroupMMCommon.cuh",
        'delta >=0 && "expected gemm dimension to be greater or equal 0\\n"',
        "size-mismatch",
    ),
    (
        "GroupMMCommon.cuh",
        'delta >=0 && "expected ofsets to be greater or equal 0\\n"',
        "size-mismatch",
    ),
    (
        "GroupMMCommon.cuh",
        'delta % align == 0 && "expected input tensor dynamic dimension byte size to be '
        'non-negative multiple of 16\\n"',
        "size-mismatch",
    ),
    # sparse compressed indices (CUDA_KERNEL_ASSERT(cond && message) prints the expression)
    ("ValidateCompressedIndicesCommon.h", "cond && message", "sparse-invariant"),
    (
        "ValidateCompressedIndicesKernel.cu",
        "`crow_indices[..., 0] == 0` is not satisfied.",
        "sparse-invariant",
    ),
    # NCCL NaN check
    ("NanCheck.cu", "!isnan(data[i])", "nan-detected"),
    # max_unpool3d (2.2+), repeat_interleave's negative repeat, EmbeddingBag max mode (2.9)
    ("MaxUnpooling.cu", "index >= 0 && index < outputImageSize", "index-out-of-range"),
    ("Repeat.cu", "repeat >= 0", "size-mismatch"),
    (
        "EmbeddingBag.cu",
        '!has_invalid_index && "Invalid input index in EmbeddingBag: index out of range '
        '[0, numRows)"',
        "index-out-of-range",
    ),
    # index_put_ / take / put before 1.9 (IndexKernel.cu and THC's indexToOffset)
    ("IndexKernel.cu", "linearIndex < size && linearIndex >= -size", "index-out-of-range"),
    ("THCTensorIndex.cu", "linearIndex < size && linearIndex >= -size", "index-out-of-range"),
    # PyTorch's own _assert_async.msg callers (torch/_decomp one_hot, torch/nested): eager
    # under export/compile fails in TensorCompare.cu, Inductor in its Triton kernel
    ("TensorCompare.cu", "one_hot: Class values must be non-negative.", "label-out-of-range"),
    (
        "TensorCompare.cu",
        "one_hot: Class values must be smaller than num_classes.",
        "label-out-of-range",
    ),
    ("c4x2k.py", "one_hot: Class values must be smaller than num_classes.", "label-out-of-range"),
    (
        "TensorCompare.cu",
        "Some indices in the ragged dimension are out of bounds!",
        "index-out-of-range",
    ),
    # Inductor
    ("cabcdefxyz.py", "index out of bounds: 0 <= tmp4 < 50257", "index-out-of-range"),
    ("c7xk2.py", "index out of bounds: 0 <= tmp12 < ks0", "index-out-of-range"),
]

FORMATS = {
    "linux": "/pytorch/aten/src/ATen/native/cuda/{file}:123: some_kernel<float>: block: [0,0,0], "
    "thread: [1,0,0] Assertion `{cond}` failed.",
    "windows": "C:\\w\\pytorch\\aten\\src\\ATen\\native\\cuda\\{file}:123: block: [0,0,0], "
    "thread: [1,0,0] Assertion `{cond}` failed.",
    "old-pretty": "../aten/src/ATen/native/cuda/{file}:77: void at::native::<unnamed>::kernel"
    "(scalar_t *, long) [with scalar_t = float]: block: [3,0,0], thread: [31,0,0] "
    "Assertion `{cond}` failed.",
    "dsa": "Assertion failure 0\n  GPU assertion failure message = {cond}\n"
    "  File containing assertion = /src/aten/src/ATen/native/cuda/{file}:123\n"
    "  Device function containing assertion = some_kernel\n",
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize(("file", "condition", "cause"), CASES)
def test_device_line_maps_to_cause(fmt, file, condition, cause):
    device = FORMATS[fmt].format(file=file, cond=condition)
    diagnosis = diagnose(HEADLINE, device_output=device)
    assert diagnosis is not None
    assert diagnosis.cause == cause
    assert diagnosis.source


@pytest.mark.parametrize("name", sorted(H100_TORCH_2_11))
def test_the_lines_a_real_gpu_printed_map_to_their_cause(name):
    line, cause = H100_TORCH_2_11[name]
    diagnosis = diagnose(ASSERT_2_9, device_output=line)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == cause, diagnosis.assert_lines


def test_a_line_with_no_readable_condition_maps_by_its_kernel_function():
    # torch._assert_async(cond) without a message prints an empty condition (seen on an H100).
    # The file alone decides too (every assert of TensorCompare.cu is _assert_async's), so the
    # function is tested on the line without its path.
    line, _ = H100_TORCH_2_11["assert-async"]
    pathless = line.split("TensorCompare.cu:109: ")[1]
    assert diagnose(ASSERT_2_9, device_output=pathless).cause == "user-assert"
    elsewhere = pathless.replace("_assert_async_cuda_kernel", "some_other_kernel")
    assert diagnose(ASSERT_2_9, device_output=elsewhere).cause == "unknown-assert"
    assert diagnose(ASSERT_2_9, device_output=line).cause == "user-assert"


def test_lines_folded_from_hundreds_of_threads_still_map():
    line = FORMATS["linux"].format(file="Loss.cu", cond="t >= 0 && t < n_classes")
    device = "\n".join(line.replace("[1,0,0]", f"[{i},0,0]") for i in range(500))
    diagnosis = diagnose(HEADLINE, device_output=device)
    assert diagnosis is not None
    assert diagnosis.cause == "label-out-of-range"
    assert diagnosis.assert_lines[0].count == 500


def test_rocm_file_extension_matches_the_cuda_rule():
    device = (
        "/r/aten/src/ATen/native/hip/Loss.hip:250: k: "
        "Device-side assertion `t >= 0 && t < n_classes' failed."
    )
    diagnosis = diagnose(HEADLINE, device_output=device)
    assert diagnosis is not None
    assert diagnosis.cause == "label-out-of-range"


@pytest.mark.parametrize(
    ("file", "condition"),
    [
        ("CUDALoops.cuh", "blockDim.x == num_threads()"),
        ("Reduce.cuh", "config.output_mult[0] != 0"),
        ("Indexing.cu", "false"),
        ("Loss.cu", "blockDim.x == 1024"),
        ("SortUtils.cuh", "sort_size <= items_per_thread * num_threads"),
        ("Sorting.cu", 'false && "unreachable"'),
        # found by tests/data/extract_assert_sites.py: dtype dispatch, reduction bookkeeping,
        # topk's slot counting, depthwise conv3d's launch shape, multinomial's launch
        ("DynamicCast.h", "ScalarType::Float == src_type"),
        ("TypeCast.h", "ScalarType::Half == dest_type"),
        ("Reduce.cuh", "noutputs == 1"),
        ("Reduce.cuh", "!final_output"),
        ("TensorTopK.cu", "writeIndex < outputSliceSize"),
        ("THCTensorTopK.cuh", "outputSliceSize >= writeIndexStart"),
        ("DepthwiseConv3d.cu", "__popc(blockDim.x) == 1"),
        ("MultinomialKernel.cu", "props != NULL"),
        # symmetric memory (laurentdupin/pytorch@fd4a5114 nvshmem_extension.cu,
        # pytorch/pytorch@fd5eb68a symm_mem/ops/nccl_all_to_all_nd.cu): limits and alignment
        # the host checked before the launch
        ("nvshmem_extension.cu", "team != NVSHMEM_TEAM_INVALID"),
        ("nvshmem_extension.cu", "n <= THREADS_PER_BLOCK"),
        ("nvshmem_extension.cu", 'minor_size <= A2AV_TILE_SIZE && "minor_size is too large\\n"'),
        ("nccl_all_to_all_nd.cu", "(reinterpret_cast<uintptr_t>(dst_peer_base) & 15) == 0"),
    ],
)
def test_internal_invariants_are_never_blamed_on_user_data(file, condition):
    device = FORMATS["linux"].format(file=file, cond=condition)
    diagnosis = diagnose(HEADLINE, device_output=device)
    assert diagnosis is not None
    assert diagnosis.cause == "pytorch-internal"
    assert "not the values of your data" in diagnosis.explanation


# Lines pasted without their path: the kernel function decides between families that print the
# same condition, and names the family when the condition is lost.
PATHLESS: list[tuple[str, str]] = [
    (
        "fractional_max_pool2d_backward_out_cuda_frame: block: [0,0,0], thread: [3,0,0] "
        "Assertion `index >= 0` failed.",
        "index-out-of-range",
    ),
    (
        "nll_loss_backward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [3,0,0] "
        "Assertion `index >= 0` failed.",
        "pytorch-internal",
    ),
    (
        "_assert_async_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `one_hot: Class "
        "values must be smaller than num_classes.` failed.",
        "label-out-of-range",
    ),
    (
        "_assert_async_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `tokens must "
        "fit the cache` failed.",
        "user-assert",
    ),
    (
        "max_unpooling3d_forward_kernel: block: [2,1,0], thread: [7,3,0] Assertion `index >= 0 "
        "&& index < outputImageSize` failed.",
        "index-out-of-range",
    ),
    ("compute_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `` failed.", "size-mismatch"),
    ("gatherTopK: block: [0,0,0], thread: [0,0,0] Assertion `` failed.", "pytorch-internal"),
    (
        "segment_reduce_forward_kernel: block: [0,0,0], thread: [0,0,0] Assertion "
        "`lengths_data[row_id] >= 0` failed.",
        "size-mismatch",
    ),
]


@pytest.mark.parametrize(("line", "cause"), PATHLESS)
def test_a_line_without_its_path_maps_by_function_and_condition(line, cause):
    diagnosis = diagnose(ASSERT_2_9, device_output=line)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == cause, diagnosis.assert_lines


def test_repeat_interleave_printf_site_prints_its_message_line_then_the_assert():
    # CUDA_KERNEL_ASSERT_PRINTF (c10 Macros.h) prints its own line, then the runtime's.
    device = (
        "[CUDA_KERNEL_ASSERT] /pytorch/aten/src/ATen/native/cuda/Repeat.cu:24: "
        "compute_cuda_kernel: block: [0,0,0], thread: [0,0,0]: Assertion failed: "
        "`result_size == cumsum_ptr[size - 1]`: Invalid input! In `repeat_interleave`, the "
        "`output_size` argument (7) must be the same as the sum of the elements in the "
        "`repeats` tensor (6).\n/pytorch/aten/src/ATen/native/cuda/Repeat.cu:24: "
        "compute_cuda_kernel: block: [0,0,0], thread: [0,0,0] Assertion `result_size == "
        "cumsum_ptr[size - 1]` failed."
    )
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.cause == "size-mismatch"
    assert "repeat_interleave" in diagnosis.title


def test_unknown_condition_in_a_known_file_is_an_unknown_assert_not_a_guess():
    device = FORMATS["linux"].format(file="Loss.cu", cond="weird_new_check(x)")
    diagnosis = diagnose(HEADLINE, device_output=device)
    assert diagnosis is not None
    assert diagnosis.cause == "unknown-assert"


def test_match_is_on_file_and_condition_not_on_line_number():
    a = FORMATS["linux"].format(file="Loss.cu", cond="t >= 0 && t < n_classes")
    b = a.replace(":123:", ":99999:")
    assert diagnose(HEADLINE, device_output=a).cause == diagnose(HEADLINE, device_output=b).cause


def test_every_rule_names_a_stable_cause_a_source_a_fix_and_likely_causes():
    for rule in RULES:
        assert rule.cause in CAUSES
        assert rule.source and rule.title and rule.explanation
        assert rule.fixes and rule.likely_causes


def test_assert_without_device_lines_still_ranks_the_common_causes():
    diagnosis = diagnose(HEADLINE)
    assert diagnosis is not None
    assert diagnosis.cause == "unknown-assert"
    assert diagnosis.likely_causes and "class label" in diagnosis.likely_causes[0]


def test_fixes_include_cpu_replay_and_the_dsa_build_flag_fact():
    device = FORMATS["linux"].format(file="Loss.cu", cond="t >= 0 && t < n_classes")
    fixes = " ".join(diagnose(HEADLINE, device_output=device).fixes)
    assert "CPU" in fixes
    assert "TORCH_USE_CUDA_DSA is a build flag" in fixes


def test_out_of_memory_is_not_sticky():
    diagnosis = diagnose(
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"
    )
    assert diagnosis is not None
    assert diagnosis.cause == "not-sticky"
    assert not diagnosis.sticky


def test_host_side_index_error_is_not_a_cuda_error():
    assert diagnose(IndexError("Target 3 is out of bounds.")) is None
    assert diagnose(RuntimeError("index 5 is out of bounds for dimension 0 with size 3")) is None


def test_device_lines_in_the_output_do_not_make_a_non_cuda_error_sticky():
    device = FORMATS["linux"].format(file="Loss.cu", cond="t >= 0 && t < n_classes")
    assert diagnose(ValueError("bad value"), device_output=device) is None


def test_import_stays_free_of_torch_and_ipython():
    import subprocess
    import sys

    code = (
        "import nb_cudaguard, nb_cudaguard.diagnosis.rules, nb_cudaguard.diagnosis.evidence, "
        "nb_cudaguard.runtime.capture, nb_cudaguard.runtime.cells, sys; "
        "print([m for m in ('torch','IPython','ipywidgets') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert nb_cudaguard.diagnose is diagnose


# Sites read from current copies of PyTorch's sources (tests/data/pytorch_assert_sites.json
# names each copy): device lines as a release build prints them.
CURRENT_SITES = [
    # Loss.cu's CHECK_INDEX_IN_CLASS: uint8 targets print the bound alone
    ("Loss.cu", "nll_loss_forward_reduce_cuda_kernel_2d", "t < n_classes", "label-out-of-range"),
    (
        "Loss.cu",
        "nll_loss_backward_no_reduce_cuda_kernel",
        "cur_target < n_classes",
        "label-out-of-range",
    ),
    # nll_loss2d's own int64 offset guards are PyTorch's bookkeeping, not the labels
    ("NLLLoss2d.cu", "nll_loss2d_forward_kernel", "input_index >= 0", "pytorch-internal"),
    ("NLLLoss2d.cu", "nll_loss2d_backward_kernel", "grad_input_index >= 0", "pytorch-internal"),
    ("MultinomialKernel.cu", "sampleMultinomialOnce", "!at::_isnan(val)", "nan-detected"),
    ("MultinomialKernel.cu", "sampleMultinomialOnce", "!_isinf(val)", "nan-detected"),
    ("MultinomialKernel.cu", "renormRowsL1", "!(val < zero)", "probability-out-of-range"),
    # the TMA scatter kernels (sm_90+) and the vectorized scatter_add
    (
        "TmaScatterKernel.cu",
        "tma_scatter_kernel",
        'ind >= 0 && ind < self_dim_size && "tma scatter index out of bounds"',
        "index-out-of-range",
    ),
    (
        "TmaScatterAddKernel.cu",
        "tma_scatter_add_kernel",
        'ind >= 0 && ind < self_dim_size && "tma scatter add index out of bounds"',
        "index-out-of-range",
    ),
    (
        "TmaScatterAddKernel.cu",
        "tma_scatter_add_kernel",
        'false && "tma_scatter_add_kernel requires sm_90+"',
        "pytorch-internal",
    ),
    (
        "IndexKernelUtils.cu",
        "vectorized_scatter_add_kernel",
        'ind >= 0 && ind < self_dim_size && "vectorized scatter add kernel index out of bounds"',
        "index-out-of-range",
    ),
    (
        "Indexing.cu",
        "operator()",
        'idx >= -size && idx < size && "index_select(): index out of bounds"',
        "index-out-of-range",
    ),
]


@pytest.mark.parametrize(("file", "function", "condition", "cause"), CURRENT_SITES)
def test_current_sites_printed_by_a_release_build_name_their_cause(
    file, function, condition, cause
):
    device = (
        f"/pytorch/aten/src/ATen/native/cuda/{file}:120: {function}: block: [3,0,0], "
        f"thread: [64,0,0] Assertion `{condition}` failed."
    )
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == cause


def test_the_vectorized_gather_kernel_is_explained_for_every_op_that_uses_it():
    """torch.gather, x[idx] and index_select print the same line as an embedding lookup: the
    words must not blame an embedding alone."""
    diagnosis = diagnose(
        ASSERT_2_9, device_output=H100_TORCH_2_11["embedding-vectorized-gather"][0]
    )
    assert diagnosis is not None and diagnosis.cause == "index-out-of-range"
    words = f"{diagnosis.title} {diagnosis.explanation}"
    for op in ("embedding", "index_select", "gather", "x[idx]"):
        assert op in words, op


def test_an_embedding_with_max_norm_is_explained_as_an_embedding_lookup():
    """nn.Embedding(max_norm=...) renormalises the looked-up rows first: Embedding.cu's renorm
    kernels check the ids (cyyever/pytorch@a4d795d8), before any index_select runs."""
    device = (
        "/pytorch/aten/src/ATen/native/cuda/Embedding.cu:196: renorm_kernel: block: [2,0,0], "
        "thread: [0,0,0] Assertion `index >= 0 && index < num_weights && "
        '"embedding_renorm_: index out of bounds"` failed.'
    )
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.cause == "index-out-of-range"
    assert diagnosis.source is not None and "Embedding.cu" in diagnosis.source


NVSHMEM = "/pytorch/torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu"


@pytest.mark.parametrize(
    "condition",
    [
        'split_val >= 0 && "split value is negative\\n"',
        'sum_of_splits <= input_dim0 && "sum of splits is larger than input dim\\n"',
    ],
)
def test_bad_split_sizes_of_the_symmetric_memory_all_to_all_are_the_users_splits(condition):
    """all_to_all_vdev_2d reads its splits on the GPU (laurentdupin/pytorch@fd4a5114
    nvshmem_extension.cu, exchangeSplitAndOffset_2d): only the kernel can check them."""
    device = (
        f"{NVSHMEM}:318: exchangeSplitAndOffset_2d: block: [0,0,0], thread: [5,0,0] "
        f"Assertion `{condition}` failed."
    )
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "size-mismatch"
    assert "all_to_all_vdev" in diagnosis.explanation
    assert any("splits.sum() <= input.shape[0]" in fix for fix in diagnosis.fixes)


@pytest.mark.parametrize(
    "device",
    [
        f"{NVSHMEM}:240: allToAllV_2d: block: [0,0,0], thread: [0,0,0] "
        "Assertion `SM arch unsupported for NVSHMEM` failed.",
        "/pytorch/torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory-inl.cuh:96: "
        "multimem_st: block: [0,0,0], thread: [0,0,0] Assertion `false` failed.",
        # without the path: the message says it all
        "tile_reduce_kernel: block: [1,0,0], thread: [0,0,0] Assertion `SM arch unsupported "
        "for NVSHMEM` failed.",
    ],
)
def test_a_symmetric_memory_kernel_on_a_gpu_without_its_features_says_so(device):
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause == "pytorch-internal"
    assert "GPU that lacks the features" in diagnosis.title


def test_a_bare_false_from_another_kernel_is_not_blamed_on_symmetric_memory():
    """`false` is printed by many kernels' unreachable branches: without the file, only the
    symmetric-memory helpers' own function names point there."""
    device = "some_kernel: block: [0,0,0], thread: [0,0,0] Assertion `false` failed."
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.cause == "pytorch-internal"
    assert "symmetric" not in diagnosis.title


def test_fractional_max_pool_backward_points_at_the_random_samples():
    """The forward places its windows from `_random_samples`, whose values PyTorch does not
    check (FractionalMaxPooling.h checks dtype and shape): a sample outside [0, 1) makes the
    backward's index check fire (Lanurence666/pytorch_backport_py38@faec2d6a)."""
    device = (
        "/pytorch/aten/src/ATen/native/cuda/FractionalMaxPool2d.cu:125: "
        "fractional_max_pool2d_backward_out_cuda_frame: block: [0,3,0], thread: [9,0,0] "
        "Assertion `inputH < gradInput.size(2)` failed."
    )
    diagnosis = diagnose(ASSERT_2_9, device_output=device)
    assert diagnosis is not None and diagnosis.cause == "index-out-of-range"
    assert "_random_samples" in diagnosis.explanation
    assert "[0, 1)" in diagnosis.likely_causes[0]
