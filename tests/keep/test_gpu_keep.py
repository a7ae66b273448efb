"""On a real GPU: GPU memory is never read by the keep, snapshots are, and a model trained on
CUDA comes back after a real device-side assert and a restart, and trains on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nb_cudaguard.keep import store
from nb_cudaguard.keep.snapshot import Snapshots

pytestmark = pytest.mark.gpu


@pytest.fixture
def profile(tmp_path: Path) -> tuple[str, str]:
    connection = tmp_path / "kernel-gpu.json"
    connection.write_text("{}")
    return str(tmp_path / "profile"), str(connection)


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = model.cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randn(8, 16, device="cuda")
        torch.nn.functional.cross_entropy(
            model(x), torch.randint(0, 4, (8,), device="cuda")
        ).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_cuda_objects_are_listed_not_read_and_cpu_ones_kept(profile):
    model, optimizer = trained()
    namespace = {
        "model": model,
        "optimizer": optimizer,
        "gpu": torch.ones(3, device="cuda"),
        "cpu": torch.ones(3),
        "mixed": {"a": torch.ones(2, device="cuda")},
    }
    manifest = store.save(namespace, *profile)
    reasons = {s.name: s.reason for s in manifest.skipped}
    assert set(reasons) == {"model", "optimizer", "gpu", "mixed"}
    assert all(r.startswith("holds GPU memory (a tensor on cuda:0") for r in reasons.values())
    assert [k.name for k in manifest.kept] == ["cpu"]


def test_a_snapshot_brings_the_model_and_optimizer_back_on_the_cpu_and_training_resumes(profile):
    model, optimizer = trained()
    namespace = {"model": model, "optimizer": optimizer}
    snapshots = Snapshots()
    snapshots.add("model", model)
    snapshots.add("optimizer", optimizer)
    snapshots.after_cell(namespace, 5)
    torch.cuda.synchronize()
    expected = {k: v.cpu() for k, v in model.state_dict().items()}
    substitutes, notes, missing = snapshots.for_keep()
    assert missing == {} and notes["model"] == "snapshot after cell [5]"
    manifest = store.save(
        namespace, *profile, store.SaveOptions(substitutes=substitutes, notes=notes)
    )
    assert {k.name: k.kind for k in manifest.kept} == {"model": "snapshot", "optimizer": "snapshot"}
    fresh: dict[str, object] = {}
    store.restore(fresh, *profile)
    back, opt = fresh["model"], fresh["optimizer"]
    for name, value in back.state_dict().items():
        assert value.device.type == "cpu" and torch.equal(value, expected[name])
    assert all(
        p is q for p, q in zip(opt.param_groups[0]["params"], back.parameters(), strict=True)
    )
    back.to("cuda")
    opt.load_state_dict(opt.state_dict())  # moves the optimizer's state to its parameters' device
    x = torch.randn(8, 16, device="cuda")
    torch.nn.functional.cross_entropy(back(x), torch.randint(0, 4, (8,), device="cuda")).backward()
    opt.step()
    assert all(s["exp_avg"].device.type == "cuda" for s in opt.state.values())


def test_only_changed_tensors_are_copied_on_cuda():
    model, _ = trained()
    namespace = {"model": model}
    snapshots = Snapshots()
    snapshots.add("model", model)
    for cell in (1, 2):
        snapshots.after_cell(namespace, cell)
        torch.cuda.synchronize()
    snapshots.after_cell(namespace, 3)
    assert snapshots.last_bytes == 0


STEPS = """
import torch, torch.nn.functional as F
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = model.cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
def step(labels):
    x = torch.randn(8, 16, device="cuda")
    loss = F.cross_entropy(model(x), labels.cuda())
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    return loss.item()
"""
SAVE_GOOD = """
import json
json.dump({{k: v.cpu().tolist() for k, v in model.state_dict().items()}}, open({path!r}, "w"))
"""
COMPARE = """
import json, torch
good = json.load(open({path!r}))
print(all(torch.equal(v, torch.tensor(good[k])) for k, v in model.state_dict().items()))
"""
RESUME = """
model.to("cuda")
optimizer.load_state_dict(optimizer.state_dict())
print(step(torch.randint(0, 4, (8,))))
"""


@pytest.mark.parametrize("restart", ["--no-blocking", ""], ids=["plain", "blocking"])
def test_a_model_trained_on_cuda_survives_a_real_assert_and_training_resumes(tmp_path, restart):
    # blocking (the default): the restore and the training after it run with blocking launches
    pytest.importorskip("websocket")
    from jupyter_harness import JupyterServer, wait_for_new_process

    saved = str(tmp_path / "good.json")
    server = JupyterServer(tmp_path / "server")
    try:
        kid = server.start_kernel()
        pid, _ = wait_for_new_process(server, kid, -1)
        sock = server.connect(kid)
        try:
            setup = STEPS + "\n%load_ext nb_cudaguard\n%cudaguard keep model optimizer"
            assert sock.execute(setup, timeout=120).status == "ok"
            assert sock.execute("step(torch.randint(0, 4, (8,)))").status == "ok"
            assert sock.execute(SAVE_GOOD.format(path=saved)).status == "ok"
            bad = sock.execute("step(torch.full((8,), 7))")  # labels >= 4: a device-side assert
            assert bad.status == "error"
            assert "poisoned" in sock.execute("%cudaguard status").stream
            said = sock.execute(f"%cudaguard restart {restart}").stream
            assert "Kept" in said and "`model`" not in said.split("Not kept:")[-1]
        finally:
            sock.close()
        _, blocking = wait_for_new_process(server, kid, pid, timeout=60)
        assert blocking == (None if restart else "1")
        sock = server.connect(kid)
        try:
            offer = sock.execute("%load_ext nb_cudaguard")
            assert "snapshot after cell" in "\n".join(
                d.get("text/plain", "") for d in offer.displays
            )
            restored = sock.execute("%cudaguard restore", timeout=120)
            assert restored.status == "ok" and "model.to('cuda')" in restored.stream
            assert sock.execute(COMPARE.format(path=saved)).stream.strip() == "True"
            resume = sock.execute(RESUME, timeout=120)
            assert resume.status == "ok", resume.messages
            assert float(resume.stream.strip()) > 0
        finally:
            sock.close()
    finally:
        server.stop()
