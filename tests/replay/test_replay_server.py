"""Replay to the true line, end to end: a real Jupyter server, a kernel that fails, our restart,
and the new process re-running exactly the cells the failing one needs.

Each cell prints a marker, so what the replay ran is read from the kernel's own output.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from jupyter_harness import (
    JupyterServer,
    Reply,
    installed_extensions,
    nbconvert,
    outputs_of,
    save_notebook,
    wait_for_new_process,
)
from pytorch_texts import ASSERT_2_9

from nb_cudaguard.notebook.actions import BLOCKING_REPLAY_LABEL
from nb_cudaguard.notebook.replay_glue import REPLAY_LABEL

pytest.importorskip("websocket")
pytest.importorskip("jupyter_server")
pytest.importorskip("torch")

DATA = "print('RAN:data')\ndata = [0, 1, 2]"
UNUSED = "print('RAN:unused')\nunused = 5"
SHOW = "print('RAN:show')\ndata"
MUTATE = "print('RAN:mutate')\ndata.append(3)"
# Fails as a current PyTorch does after a device-side assert, only with the mutated data.
FAIL_ASSERT = (
    "print('RAN:fail')\nimport torch\nif len(data) == 4:\n"
    f"    raise torch.AcceleratorError({ASSERT_2_9!r})"
)
# A real op that fails on CPU: an embedding id out of range, at line 5 of the cell.
FAIL_INDEX = (
    "print('RAN:fail')\nimport torch\nemb = torch.nn.Embedding(3, 2)\nids = torch.tensor(data)\n"
    "out = emb(ids)\ntotal = out.sum()"
)
# What a restore of the mutated data would put back in the new process.
RESTORED = "data = [0, 1, 2, 3]"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _markers(text: str) -> list[str]:
    return re.findall(r"RAN:(\w+)", text)


def _fail_then_restart(server, kid, pid, failing: str, restart: str = "%cudaguard restart"):
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard").status == "ok"
        for cell in (DATA, UNUSED, SHOW, MUTATE):
            assert sock.execute(cell).status == "ok"
        failed = sock.execute(failing, timeout=60)
        assert failed.status == "error"
        sock.execute(restart)
    wait_for_new_process(server, kid, pid)
    return failed


def _load_then_replay(server, kid, *cells: str) -> tuple[Reply, Reply]:
    """In the new process: `%load_ext nb_cudaguard` (which shows the offer), ``cells``, then
    `%cudaguard replay --yes`."""
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        for cell in cells:
            sock.execute(cell)
        return loaded, sock.execute("%cudaguard replay --yes", timeout=90)


def test_replay_runs_only_the_needed_cells_and_stops_at_the_failing_one(server, server_kernel):
    kid, pid = server_kernel
    failed = _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    loaded, replay = _load_then_replay(server, kid)
    offered = [d["text/plain"] for d in loaded.displays if "Replay to cell" in d["text/plain"]]
    assert len(offered) == 1
    assert f"Replay to cell [{failed.execution_count}] of the previous kernel" in offered[0]
    assert "blocking mode is on" in " ".join(d["text/plain"] for d in loaded.displays)
    assert _markers(replay.stream) == ["data", "mutate", "fail"]
    (error,) = replay.errors
    assert error["ename"] == "AcceleratorError"
    assert "device-side assert triggered" in error["evalue"]
    assert f"Replay stopped at cell [{failed.execution_count}]" in replay.stream
    assert "Blocking mode is off" not in replay.stream  # our restart switched it on


def test_a_cpu_index_error_is_shown_at_its_true_line_after_the_replay(server, server_kernel):
    kid, pid = server_kernel
    failed = _fail_then_restart(server, kid, pid, FAIL_INDEX)
    _, replay = _load_then_replay(server, kid)
    assert _markers(replay.stream) == ["data", "mutate", "fail"]
    (error,) = replay.errors
    assert error["ename"] == "IndexError"
    assert error["evalue"] == "index out of range in self"
    cell_frame = next(ANSI.sub("", f) for f in error["traceback"] if "emb(ids)" in ANSI.sub("", f))
    assert re.search(r"----> 5 out = emb\(ids\)", cell_frame)
    # Labelled as the replayed cell, not as the cell that ran `%cudaguard replay --yes`.
    assert f"Cell In[{failed.execution_count}], line 5" in cell_frame, cell_frame


def test_the_button_on_the_banner_runs_the_replay(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        button = loaded.button(REPLAY_LABEL)
        clicked = sock.collect(sock.click(button), timeout=90, reply=False, cell=loaded)
    # The click's output goes to the real outputs of the cell that showed the offer.
    assert _markers(clicked.stream) == ["data", "mutate", "fail"]
    assert [e["ename"] for e in clicked.errors] == ["AcceleratorError"]
    assert "Replay stopped at cell" in clicked.widget_text


def test_the_button_replays_cells_that_await_on_the_kernels_loop(server, server_kernel):
    # The click runs in ipykernel's event loop, as `%cudaguard replay` does: a cell with a
    # top-level ``await`` runs on that loop, and awaits a task an earlier replayed cell started.
    kid, pid = server_kernel
    cells = (
        "import asyncio\nprint('RAN:start')\n"
        "async def double(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\n"
        "task = asyncio.ensure_future(double(21))",
        "print('RAN:await')\nanswer = await task",
    )
    failing = (
        f"print('RAN:fail', answer)\nimport torch\nraise torch.AcceleratorError({ASSERT_2_9!r})"
    )
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard").status == "ok"
        for cell in cells:
            assert sock.execute(cell).status == "ok", cell
        assert sock.execute(failing, timeout=60).status == "error"
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        clicked = sock.collect(
            sock.click(loaded.button(REPLAY_LABEL)), timeout=90, reply=False, cell=loaded
        )
    assert _markers(clicked.stream) == ["start", "await", "fail"], clicked.stream
    assert "RAN:fail 42" in clicked.stream
    assert [e["ename"] for e in clicked.errors] == ["AcceleratorError"]


def test_what_the_namespace_has_is_not_rebuilt(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    _, replay = _load_then_replay(server, kid, RESTORED)
    assert _markers(replay.stream) == ["fail"]


def test_another_kernel_has_nothing_to_replay(server, server_kernel):
    kid, pid = server_kernel
    with server.new_kernel() as (other, _):
        _fail_then_restart(server, kid, pid, FAIL_ASSERT)
        with server.connect(other) as sock:
            sock.execute("%load_ext nb_cudaguard")
            out = sock.execute("%cudaguard replay")
        assert "nothing to replay" in out.stream + str(out.errors)


def test_after_a_restart_from_the_kernel_menu_there_is_nothing_to_replay(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        sock.execute(DATA)
        sock.execute(MUTATE)
        assert sock.execute(FAIL_INDEX).status == "error"
    server.restart_kernel(kid)  # the frontend's restart: we saved nothing
    wait_for_new_process(server, kid, pid)
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        out = sock.execute("%cudaguard replay")
    assert not any("Replay to cell" in d.get("text/plain", "") for d in loaded.displays)
    assert "nothing to replay: no cells were saved for this kernel" in out.stream


def _restart_and_wait(server, kid, command):
    with server.connect(kid) as sock:
        pid = int(sock.execute("import os; print(os.getpid())", silent=True).stream.split()[0])
        sock.execute(command)
    wait_for_new_process(server, kid, pid)


def test_a_plain_restart_offers_the_blocking_one_which_keeps_the_cells(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT, restart="%cudaguard restart --no-blocking")
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
    offered = " ".join(d["text/plain"] for d in loaded.displays)
    assert "Replay to cell" in offered
    assert "Blocking mode is off in this kernel" in offered
    assert "`%cudaguard restart`" in offered
    _restart_and_wait(server, kid, "%cudaguard restart")  # blocking, before any replay
    _, replay = _load_then_replay(server, kid)
    assert _markers(replay.stream) == ["data", "mutate", "fail"]
    assert "Blocking mode is off" not in replay.stream


def test_a_kernel_restarted_after_a_replay_can_replay_again(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    _, first = _load_then_replay(server, kid)
    assert _markers(first.stream) == ["data", "mutate", "fail"]
    _restart_and_wait(server, kid, "%cudaguard restart")
    _, again = _load_then_replay(server, kid)
    assert _markers(again.stream) == ["data", "mutate", "fail"], again.stream + str(again.errors)
    assert [e["ename"] for e in again.errors] == ["AcceleratorError"]


def test_one_click_after_a_restore_runs_the_new_shorter_plan(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
        button = loaded.button(REPLAY_LABEL)
        sock.execute(RESTORED)
        clicked = sock.collect(sock.click(button), timeout=90, reply=False, cell=loaded)
    assert _markers(clicked.stream) == ["fail"]  # data and mutate are there already
    assert "with fewer cells to run again. Running it." in clicked.widget_text
    assert "Replay stopped at cell" in clicked.widget_text
    assert "traceback is above" not in clicked.widget_text + clicked.stream


def test_a_click_after_the_plan_grew_shows_it_and_runs_it_on_the_next_click(server, server_kernel):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    with server.connect(kid) as sock:
        # Before the offer (shown at the first cell of the user's): its plan runs the failing
        # cell only; silent, as a frontend's own code runs.
        sock.execute(RESTORED, silent=True)
        loaded = sock.execute("%load_ext nb_cudaguard")
        button = loaded.button(REPLAY_LABEL)
        sock.execute("del data")  # now data must be built again: cells not in the plan shown
        first = sock.collect(sock.click(button), timeout=30, reply=False, cell=loaded)
        second = sock.collect(sock.click(button), timeout=90, reply=False, cell=loaded)
    assert _markers(first.stream) == []
    assert "runs cells the old one did not. Click again to run it." in first.widget_text
    assert _markers(second.stream) == ["data", "mutate", "fail"]


# A model, an optimizer built from its parameters, a step through the optimizer's name only: the
# replay must rebuild the model and step it again, or the failing cell sees other weights.
TRAINING = (
    "import torch\ntorch.manual_seed(0)\nprint('RAN:seed')",
    "model = torch.nn.Linear(2, 1)\nprint('RAN:model')",
    "opt = torch.optim.SGD(model.parameters(), lr=1.0)\nprint('RAN:opt')",
    "model(torch.ones(1, 2)).sum().backward()\nprint('RAN:backward')",
    "unused = 5\nprint('RAN:unused')",
    "opt.step()\nprint('RAN:step')",
)
FAIL_WITH_WEIGHTS = (
    "print('RAN:fail')\nprint('WEIGHTS', [round(w, 6) for w in model.weight.flatten().tolist()])"
    f"\nraise torch.AcceleratorError({ASSERT_2_9!r})"
)


def _weights(text: str) -> str:
    return re.findall(r"WEIGHTS (\[.*\])", text)[-1]


def test_replay_rebuilds_the_model_and_steps_it_again_through_the_optimizer(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard").status == "ok"
        for cell in TRAINING:
            assert sock.execute(cell, timeout=60).status == "ok"
        failed = sock.execute(FAIL_WITH_WEIGHTS, timeout=60)
        assert failed.status == "error"
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    loaded, replay = _load_then_replay(server, kid)
    offered = " ".join(d["text/plain"] for d in loaded.displays)
    # opt.step() changed model's weights when it ran (its record), not opt's own state (SGD
    # without momentum keeps none)
    assert re.search(r"opt\.step\(\) \.\.\.   <- changes model\b", offered), offered
    assert _markers(replay.stream) == ["seed", "model", "opt", "backward", "step", "fail"]
    assert _weights(replay.stream) == _weights(failed.stream)  # the same step, replayed
    assert [e["ename"] for e in replay.errors] == ["AcceleratorError"]


def test_without_blocking_mode_a_button_restarts_in_it_and_the_replay_is_offered_there(
    server, server_kernel
):
    kid, pid = server_kernel
    _fail_then_restart(server, kid, pid, FAIL_ASSERT, restart="%cudaguard restart --no-blocking")
    with server.connect(kid) as sock:
        pid = int(sock.execute("import os; print(os.getpid())", silent=True).stream.split()[0])
        loaded = sock.execute("%load_ext nb_cudaguard")
        buttons = {c["data"]["state"].get("description"): c["comm_id"] for c in loaded.comm_opens()}
        assert REPLAY_LABEL in buttons  # replaying here, without blocking mode, stays possible
        sock.click(buttons[BLOCKING_REPLAY_LABEL])
        said = ""
        deadline = time.monotonic() + 20
        while "the replay again" not in said and time.monotonic() < deadline:
            message = json.loads(sock.ws.recv())
            if message["msg_type"] == "comm_msg":
                said += message["content"]["data"].get("state", {}).get("value", "")
    assert "Restarting" in said and "offers the replay again" in said
    _, blocking = wait_for_new_process(server, kid, pid)
    assert blocking == "1"
    loaded, replay = _load_then_replay(server, kid)
    shown = " ".join(d["text/plain"] for d in loaded.displays)
    assert "blocking mode is on" in shown
    assert "Replay to cell" in shown
    assert BLOCKING_REPLAY_LABEL not in [
        c["data"]["state"].get("description") for c in loaded.comm_opens()
    ]
    assert _markers(replay.stream) == ["data", "mutate", "fail"]
    assert [e["ename"] for e in replay.errors] == ["AcceleratorError"]
    assert "Blocking mode is off" not in replay.stream


# --- issue 22: the state a replay leaves ---

SETUP_BOTH = (
    "import torch\nprint('RAN:setup')\nlabels = torch.tensor([0, 1, 3])\nx = torch.ones(3, 2)"
)
FAIL_ON_LABEL_3 = (
    "print('RAN:fail')\nprint('LABELS', labels.tolist(), tuple(x.shape))\n"
    f"if int(labels.max()) >= 3:\n    raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def _run_restart(server, kid, pid, cells: tuple[str, ...], failing: str) -> Reply:
    """In the old process: ``cells``, then ``failing`` (which must fail), then our restart."""
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard").status == "ok"
        for cell in cells:
            assert sock.execute(cell, timeout=60).status == "ok", cell
        failed = sock.execute(failing, timeout=60)
        assert failed.status == "error"
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    return failed


def test_a_replay_leaves_a_restored_and_fixed_name_as_it_is(server, server_kernel):
    # Only labels is restored, and fixed; x is missing, so the cell that made both runs again:
    # it must not make labels again (the fix would be lost and the error come back).
    kid, pid = server_kernel
    _run_restart(server, kid, pid, (SETUP_BOTH,), FAIL_ON_LABEL_3)
    _, replay = _load_then_replay(
        server, kid, "%cudaguard restore labels", "labels[2] = 2", "print('NOW', labels.tolist())"
    )
    assert _markers(replay.stream) == ["setup", "fail"]
    assert "LABELS [0, 1, 2] (3, 2)" in replay.stream, replay.stream
    assert "the labels here is put back after it" in " ".join(
        d["text/plain"] for d in replay.displays
    )
    assert replay.status == "ok"  # the fix holds: the failing cell runs through


HISTORY_AND_LABELS = (
    "import torch\nprint('RAN:imports')",
    "history = []\nprint('RAN:history')",
    "labels = torch.tensor([1, 2, 4])\nprint('RAN:labels')",
)
FAIL_CHANGING = (
    "print('RAN:fail')\nhistory.append(len(history))\nlabels -= 1\n"
    "print('STATE', history, labels.tolist())\n"
    f"if int(labels.max()) >= 3:\n    raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def test_a_replay_does_not_apply_the_failing_cells_changes_twice_to_what_was_restored(
    server, server_kernel
):
    kid, pid = server_kernel
    failed = _run_restart(server, kid, pid, HISTORY_AND_LABELS, FAIL_CHANGING)
    state = re.findall(r"STATE .*", failed.stream)[0]
    assert state == "STATE [0] [0, 1, 3]"
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        restored = sock.execute("%cudaguard restore")
        assert "Restored" in restored.stream, restored.stream
        planned = sock.execute("%cudaguard replay")
        replay = sock.execute("%cudaguard replay --yes", timeout=90)
        after = sock.execute("print('AFTER', history, labels.tolist())")
    plan = " ".join(d["text/plain"] for d in planned.displays)
    assert "defines history again (the one restored has the failing cell's change already)" in plan
    assert "defines labels again (the one restored has the failing cell's change already)" in plan
    assert re.findall(r"STATE .*", replay.stream) == [state]  # as before the failure, then once
    assert "AFTER [0] [0, 1, 3]" in after.stream  # as the failure left it, not changed twice
    assert replay.status == "error"


def test_replay_yes_fails_its_cell_when_the_failing_cell_fails_again(server, server_kernel):
    kid, pid = server_kernel
    failed = _fail_then_restart(server, kid, pid, FAIL_ASSERT)
    _, replay = _load_then_replay(server, kid)
    assert replay.status == "error"  # so Run All stops here
    assert [e["ename"] for e in replay.errors] == ["AcceleratorError"]
    assert f"UsageError: Replay stopped at cell [{failed.execution_count}]" in replay.stream


HELPERS = """\
import torch


