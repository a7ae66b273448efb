"""diagnose(): an exception or a text in, a Diagnosis (or None) out. Pure: no IPython, no torch."""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .assert_lines import parse_assert_lines
from .classify import classify_exception, classify_text, error_text
from .hints import with_text_hints
from .model import UNKNOWN_CODE, AssertLine, CudaError, Diagnosis
from .rules import Rule, match_rules
from .where import where_in_text

CPU_REPLAY_FIX = (
    "Replay the failing step on CPU (`model.cpu()`, the batch on CPU): the same bad input gives "
    "a readable Python error there, at the right line."
)
DSA_NOTE = (
    "TORCH_USE_CUDA_DSA is a build flag: stock PyTorch wheels lack it, and setting it at run "
    "time does nothing."
)

# Sticky errors other than a device-side assert: (cause, title, explanation).
_STICKY_KINDS: dict[str, tuple[str, str, str]] = {
    "cudaErrorAssert": (
        "unknown-assert",
        "A GPU kernel hit a device-side assert",
        "A check inside a CUDA kernel failed, almost always because of a bad value in the "
        "input: a class label or an index out of range, a probability outside [0, 1], NaN. "
        "The GPU's own message (the line with `Assertion ... failed.` printed by the kernel) "
        "names the check.",
    ),
    "cudaErrorIllegalAddress": (
        "illegal-memory-access",
        "A GPU kernel read or wrote memory it does not own",
        "A kernel accessed an address outside its tensors. In PyTorch this is usually an index "
        "that no check caught (ctc_loss targets, custom CUDA/Triton kernels, a bad "
        "non-contiguous view), or a bug in a CUDA extension.",
    ),
    "cudaErrorLaunchFailure": (
        "launch-failure",
        "A GPU kernel crashed",
        "A kernel failed while running ('unspecified launch failure'): often an out-of-bounds "
        "access in a custom kernel or extension, sometimes a driver or hardware fault (Xid "
        "errors in the system log).",
    ),
    "cudaErrorMisalignedAddress": (
        "misaligned-address",
        "A GPU kernel used a misaligned address",
        "A kernel loaded or stored data at an address not aligned for its type: usually a "
        "custom or vectorised kernel given a tensor with an unusual offset or stride.",
    ),
}
# Without the device lines: the causes of real reports, most frequent first.
_ANY_ASSERT_CAUSES = (
    "a class label outside 0..C-1 in cross_entropy / nll_loss (labels 1..C, -1 or the pad id "
    "instead of -100, a 255 'void' label, num_labels left at 2)",
    "a token id >= the vocabulary size (tokens added without "
    "model.resize_token_embeddings(len(tokenizer))), a sequence longer than "
    "max_position_embeddings, or token_type_ids on a RoBERTa-style model",
    "BCELoss on logits instead of BCEWithLogitsLoss (input outside [0, 1])",
    "NaN/inf logits when sampling (multinomial, generate(do_sample=True) in fp16)",
)
_OTHER_STICKY = (
    "other-sticky",
    "The GPU reported an error that corrupts the CUDA context",
    "NVIDIA documents this error as leaving the process in an inconsistent state: the process "
    "must be restarted.",
)


def _error_text(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception_only(type(error), error))
    except Exception:
        return type(error).__name__


def _sticky_diagnosis(
    error: CudaError, lines: tuple[AssertLine, ...], matched: tuple[Rule, AssertLine] | None
) -> Diagnosis:
    """``matched``: the rule the lines matched (matched once, by the caller)."""
    cause, title, explanation = _STICKY_KINDS.get(error.name, _OTHER_STICKY)
    fixes: tuple[str, ...] = (CPU_REPLAY_FIX,)
    if error.name == "cudaErrorAssert":
        fixes = (*fixes, DSA_NOTE)
        if matched is not None:
            rule, _line = matched
            return Diagnosis(
                cause=rule.cause,
                sticky=True,
                title=rule.title,
                explanation=rule.explanation,
                fixes=(*rule.fixes, *fixes),
                assert_lines=lines,
                error=error,
                likely_causes=rule.likely_causes,
                source=rule.source,
            )
    return Diagnosis(
        cause=cause,
        sticky=True,
        title=title,
        explanation=explanation,
        fixes=fixes,
        assert_lines=lines,
        error=error,
        likely_causes=_ANY_ASSERT_CAUSES if error.name == "cudaErrorAssert" else (),
    )


