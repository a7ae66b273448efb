"""What keep and restore say: the restart's sentence, the offer, the restore's message."""

from __future__ import annotations

from nb_cudaguard.keep.store import Kept, Manifest, NotKept, Restored, Skipped
from nb_cudaguard.keep.text import kept_sentence, not_kept_text, offer_text, restored_text

GPU_REASON = (
    "holds GPU memory (a tensor on cuda:0, shape [4, 3]): GPU memory is never read here "
    "(after a CUDA error it cannot be); `%cudaguard keep NAME` keeps a CPU snapshot of it "
    "after each cell"
)


def manifest(**changes) -> Manifest:
    base = {
        "kernel": "/run/kernel-1.json",
        "created": 1000.0,
        "kept": (
            Kept("np", "module", 0, None, "module", "numpy"),
            Kept("ids", "torch.Tensor int64 [50000, 512]", 204_800_000, "v1.bin"),
        ),
        "skipped": (
            Skipped("model", "torch.nn.Linear", GPU_REASON),
            Skipped("log", "_io.TextIOWrapper", "an open file or stream: open it again"),
        ),
        "ipython_names": 12,
        "total": 204_800_400,
    }
    return Manifest(**{**base, **changes})


def test_the_restart_says_how_much_was_kept_and_what_not_in_short():
    text = kept_sentence(manifest())
    assert text.startswith("Kept 2 variables (204.8 MB) for the new kernel:")
    assert "`model` (holds GPU memory (a tensor on cuda:0, shape [4, 3])" in text
    assert "never read here" not in text  # the offer gives the long reason
    assert text.endswith("Then re-run the cells that made what was not kept.")


def test_nothing_to_say_when_the_namespace_was_empty():
    assert kept_sentence(manifest(kept=(), skipped=())) == ""
    assert kept_sentence(manifest(skipped=())).endswith("offers to restore them.")


def test_the_offer_lists_names_types_sizes_and_reasons():
    lines = offer_text(manifest(), now=1008.0).splitlines()
    assert lines[0] == (
        "nb_cudaguard: the previous process of this kernel kept 2 variables (204.8 MB) 8 s ago:"
    )
    assert lines[1].split() == ["np", "module,", "imported", "again"]
    assert lines[2].split()[:2] == ["ids", "torch.Tensor"] and lines[2].endswith("204.8 MB")
    assert lines[3] == "Not kept:"
    assert lines[4].split()[0] == "model" and "GPU memory is never read" in lines[4]
    assert "IPython's own names" in lines[6]
    assert "`%cudaguard restore`" in lines[-1]


def test_a_restored_snapshot_says_how_to_move_it_back():
    done = Restored(
        (
            Kept(
                "model", "torch.nn.Linear", 10, "g0.bin", "snapshot", note="snapshot after cell [3]"
            ),
            Kept(
                "opt", "torch.optim.Adam", 10, "g0.bin", "snapshot", note="snapshot after cell [3]"
            ),
        ),
        (("x", "ModuleNotFoundError: No module named 'gone'"),),
        (Kept("y", "int", 28, "v2.bin"),),
    )
    text = restored_text(done, 0.25)
    assert text.startswith("Restored `model`, `opt` (20 B) in 0.2 s.")
    assert "`model.to('cuda')` moves it back to the GPU" in text
    assert "`opt.load_state_dict(opt.state_dict())` moves its state to them" in text
    assert "`x` could not be restored: ModuleNotFoundError" in text
    assert text.endswith("Still kept: `y` (`%cudaguard restore NAME`).")


def test_a_restore_says_what_came_along_and_what_was_left_with_what_shares_with_it():
    model = Kept("model", "torch.nn.Linear", 10, "v1.bin")
    opt = Kept("opt", "torch.optim.Adam", 30, "v1.bin")
    labels = Kept("labels", "list, 3 items", 5, "v2.bin")
    done = Restored(
        (opt, model),
        (),
        (labels,),
        along=(model,),
        skipped=(labels,),
        held=(("mask", ("labels",)), ("weights", ("labels",))),
        read=32,
    )
    text = restored_text(done, 0.1)
    assert text.startswith("Restored `opt`, `model` (32 B) in 0.1 s.")
    assert "`model` came too: they share state" in text
    assert "Left as you made them in this kernel: `labels` (`%cudaguard restore --force" in text
    assert (
        "Not restored either: `mask`, `weights`, which share state with `labels` and come back "
        "only with it (with `--force`, all together)."
    ) in text


def test_a_second_restore_says_what_was_restored_already():
    alpha, beta = Kept("alpha", "int", 28, "v1.bin"), Kept("beta", "int", 28, "v2.bin")
    done = Restored((), (), (), already=(alpha, beta), restored_at=1000.0)
    text = restored_text(done, 0.0, now=1130.0)
    assert text == "`alpha`, `beta` were already restored 2 min ago. Nothing else is kept."


def test_a_name_not_kept_is_answered_with_what_was():
    error = NotKept(["nonexistent"], ["alpha", "beta"], ["gamma"])
    assert not_kept_text(error) == (
        "not kept: nonexistent. Kept: alpha, beta (`%cudaguard restore NAME ...`). "
        "Already restored: gamma."
    )


def test_the_offer_says_which_names_come_back_together():
    kept = (
        Kept("model", "torch.nn.Linear", 10, "v1.bin"),
        Kept("opt", "torch.optim.Adam", 30, "v1.bin"),
        Kept("labels", "list, 3 items", 5, "v3.bin"),
    )
    text = offer_text(manifest(kept=kept), now=1008.0)
    assert "Restored together (they share objects or memory): model, opt." in text


def test_a_restore_says_which_names_came_back_without_their_autograd_graph():
    loss = Kept("loss", "Tensor", 64, "v1.bin", graph=True)
    model = Kept("model", "Linear", 640, "v2.bin")
    text = restored_text(Restored((loss, model), (), ()), 0.1)
    assert (
        "`loss` held tensors autograd computed: they came back as leaves, without the graph"
    ) in text
    assert "`model` held" not in text
