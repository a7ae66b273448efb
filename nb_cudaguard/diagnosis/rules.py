"""Device-side assert rules: which PyTorch kernel condition means which cause. Rules are data.

Each rule is one condition family: the kernel source files it lives in, a regular expression for
the condition (or the ``CUDA_KERNEL_ASSERT_MSG`` message) text, the PyTorch source it comes from,
the plain words, the likely causes (ranked, from real reports) and the fix. A rule never matches
on a path prefix or a line number: they differ per build and release. File names are compared
without their extension, so a ROCm build's ``Loss.hip`` matches ``Loss.cu``.

Rules are tried in order: internal invariants first (never blamed on the user's data), then the
families of user-triggerable asserts, then message-only rules that match in any file.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from .model import AssertLine


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


@dataclass(frozen=True)
class Rule:
    cause: str  # a stable cause id (see _diagnosis.CAUSES)
    files: tuple[str, ...]  # kernel source file names or glob patterns; empty matches any file
    condition: str  # regular expression searched in the condition or message text
    source: str  # where in PyTorch the assert lives, for the reader
    title: str
    explanation: str
    likely_causes: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    op: str = ""  # the operation family, which tells the evidence gatherer what to look for
    # Kernel function names (glob patterns) that identify the family when a line prints no
    # readable condition (``torch._assert_async`` without a message prints an empty one).
    functions: tuple[str, ...] = ()
    file_only: bool = False  # the condition is too generic to match without the file name
    # What the condition alone must show when a line comes without its file name, for a rule
    # whose own condition needs the file ("." = anything in this file): e.g. segment_reduce's
    # ``lengths_data[index] >= 0``.
    bare_condition: str = ""
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _bare: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", re.compile(self.condition))
        bare = re.compile(self.bare_condition) if self.bare_condition else None
        object.__setattr__(self, "_bare", bare)

    def matches_file(self, name: str) -> bool:
        if not self.files:
            return True
        for pattern in self.files:
            if any(ch in pattern for ch in "*?["):
                if fnmatch.fnmatch(name, pattern):
                    return True
            elif _stem(pattern) == _stem(name):
                return True
        return False

    @property
    def needs_file(self) -> bool:
        """A rule whose condition says too little alone ("." for "anything in this file") cannot
        match a line pasted without its file name."""
        return self.file_only or self.condition in (".", "")

    def matches(self, line: AssertLine) -> bool:
        """By the condition (or message) the line prints, in a file of this rule; a line without
        a file name matches on its condition alone (its bare condition, or, for a rule whose
        condition says too little alone, when its kernel function is one of this rule's)."""
        condition = line.condition.strip()
        if not condition:
            # An unreadable condition (cut off, interleaved, an _assert_async without message)
            # in a file whose every assert is this rule's ("." = anything in this file).
            return bool(line.file) and self.condition == "." and self.matches_file(line.file)
        if line.file:
            if not self.matches_file(line.file):
                return False
        elif self._bare is not None and self._bare.search(condition):
            return True
        elif self.needs_file and not self.matches_function(line):
            return False
        return self._compiled.search(condition) is not None

    def read_of(self, line: AssertLine) -> int:
        """How much of the line's condition this rule's patterns read: the characters its
        matches cover (its bare condition's or its own, whichever reads more; "." reads
        nothing: such a rule matches by its file or kernel function)."""
        condition = line.condition.strip()
        own = self._compiled if self.condition not in (".", "") else None
        return max(
            (
                sum(m.end() - m.start() for m in pattern.finditer(condition))
                for pattern in (self._bare, own)
                if pattern is not None
            ),
            default=0,
        )

    def matches_function(self, line: AssertLine) -> bool:
        """By the kernel function, for a line whose condition is unreadable or unknown: empty
        (``torch._assert_async`` without a message), cut off, or interleaved with another."""
        if line.function is None or (line.file and not self.matches_file(line.file)):
            return False
        return any(fnmatch.fnmatchcase(line.function, pattern) for pattern in self.functions)


# --- shared words -------------------------------------------------------------------------------
_CPU_CHECK_LABELS = (
    "Check on CPU before the loss: "
    "`assert ((labels >= 0) & (labels < logits.shape[1]) | (labels == -100)).all()`."
)
_LABEL_CAUSES = (
    "labels are numbered 1..C instead of 0..C-1 (shift them: `labels - 1`)",
    "the classifier has fewer outputs than the data has classes (`num_labels` left at its "
    "default of 2, or `nn.Linear(..., out_features)` too small)",
    "padding labels are -1 or the tokenizer's pad id instead of -100 (the ignore_index)",
    "a segmentation mask uses 255 for 'void' pixels without `ignore_index=255`",
)
_LABEL_FIXES = (
    _CPU_CHECK_LABELS,
    "Size the output layer for every class: `nn.Linear(hidden, num_classes)`, or "
    "`AutoModelForSequenceClassification.from_pretrained(name, num_labels=num_classes)`.",
    "Mark labels to skip with -100 (the default ignore_index), e.g. "
    "`labels[labels == tokenizer.pad_token_id] = -100`, or pass "
    "`nn.CrossEntropyLoss(ignore_index=255)`.",
)
_INDEX_CAUSES = (
    "a token id >= the embedding's vocabulary size: tokens were added to the tokenizer without "
    "`model.resize_token_embeddings(len(tokenizer))`, or the tokenizer does not match the model",
    "a sequence longer than `max_position_embeddings` (position ids past the position table)",
    "`token_type_ids` with a 1 on a model that has one token type (RoBERTa-style, "
    "`type_vocab_size=1`)",
    "a negative index, or an index computed from the wrong dimension",
)
_INDEX_FIXES = (
    "Check on CPU: `assert 0 <= ids.min() and ids.max() < embedding.num_embeddings`.",
    "After adding tokens: `model.resize_token_embeddings(len(tokenizer))`.",
    "Truncate to the model's limit: `tokenizer(..., truncation=True, "
    "max_length=model.config.max_position_embeddings)`; drop `token_type_ids` for models "
    "with `type_vocab_size == 1`.",
)
_GATHER_CAUSES = (
    "an index tensor holding positions of another (larger) dimension or tensor",
    "labels used as indices (gather of log-probabilities) with a label >= the number of classes",
    "negative indices: gather/scatter do not wrap around like Python indexing",
)
_GATHER_FIXES = (
    "Check on CPU: `assert 0 <= index.min() and index.max() < src.shape[dim]` for the `dim` "
    "you pass.",
)
_PROB_NAN_CAUSES = (
    "NaN or inf logits, typically from fp16/bf16 overflow while sampling "
    "(`generate(do_sample=True)` in half precision, a too-small temperature)",
    "weights that became NaN in training (a diverged step, a too-high learning rate)",
    "a probability row with negative entries (probabilities built by hand, not by softmax)",
    "a row that is all zeros (every token masked out, top-k/top-p filtering removed everything)",
)
_PROB_NAN_FIXES = (
    "Check the logits on the step before sampling: "
    "`assert torch.isfinite(logits).all()` (on CPU after a restart, or before the call).",
    "Sample from `torch.softmax(logits.float(), dim=-1)`, load the model in float32 or "
    "bfloat16 instead of float16, and keep the temperature reasonable.",
)
_RANDOM_FIX = "Validate the parameters before sampling: `assert ((p >= 0) & (p <= 1)).all()`."

_INTERNAL_TITLE = "An internal PyTorch check failed inside a GPU kernel"
_INTERNAL_EXPLANATION = (
    "This assert guards PyTorch's own kernel invariants (launch configuration, internal "
    "bookkeeping), not the values of your data. It points to a PyTorch or driver bug, a "
    "custom extension, or memory corrupted by an earlier kernel."
)
_INTERNAL_CAUSES = (
    "an earlier kernel corrupted memory (a custom CUDA/Triton kernel or extension)",
    "a PyTorch bug in this release for this shape/dtype: search the PyTorch issue tracker for "
    "the file and condition",
)
_INTERNAL_FIXES = (
    "Re-run with CUDA_LAUNCH_BLOCKING=1 to find the failing operation, then try the same step "
    "on CPU; if it passes there, report it to PyTorch with the condition text.",
)

RULES: tuple[Rule, ...] = (
    # --- internal invariants: never the user's data -----------------------------------------------
    Rule(
        cause="pytorch-internal",
        files=("safe_conv.h",),
        # CUDA_KERNEL_ASSERT_PRINTF(false, "value cannot be safely converted without overflow:
        # %s", name): its own [CUDA_KERNEL_ASSERT] line names the value
        condition=r".",
        source="c10/util/safe_conv.h (c10::safe_conv, a range-checked integer narrowing used in "
        "kernels)",
        title="A kernel could not narrow an integer without overflow",
        explanation=(
            "A PyTorch kernel converts a size, index or offset to a smaller integer type and the "
            "value did not fit (the `[CUDA_KERNEL_ASSERT]` line before it names the value). "
            "PyTorch guards this instead of silently truncating."
        ),
        likely_causes=(
            "a tensor, index or offset larger than the 32-bit range the kernel narrows to "
            "(more than 2**31 elements or bytes)",
            "a negative value where an unsigned size or count was expected",
            *_INTERNAL_CAUSES,
        ),
        fixes=(
            "Re-run with CUDA_LAUNCH_BLOCKING=1 to find the operation, check the sizes and "
            "index values it gets on CPU, and split very large tensors into chunks.",
        ),
        op="internal",
        functions=("safe_conv*",),
    ),
    Rule(
        cause="pytorch-internal",
        files=(
            "nvshmem_extension.cu",
            "CUDASymmetricMemory-inl.cuh",
            "CUDASymmetricMemoryOps.cu",
            "CUDASymmetricMemory.cu",
        ),
        # nvshmem_extension.cu: CUDA_KERNEL_ASSERT_MSG(false, "SM arch unsupported for NVSHMEM")
        # where __CUDA_ARCH__ < 700 or == 1100; CUDASymmetricMemory-inl.cuh: CUDA_KERNEL_ASSERT(
        # false) where the multimem / system-scope atomic instructions do not exist
        condition=r"SM arch unsupported for NVSHMEM|^\s*false\s*$",
        # "false" alone could be any kernel's: without the file, only these helpers' own lines
        file_only=True,
        bare_condition=r"SM arch unsupported for NVSHMEM",
        source="torch/csrc/distributed/c10d/symm_mem (nvshmem_extension.cu, "
        "CUDASymmetricMemory-inl.cuh)",
        title="A symmetric-memory kernel ran on a GPU that lacks the features it needs",
        explanation=(
            "A torch.distributed symmetric-memory kernel (the NVSHMEM all-to-all of MoE "
            "dispatch, the multicast / one-shot all-reduce) was built without the instructions "
            "this GPU would need, and stopped instead of computing wrong results. NVSHMEM "
            "kernels need compute capability 7.0 or newer; the multicast and system-scope atomic "
            "operations need newer GPUs (Hopper-class with NVLink multicast). It is not about "
            "your data."
        ),
        likely_causes=(
            "a GPU older than the operation supports (mixed GPU types across ranks included)",
            "a PyTorch build whose CUDA architecture list does not include this GPU",
        ),
        fixes=(
            "Use the ordinary NCCL collectives on this machine (`dist.all_to_all_single`, "
            "`dist.all_reduce`) instead of the symmetric-memory ops, or run on GPUs that "
            "support them; `nvidia-smi --query-gpu=name,compute_cap --format=csv` shows "
            "each GPU's compute capability.",
        ),
        op="internal",
        functions=(
            # symmetric memory's multicast and atomics on a GPU without them
            # (torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemory-inl.cuh)
            "multimem_*",
            "ld_acquire_sys_u32",
            "red_sub_relaxed_sys_u32",
            "add_bf16x2",
            "cas",
            "tile_reduce_kernel*",  # nvshmem_extension.cu: only the GPU check and the team's
        ),
    ),
    Rule(
        cause="pytorch-internal",
        files=(),
        condition=r"\b(?:blockDim|gridDim|threadIdx|warpSize|C10_WARP_SIZE|sizeof)\b"
        r"|^\s*(?:false|0)\s*(?:&&.*)?$|unreachable|can_use_32bit_indexing|canUse32BitIndexMath"
        # host-side property lookups and TensorIterator arity (MultinomialKernel, MemoryAccess)
        r"|\bprops\s*!=\s*(?:NULL|nullptr)|\biter\.n(?:in|out)puts\(\)"
        # Reduce.cuh's output bookkeeping; c10 DynamicCast.h (TypeCast.h before 2.1) dtype
        # dispatch; topk's gatherTopK slot counting (TensorTopK.cu, THCTensorTopK.cuh)
        r"|\bfinal_output\b|\boutput_vec_size\s*==|\bnoutputs\s*==\s*1\b"
        r"|ScalarType::\w+\s*==\s*(?:src|dest)_type"
        r"|\bwriteIndex\s*<\s*outputSliceSize|\boutputSliceSize\s*>=\s*writeIndexStart"
        # nll_loss2d's int64 offset guards (NLLLoss2d.cu)
        r"|^\s*(?:grad_)?input_index\s*>=\s*0\s*$"
        # symmetric memory (nvshmem_extension.cu, symm_mem/ops/*.cu): the team handle, the
        # scan's thread limits and 16-byte alignment, each checked on the host before launch
        r"|\b(?:NV|ROC)SHMEM_TEAM_INVALID\b"
        r"|\b(?:THREADS_PER_BLOCK|WARP_SIZE|A2AV_TILE_SIZE|NUM_TILES)\b"
        r"|&\s*15\s*\)\s*==\s*0",
        source="kernel launch invariants across aten/src/ATen/native/cuda (CUDALoops.cuh, "
        "MemoryAccess.cuh, Reduce.cuh, SortUtils.cuh, SortingRadixSelect.cuh, TensorTopK.cu), "
        "c10/core/DynamicCast.h",
        title=_INTERNAL_TITLE,
        explanation=_INTERNAL_EXPLANATION,
        likely_causes=_INTERNAL_CAUSES,
        fixes=_INTERNAL_FIXES,
        op="internal",
        functions=(
            "vectorized_elementwise_kernel*",
            "LoadWithCast",
            "StoreWithCast",
            "thread_reduce",
            "get_accumulated_output",
            "accumulate_in_output",
            "set_results",
            "set_results_to_output",
            "warpMergeSortKVInPlace",
            "findPattern*",
            "gatherTopK*",
            "writeResult",  # gatherTopK's helper on ROCm (TensorTopK.cu)
            "warpMergeSortTopK",
            "computeBlockwiseWithinKCounts",
            # symmetric memory's scan helpers (nvshmem_extension.cu) and NCCL's all-to-all
            # (symm_mem/ops/nccl_all_to_all_nd.cu): limits and alignment the host checked
            "prefixSum*",
            "exchangeSplitAndOffset",  # the 1-D exchange checks only the team and its size
            "allToAllV_2d*",  # the 2-D copy checks only the tile limits the host checked
            "all_to_all_lsa_kernel",
            "vectorized_layer_norm_kernel_impl",  # layer_norm_kernel.cu: double never vectorized
            "renormRows",  # multinomial's launch bookkeeping (`props != NULL`)
            "conv_depthwise3d*",
        ),
    ),
    Rule(
        cause="pytorch-internal",
        files=("Loss.cu",),
        # nll_loss backward guards its own int64 offset arithmetic against overflow.
        condition=r"^\s*index\s*>=\s*0\s*$",
        source="aten/src/ATen/native/cuda/Loss.cu (nll_loss_backward_reduce_cuda_kernel_2d)",
        title=_INTERNAL_TITLE,
        explanation=_INTERNAL_EXPLANATION,
        likely_causes=_INTERNAL_CAUSES,
        fixes=_INTERNAL_FIXES,
        op="internal",
    ),
    # --- class targets ----------------------------------------------------------------------------
    Rule(
        cause="label-out-of-range",
        files=(
            "Loss.cu",
            "NLLLoss2d.cu",
            "ClassNLLCriterion.cu",
            "SpatialClassNLLCriterion.cu",
            "CrossEntropy*.cu",
            "SoftMax.cu",
        ),
        condition=r"\b(?:t|cur_target|target_val|target)\s*(?:>=\s*0\s*&&\s*\w+\s*)?<\s*"
        r"(?:n_classes|classes|nClasses)\b",
        source="aten/src/ATen/native/cuda/Loss.cu and NLLLoss2d.cu (nll_loss, nll_loss2d, "
        "forward and backward, used by cross_entropy); THCUNN ClassNLLCriterion.cu before 1.8",
        title="A class label is outside 0..num_classes-1",
        explanation=(
            "cross_entropy / nll_loss got a target class that is negative or not smaller than "
            "the number of classes the model outputs (and is not ignore_index)."
        ),
        likely_causes=_LABEL_CAUSES,
        fixes=_LABEL_FIXES,
        op="class-target",
        functions=(
            "nll_loss*",
            "cunn_ClassNLLCriterion*",
            "cunn_SpatialClassNLLCriterion*",
            "*ClassNLLCriterion*",
        ),
    ),
    Rule(
        cause="label-out-of-range",
        files=(
            "MultiMarginLoss.cu",
            "MultiMarginCriterion.cu",
            "MultiLabelMarginLoss.cu",
            "MultiLabelMarginCriterion.cu",
        ),
        condition=r"target(?:_k|_idx)?\s*(?:>=\s*0\s*&&\s*\w+\s*)?<\s*dim|target index is out of",
        source="aten/src/ATen/native/cuda/MultiMarginLoss.cu (multi_margin_loss), "
        "MultiLabelMarginCriterion.cu",
        title="A class label is outside 0..num_classes-1 (margin loss)",
        explanation=(
            "multi_margin_loss / multilabel_margin_loss got a target class that is negative or "
            "not smaller than the number of classes in the input."
        ),
        likely_causes=_LABEL_CAUSES[:2],
        fixes=_LABEL_FIXES[:2],
        op="class-target",
        functions=(
            "MultiMarginLoss_*",
            "MultilabelMarginLoss_*",
            "multilabel_margin*",
            "cunn_MultiMarginCriterion*",
            "cunn_MultiLabelMarginCriterion*",
        ),
    ),
    # --- binary cross entropy ---------------------------------------------------------------------
    Rule(
        cause="probability-out-of-range",
        files=("Loss.cu", "BCECriterion.cu"),
        # THCUNN dereferences: `*input >= 0. && *input <= 1.`
        condition=r"\b(?:input_val|input|x)\s*>=\s*(?:zero|0\.?)\s*&&\s*\*?\w+\s*<=\s*(?:one|1\.?)",
        source="aten/src/ATen/native/cuda/Loss.cu (binary_cross_entropy forward/backward); "
        "THCUNN BCECriterion.cu",
        title="BCELoss got an input outside [0, 1]",
        explanation=(
            "binary_cross_entropy (nn.BCELoss) takes probabilities: every input value must lie "
            "in [0, 1]. A value outside means raw scores (logits) or NaN reached it."
        ),
        likely_causes=(
            "BCELoss applied to logits: the model's last layer has no sigmoid (use "
            "BCEWithLogitsLoss on raw scores instead)",
            "NaN in the model output (training diverged, fp16 overflow)",
            "probabilities computed by hand that overshoot by rounding (1.0000001)",
        ),
        fixes=(
            "Use `nn.BCEWithLogitsLoss()` on the raw scores (drop the sigmoid): it is also "
            "numerically stable.",
            "Or clamp: `loss = F.binary_cross_entropy(probs.clamp(0, 1), target)`.",
        ),
        op="bce-input",
    ),
    Rule(
        cause="probability-out-of-range",
        files=("Loss.cu", "BCECriterion.cu"),
        condition=r"\b(?:target_val|target|y)\s*>=\s*(?:zero|0\.?)\s*&&\s*\*?\w+\s*<=\s*(?:one|1\.?)",
        source="aten/src/ATen/native/cuda/Loss.cu (binary_cross_entropy target check)",
        title="BCELoss got a target outside [0, 1]",
        explanation=(
            "binary_cross_entropy takes targets in [0, 1] (0/1 labels or soft labels); a target "
            "outside that range was passed."
        ),
        likely_causes=(
            "class indices (0..C-1) passed as BCE targets for a multi-class problem: use "
            "CrossEntropyLoss with integer labels instead",
            "labels encoded as -1/1 or 1/2 instead of 0/1",
            "padding labels (-100, -1) mixed into the targets",
        ),
        fixes=(
            "Check on CPU: `assert ((target >= 0) & (target <= 1)).all()`; map -1/1 labels "
            "with `(target + 1) / 2`.",
        ),
        op="bce-target",
    ),
    # --- indices into an embedding / index_select / index_add ... ---------------------------------
    Rule(
        cause="index-out-of-range",
        files=("IndexKernelUtils.cu",),
        condition=r"vectorized gather kernel index out of bounds"
        r"|\bind\s*>=\s*0\s*&&\s*ind\s*<\s*ind_dim_size",
        source="aten/src/ATen/native/cuda/IndexKernelUtils.cu (vectorized_gather_kernel, since "
        "2.8: the fast path of index_select and embedding lookups, x[idx] indexing and "
        "torch.gather with a broadcast index)",
        title="An index is out of range for the tensor it reads from",
        explanation=(
            "An embedding lookup, index_select, `x[idx]` indexing or torch.gather (they share "
            "PyTorch's vectorized gather kernel) got an index that is negative (where negative "
            "indices are not allowed) or not smaller than the size of the dimension it reads "
            "from."
        ),
        likely_causes=(
            *_INDEX_CAUSES,
            "an index tensor built for another tensor or a larger dimension (torch.gather "
            "indices, a top-k or argmax taken over the wrong dimension)",
        ),
        fixes=(
            *_INDEX_FIXES,
            "For gather or x[idx]: check on CPU that `0 <= index.min()` and "
            "`index.max() < source.shape[dim]`.",
        ),
        op="index",
        functions=("vectorized_gather_kernel*",),
    ),
    Rule(
        cause="index-out-of-range",
        files=(
            "Indexing.cu",
            "THCTensorIndex.cu",
            "Embedding.cu",
            "EmbeddingBag.cu",
            "EmbeddingBackwardKernel.cu",
            "LookupTable.cu",
            "LookupTableBag.cu",
        ),
        # EmbeddingBag.cu: `input[emb] < numRows`
        condition=r"\b(?:srcIndex|ind|input_idx|idx|index|input\[\w+\])\s*<\s*\w*(?:SelectDimSize|ind_dim_size"
        r"|numRows|num_embeddings|numel|size)\b"
        # Embedding.cu's renorm (nn.Embedding(max_norm=...)) checks the ids before the lookup
        r"|embedding_renorm_: index out of bounds|\bindex\s*<\s*num_weights\b",
        source="aten/src/ATen/native/cuda/Indexing.cu (index_select: embedding, token lookups); "
        "Embedding.cu (embedding_renorm_, max_norm); EmbeddingBag.cu",
        title="An index is out of range for the tensor it selects from",
        explanation=(
            "index_select (which nn.Embedding uses) or an embedding lookup got an index that is "
            "negative or not smaller than the size of the table it reads from."
        ),
        likely_causes=_INDEX_CAUSES,
        fixes=_INDEX_FIXES,
        op="embedding",
        functions=(
            "indexSelectSmallIndex",
            "indexSelectLargeIndex",
            "EmbeddingBag_updateOutputKernel_*",
            "renorm_kernel",
            "embedding_renorm*",
            "embedding_backward*",
            "embedding_bag*",
            "cunn_LookupTable*",
        ),
    ),
    Rule(
        cause="index-out-of-range",
        files=("Indexing.cu", "THCTensorIndex.cu", "IndexKernel.cu"),
        condition=r"\bdstIndex\s*<\s*\w*DimSize|index_(?:copy|fill|add|reduce)_?\(?\)?:? ?index "
        r"out of bounds|\bidx\s*(?:>=\s*-?\w+\s*&&\s*idx\s*)?<\s*self_dim_size",
        source="aten/src/ATen/native/cuda/Indexing.cu (index_add, index_reduce) and "
        "IndexKernel.cu (index_copy, index_fill)",
        title="An index is out of range for index_add / index_copy / index_fill",
        explanation=(
            "index_add_ / index_copy_ / index_fill_ / index_reduce_ got an index that is "
            "negative or not smaller than the size of the destination dimension."
        ),
        likely_causes=(
            "indices computed for a larger tensor (another batch, the unfiltered dataset)",
            "indices built from labels or ids that start at 1",
        ),
        fixes=("Check on CPU: `assert 0 <= index.min() and index.max() < dest.shape[dim]`.",),
        op="index",
        functions=(
            "indexFuncSmallIndex",
            "indexFuncLargeIndex",
            "indexAddSmallIndex",
            "indexAddLargeIndex",
            "indexCopySmallIndex",
            "indexCopyLargeIndex",
            "index_copy*",
            "index_fill*",
        ),
    ),
    Rule(
        cause="index-out-of-range",
        files=("IndexKernel.cu", "Indexing.cu", "THCTensorIndex.cu", "TensorAdvancedIndexing.cu"),
        condition=r"index out of bounds|out of range"
        r"|-?sizes\[i\]\s*<=\s*index|\bidx\s*>=\s*-?numel"
        # index_put_ / put_ / take before 1.9 (IndexKernel.cu, THCTensorIndex.cu indexToOffset)
        r"|\blinearIndex\s*<\s*size\s*&&\s*linearIndex\s*>=\s*-size",
        source="aten/src/ATen/native/cuda/IndexKernel.cu (advanced indexing x[idx], "
        "index_put_, take, put_)",
        title="An index is out of range in tensor indexing",
        explanation=(
            "Advanced indexing (`x[idx]`, `x[idx] = v`, index_put_), take or put_ got an index "
            "outside -size..size-1 for the indexed dimension."
        ),
        likely_causes=(
            "an index tensor built for another tensor or a longer sequence",
            "labels or ids used as indices with an off-by-one (1-based ids)",
            "a mask/attention tensor of the wrong length used to index (KV-cache steps)",
        ),
        fixes=("Check on CPU: `assert (-x.shape[d] <= idx).all() and (idx < x.shape[d]).all()`.",),
        op="index",
        functions=("indexToOffset",),
    ),
    Rule(
        cause="size-mismatch",
        files=("IndexKernel.cu", "THCTensorMasked.cuh", "THCTensorMasked.cu", "Indexing.cu"),
        # masked_scatter_size_check: `totalElements <= srcSize` (1.x-2.1), `selected <= source_size`
        condition=r"maskPrefixSum\s*<\s*srcSize|src(?:_index|Index)?\s*<\s*src_?(?:numel|Size|size)"
        r"|totalElements\s*<=\s*srcSize|selected\s*<=\s*source_size",
        source="aten/src/ATen/native/cuda/IndexKernel.cu (masked_scatter_)",
        title="masked_scatter_ got a source with fewer elements than the mask selects",
        explanation=(
            "masked_scatter_ copies one source element per True in the mask; the source has "
            "fewer elements than the mask has True values."
        ),
        likely_causes=(
            "in a vision-language model: `input_ids` holds more image placeholder tokens than "
            "the vision encoder produced features (the processor and the model disagree on the "
            "image size, patches or number of images; or the prompt was truncated mid-image)",
            "the mask selects more elements than the source provides",
        ),
        fixes=(
            "Check on CPU: `assert source.numel() >= mask.sum()`.",
            "For a vision-language model, use the model's own processor for both text and "
            "images, do not truncate prompts that contain images, and compare "
            "`(input_ids == image_token_id).sum()` with the number of image features.",
        ),
        op="masked-scatter",
        functions=("masked_scatter_size_check",),
    ),
    Rule(
        cause="size-mismatch",
        files=("EmbeddingBag.cu", "LookupTableBag.cu"),
        condition=r"\bend\s*>=\s*begin\b",
        source="aten/src/ATen/native/cuda/EmbeddingBag.cu (EmbeddingBag_updateOutputKernel_*)",
        title="embedding_bag got offsets that decrease",
        explanation=(
            "nn.EmbeddingBag / F.embedding_bag reads bag i from offsets[i] to offsets[i+1]; an "
            "offset smaller than the one before it makes a bag end before it begins."
        ),
        likely_causes=(
            "offsets that are not a running sum of bag lengths (lengths passed as offsets)",
            "offsets of another batch, or not sorted after the bags were shuffled",
        ),
        fixes=(
            "Build offsets on CPU: `offsets = torch.cat([torch.zeros(1, dtype=torch.long), "
            "lengths.cumsum(0)[:-1]])` and check `(offsets.diff() >= 0).all()`.",
        ),
        op="embedding-bag-offsets",
        # before 1.9 one kernel whose only check was the offsets
        functions=("EmbeddingBag_updateOutputKernel",),
    ),
    # --- gather / scatter -------------------------------------------------------------------------
    Rule(
        cause="index-out-of-range",
        files=(
            "ScatterGatherKernel.cu",
            "THCTensorScatterGather.cu",
            "IndexKernelUtils.cu",
            "TmaScatterKernel.cu",
            "TmaScatterAddKernel.cu",
            "TmaScatterReduceKernel.cu",
        ),
        condition=r"scatter gather kernel index out of bounds|vectorized scatter"
        r"|tma scatter (?:add |reduce )?index out of bounds"
        r"|\bidx_dim\s*>=\s*0\s*&&\s*idx_dim\s*<\s*index_size"
        r"|indexValue\s*>=\s*0\s*&&\s*indexValue\s*<\s*\w+\.sizes\[dim\]",
        source="aten/src/ATen/native/cuda/ScatterGatherKernel.cu (gather, scatter, scatter_add, "
        "scatter_reduce); THC THCTensorScatterGather.cu",
        title="gather / scatter got an index out of range",
        explanation=(
            "gather / scatter / scatter_add got an index that is negative or not smaller than "
            "the size of the dimension it indexes."
        ),
        likely_causes=_GATHER_CAUSES,
        fixes=_GATHER_FIXES,
        op="gather",
        functions=(
            "_scatter_gather_elementwise_kernel*",
            "*scatter_gather*",
            "vectorized_scatter*",
            "tma_scatter*",
            "THCudaTensor_gatherKernel",
            "THCudaTensor_scatter*Kernel",
        ),
    ),
    # --- sampling ---------------------------------------------------------------------------------
    Rule(
        cause="probability-out-of-range",
        files=(),
        condition=r"probability tensor contains either",
        source="aten/src/ATen/native/cuda/TensorCompare.cu (_assert_async_msg, used by "
        "multinomial's input check)",
        title="multinomial / sampling got an invalid probability tensor",
        explanation=(
            "torch.multinomial (used by `generate(do_sample=True)`, samplers and RL policies) "
            "found inf, NaN or a negative value in the probabilities."
        ),
        likely_causes=_PROB_NAN_CAUSES,
        fixes=_PROB_NAN_FIXES,
        op="multinomial",
    ),
    Rule(
        cause="nan-detected",
        files=(
            "MultinomialKernel.cu",
            "THCTensorRandom.cuh",
            "THCTensorRandom.cu",
            "Multinomial.cu",
        ),
        condition=r"isnan|isinf",
        source="aten/src/ATen/native/cuda/MultinomialKernel.cu (sampleMultinomialOnce)",
        title="multinomial got NaN or inf probabilities",
        explanation="torch.multinomial found NaN or inf in the probabilities it samples from.",
        likely_causes=_PROB_NAN_CAUSES,
        fixes=_PROB_NAN_FIXES,
        op="multinomial",
    ),
    Rule(
        cause="probability-out-of-range",
        files=(
            "MultinomialKernel.cu",
            "THCTensorRandom.cuh",
            "THCTensorRandom.cu",
            "Multinomial.cu",
        ),
        condition=r"val\s*>=\s*zero|!\s*\(\s*val\s*<\s*zero\s*\)|ge\(val,\s*zero\)|lt\(val,\s*zero\)"
        r"|sum\s*>\s*(?:acc)?[Zz]ero|cumdist\[size\s*-\s*1\]\s*>",
        source="aten/src/ATen/native/cuda/MultinomialKernel.cu (renormRows, "
        "sampleMultinomialOnce, binarySearchForMultinomial)",
        title="multinomial got negative probabilities or a row that sums to zero",
        explanation=(
            "torch.multinomial needs non-negative weights with a positive sum in every row; a "
            "row had a negative entry or summed to zero (or overflowed)."
        ),
        likely_causes=(
            "a row that is all zeros (every candidate masked out, top-k/top-p removed all)",
            *_PROB_NAN_CAUSES[:3],
        ),
        fixes=(
            "Check on CPU: `assert (probs >= 0).all() and (probs.sum(-1) > 0).all()`.",
            *_PROB_NAN_FIXES[1:],
        ),
        op="multinomial",
        functions=(
            "sampleMultinomialOnce*",
            "renormRowsL1*",
            "sampleMultinomialWithReplacement*",
            "binarySearchForMultinomial*",
            "multinomial*",
        ),
    ),
    Rule(
        cause="probability-out-of-range",
        files=(
            "DistributionTemplates.h",
            "Distributions.cu",
            "DistributionBernoulli.cu",
            "THCTensorRandom.cu",
        ),
        condition=r"0\s*<=\s*p\d?\s*&&\s*p\d?\s*<=\s*1",
        source="aten/src/ATen/native/cuda/DistributionTemplates.h (bernoulli_tensor_cuda_kernel)",
        title="bernoulli got a probability outside [0, 1]",
        explanation="torch.bernoulli / dropout masks got a probability outside [0, 1] (or NaN).",
        likely_causes=(
            "probabilities from raw scores without a sigmoid",
            "NaN in the probability tensor (diverged training, fp16 overflow)",
        ),
        fixes=(_RANDOM_FIX, "Use `torch.sigmoid(scores)` to turn scores into probabilities."),
        op="bernoulli",
        functions=("bernoulli*",),
    ),
    Rule(
        cause="probability-out-of-range",
        files=("Distributions.cu", "Distributions.h"),
        condition=r"lambda\s*>=\s*0|invalid Poisson rate",
        source="aten/src/ATen/native/cuda/Distributions.cu (poisson_cuda_kernel)",
        title="poisson got a negative rate",
        explanation="torch.poisson needs rates >= 0; a rate was negative or NaN.",
        likely_causes=("rates from raw scores without exp/softplus", "NaN rates"),
        fixes=("Check on CPU: `assert (rates >= 0).all()`; use `F.softplus(x)` for rates.",),
        op="poisson",
    ),
    # --- explicit asserts -------------------------------------------------------------------------
    # Messages of PyTorch's own _assert_async.msg callers (found by extract_assert_sites.py in
    # torch/*.py): they fail in TensorCompare.cu like a user's assert, but say what broke.
    Rule(
        cause="label-out-of-range",
        files=("TensorCompare.cu", "*.py", "unknown"),
        condition=r"one_hot: Class values must be",
        source="torch/_decomp/decompositions.py (one_hot under torch.compile / export: "
        "_assert_async.msg, or the Triton kernel's device_assert)",
        title="one_hot got a class value outside 0..num_classes-1",
        explanation=(
            "F.one_hot(labels, num_classes) in a compiled or exported graph checks its labels "
            "on the GPU: a label was negative or not smaller than num_classes."
        ),
        likely_causes=(
            "labels numbered 1..C instead of 0..C-1, or num_classes one too small",
            "padding or ignore labels (-100, -1, 255) passed to one_hot",
        ),
        fixes=(
            "Check on CPU: `assert 0 <= labels.min() and labels.max() < num_classes`; mask "
            "ignored labels before one_hot (`labels.clamp(min=0)` and zero those rows after).",
        ),
        op="one-hot",
    ),
    Rule(
        cause="index-out-of-range",
        files=("TensorCompare.cu", "*.py", "unknown"),
        condition=r"indices in the ragged dimension are out of bounds",
        source="torch/nested/_internal/ops.py (select/index on a jagged nested tensor)",
        title="An index is out of range in a nested tensor's ragged dimension",
        explanation=(
            "Indexing a jagged nested tensor (torch.nested, layout=torch.jagged) along its "
            "ragged dimension used an index not smaller than that component's length."
        ),
        likely_causes=("an index computed for the longest sequence applied to shorter ones",),
        fixes=(
            "Check each component's length first: `lengths = nt.offsets().diff()`, then "
            "`assert (idx < lengths).all()`.",
        ),
        op="index",
    ),
    Rule(
        cause="user-assert",
        files=("TensorCompare.cu",),
        condition=r".",
        # torch._assert_async before the message overload (1.9-2.0) printed its own condition.
        bare_condition=r"^input\[0\]\s*!=\s*(?:0|c10::complex)",
        source="aten/src/ATen/native/cuda/TensorCompare.cu (_assert_async); its message-less "
        "callers in PyTorch: Indexing.cu wrapIndexOnce (index_put_ with accumulate=True, "
        "deterministic index_put_/index_add_), cudnn/LossCTC.cpp (ctc_loss with CUDA lengths)",
        title="An asynchronous assert (torch._assert_async) failed",
        explanation=(
            "A `torch._assert_async(cond)` check found its condition false on the GPU. PyTorch "
            "itself makes such checks without a message (so the line shows an empty "
            "condition) for index bounds in `index_put_(..., accumulate=True)` and for CTC "
            "lengths; a message, when there is one, says what broke."
        ),
        likely_causes=(
            "an index out of range in `x.index_put_(indices, values, accumulate=True)` (also "
            "`index_put_`/`index_add_` under `torch.use_deterministic_algorithms(True)`): the "
            "bounds check runs as an _assert_async",
            "`F.ctc_loss` with length tensors on the GPU where a target is longer than its "
            "input (`target_lengths > input_lengths`) or an input length is 256 or more (cuDNN)",
            "the condition checked by your code or a library calling torch._assert_async",
        ),
        fixes=(
            "Check indices on CPU before index_put_: "
            "`assert (-x.shape[d] <= idx).all() and (idx < x.shape[d]).all()`.",
            "For ctc_loss: `assert (target_lengths <= input_lengths).all()`.",
            "Evaluate the same condition on CPU tensors to see which value breaks it.",
        ),
        op="assert-async",
        functions=("_assert_async_cuda_kernel",),
    ),
    # --- shapes, sizes, offsets -------------------------------------------------------------------
    Rule(
        cause="size-mismatch",
        files=("Repeat.cu",),
        condition=r".",
        source="aten/src/ATen/native/cuda/Repeat.cu (repeat_interleave)",
        title="repeat_interleave: repeats do not add up to output_size",
        explanation=(
            "repeat_interleave was given an `output_size` that differs from the sum of the "
            "repeats (or a negative repeat)."
        ),
        likely_causes=("`output_size` computed from another tensor than `repeats`",),
        fixes=("Check on CPU: `assert (repeats >= 0).all() and repeats.sum() == output_size`.",),
        op="repeat-interleave",
        functions=("compute_cuda_kernel*",),
        # Repeat.cu: CUDA_KERNEL_ASSERT_PRINTF(result_size == cumsum_ptr[size - 1], "Invalid
        # input! In `repeat_interleave`, ...") and CUDA_KERNEL_ASSERT(repeat >= 0), now
        # `repeat >= 0 && start >= 0 && end <= result_size` (a negative repeat breaks the cumsum)
        bare_condition=r"\bresult_size\s*==\s*cumsum_ptr\b|^\s*repeat\s*>=\s*0\s*$"
        r"|^\s*repeat\s*>=\s*0\s*&&\s*start\s*>=\s*0\s*&&\s*end\s*<=\s*result_size\b"
        r"|In `repeat_interleave`",
    ),
    Rule(
        cause="size-mismatch",
        files=("SegmentReduce.cu",),
        condition=r".",
        source="aten/src/ATen/native/cuda/SegmentReduce.cu (segment_reduce)",
        title="segment_reduce: lengths/offsets do not match the data",
        explanation=(
            "segment_reduce got lengths or offsets that do not cover the data along the "
            "reduced axis (negative lengths, or a sum different from the data size)."
        ),
        likely_causes=("lengths computed for another batch or before filtering",),
        fixes=(
            "Check on CPU: `assert (lengths >= 0).all() and lengths.sum() == data.shape[axis]`.",
        ),
        op="segment-reduce",
        functions=("segment_reduce*", "post_sum_div_kernel*"),
        bare_condition=r"\b(?:lengths|offsets)_data\[\w+\]\s*>=\s*0",
    ),
    Rule(
        cause="index-out-of-range",
        files=("MaxUnpooling.cu", "SpatialMaxUnpooling.cu", "VolumetricMaxUnpooling.cu"),
        condition=r"maxind|index|<",
        file_only=True,
        source="aten/src/ATen/native/cuda/MaxUnpooling.cu (max_unpool2d/3d)",
        title="max_unpool got an index outside the output",
        explanation=(
            "max_unpool2d/3d got indices that point outside the output it builds: the indices "
            "did not come from the matching max_pool call, or output_size is too small."
        ),
        likely_causes=(
            "indices from a max_pool with another kernel/stride/padding, or another tensor",
            "an output_size smaller than the pooled input's original size",
        ),
        fixes=("Pass `output_size=x.shape` of the tensor that was pooled, and its own indices.",),
        op="max-unpool",
        functions=("max_unpooling*",),
        # MaxUnpooling.cu since 2.2: `maxind >= 0 && maxind < outputImageSize` (2d),
        # `index >= 0 && index < outputImageSize` (3d)
        bare_condition=r"\b(?:maxind|index)\s*>=\s*0\s*&&\s*(?:maxind|index)\s*<\s*outputImageSize"
        r"|\bmaxind\s*<\s*output\w*Size",
    ),
    Rule(
        cause="nan-detected",
        files=(
            "FractionalMaxPool2d.cu",
            "FractionalMaxPool3d.cu",
            "SpatialFractionalMaxPooling.cu",
            "VolumetricFractionalMaxPooling.cu",
        ),
        condition=r"maxIndex\s*!=\s*-1|lower_bound|maxVal",
        source="aten/src/ATen/native/cuda/FractionalMaxPool2d.cu / 3d.cu",
        title="fractional_max_pool found no maximum in a window",
        explanation=(
            "fractional_max_pool found a pooling window without a maximum: the window's values "
            "are all -inf or NaN."
        ),
        likely_causes=("NaN/-inf activations (diverged training, fp16 overflow)",),
        fixes=("Check `torch.isfinite(x).all()` on the pooled input.",),
        op="fractional-max-pool",
        functions=("fractional_max_pool2d_out*", "fractional_max_pool3d_out*"),
    ),
    Rule(
        cause="index-out-of-range",
        files=("FractionalMaxPool2d.cu", "FractionalMaxPool3d.cu"),
        condition=r"index|<",
        file_only=True,
        source="aten/src/ATen/native/cuda/FractionalMaxPool2d.cu / 3d.cu (backward)",
        title="fractional_max_pool backward got an index outside the input",
        explanation=(
            "fractional_max_pool's backward scatters each gradient to the input position its "
            "forward pass recorded, and a recorded position lies outside the input. The forward "
            "places its pooling windows from `_random_samples`; PyTorch checks their shape but "
            "not their values, so a sample outside [0, 1) puts windows past the input's edge."
        ),
        likely_causes=(
            "`_random_samples` passed to `F.fractional_max_pool2d/3d` (or `nn.FractionalMaxPool"
            "2d/3d`) with values outside [0, 1): made with `torch.randn` instead of "
            "`torch.rand`, or scaled",
            "indices from another pooling call or another tensor given to the backward op",
        ),
        fixes=(
            "Check the samples on CPU: `assert ((s >= 0) & (s < 1)).all()`, or leave "
            "`_random_samples` unset so PyTorch draws them.",
            "Use the indices returned by the same fractional_max_pool call.",
        ),
        op="fractional-max-pool",
        functions=("fractional_max_pool*backward*",),
        bare_condition=r"\binput[THW]\s*<\s*gradInput\.size\(",
    ),
    Rule(
        cause="size-mismatch",
        files=("nvshmem_extension.cu",),
        condition=r"sum of splits is larger than input dim|split value is negative"
        r"|\bsum_of_splits\s*<=\s*input_dim0|\bsplit_val\s*>=\s*0"
        r"|\bblock_size\s*\*\s*blocks_per_peer\s*==\s*peer_size",
        source="torch/csrc/distributed/c10d/symm_mem/nvshmem_extension.cu "
        "(exchangeSplitAndOffset_2d, allToAllV: torch.ops.symm_mem.all_to_all_vdev*)",
        title="A symmetric-memory all-to-all got split sizes that do not fit its input",
        explanation=(
            "`torch.ops.symm_mem.all_to_all_vdev` / `all_to_all_vdev_2d` (the NVSHMEM "
            "all-to-all that Mixture-of-Experts layers use to send tokens to experts) read the "
            "split sizes from a GPU tensor, so only the kernel can check them: a split was "
            "negative, the splits add up to more rows than the input has, or one peer's share "
            "in bytes does not divide evenly among the blocks that copy it (a case the kernel "
            "does not handle yet)."
        ),
        likely_causes=(
            "split counts that do not belong to this input: counted from another batch, or "
            "before tokens were dropped for expert capacity",
            "negative counts (-1 used as padding, or an integer overflow)",
            "splits in the wrong unit: bytes or elements instead of rows of dim 0",
        ),
        fixes=(
            "Check the splits before the call: `assert (splits >= 0).all() and splits.sum() <= "
            "input.shape[0]` (for the 2-D version, over all experts of this rank).",
            "If both hold, pad each split so its byte size divides evenly among the copy "
            "blocks, or report the shapes to PyTorch.",
        ),
        op="symm-mem-all-to-all",
        functions=("exchangeSplitAndOffset_2d*", "allToAllV"),
    ),
    Rule(
        cause="size-mismatch",
        # the header's name is what the device prints, for every grouped GEMM that includes it
        files=("GroupMMCommon.cuh", "*GroupMM*", "*GroupedMM*"),
        condition=r"expected (?:gemm dimension|ofsets|offsets) to be greater or equal 0"
        r"|expected (?:input|output) tensor dynamic dimension byte size"
        r"|expected offset to be less than tensor size",
        source="aten/src/ATen/native/cuda/GroupMMCommon.cuh (torch._grouped_mm offsets)",
        title="grouped matmul got bad group offsets",
        explanation=(
            "torch._grouped_mm / scaled grouped GEMM got `offs` that are not non-decreasing, or "
            "a group size whose byte size is not a multiple of 16 (TMA alignment)."
        ),
        likely_causes=(
            "offsets that are not a cumulative sum of group sizes (`torch.cumsum(sizes, 0)`)",
            "group sizes that are not multiples of 16 bytes / 8 bf16 elements",
        ),
        fixes=(
            "Build offsets with `torch.cumsum(group_sizes, 0, dtype=torch.int32)` and pad each "
            "group to a multiple of 16 bytes.",
        ),
        op="grouped-gemm",
        functions=("prepare_grouped_gemm_data*",),
    ),
    Rule(
        cause="sparse-invariant",
        files=("ValidateCompressedIndicesCommon.h", "ValidateCompressedIndicesKernel.cu"),
        condition=r"cond && message|is not satisfied",
        source="aten/src/ATen/native/sparse/ValidateCompressedIndicesCommon.h",
        title="A sparse CSR/CSC/BSR/BSC tensor has invalid compressed indices",
        explanation=(
            "Validating a compressed sparse tensor failed: its compressed indices must start at "
            "0, end at nnz, never decrease, and its plain indices must be in range and sorted "
            "without duplicates within each row (column)."
        ),
        likely_causes=(
            "crow_indices/col_indices built by hand with an off-by-one or for another shape",
            "unsorted or duplicate column indices within a row",
        ),
        fixes=(
            "Build it on CPU first: `torch.sparse_csr_tensor(crow, col, values, size)` raises a "
            "readable error there; or convert from COO with `.to_sparse_csr()`.",
        ),
        op="sparse-compressed",
    ),
    Rule(
        cause="sparse-invariant",
        files=(),
        condition=r"(?:crow|ccol|col|row)_indices\[.*is not satisfied",
        source="aten/src/ATen/native/sparse/ValidateCompressedIndicesCommon.h",
        title="A sparse CSR/CSC/BSR/BSC tensor has invalid compressed indices",
        explanation=(
            "A compressed sparse tensor's indices break an invariant (start at 0, end at nnz, "
            "non-decreasing, plain indices in range, sorted and distinct)."
        ),
        likely_causes=("compressed indices built by hand with an off-by-one or for another shape",),
        fixes=("Build it on CPU first, or convert from COO with `.to_sparse_csr()`.",),
        op="sparse-compressed",
    ),
    Rule(
        cause="nan-detected",
        files=("NanCheck.cu",),
        condition=r"isnan|nan",
        file_only=True,
        source="torch/csrc/distributed/c10d/NanCheck.cu (TORCH_NCCL_NAN_CHECK)",
        title="NCCL NaN check: a collective's input contains NaN",
        explanation=(
            "With TORCH_NCCL_NAN_CHECK=1, PyTorch checks every collective's input on the GPU; "
            "a tensor sent to all_reduce/broadcast/... contained NaN."
        ),
        likely_causes=(
            "gradients that became NaN (diverged step, too-high learning rate, fp16 overflow)",
            "uninitialised buffers (torch.empty) sent to a collective",
        ),
        fixes=(
            "Find the first NaN: `torch.autograd.set_detect_anomaly(True)` on a small run, "
            "lower the learning rate, use bf16 or a GradScaler.",
        ),
        op="nccl-nan",
    ),
    # --- compiled code ----------------------------------------------------------------------------
    Rule(
        cause="index-out-of-range",
        # Triton may print the file as "unknown:0: unknown: block: ...".
        files=("*.py", "unknown"),
        condition=r"index out of bounds: 0 <= tmp\d+ < \S+",
        source="torch/_inductor (the bounds check torch.compile adds to generated Triton kernels)",
        title="An index is out of range in a torch.compile'd kernel",
        explanation=(
            "A kernel generated by torch.compile (Inductor) checked an index against the size "
            "it reads from and found it out of range: the same bad index would fail in eager "
            "mode (an embedding lookup, gather or indexing)."
        ),
        likely_causes=_INDEX_CAUSES,
        fixes=(
            "Run the same step without torch.compile on CPU: the eager error names the operation.",
            *_INDEX_FIXES,
        ),
        op="inductor-index",
    ),
    Rule(
        cause="user-assert",
        files=("*.py", "unknown"),
        condition=r".",
        source="a Triton kernel's tl.device_assert",
        title="A Triton kernel's device assert failed",
        explanation=(
            "A `tl.device_assert` in a Triton kernel (yours, a library's, or generated by "
            "torch.compile) found its condition false."
        ),
        likely_causes=("the condition printed above, in the kernel named by the file",),
        fixes=("Run the same step with the kernel's reference (eager, CPU) implementation.",),
        op="triton-assert",
    ),
    # --- message-only shapes, any file ------------------------------------------------------------
    Rule(
        cause="index-out-of-range",
        files=(),
        condition=r"index out of bounds|out of bounds|out of range",
        source="an index bounds check in a CUDA kernel",
        title="An index is out of range inside a GPU kernel",
        explanation=(
            "A kernel checked an index against the size it reads from and found it out of range."
        ),
        likely_causes=_INDEX_CAUSES[3:] + _INDEX_CAUSES[:1],
        fixes=("Replay the step on CPU: the CPU kernel names the operation and the bad index.",),
        op="index",
    ),
    # --- files that only hold internal machinery --------------------------------------------------
    Rule(
        cause="pytorch-internal",
        files=(
            "CUDALoops.cuh",
            "MemoryAccess.cuh",
            "Loops.cuh",
            "Reduce.cuh",
            "OffsetCalculator.cuh",
            "thread_constants.h",
            "CUDAApplyUtils.cuh",
            "ScanUtils.cuh",
            "SortUtils.cuh",
            "block_reduce.cuh",
            "TensorInfo.cuh",
            "KernelUtils.cuh",
            "PersistentSoftmax.cuh",
            "CUDAGraphsUtils.cuh",
            "IntegerDivider.cuh",
            "DeviceSqrt.cuh",
            "Sort.cu",
            "SortStable.cu",
            "Sorting.cu",
            "SortingRadixSelect.cuh",
            "jit_utils.cpp",
            "CUDAJitLoops.cuh",
            "DynamicCast.h",
            "TypeCast.h",
            "TensorTopK.cu",
            "THCTensorTopK.cuh",
            "DepthwiseConv3d.cu",
        ),
        condition=r".",
        source="PyTorch's shared CUDA kernel machinery",
        title=_INTERNAL_TITLE,
        explanation=_INTERNAL_EXPLANATION,
        likely_causes=_INTERNAL_CAUSES,
        fixes=_INTERNAL_FIXES,
        op="internal",
    ),
)


# Where PyTorch's own device code lives in every build's paths ("/pytorch/aten/src/ATen/...",
# "C:\\cb\\pytorch_1000\\work\\aten\\...", "/__w/pytorch/pytorch/c10/...", THC's old
# "torch/lib/THC"), third-party kernels it ships included.
_PYTORCH_TREE = re.compile(r"(?:^|/)(?:aten|c10|caffe2|third_party|torch/(?:csrc|lib))/")
_DIRECTORY = re.compile(r"(\S*[\\/])[^\\/\s]+\.(?:cu|cuh|hip|h|hpp|cpp|cc|cxx):\d+")
# HIP compiles device code from host-language files too ("vectoradd_hip.cpp:50: void
# vectoradd_float(...): Device-side assertion `0' failed."); PyTorch's kernels are .cu/.hip files
# and headers.
_HOST_LANGUAGE = (".cpp", ".cc", ".cxx", ".c")

OWN_KERNEL = Rule(
    cause="user-assert",
    files=(),
    condition=r".",
    source="the kernel source named on the device line (its path is outside PyTorch's aten/, "
    "c10/ and torch/csrc/)",
    title="An assert in a GPU kernel outside PyTorch failed (your own or an extension's)",
    explanation=(
        "The device line names a kernel file whose path is not in PyTorch's sources: the "
        "`assert` that failed is in CUDA/HIP code compiled by you or by a library (a custom "
        "extension, `load_inline`, a JIT-compiled op), not one of PyTorch's checks. Its "
        "condition and line number, printed above, are that code's own."
    ),
    likely_causes=(
        "an input the kernel does not handle: a size, index or value range its author assumed",
        "a branch the author marked unreachable (`assert(0)` / `assert(false)`) that the inputs "
        "reached",
        "the kernel launched with a grid or block shape it was not written for",
    ),
    fixes=(
        "Open that file at the printed line, and check on CPU the values its condition reads "
        "before the launch (or run the kernel's reference implementation on the same inputs).",
    ),
    op="user-kernel",
)


def outside_pytorch(line: AssertLine) -> bool:
    """The device line's path shows a kernel file outside PyTorch's source tree. A line without
    a directory (pasted, or a Windows build's bare name) says nothing, nor does a Python file
    (Triton and Inductor kernels have rules of their own)."""
    if not line.file or line.file.endswith(".py"):
        return False
    found = _DIRECTORY.search(line.raw)
    if found is None:
        known = any(rule.files and rule.matches_file(line.file) for rule in RULES)
        return line.file.endswith(_HOST_LANGUAGE) and not known
    path = found.group(1).replace("\\", "/")
    # ".../Loss.cu", "../Loss.cu": the paste shortened the path, which then says nothing
    if not any(part.strip(".") and not part.endswith(":") for part in path.split("/")):
        return False
    return _PYTORCH_TREE.search(path) is None


def rule_for(line: AssertLine) -> Rule | None:
    """The rule for one assert line, or None when no rule knows it: a kernel file outside
    PyTorch is that kernel's own assert; else a rule that knows both its condition and its
    kernel function first (a line without its file name: ``index >= 0`` is nll_loss's own
    bookkeeping, fractional_max_pool's an index check), then by its condition (without the
    file, the rule that reads most of it), then by its kernel function."""
    if outside_pytorch(line):
        return OWN_KERNEL
    if line.function and not line.file:
        for rule in RULES:
            knows_both = rule.functions and rule.condition != "."
            if knows_both and rule.matches_function(line) and rule.matches(line):
                return rule
    if not line.file:
        # Without its file a condition can match several rules: the one that reads the most of
        # it wins (``idx_dim >= 0 && idx_dim < index_size && "index out of bounds"`` is
        # gather's, though advanced indexing prints "index out of bounds" too); first on ties.
        found = [rule for rule in RULES if rule.matches(line)]
        if found:
            return max(found, key=lambda rule: rule.read_of(line))
    for rule in RULES:
        if rule.matches(line):
            return rule
    for rule in RULES:
        if rule.matches_function(line):
            return rule
    return _by_file_alone(line)


_ABRIDGED = re.compile(r"(?:\.\.\.|\u2026)\s*$|\s(?:\.\.\.|\u2026)\s|\[\s*\.\.\.\s*\]")


def _by_file_alone(line: AssertLine) -> Rule | None:
    """For a condition that was cut off ("idx_dim >= 0 && ...") or could not be read: the rule
    of its file when its rules name one cause, or most of them do (ScatterGatherKernel.cu only
    checks gather/scatter indices, IndexKernel.cu mostly indices; Loss.cu checks labels, BCE
    inputs and its own bookkeeping, so a cut condition there names nothing)."""
    condition = line.condition.strip()
    if not line.file or (condition and not _ABRIDGED.search(condition)):
        return None
    candidates = [rule for rule in RULES if rule.files and rule.matches_file(line.file)]
    causes = Counter(rule.cause for rule in candidates)
    if not causes:
        return None
    # Where the file's checks name several causes, the one more than half of them name
    # (IndexKernel.cu: two index checks and masked_scatter's size check), never an internal
    # invariant; Loss.cu's labels, BCE inputs and bookkeeping name none.
    (cause, most), *_others = causes.most_common()
    if most * 2 <= len(candidates) or cause == "pytorch-internal":
        return None
    # the family whose own file this is first (IndexKernel.cu: advanced indexing)
    family = [rule for rule in candidates if rule.cause == cause]
    return next((rule for rule in family if _stem(rule.files[0]) == _stem(line.file)), family[0])


def match_rules(lines: Sequence[AssertLine]) -> tuple[Rule, AssertLine] | None:
    """The first rule matching any of the assert lines, in the order the lines were printed."""
    for line in lines:
        rule = rule_for(line)
        if rule is not None:
            return rule, line
    return None
