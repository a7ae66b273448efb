"""Diagnosis.to_dict()/from_dict() and the machine-readable payload every panel carries."""

from __future__ import annotations

import dataclasses
import json

import pytest
from IPython.utils.capture import capture_output
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11, HEADLINE, RAISE_ASSERT

from nb_cudaguard import AssertLine, ContextState, CudaError, Diagnosis, diagnose
from nb_cudaguard.diagnosis.render import Panel
from nb_cudaguard.diagnosis.schema import MIME_TYPE, SCHEMA_VERSION, from_json, to_json

DEVICE_LINE = H100_TORCH_2_11["cross-entropy-label"][0] + "\n"

FULL = Diagnosis(
    cause="label-out-of-range",
    sticky=True,
    title="A class label is outside 0..num_classes-1",
    explanation="cross_entropy got a target class that is out of range.",
    fixes=("labels - 1",),
    assert_lines=(AssertLine("Loss.cu", "t >= 0 && t < n_classes", "nll", 20, "Loss.cu:245: ..."),),
    error=CudaError("cudaErrorAssert", 710, True, HEADLINE),
    likely_causes=("labels 1..C",),
    evidence=("`labels` contains 3 but the classifier has 3 outputs.",),
    where="surfaced at loss.item() in cell [5]; launched in cell [4]",
    source="aten/src/ATen/native/cuda/Loss.cu",
    context=ContextState.POISONED,
)


def test_to_dict_is_plain_json_and_from_dict_gives_the_same_diagnosis():
    data = json.loads(json.dumps(FULL.to_dict()))
    assert data["context"] == "poisoned"
    assert data["assert_lines"][0] == {
        "file": "Loss.cu",
        "condition": "t >= 0 && t < n_classes",
        "function": "nll",
        "count": 20,
        "raw": "Loss.cu:245: ...",
    }
    assert data["error"] == {
        "name": "cudaErrorAssert",
        "code": 710,
        "sticky": True,
        "message": HEADLINE,
    }
    back = Diagnosis.from_dict(data)
    assert back == FULL
    assert isinstance(back.assert_lines, tuple) and isinstance(back.assert_lines[0], AssertLine)
    assert back.context is ContextState.POISONED


def test_every_field_is_serialised_including_fields_added_later():
    names = {f.name for f in dataclasses.fields(Diagnosis)}
    assert set(FULL.to_dict()) == names


def test_from_dict_ignores_unknown_keys_and_defaults_missing_optional_fields():
    minimal = {"cause": "unknown-assert", "sticky": True, "title": "t", "explanation": "e"}
    back = Diagnosis.from_dict({**minimal, "from_a_newer_version": 1, "error": None})
    assert back == Diagnosis("unknown-assert", True, "t", "e")


def test_from_dict_rejects_what_is_not_an_object():
    with pytest.raises(TypeError):
        Diagnosis.from_dict(["cause"])  # type: ignore[arg-type]


def test_a_real_diagnosis_round_trips():
    diagnosis = diagnose(DEVICE_LINE + ASSERT_2_9)
    assert diagnosis is not None
    assert Diagnosis.from_dict(json.loads(json.dumps(diagnosis.to_dict()))) == diagnosis


def test_the_payload_names_the_schema_the_device_and_a_required_restart():
    payload = json.loads(json.dumps(to_json(FULL)))
    assert payload["schema_version"] == SCHEMA_VERSION
    assert "device" in payload
    assert payload["action"]["restart_kernel"] == "required"
    assert payload["action"]["blocking"] is True
    assert payload["action"]["rerun_cells"] is False
    assert from_json(payload) == FULL


def test_a_probe_that_found_the_context_alive_only_recommends_a_restart():
    alive = dataclasses.replace(FULL, context=ContextState.HEALTHY)
    assert to_json(alive)["action"]["restart_kernel"] == "recommended"


def test_a_non_sticky_error_needs_no_restart():
    oom = diagnose("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert oom is not None and not oom.sticky
    assert to_json(oom)["action"]["restart_kernel"] == "not-needed"


def test_a_panel_in_blocking_mode_asks_for_a_plain_restart_in_its_payload_too():
    payload = Panel(FULL, blocking=True)._repr_mimebundle_()[MIME_TYPE]
    action = payload["action"]
    assert (action["blocking"], action["blocking_on"]) == (False, True)
    assert action["command"] == "%cudaguard restart --no-blocking"
    assert "the traceback shows the true line" in action["message"]
    assert Panel(FULL)._repr_mimebundle_()[MIME_TYPE]["action"]["blocking"] is True


def test_the_panel_bundle_carries_the_payload_beside_text_markdown_and_html():
    bundle = Panel(FULL)._repr_mimebundle_()
    # no plain application/json: JupyterLab ranks its JSON viewer above HTML
    assert set(bundle) == {"text/plain", "text/markdown", "text/html", MIME_TYPE}
    assert from_json(bundle[MIME_TYPE]) == FULL


def test_text_readers_get_the_verdict_line_first_and_the_payload_in_markdown():
    bundle = Panel(FULL)._repr_mimebundle_()
    first = bundle["text/plain"].splitlines()[0]
    assert first == bundle["text/markdown"].splitlines()[0] == bundle[MIME_TYPE]["verdict"]
    assert first.startswith("nb_cudaguard: CUDA context POISONED, restart required; cause=")
    assert first.endswith("; run: %cudaguard restart")
    fenced = bundle["text/markdown"].split("```json\n")[1].split("\n```")[0]
    assert json.loads(fenced) == bundle[MIME_TYPE]


def test_the_panel_shown_in_a_real_shell_carries_the_payload(shell):
    shell.extension_manager.load_extension("nb_cudaguard")
    with capture_output() as captured:
        shell.run_cell(RAISE_ASSERT)
    payloads = [o.data[MIME_TYPE] for o in captured.outputs if MIME_TYPE in o.data]
    assert len(payloads) == 1
    assert payloads[0]["sticky"] is True
    assert payloads[0]["action"]["command"] == "%cudaguard restart"