def _with_evidence(
    diagnosis: Diagnosis,
    error: BaseException | str,
    frames: Sequence[Mapping[str, Any]] | None,
    namespace: Mapping[str, Any] | None,
    matched: tuple[Rule, AssertLine] | None,
) -> Diagnosis:
    """Add sentences read from Python objects and CPU tensors, and rank the likely causes;
    ``matched``: the rule the diagnosis's lines matched."""
    from .evidence import frames_of, gather_evidence

    if frames is None:
        frames = frames_of(error) if isinstance(error, BaseException) else []
    if not frames and namespace is None:
        return diagnosis
    ops: tuple[str, ...]
    if matched is not None:
        ops = (matched[0].op,)
    elif diagnosis.cause == "unknown-assert":
        # No device lines: ask every family; only what is found is reported.
        ops = ("class-target", "embedding", "bce-input", "multinomial")
    else:
        return diagnosis
    sentences: list[str] = []
    ranked = diagnosis.likely_causes
    for op in ops:
        found = gather_evidence(op, ranked, frames=frames, namespace=namespace)
        sentences.extend(s for s in found.sentences if s not in sentences)
        if matched is not None:
            ranked = found.ranked_causes
    return replace(diagnosis, evidence=(*diagnosis.evidence, *sentences), likely_causes=ranked)


def _not_sticky_diagnosis(error: CudaError) -> Diagnosis:
    # A code alone ("Check failed: error == cudaSuccess (48 vs. 0)") gets its meaning said.
    meaning = error_text(error.name)
    named = (
        f" ({error.name}: {meaning})"
        if meaning and meaning.lower() not in error.message.lower()
        else ""
    )
    if error.code == UNKNOWN_CODE:  # NVIDIA does not say whether the context survives it
        title = "An unknown internal CUDA error"
        advice = (
            "NVIDIA does not say whether the CUDA context survives it. Run one small CUDA call "
            "(`torch.zeros(1, device='cuda').item()`): if that fails too, restart the process; "
            "if the GPU stays unusable, `nvidia-smi` and the system log's Xid lines say whether "
            "the GPU itself failed."
        )
    else:
        title = "A CUDA error that leaves the CUDA context usable"
        advice = "fix the cause and run the code again; no restart is needed."
    return Diagnosis(
        cause="not-sticky",
        sticky=False,
        title=title,
        explanation=f"{error.message}{named} — {advice}",
        error=error,
    )


def _merge(*groups: tuple[AssertLine, ...]) -> tuple[AssertLine, ...]:
    """Assert lines of several texts, first seen first, the same site counted once per text."""
    merged: dict[tuple[str, str | None, str], AssertLine] = {}
    for group in groups:
        for line in group:
            key = (line.file, line.function, line.condition)
            if key not in merged:
                merged[key] = line
    return tuple(merged.values())


@dataclass(frozen=True)
class Recognised:
    """A CUDA error read from an exception or a text: the first, cheap step of ``diagnose``,
    so that a caller can decide whether to gather more (device output, the user's objects)
    before the one full diagnosis (``explain``)."""

    error: BaseException | str
    cuda_error: CudaError
    text: str
    own_lines: tuple[AssertLine, ...]


