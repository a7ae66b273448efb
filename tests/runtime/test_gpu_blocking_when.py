"""On a real GPU: when does setting CUDA_LAUNCH_BLOCKING in a live process still work, and is
``%cudaguard status``'s "effective" verdict (``blocking_state``) what the GPU really does?

Each case is a fresh process that sets the variable at one moment of CUDA's start-up, then
measures whether a launch waits for its kernel (``torch.cuda._sleep`` keeps the GPU busy for a
known time: an asynchronous launch returns at once, a blocking one only after it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import kernel_env

pytestmark = pytest.mark.gpu

CHILD = """
import json, os, time
{at_start}
import torch
from nb_cudaguard.runtime.blocking import blocking_state, watch_cuda_init
watch_cuda_init(torch)  # what the extension does at load: watch torch's lazy CUDA start
{after_import}
torch.cuda.is_available()
{after_is_available}
torch.ones(1, device="cuda").sum().item()
{after_first_allocation}
torch.cuda.synchronize()
t0 = time.perf_counter(); torch.cuda._sleep(200_000_000); t1 = time.perf_counter()
torch.cuda.synchronize(); t2 = time.perf_counter()
state = blocking_state(torch.cuda.is_initialized())
print(json.dumps({{"blocks": (t1 - t0) > 0.5 * (t2 - t0), "launch_s": t1 - t0,
                  "kernel_s": t2 - t0, "effective": state.effective, "reason": state.reason}}))
"""
MOMENTS = ("at_start", "after_import", "after_is_available", "after_first_allocation")
SET = "os.environ['CUDA_LAUNCH_BLOCKING'] = '1'"


def _measure(moment: str | None) -> dict[str, object]:
    code = CHILD.format(**{m: (SET if m == moment else "") for m in MOMENTS})
    env = kernel_env()
    env.pop("CUDA_LAUNCH_BLOCKING", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    print(moment, result)  # shown with -s: the table in docs/gpu.md
    return result


def test_without_the_variable_launches_are_asynchronous() -> None:
    result = _measure(None)
    assert result["blocks"] is False and result["effective"] is False


def test_set_before_the_first_cuda_call_it_blocks() -> None:
    for moment in ("at_start", "after_import"):
        assert _measure(moment)["blocks"] is True, moment


def test_set_after_the_first_allocation_it_is_too_late() -> None:
    assert _measure("after_first_allocation")["blocks"] is False


@pytest.mark.parametrize("moment", MOMENTS)
def test_the_effective_verdict_is_what_the_gpu_does(moment: str) -> None:
    result = _measure(moment)
    assert result["effective"] is result["blocks"], result