class _Trainer:
    def fit(self, net):
        with torch.no_grad():
            net.weight.add_(1.0)


trainer = _Trainer()
"""


def test_a_replay_follows_a_trainer_imported_from_a_module_beside_the_notebook(
    server, server_kernel
):
    kid, pid = server_kernel
    (server.root / "nbcg_helpers.py").write_text(HELPERS)
    cells = (
        "import torch\ntorch.manual_seed(0)\nprint('RAN:seed')",
        "model = torch.nn.Linear(2, 1)\nprint('RAN:model')",
        "from nbcg_helpers import trainer\nprint('RAN:import')",
        "unused = 5\nprint('RAN:unused')",
        "trainer.fit(model)\nprint('RAN:fit')",
    )
    failed = _run_restart(server, kid, pid, cells, FAIL_WITH_WEIGHTS)
    _, replay = _load_then_replay(server, kid)
    assert _markers(replay.stream) == ["seed", "model", "import", "fit", "fail"]
    assert _weights(replay.stream) == _weights(failed.stream)


CONSENT = (
    "import os, shutil\nprint('RAN:data')\ndata = [0, 1, 2]\n"
    "os.makedirs('scratch', exist_ok=True)\nshutil.rmtree('scratch')",
    "!echo hello\n%pip --version\nprint('RAN:shell')\ndata.append(3)",
    "import time\ntime.sleep(1.2)\nwith open('out.txt', 'w') as f:\n    f.write(str(data))\n"
    "data.append(4)\nprint('RAN:write')",
)
FAIL_ON_DATA = (
    "print('RAN:fail')\nimport torch\nif len(data) == 5:\n"
    f"    raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def test_the_plan_shows_each_cells_whole_code_and_flags_what_it_does_beyond_python(
    server, server_kernel
):
    kid, pid = server_kernel
    _run_restart(server, kid, pid, CONSENT, FAIL_ON_DATA)
    with server.connect(kid) as sock:
        loaded = sock.execute("%load_ext nb_cudaguard")
    (text,) = [d["text/plain"] for d in loaded.displays if "Replay to cell" in d["text/plain"]]
    (page,) = [d["text/html"] for d in loaded.displays if "Replay to cell" in d["text/plain"]]
    for line in (*CONSENT[0].splitlines(), "!echo hello", "    f.write(str(data))"):
        assert f"      | {line}" in text  # the whole code, not its first line
    assert "! writes or deletes files (os.makedirs, shutil.rmtree)" in text
    assert "! installs packages (%pip --version; not run again)" in text
    assert "! runs shell commands (!echo hello)" in text
    assert "! writes or deletes files (open(..., 'w'))" in text
    took = re.search(r"They took (\d+\.\d) s before", text)  # the time.sleep(1.2), recorded
    assert took is not None and float(took.group(1)) >= 1.2, text
    assert "Look before running" in text
    assert page.count("<details>") == 4 and "shutil.rmtree(&#x27;scratch&#x27;)" in page


# Forms the text alone misses; the record of what each cell did when it ran catches them.
RECORDED = (
    "print('RAN:setup')\nimport torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.5)",
    "print('RAN:trainer')\nclass Trainer:\n    def __init__(self, m, o):\n"
    "        self.m, self.o = m, o\n"
    "    def train(self):\n        for _ in range(3):\n            self.o.zero_grad()\n"
    "            self.m(torch.ones(8, 4)).pow(2).sum().backward()\n            self.o.step()\n"
    "        return 'trained'\ntrainer = Trainer(model, opt)",
    "print('RAN:train')\nresults = [trainer.train() for _ in range(2)]",
    "print('RAN:noisy')\ndef noisy():\n    return torch.randn(7)",
    "print('RAN:peek')\npeek = noisy()",
    "print('RAN:grad')\ntorch.set_grad_enabled(False)",
)
RECORDED_FAIL = (
    "print('RAN:fail')\nweights = model.weight.sum().item()\ndraw = torch.rand(3).tolist()\n"
    "grad_on = torch.is_grad_enabled()\n"
    "print('STATE', json.dumps([weights, draw, grad_on]))\n"
    f"raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def test_replay_from_what_the_cells_did_reaches_the_state_before_the_failure(server, server_kernel):
    kid, pid = server_kernel
    with server.connect(kid) as sock:
        assert sock.execute("%load_ext nb_cudaguard\nimport json").status == "ok"
        for cell in RECORDED:
            assert sock.execute(cell).status == "ok"
        failed = sock.execute(RECORDED_FAIL, timeout=60)
        assert failed.status == "error"
        sock.execute("%cudaguard restart")
    wait_for_new_process(server, kid, pid)
    _, replay = _load_then_replay(server, kid, "import json")
    before = re.findall(r"STATE (.*)", failed.stream)
    after = re.findall(r"STATE (.*)", replay.stream)
    assert before and after and json.loads(after[-1]) == json.loads(before[-1])
    # The training calls inside a comprehension and the grad-mode setting ran again; the peek
    # through a notebook function did not, and the failing cell drew what it drew (its random
    # state restored).
    plan = " ".join(d["text/plain"] for d in replay.displays)
    assert _markers(replay.stream) == ["setup", "trainer", "train", "grad", "fail"], plan


def test_a_clicked_replay_stays_in_the_saved_reopened_and_converted_notebook(tmp_path):
    """The replayed traceback at the true line, the panel and the outcome are real outputs of the
    cell that showed the offer: the file the server writes holds them, and nbconvert shows them."""
    server = JupyterServer(tmp_path, extra_args=installed_extensions())
    try:
        with server.new_kernel() as (kid, pid):
            failed = _fail_then_restart(server, kid, pid, FAIL_ASSERT)
            with server.connect(kid) as sock:
                loaded = sock.execute("%load_ext nb_cudaguard")
                button = loaded.button(REPLAY_LABEL)
                clicked = sock.collect(sock.click(button), timeout=90, reply=False, cell=loaded)
        outputs = outputs_of(loaded.messages + clicked.messages, loaded)
        saved = save_notebook(server, "replayed.ipynb", [("%load_ext nb_cudaguard", outputs)])
        status, reopened = server.request("GET", "/api/contents/replayed.ipynb")
        converted = nbconvert(server, "replayed.ipynb")
    finally:
        server.stop()
    assert status == 200
    # What a reopened notebook shows: the server reads the file back (strings joined).
    kept = reopened["content"]["cells"][0]["outputs"]
    assert len(kept) == len(saved["cells"][0]["outputs"])
    (error,) = [o for o in kept if o["output_type"] == "error"]
    frames = ANSI.sub("", "\n".join(error["traceback"]))
    assert error["ename"] == "AcceleratorError"
    assert "----> 4     raise torch.AcceleratorError" in frames, frames  # the true line
    assert f"Cell In[{failed.execution_count}], line 4" in frames, frames
    texts = [o["data"]["text/plain"] for o in kept if o["output_type"] == "display_data"]
    panel = [t for t in texts if "A GPU kernel hit a device-side assert" in t]
    assert panel, "\n=====\n".join(texts)  # the panel of the replayed failure, as its text
    assert all("text/plain" in o["data"] for o in kept if "data" in o)
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in kept)
    streams = "".join(o["text"] for o in kept if o["output_type"] == "stream")
    assert _markers(streams) == ["data", "mutate", "fail"]
    assert f"Replay stopped at cell [{failed.execution_count}]" in streams
    assert "raise torch.AcceleratorError" in ANSI.sub("", converted)
    assert f"Replay stopped at cell [{failed.execution_count}]" in converted
    assert "A GPU kernel hit a device-side assert" in converted


CLASS_CELLS = (
    "import torch, threading\nprint('RAN:imports')",
    # tok holds a lock, so it is not kept: the cell runs again, and makes it of the kept Tok
    "class Tok:\n    def __init__(self, n):\n        self.n = n\n"
    "tok = Tok(3)\ntok.lock = threading.Lock()\nprint('RAN:tok')",
    "toks = [Tok(i) for i in range(3)]\nprint('RAN:toks')",
)
FAIL_CLASS = (
    "print('RAN:fail')\n"
    "print('SAME', type(tok) is Tok, all(type(t) is Tok for t in toks), isinstance(tok, Tok))\n"
    f"raise torch.AcceleratorError({ASSERT_2_9!r})"
)


def test_a_replayed_class_cell_leaves_one_class_for_restored_and_rebuilt_instances(
    server, server_kernel
):
    kid, pid = server_kernel
    failed = _run_restart(server, kid, pid, CLASS_CELLS, FAIL_CLASS)
    assert "SAME True True True" in failed.stream
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        restored = sock.execute("%cudaguard restore")
        assert "`Tok`, `toks`" in restored.stream and "`tok`" not in restored.stream
        planned = sock.execute("%cudaguard replay")
        replay = sock.execute("%cudaguard replay --yes", timeout=90)
        after = sock.execute("print('AFTER', type(tok) is Tok, all(type(t) is Tok for t in toks))")
        names = sock.execute("print(sorted(dir()))")
    plan = " ".join(d["text/plain"] for d in planned.displays)
    assert "the Tok here stays from the cell's class/def on" in plan, plan
    assert _markers(replay.stream) == ["tok", "fail"]
    assert "SAME True True True" in replay.stream, replay.stream
    assert "AFTER True True" in after.stream
    assert "'toks'" in names.stream and "_nb_cudaguard_kept" not in names.stream


def test_a_restored_value_the_user_fixed_after_the_restore_stays_theirs(server, server_kernel):
    kid, pid = server_kernel
    failed = _run_restart(server, kid, pid, HISTORY_AND_LABELS, FAIL_CHANGING)
    assert re.findall(r"STATE .*", failed.stream) == ["STATE [0] [0, 1, 3]"]
    with server.connect(kid) as sock:
        sock.execute("%load_ext nb_cudaguard")
        assert "Restored" in sock.execute("%cudaguard restore").stream
        sock.execute("labels[2] = 2")  # the user's fix, in place, on the restored tensor
        planned = sock.execute("%cudaguard replay")
        replay = sock.execute("%cudaguard replay --yes", timeout=90)
        after = sock.execute("print('AFTER', history, labels.tolist())")
    plan = " ".join(d["text/plain"] for d in planned.displays)
    assert (
        "kept as you changed them after the restore: labels (though the one restored has the "
        "failing cell's change already)" in plan
    ), plan
    assert "defines history again" in plan  # not changed by the user: built again as before
    assert _markers(replay.stream) == ["history", "fail"]  # labels' cell is not run again
    assert re.findall(r"STATE .*", replay.stream) == ["STATE [0] [-1, 0, 1]"]
    assert "AFTER [0] [-1, 0, 1]" in after.stream