def recognise(error: BaseException | str) -> Recognised | None:
    """The CUDA error in ``error``, or None for anything that is not one (from its own text: a
    Python error is never a CUDA error)."""
    if isinstance(error, BaseException):
        cuda_error = classify_exception(error)
        text = _error_text(error)
    elif isinstance(error, str):
        cuda_error = classify_text(error)
        text = error
    else:
        raise TypeError(f"diagnose() takes an exception or a text, not {type(error).__name__}")
    own_lines = parse_assert_lines(text)
    if cuda_error is None:
        # Device assert lines alone (a pasted log, a wrapper's message) are a device-side assert
        # too.
        if not own_lines:
            return None
        cuda_error = CudaError("cudaErrorAssert", 710, True, own_lines[0].raw)
    return Recognised(error, cuda_error, text, own_lines)


def diagnose(
    error: BaseException | str,
    *,
    device_output: str = "",
    namespace: Mapping[str, Any] | None = None,
    frames: Sequence[Mapping[str, Any]] | None = None,
    where: str | None = None,
) -> Diagnosis | None:
    """Explain a CUDA error.

    ``error`` is an exception or a text (an error message, a log, a traceback; it may include the
    device assert lines). ``device_output`` is extra text captured from the process's fd 2, where
    the CUDA runtime prints those lines, scoped by the caller to this failure (what was captured
    since the last cell that succeeded): its assert lines decide the cause, and make a follow-on
    CUDA error (cuBLAS, cuDNN, ...) the fallout of an assert. Returns None for anything that is
    not a CUDA error; a CUDA error that leaves the context usable gives ``sticky=False``.

    With ``namespace`` (the user's variables) or ``frames`` (local variables of the failing
    frames, innermost first; taken from the exception's traceback when only ``namespace`` is
    given), the diagnosis adds evidence read from Python objects and CPU tensors, never from CUDA
    memory. ``where`` says where the error surfaced and where it was most likely launched; for
    a text, it is read from the text's traceback where not given. Without them, diagnose() is
    pure: it reads only the texts.
    """
    recognised = recognise(error)
    if recognised is None:
        return None
    return explain(
        recognised, device_output=device_output, namespace=namespace, frames=frames, where=where
    )


def explain(
    recognised: Recognised,
    *,
    device_output: str = "",
    namespace: Mapping[str, Any] | None = None,
    frames: Sequence[Mapping[str, Any]] | None = None,
    where: str | None = None,
) -> Diagnosis:
    """The rest of ``diagnose`` for an error already recognised (the same arguments)."""
    error, cuda_error, text = recognised.error, recognised.cuda_error, recognised.text
    own_lines = recognised.own_lines
    device_lines = parse_assert_lines(device_output) if device_output else ()
    fallout: CudaError | None = None
    if not cuda_error.sticky:
        if not (own_lines or device_lines):
            return with_text_hints(_not_sticky_diagnosis(cuda_error), text)
        # A poisoned context wins: cuBLAS/cuDNN/MTGP errors and the like under an assert are its
        # fallout: every call after a sticky error fails (NVIDIA's error types). ``device_output``
        # is the caller's, scoped to this failure.
        fallout = cuda_error
        first = (own_lines or device_lines)[0]
        cuda_error = CudaError("cudaErrorAssert", 710, True, first.raw)
    lines = _merge(device_lines, own_lines)
    matched = match_rules(lines)  # once: the cause and the evidence both follow from it
    diagnosis = _sticky_diagnosis(cuda_error, lines, matched)
    if fallout is not None:
        diagnosis = replace(
            diagnosis,
            explanation=f"{diagnosis.explanation} The error raised (`{fallout.message[:160]}`) "
            "is fallout of this assert, not its cause.",
        )
    diagnosis = with_text_hints(diagnosis, text)
    if namespace is not None or frames is not None:
        diagnosis = _with_evidence(diagnosis, error, frames, namespace, matched)
    if where is None and isinstance(error, str):
        where = where_in_text(text)
    if where:
        diagnosis = replace(diagnosis, where=where)
    return diagnosis
