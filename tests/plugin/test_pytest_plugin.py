"""The pytest plugin, driven by pytester: off without --cudaguard, and with it the poisoning test
is named, the cascade after it is cut short, and an xdist worker is replaced."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
from pytorch_texts import ASSERT_2_9, H100_TORCH_2_11

pytest_plugins = ["pytester"]

LOSS_LINE = H100_TORCH_2_11["cross-entropy-label"][0]

SUITE = textwrap.dedent(
    f"""
    import pytest
    import torch

    ASSERT = {ASSERT_2_9!r}
    DEVICE_LINE = {LOSS_LINE!r}

    def test_a_poisoner():
        labels = torch.tensor([0, 1, 3])
        model = torch.nn.Linear(4, 3)
        raise torch.AcceleratorError(ASSERT + DEVICE_LINE)

    @pytest.mark.gpu
    def test_b_marked_gpu():
        pass  # would pass: it must not even run after the poisoning

    def test_c_cuda_error_afterwards():
        raise torch.AcceleratorError(ASSERT)

    def test_d_cpu_only():
        assert sum([1, 2]) == 3
    """
)
INI = "[pytest]\nmarkers =\n    gpu: needs a GPU\n"


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(INI)
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_without_the_flag_pytest_behaves_as_without_the_plugin(suite: pytest.Pytester):
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    absent = suite.runpytest("-p", "no:cacheprovider", "-p", "no:nb_cudaguard")

    def body(run: pytest.RunResult) -> list[str]:
        # Only the header's list of installed plugins and the timing may differ.
        return [
            line.split(" in ")[0]
            for line in run.stdout.lines
            if not line.startswith(("plugins:", "rootdir:"))
        ]

    assert body(result) == body(absent)
    assert not any("nb_cudaguard" in line for line in body(result))


def test_the_poisoning_test_is_named_with_its_diagnosis(suite: pytest.Pytester):
    result = suite.runpytest("--cudaguard", "-p", "no:cacheprovider")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=3)
    assert "nb_cudaguard: this test poisoned the CUDA context" in out
    assert "label-out-of-range: A class label is outside 0..num_classes-1" in out
    # evidence read from the failing test's own frame
    assert "`labels` contains 3 but the classifier `model` has 3 outputs" in out
    result.stdout.fnmatch_lines(
        ["*= nb_cudaguard =*", "test_suite.py::test_a_poisoner poisoned the CUDA context*"]
    )


def test_the_report_advises_running_the_test_again_not_restarting_a_kernel(
    suite: pytest.Pytester,
):
    out = suite.runpytest("--cudaguard", "-p", "no:cacheprovider").stdout.str()
    assert "`CUDA_LAUNCH_BLOCKING=1 python -m pytest test_suite.py::test_a_poisoner ...`" in out
    assert "the button below" not in out and "kernel restart" not in out


def test_later_cuda_tests_fail_fast_with_one_line_pointing_there(suite: pytest.Pytester):
    result = suite.runpytest("--cudaguard", "-p", "no:cacheprovider")
    out = result.stdout.str()
    pointer = "the CUDA context of this process was poisoned by test_suite.py::test_a_poisoner"
    result.stdout.fnmatch_lines(
        [
            "*_ test_b_marked_gpu _*",
            f"nb_cudaguard: not run: {pointer}; see its report.",
            "*_ test_c_cuda_error_afterwards _*",
            f"nb_cudaguard: fallout: {pointer}; see its report.",
        ]
    )
    # The cascade does not repeat the traceback: the error text appears for the poisoner only.
    assert out.count("raise torch.AcceleratorError(ASSERT)") == 0
    assert "2 later CUDA test(s) failed because of it" in out
    assert "test_d_cpu_only PASSED" in suite.runpytest("--cudaguard", "-v").stdout.str()


def test_a_path_after_the_bare_flag_gets_a_clear_usage_error(suite: pytest.Pytester):
    result = suite.runpytest("--cudaguard", "test_suite.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "write --cudaguard=MODE" in result.stderr.str()


def test_strict_runs_each_test_under_the_guard(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_guarded=textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F

            def test_bad_label():
                F.cross_entropy(torch.randn(2, 3), torch.tensor([0, 3]))
            """
        )
    )
    plain = pytester.runpytest("-p", "no:cacheprovider")
    plain.stdout.fnmatch_lines(["*IndexError: Target 3 is out of bounds*"])
    strict = pytester.runpytest("--cudaguard=strict", "-p", "no:cacheprovider")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines(["*GuardIndexError*"])


