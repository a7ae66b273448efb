"""Every device-side assert site of PyTorch maps to a rule (or to pytorch-internal).

tests/data/pytorch_assert_sites.json lists the sites, generated from PyTorch's sources with the
commit each came from (see its "about"). A site whose text no rule knows would reach the user as
"unknown-assert": adding a PyTorch kernel check means adding a rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.model import AssertLine
from nb_cudaguard.diagnosis.rules import rule_for

SITES = json.loads(
    (Path(__file__).parent.parent / "data" / "pytorch_assert_sites.json").read_text()
)["sites"]


def _id(site: dict) -> str:
    return f"{site['file']}:{site.get('function') or site.get('line')}:{site['printed'][:40]}"


@pytest.mark.parametrize("site", SITES, ids=[_id(s) for s in SITES])
def test_every_pytorch_assert_site_maps_to_a_rule(site):
    line = AssertLine(file=site["file"], condition=site["printed"], function=site.get("function"))
    rule = rule_for(line)
    assert rule is not None, site
    if "cause" in site:
        assert rule.cause == site["cause"], site


@pytest.mark.parametrize("site", SITES, ids=[_id(s) for s in SITES])
def test_every_site_printed_as_the_gpu_prints_it_names_its_cause(site):
    function = site.get("function") or "kernel"
    printed = (
        f"/pytorch/{site['path']}:{site.get('line', 100)}: {function}: block: [0,0,0], "
        f"thread: [0,0,0] Assertion `{site['printed']}` failed."
    )
    diagnosis = diagnose(printed + "\nRuntimeError: CUDA error: device-side assert triggered")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause != "unknown-assert", printed
    if "cause" in site:
        assert diagnosis.cause == site["cause"]


def test_the_site_list_records_where_it_came_from():
    assert len(SITES) >= 50
    assert all(site["commit"] for site in SITES)
