"""The panel as a user reads it: what matters first, nothing twice, blocking-aware; and the
%cudaguard magic's commands and bad options."""

from __future__ import annotations

import re
import sys
from dataclasses import replace

import pytest
import torch
from conftest import Kernel, kernel_env
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11
from torch import nn

from nb_cudaguard.diagnosis.engine import diagnose
from nb_cudaguard.diagnosis.model import ContextState
from nb_cudaguard.diagnosis.render import Panel, to_html, to_text
from nb_cudaguard.notebook.actions import (
    BLOCKING_LABEL,
    DOES_BLOCKING,
    DOES_PLAIN_FIX,
    PLAIN_LABEL,
    PLAIN_OFF_LABEL,
    WIDGET_MIME,
    after_restart_text,
    command_text,
)

LABEL_LINE = H100_TORCH_2_11["cross-entropy-label"][0]
RAISE = f"import torch\nraise torch.AcceleratorError({ASSERT_2_9!r})"


def label_diagnosis():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    labels = torch.tensor([1, 2, 3, 3])
    diagnosis = diagnose(
        torch.AcceleratorError(ASSERT_2_9),
        device_output=LABEL_LINE,
        namespace={"model": model, "labels": labels},
        where="It surfaced in cell [5] at `loss.item()`.",
    )
    assert diagnosis is not None
    return diagnosis


def sentences(text: str) -> list[str]:
    flat = re.sub(r"<[^>]+>", " ", text)
    parts = re.split(r"(?<=[.:])\s+|\n", flat)
    return [p.strip(" -") for p in parts if len(p.strip(" -")) > 25]


def test_the_headline_then_the_users_evidence_then_the_one_best_step():
    lines = to_text(label_diagnosis()).splitlines()
    assert lines[1].startswith("nb_cudaguard: A class label is outside 0..num_classes-1.")
    assert "only a kernel restart fixes it" in lines[1]
    assert lines[2].startswith("Your data: `labels` contains 3 but the classifier `model.2`")
    assert (
        lines[3]
        == "Most likely: labels are numbered 1..C instead of 0..C-1 (shift them: `labels - 1`)"
    )
    assert lines[5] == "Details:"


def test_everything_else_is_in_one_collapsed_details_section():
    page = to_html(label_diagnosis())
    assert page.count("<details") == 1 and "<details open" not in page
    visible = re.sub(r"<[^>]+>", "", page.split("<details")[0])
    assert "contains 3" in visible and "labels - 1" in visible
    hidden = page.split("<details")[1]
    for item in ("Loss.cu", "TORCH_USE_CUDA_DSA", "label-out-of-range", "loss.item()"):
        assert item in hidden and item not in visible


def test_without_evidence_the_gpus_own_message_comes_first():
    diagnosis = diagnose(torch.AcceleratorError(ASSERT_2_9), device_output=LABEL_LINE)
    lines = to_text(diagnosis).splitlines()
    assert lines[2] == "The GPU said:"
    assert "Loss.cu (nll_loss_forward_reduce_cuda_kernel_2d)" in lines[3]
    assert lines[4].startswith("Fix: ")


def test_no_sentence_twice_across_panel_buttons_and_hint():
    diagnosis = label_diagnosis()
    texts = [
        to_text(diagnosis),
        DOES_PLAIN_FIX,
        DOES_BLOCKING,
        command_text(False, cause_known=True),
        after_restart_text("rest", True),
    ]
    seen: dict[str, int] = {}
    for index, text in enumerate(texts):
        for sentence in set(sentences(text)):
            assert sentence not in seen, f"said twice: {sentence!r}"
            seen[sentence] = index
    assert (
        "TORCH_USE_CUDA_DSA"
        not in to_text(diagnosis).split("How to fix it")[1].split("  What the GPU")[0]
    ), "a build flag is a fact, not a fix"


def test_a_process_without_cuda_says_why_the_context_was_not_checked():
    # What the probe reports in a process that never started CUDA (the demos without a GPU).
    text = to_text(replace(label_diagnosis(), context=ContextState.NO_CUDA))
    assert "On a GPU this breaks" in text.splitlines()[1]
    assert "has not started CUDA, so the error did not come from its GPU" in text


def test_a_blocking_panel_says_the_traceback_is_right_and_drops_the_blocking_advice():
    text = to_text(label_diagnosis(), blocking=True)
    assert "the traceback above points at the line that launched" in text
    assert "CUDA_LAUNCH_BLOCKING=1 (`%cudaguard restart`" not in text
    assert "Where:" not in text  # "surfaced later" no longer applies
    assert "data-blocking='true'" in Panel(label_diagnosis(), True)._repr_mimebundle_()["text/html"]


def _buttons(out) -> list[str]:
    return [
        m["content"]["data"]["state"]["description"]
        for m in out.of_type("comm_open")
        if m["content"]["data"]["state"].get("_model_name") == "ButtonModel"
    ]


def test_in_a_kernel_started_with_blocking_only_a_plain_restart_is_offered():
    k = Kernel(kernel_env(CUDA_LAUNCH_BLOCKING="1"))
    try:
        k.execute("%load_ext nb_cudaguard")
        out = k.execute(RAISE)
    finally:
        k.shutdown()
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    assert "the traceback above points at the line" in panel["text/plain"]
    assert _buttons(out) == [PLAIN_LABEL]
    (actions,) = [d for d in out.displays if WIDGET_MIME in d]
    assert "--no-blocking" in actions["text/plain"]
    assert "`%cudaguard restart` (" not in actions["text/plain"]