def test_a_name_the_test_module_bound_to_a_torch_op_is_checked(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_early=textwrap.dedent(
            """
            import torch
            from torch import gather

            def test_bad_index():
                gather(torch.randn(2, 3), 1, torch.tensor([[3], [0]]))

            def test_put_back_after_the_test():
                assert gather is torch.gather
            """
        )
    )
    strict = pytester.runpytest("--cudaguard=strict", "-p", "no:cacheprovider")
    strict.assert_outcomes(failed=1, passed=1)
    strict.stdout.fnmatch_lines(["*GuardError: torch.gather: index out of range*"])


@pytest.mark.usefixtures("device_path")  # pytester runs in this process
def test_deferred_fails_the_test_before_its_optimizer_step(pytester: pytest.Pytester):
    pytester.makepyfile(
        test_guarded=textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F

            def test_bad_label():
                model = torch.nn.Linear(4, 3)
                before = model.weight.detach().clone()
                opt = torch.optim.SGD(model.parameters(), lr=1.0)
                F.cross_entropy(model(torch.randn(2, 4)), torch.tensor([0, 3])).backward()
                try:
                    opt.step()
                finally:
                    assert torch.equal(model.weight, before)

            def test_bad_id_without_a_step():
                F.embedding(torch.tensor([5]), torch.randn(4, 2))

            def test_good():
                F.cross_entropy(torch.randn(2, 3), torch.tensor([0, -100])).item()
            """
        )
    )
    result = pytester.runpytest("--cudaguard=deferred", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(["*GuardIndexError*"])
    assert "No optimizer step has run" in result.stdout.str()


@pytest.mark.skipif(
    importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed"
)
def test_under_xdist_the_poisoned_worker_is_replaced(suite: pytest.Pytester):
    result = suite.runpytest_subprocess(
        "--cudaguard", "-n", "1", "-p", "no:cacheprovider", "-v", timeout=240
    )
    out = result.stdout.str() + result.stderr.str()
    assert "nb_cudaguard: this test poisoned the CUDA context" in out
    assert "replacing crashed worker gw0" in out
    # The fresh worker's context is clean: the marked GPU test runs, and passes.
    result.stdout.fnmatch_lines(["*PASSED test_suite.py::test_b_marked_gpu*"])
    result.stdout.fnmatch_lines(["*= nb_cudaguard =*", "*test_a_poisoner poisoned the CUDA*"])


def test_a_pytest_started_from_an_xdist_worker_is_not_a_worker(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    # Every process a worker starts inherits PYTEST_XDIST_WORKER (seen on a GPU machine running
    # this suite with -n 8): such an inner pytest must report, not end itself as a worker would.
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    result = suite.runpytest_subprocess("--cudaguard", "-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*= nb_cudaguard =*", "*test_a_poisoner poisoned the CUDA*"])


GPU_SUITE = textwrap.dedent(
    """
    import pytest
    import torch
    import torch.nn.functional as F

    @pytest.mark.gpu
    def test_a_real_device_side_assert():
        logits = torch.randn(4, 3, device="cuda")
        labels = torch.tensor([0, 1, 2, 3], device="cuda")
        print(F.cross_entropy(logits, labels).item())

    @pytest.mark.gpu
    def test_b_needs_the_gpu():
        assert torch.ones(2, device="cuda").sum().item() == 2
    """
)


@pytest.mark.gpu
def test_on_a_gpu_the_real_assert_is_named_and_the_next_gpu_test_does_not_run(
    pytester: pytest.Pytester,
):
    pytester.makeini(INI)
    pytester.makepyfile(test_gpu_suite=GPU_SUITE)
    # A subprocess: the assert breaks the context of the process it runs in.
    result = pytester.runpytest_subprocess("--cudaguard", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*nb_cudaguard: this test poisoned the CUDA context*",
            "nb_cudaguard: not run: the CUDA context of this process was poisoned by "
            "test_gpu_suite.py::test_a_real_device_side_assert; see its report.",
        ]
    )


@pytest.mark.parametrize("mode", ["strict", "deferred"])
def test_torch_behaves_as_bare_inside_and_after_each_guarded_test(
    pytester: pytest.Pytester, mode: str
):
    pytester.makepyfile(
        test_bare_torch=textwrap.dedent(
            """
            import torch

            def scalars():
                return [torch.tensor(1.5), torch.nn.Parameter(torch.tensor(2.5))]

            def test_inside():
                assert torch.tensor(scalars()).tolist() == [1.5, 2.5]

            def test_after():
                assert torch.tensor(scalars()).tolist() == [1.5, 2.5]
            """
        )
    )
    result = pytester.runpytest(f"--cudaguard={mode}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
