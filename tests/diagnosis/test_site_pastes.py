"""Every PyTorch assert site survives every way people paste its device line (issue 9, item 3).

For each site of tests/data/pytorch_assert_sites.json the exact line the GPU prints (as the H100
lines of tests/pytorch_texts.py show: ``<path>:<line>: <function>: block: [x,y,z], thread:
[x,y,z] Assertion `<cond>` failed.``)
is put under a real exception text and passed through each class of damage seen in public
reports: the whole paste flattened onto one line (issue titles, dialogs), log prefixes
(timestamps, torchrun's ``[rank3]:``, logger names), two threads' lines run together, the
backticks re-quoted, the path or the block/thread numbers abridged with ``...``, and full-width
punctuation from an IME or a machine translation. The diagnosis must stay sticky and name the
site's cause. A failure here is fixed in the class (classify.py / assert_lines.py / rules.py),
never by special-casing a site.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from pytorch_texts import ASSERT_2_9

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.model import AssertLine
from nb_cudaguard.diagnosis.rules import rule_for

SITES = json.loads(
    (Path(__file__).parent.parent / "data" / "pytorch_assert_sites.json").read_text()
)["sites"]

# A pasted traceback: the device lines, then Python's report of the exception.
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 42, in <module>\n'
    "    loss.backward()\n"
    f"torch.AcceleratorError: {ASSERT_2_9}"
)


def _device_line(site: dict, thread: int = 0) -> str:
    return (
        f"/pytorch/{site['path']}:{site.get('line') or 100}: {site.get('function') or 'kernel'}"
        f": block: [0,0,0], thread: [{thread},0,0] Assertion `{site['printed']}` failed."
    )


def _two_lines(site: dict) -> str:
    return f"{_device_line(site, 0)}\n{_device_line(site, 1)}"


def _full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if c in ":,[]`()" else c for c in text)


def _flattened(site: dict) -> str:
    return f"{_two_lines(site)}\n{TRACEBACK}".replace("\n", " ")


def _prefixed(prefix: str) -> Callable[[dict], str]:
    def paste(site: dict) -> str:
        text = f"{_two_lines(site)}\n{TRACEBACK}"
        return "\n".join(prefix + line for line in text.splitlines())

    return paste


def _run_together(site: dict) -> str:
    # Two threads printed at once: the second line starts where the first had not ended.
    return f"{_device_line(site, 0)}{_device_line(site, 1)}\n{TRACEBACK}"


def _requoted(quote_open: str, quote_close: str) -> Callable[[dict], str]:
    def paste(site: dict) -> str:
        line = _device_line(site).replace(
            f"`{site['printed']}`", f"{quote_open}{site['printed']}{quote_close}"
        )
        return f"{line}\n{TRACEBACK}"

    return paste


def _numbers_abridged(site: dict) -> str:
    line = _device_line(site).replace(
        "block: [0,0,0], thread: [0,0,0]", "block: [...], thread: [...]"
    )
    return f"{line}\n...\n{TRACEBACK}"


def _path_abridged(site: dict) -> str:
    line = _device_line(site).replace(f"/pytorch/{site['path']}", f".../{site['file']}")
    return f"{line}\n{TRACEBACK}"


def _full_width_paste(site: dict) -> str:
    return f"{_full_width(_two_lines(site))}\n{TRACEBACK}"


def _windows(site: dict) -> str:
    # MSVC builds print no function: "C:\\...\\Loss.cu:250: block: [...] Assertion ..."
    path = "C:\\actions-runner\\_work\\pytorch\\" + site["path"].replace("/", "\\")
    line = (
        f"{path}:{site.get('line') or 100}: block: [0,0,0], thread: [0,0,0] "
        f"Assertion `{site['printed']}` failed."
    )
    return f"{line}\n{TRACEBACK}"


def _path_dropped(site: dict) -> str:
    # Quoted from the kernel function on: "nll_loss_forward_..._kernel_2d: block: [...] ..."
    return f"{_device_line(site).split(': ', 1)[1]}\n{TRACEBACK}"


def _hard_wrapped(width: int) -> Callable[[dict], str]:
    # An editor's or a console's hard wrap: every line cut at the width, at a space.
    def paste(site: dict) -> str:
        text = f"{_two_lines(site)}\n{TRACEBACK}"
        return "\n".join(
            textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
            for line in text.splitlines()
        )

    return paste


PASTES: dict[str, Callable[[dict], str]] = {
    "as printed": lambda site: f"{_two_lines(site)}\n{TRACEBACK}",
    "flattened onto one line": _flattened,
    "timestamps": _prefixed("2026-03-02 14:07:11,482 - ERROR - "),
    "torchrun [rank3]:": _prefixed("[rank3]: "),
    "logger name": _prefixed("ERROR:trainer: "),
    "ray worker": _prefixed("(RayTrainWorker pid=4242) "),
    "threads run together": _run_together,
    "single quotes": _requoted("'", "'"),
    "typographic quotes": _requoted("\u2018", "\u2019"),
    "backtick and apostrophe": _requoted("`", "'"),
    "block/thread abridged": _numbers_abridged,
    "path abridged": _path_abridged,
    "full-width punctuation": _full_width_paste,
    "windows build (no function)": _windows,
    "path dropped": _path_dropped,
    "hard-wrapped at 60 columns": _hard_wrapped(60),
    "hard-wrapped at 120 columns": _hard_wrapped(120),
}

CASES = [(name, site) for name in PASTES for site in SITES]


def _id(case: tuple[str, dict]) -> str:
    name, site = case
    where = site.get("function") or site.get("line")
    return f"{name}|{site['file']}:{where}:{site['printed'][:30]}|{site.get('caller', '')[:30]}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_every_site_pasted_every_way_is_sticky_and_names_its_cause(case):
    name, site = case
    text = PASTES[name](site)
    diagnosis = diagnose(text)
    assert diagnosis is not None and diagnosis.sticky, text
    assert diagnosis.cause == site["cause"], (text, diagnosis.assert_lines)


ABRIDGED = [site for site in SITES if " && " in site["printed"]]


@pytest.mark.parametrize("site", ABRIDGED, ids=[_id(("abridged", s)) for s in ABRIDGED])
def test_a_condition_abridged_with_dots_never_names_a_wrong_cause(site):
    """`ind >=0 && ...`: the file names the cause when all its checks are of one kind;
    otherwise the paste is an unknown assert, never another cause."""
    cut = site["printed"].split(" && ")[0] + " && ..."
    line = _device_line(site).replace(f"`{site['printed']}`", f"`{cut}`")
    diagnosis = diagnose(f"{line}\n{TRACEBACK}")
    assert diagnosis is not None and diagnosis.sticky
    assert diagnosis.cause in (site["cause"], "unknown-assert")


@pytest.mark.parametrize(
    ("file", "cut", "cause"),
    [
        ("ScatterGatherKernel.cu", "idx_dim >= 0 && ...", "index-out-of-range"),
        ("DistributionTemplates.h", "0 <= p2 && ...", "probability-out-of-range"),
        ("MultiMarginLoss.cu", "target_k >= 0 && ...", "label-out-of-range"),
        ("GroupMMCommon.cuh", "delta % align == 0 && ...", "size-mismatch"),
        ("Loss.cu", "t >= 0 && ...", None),  # labels, BCE inputs and bookkeeping: no cause
        # two index checks and one masked_scatter size check: the index families (issue 33)
        ("IndexKernel.cu", "idx >= 0 && ...", "index-out-of-range"),
    ],
)
def test_an_abridged_condition_is_named_by_its_file_only_when_the_file_decides(file, cut, cause):
    rule = rule_for(AssertLine(file=file, condition=cut, function="operator()"))
    assert (rule.cause if rule else None) == cause