def test_in_a_kernel_nb_cudaguard_put_in_blocking_mode_the_button_turns_it_off():
    k = Kernel(kernel_env(CUDA_LAUNCH_BLOCKING="1", NB_CUDAGUARD_BLOCKING_AFTER_CELL="4"))
    try:
        k.execute("%load_ext nb_cudaguard")
        out = k.execute(RAISE)
    finally:
        k.shutdown()
    assert _buttons(out) == [PLAIN_OFF_LABEL]


def _primary(out) -> list[str]:
    """The labels of the buttons drawn as the primary action."""
    return [
        m["content"]["data"]["state"]["description"]
        for m in out.of_type("comm_open")
        if m["content"]["data"]["state"].get("_model_name") == "ButtonModel"
        and m["content"]["data"]["state"].get("button_style") == "danger"
    ]


NAMED_CAUSE = (
    "import os, torch\nfrom torch import nn\n"
    "model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))\n"
    "labels = torch.tensor([1, 2, 3, 3])\n"
    f"os.write(2, {(LABEL_LINE + chr(10)).encode()!r})\n"
    f"raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def test_a_cause_named_from_the_users_objects_makes_the_plain_restart_the_one_primary(kernel):
    kernel.execute("%load_ext nb_cudaguard")
    out = kernel.execute(NAMED_CAUSE)
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    assert "`labels` contains 3" in panel["text/plain"]
    assert _buttons(out) == [PLAIN_LABEL, BLOCKING_LABEL]
    assert _primary(out) == [PLAIN_LABEL]
    (actions,) = [d for d in out.displays if WIDGET_MIME in d]
    assert actions["text/plain"].startswith(
        "nb_cudaguard: Restart: `%cudaguard restart --no-blocking` (keeps the CPU variables"
    )
    notes = [
        m["content"]["data"]["state"]["value"]
        for m in out.of_type("comm_open")
        if m["content"]["data"]["state"].get("_model_name") == "HTMLModel"
    ]
    said = " ".join(notes)
    assert "apply the fix above, then re-run the failing cell" in said
    assert "so re-running shows the line that failed" in said


def test_a_normal_kernel_offers_both_restarts_with_blocking_primary_where_the_line_is_unknown(
    kernel,
):
    kernel.execute("%reset -f\n%load_ext nb_cudaguard")  # no objects left to name a cause
    out = kernel.execute(RAISE)
    assert _buttons(out) == [BLOCKING_LABEL, PLAIN_LABEL]
    assert _primary(out) == [BLOCKING_LABEL]
    panel = next(d for d in out.displays if "nb-cudaguard-panel" in d.get("text/html", ""))
    assert "data-blocking='false'" in panel["text/html"]


# --- %cudaguard --------------------------------------------------------------------------------
def test_bare_cudaguard_lists_its_commands(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", "")
    for command in ("status", "restart --no-blocking", "sync on|off", "repro [PATH]"):
        assert f"%cudaguard {command}" in captured.stdout


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("status --no-blocking", "goes with restart only"),
        ("sync on --no-blocking", "goes with restart only"),
        ("repro x.py --no-blocking", "goes with restart only"),
        ("status now", "only sync (on|off), repro (PATH), restore and keep (NAMEs) take values"),
        ("restart fast", "only sync (on|off), repro (PATH), restore and keep (NAMEs) take"),
        ("sync on off", "takes one value, not 2"),
        ("restore x --no-keep", "goes with restart only"),
        ("keep model --discard", "goes with restore only"),
        ("restore x --discard", "deletes everything kept: no NAME"),
        ("restore", "nothing to restore"),
        ("sync maybe", "takes on or off"),
        ("--no-blocking", "name a command first"),
        ("nonsense", "invalid choice"),
    ],
)
def test_an_option_that_makes_no_sense_is_a_usage_error_saying_why(shell, line, reason):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with pytest.raises(UsageError, match=re.escape(reason)):
        shell.run_line_magic("cudaguard", line)


def test_the_restart_message_names_what_the_frontend_shows():
    assert "status returns to Idle" in after_restart_text("rest", False)
    assert "session crashed" in after_restart_text("kill", False)
    assert "died or is restarting" in after_restart_text("exit", True)
    assert "CUDA_LAUNCH_BLOCKING=1" in after_restart_text("rest", True)
    assert "keeps it" in after_restart_text("rest", False, blocking_kept=True)


def test_render_stays_free_of_torch_and_ipython():
    assert "IPython" not in sys.modules["nb_cudaguard.diagnosis.render"].__dict__


def test_another_processs_error_does_not_say_this_context_would_be_broken():
    # A rank's failure explained in the notebook that launched it (ranks/launched.py): the
    # kernel never started CUDA, and nothing of the error is in its process.
    diagnosis = replace(label_diagnosis(), sticky=False, context=ContextState.NO_CUDA)
    text = to_text(diagnosis)
    assert "its own CUDA context is not involved" in text
    assert "the context would be broken" not in text
