"""The held-out cases' harness: a small notebook in a real kernel behind a real Jupyter server,
failed by a device-side assert, restarted by us, restored, replayed; the state the failing
cell starts from before and after, and what the plan says may differ (test_replay_heldout*.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

# What every round needs: a real Jupyter server and its websocket frontend, and torch in the
# kernel (a round that skips here is skipped whole, as pytest.importorskip at a module's top).
pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")
pytest.importorskip("torch")

from jupyter_harness import wait_for_new_process
from pytorch_texts import ASSERT_2_9


def restores(*names: str) -> pytest.MarkDecorator:
    """A case run with no restore, with everything restored, and with each of ``names`` alone."""
    return pytest.mark.parametrize("restore", [None, "", *names], ids=["no-restore", "all", *names])


ALL = restores()


@dataclass
class Outcome:
    before: dict
    after: dict | None
    plan: str  # what the plan's text/plain says may differ (``_warnings``)
    whole_plan: str
    replay_stream: str

    def differing(self) -> list[str]:
        after = self.after or {}
        return sorted(k for k in self.before if self.before[k] != after.get(k, "<missing>"))

    def silent(self) -> list[str]:
        """Differing keys whose notebook name the plan does not name as one that may differ."""
        found = []
        for key in self.differing():
            name = re.match(r"\w+", key).group(0)
            if not re.search(rf"\b{re.escape(name)}\b", self.plan):
                found.append(key)
        return found

    def explain(self) -> str:
        return (
            f"BEFORE {json.dumps(self.before)}\nAFTER  {json.dumps(self.after)}\n"
            f"--- plan ---\n{self.whole_plan}\n--- replay ---\n{self.replay_stream}"
        )


def _failing(fingerprint: str) -> str:
    """The failing cell: it prints the fingerprint (a dict display) first, then asserts."""
    return (
        "import json as _json, torch\n"
        f"print('FP', _json.dumps({fingerprint}, sort_keys=True, default=str))\n"
        f"raise torch.AcceleratorError({ASSERT_2_9!r})"
    )


def _fp(stream: str) -> dict | None:
    found = re.findall(r"^FP (.*)$", stream, flags=re.M)
    return json.loads(found[-1]) if found else None


def _plan_text(displays: list[dict]) -> str:
    return "\n".join(d.get("text/plain", "") for d in displays)


# A step's reason that only says what the cell binds or changes, or that the name here is used
# (put back, kept from a class/def), not that a name may differ.
_PLAIN_REASON = re.compile(
    r"^(defines|changes|imports|may define) \w+( through \w+)?$"
    r"|^the [\w, ]+ here (is|are) put back after it$"
    r"|^the [\w, ]+ here stays? from the cell's class/def on"
)


def _warnings(text: str) -> str:
    """What the plan says may differ: its head's notes (not "already here (kept)", which says the
    name is as it was) and the steps' reasons that explain something (not a plain "defines x" or
    "changes x"); never the cells' code."""
    kept = []
    for line in text.splitlines():
        if re.match(r"\s+[|!] ", line):
            continue
        step = re.match(r"\s+\[\d+\] .*?<- (.*)$", line)
        if step:
            kept += [r for r in step.group(1).split("; ") if not _PLAIN_REASON.match(r)]
        else:
            kept.append(re.sub(r"already here \(kept\): [^;)]*", "", line))
    return "\n".join(kept)


def run_case(
    server,
    kid: str,
    pid: int,
    cells: tuple[str, ...],
    fingerprint: str,
    restore: str | None = None,
    after: tuple[str, ...] = (),
    errors: tuple[int, ...] = (),
) -> Outcome:
    """``cells`` in the old kernel (those at ``errors`` must raise, the others must not), the
    failing cell, our restart; then ``restore`` (None: no restore; "": all; else the names),
    ``after``, the plan, and the replay."""
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard").status == "ok"
        for i, cell in enumerate(cells):
            reply = sock.execute(cell, timeout=60)
            expected = "error" if i in errors else "ok"
            assert reply.status == expected, (cell, reply.stream, reply.errors)
        failed = sock.execute(_failing(fingerprint), timeout=60)
        assert failed.status == "error", failed.stream
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        if restore is not None:
            restored = sock.execute(f"%cudaguard restore {restore}".strip(), timeout=60)
            assert restored.status == "ok", restored.stream + str(restored.errors)
        for cell in after:
            assert sock.execute(cell).status == "ok", cell
        planned = sock.execute("%cudaguard replay", timeout=60)
        replay = sock.execute("%cudaguard replay --yes", timeout=120)
    before = _fp(failed.stream)
    assert before is not None, failed.stream
    whole = _plan_text(planned.displays) + planned.stream
    return Outcome(before, _fp(replay.stream), _warnings(whole), whole, replay.stream)


def assert_no_silent_difference(outcome: Outcome) -> None:
    print(outcome.explain())
    assert outcome.after is not None, outcome.explain()  # the replay reached the failing cell
    assert not outcome.silent(), outcome.explain()
