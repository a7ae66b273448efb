"""The extension in a real IPython shell: load, unload, reload, coexistence, failure safety."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, terminal_ipython
from IPython.utils.capture import capture_output
from pytorch_texts import ASSERT_2_0 as ASSERT
from pytorch_texts import RAISE_ASSERT

import nb_cudaguard
from nb_cudaguard.notebook import extension


def panels(captured) -> list[dict[str, str]]:
    return [o.data for o in captured.outputs if "nb-cudaguard-panel" in o.data.get("text/html", "")]


def our_callbacks(shell) -> list[object]:
    return [
        cb
        for cb in shell.events.callbacks["post_run_cell"]
        if getattr(cb, "__self__", None).__class__ is extension.CudaGuardExtension
    ]


def test_load_registers_one_post_run_cell_hook(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    assert len(our_callbacks(shell)) == 1


def test_loading_twice_keeps_one_hook(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    nb_cudaguard.load_ipython_extension(shell)
    assert len(our_callbacks(shell)) == 1


def test_loading_twice_keeps_the_magics_and_their_state(shell):
    # IPython ignores a second registration of the same bound method, so the hook count alone
    # cannot tell; the magics can: a second load must not replace them with fresh ones.
    pytest.importorskip("torch")
    shell.run_line_magic("load_ext", "nb_cudaguard")
    try:
        shell.run_line_magic("cudacheck", "on")
        nb_cudaguard.load_ipython_extension(shell)
        with capture_output() as captured:
            shell.run_line_magic("cudacheck", "status")
        assert "cudacheck: on" in captured.stdout
    finally:
        shell.run_line_magic("cudacheck", "off")


def test_unload_removes_exactly_our_hook_and_magic(shell):
    def other(result):
        return None

    shell.events.register("post_run_cell", other)
    try:
        shell.run_line_magic("load_ext", "nb_cudaguard")
        assert "cudaguard" in shell.magics_manager.magics["line"]
        shell.run_line_magic("unload_ext", "nb_cudaguard")
        assert our_callbacks(shell) == []
        assert other in shell.events.callbacks["post_run_cell"]
        assert "cudaguard" not in shell.magics_manager.magics["line"]
    finally:
        shell.events.unregister("post_run_cell", other)


def test_reload_leaves_one_working_hook(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    shell.run_line_magic("reload_ext", "nb_cudaguard")
    assert len(our_callbacks(shell)) == 1
    with capture_output() as captured:
        shell.run_cell(RAISE_ASSERT)
    assert len(panels(captured)) == 1


def test_sticky_error_keeps_the_cell_failed_and_shows_one_panel(shell):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with capture_output() as captured:
        result = shell.run_cell(RAISE_ASSERT)
    assert not result.success
    assert isinstance(result.error_in_exec, torch.AcceleratorError)
    assert "AcceleratorError" in captured.stdout + captured.stderr  # IPython's own traceback
    (panel,) = panels(captured)
    headline = panel["text/plain"].splitlines()[1]
    assert headline.startswith("nb_cudaguard: ") and "only a kernel restart fixes it" in headline


@pytest.mark.parametrize(
    "code",
    [
        "1/0",
        "raise IndexError('Target 3 is out of bounds.')",
        "import torch\nraise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')",
        "import torch\nraise RuntimeError('CUDA error: invalid device ordinal')",
    ],
    ids=["ZeroDivisionError", "IndexError", "OutOfMemoryError", "invalid-device-ordinal"],
)
def test_non_sticky_and_non_cuda_errors_get_no_panel(shell, code):
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with capture_output() as captured:
        result = shell.run_cell(code)
    assert not result.success
    assert captured.outputs == []
    assert "nb_cudaguard" not in captured.stdout + captured.stderr


def test_another_custom_exc_handler_keeps_working_while_loaded_and_after_unload(shell):
    seen: list[str] = []

    def colab_like(self, etype, value, tb, tb_offset=None):
        seen.append(str(value))
        return ["handled by the other extension"]

    shell.set_custom_exc((ImportError,), colab_like)
    handler_before, types_before = shell.CustomTB, shell.custom_exceptions
    try:
        shell.run_line_magic("load_ext", "nb_cudaguard")
        with capture_output():
            shell.run_cell("raise ImportError('one')")
        shell.run_line_magic("unload_ext", "nb_cudaguard")
        with capture_output():
            shell.run_cell("raise ImportError('two')")
        assert seen == ["one", "two"]
        assert (shell.CustomTB, shell.custom_exceptions) == (handler_before, types_before)
    finally:
        shell.set_custom_exc((), None)


def test_sticky_error_handled_by_another_custom_exc_handler_still_gets_a_panel(shell):
    def other(self, etype, value, tb, tb_offset=None):
        return ["other extension's traceback"]

    shell.set_custom_exc((RuntimeError,), other)
    try:
        shell.run_line_magic("load_ext", "nb_cudaguard")
        with capture_output() as captured:
            shell.run_cell(RAISE_ASSERT)
        assert len(panels(captured)) == 1
    finally:
        shell.set_custom_exc((), None)


def test_our_own_failure_is_one_line_and_the_traceback_stays(shell, monkeypatch):
    shell.run_line_magic("load_ext", "nb_cudaguard")

    def broken(*args, **kwargs):
        raise KeyError("boom")

    # Fault injection: the guard rail around our analysis is what is under test.
    monkeypatch.setattr(extension, "explain", broken)
    with capture_output() as captured:
        result = shell.run_cell(RAISE_ASSERT)
    assert not result.success
    ours = [line for line in captured.stderr.splitlines() if "nb_cudaguard" in line]
    assert ours == [
        "nb_cudaguard: could not analyse this error (KeyError: 'boom'); "
        "the traceback above is complete."
    ]
    assert "AcceleratorError" in captured.stdout + captured.stderr
    assert "Error in callback" not in captured.stdout + captured.stderr


def _simulate_poisoned_context(monkeypatch) -> None:
    """Make torch.cuda behave as after a sticky error: initialised, and every call re-raises."""

    class PoisonedStream:
        def query(self) -> bool:
            raise torch.AcceleratorError(ASSERT)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: PoisonedStream())


def test_probe_reports_poisoned_context(monkeypatch):
    _simulate_poisoned_context(monkeypatch)
    assert nb_cudaguard.probe_context() is nb_cudaguard.ContextState.POISONED


def test_probe_without_cuda_initialised_reports_no_cuda():
    assert not torch.cuda.is_initialized()
    assert nb_cudaguard.probe_context() is nb_cudaguard.ContextState.NO_CUDA


def test_later_failure_in_a_poisoned_context_is_reported_as_fallout(shell, monkeypatch):
    _simulate_poisoned_context(monkeypatch)
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with capture_output() as first:
        shell.run_cell(RAISE_ASSERT, store_history=True)
    first_cell = shell.execution_count - 1
    with capture_output() as second:
        shell.run_cell(RAISE_ASSERT, store_history=True)
    assert len(panels(first)) == 1
    assert "The probe found this kernel's CUDA context broken" in panels(first)[0]["text/plain"]
    assert panels(second) == []
    (note,) = [o.data["text/plain"] for o in second.outputs]
    assert f"fallout of the CUDA error in cell [{first_cell}]" in note
    # an agent reading only this cell gets the verdict line first
    assert note.startswith(
        "nb_cudaguard: CUDA context POISONED, restart required; cause=unknown-assert; "
        "run: %cudaguard restart\n"
    )


def test_follow_on_library_error_in_poisoned_context_is_fallout(shell, monkeypatch):
    _simulate_poisoned_context(monkeypatch)
    shell.run_line_magic("load_ext", "nb_cudaguard")
    with capture_output():
        shell.run_cell(RAISE_ASSERT, store_history=True)
    first_cell = shell.execution_count - 1
    with capture_output() as second:
        shell.run_cell(
            "raise RuntimeError('CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling "
            "`cublasCreate(handle)`')",
            store_history=True,
        )
    assert [o.data["text/plain"].splitlines()[1].split(".")[0] for o in second.outputs] == [
        f"nb_cudaguard: fallout of the CUDA error in cell [{first_cell}]"
    ]


def test_terminal_ipython_prints_the_text_panel_after_the_traceback():
    script = (
        "%load_ext nb_cudaguard\n"
        + "import torch\n"
        + (f"raise torch.AcceleratorError({ASSERT!r})\n")
        + "exit\n"
    )
    proc = terminal_ipython(script)
    out = proc.stdout
    assert "AcceleratorError" in out
    assert "nb_cudaguard: A GPU kernel hit a device-side assert" in out
    assert out.index("AcceleratorError") < out.index("nb_cudaguard: A GPU kernel")


def test_loads_without_torch_and_stays_silent_until_a_cuda_error():
    blocker = "import sys; sys.modules['torch'] = None"  # `import torch` now raises ImportError
    script = textwrap.dedent(
        """\
        %load_ext nb_cudaguard
        1/0
        raise RuntimeError('CUDA error: device-side assert triggered')
        exit
        """
    )
    proc = terminal_ipython(script, blocker)
    out = proc.stdout + proc.stderr
    assert "ZeroDivisionError" in out
    # nothing of ours before the CUDA error's panel: its verdict line, then its headline
    assert out.count("nb_cudaguard:") == 2
    assert out.index("nb_cudaguard:") == out.index("nb_cudaguard: CUDA context POISONED")
    assert "nb_cudaguard: A GPU kernel hit a device-side assert" in out
    assert "could not analyse" not in out


def test_a_process_without_fd_2_runs_its_cells_and_says_so_at_most_once():
    # Some launchers close fd 2; the extension must not break cells or repeat itself.
    pre = "import os, sys; sys.stderr = sys.stdout; os.close(2)"
    # The lowest free descriptor is reused: IPython 7.34 opens a file that lands on fd 2, and
    # then there is an fd 2 to capture. The message must come exactly when there is none.
    probe = "import os\ntry:\n    os.fstat(2)\nexcept OSError:\n    print('fd 2 is closed')\n\n"
    script = probe + "%load_ext nb_cudaguard\nx = 1\ny = x + 1\nprint('y =', y)\nexit\n"
    proc = terminal_ipython(script, pre)
    assert "y = 2" in proc.stdout
    closed = "fd 2 is closed" in proc.stdout
    assert proc.stdout.count("nb_cudaguard: not capturing device output") == int(closed)
    assert "Error in callback" not in proc.stdout


def test_cudacheck_without_torch_is_a_usage_error_not_a_traceback():
    blocker = "import sys; sys.modules['torch'] = None"  # `import torch` now raises ImportError
    proc = terminal_ipython(
        "%load_ext nb_cudaguard\n%cudacheck on\n%cudacheck status\nexit\n", blocker
    )
    out = proc.stdout + proc.stderr
    assert "UsageError: %cudacheck needs PyTorch, which cannot be imported" in out
    assert "cudacheck: off" in out
    assert "Traceback" not in out


def test_a_restart_in_terminal_ipython_with_ipykernel_imported_is_refused_and_it_lives_on():
    # ipywidgets 7.7 (Colab's) imports ipykernel in terminal IPython too (its widget.py imports
    # ipykernel.comm).
    pre = "import ipykernel.kernelapp, ipykernel.comm"
    script = textwrap.dedent(
        """\
        %load_ext nb_cudaguard
        %cudaguard restart --no-blocking
        %cudaguard restart
        import nb_cudaguard, time
        try:
            nb_cudaguard.restart_kernel(blocking=False)
        except nb_cudaguard.RestartError as error:
            print('refused:', error)
        time.sleep(1.5)
        print('still', 'alive')
        exit
        """
    )
    proc = terminal_ipython(script, pre)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "still alive" in out
    assert out.count("UsageError: cannot restart: this is not a Jupyter kernel") == 2
    assert "refused: this is not a Jupyter kernel" in out


# After each cell: fd 2 is the original or our held pipe, and either way still reaches the
# terminal; unloading gives the original back (GIVEN_BACK).
FD2_WATCH = textwrap.dedent(
    """\
    import os, sys
    original = os.fstat(2).st_ino
    %load_ext nb_cudaguard
    held, ip = set(), get_ipython()
    ip.events.register('post_run_cell', lambda r: held.add(os.fstat(2).st_ino))
    """
)
GIVEN_BACK = textwrap.dedent(
    """\
    os.write(2, b'fd 2 reaches the terminal\\n')
    %unload_ext nb_cudaguard
    print('given back:', os.fstat(2).st_ino == original, len(held - {original}) <= 1)
    """
)


def test_ctrl_c_during_our_analysis_escapes_nothing_and_fd2_is_given_back():
    # A KeyboardInterrupt raised exactly when our hook starts its analysis, as Ctrl-C would.
    script = (
        FD2_WATCH
        + textwrap.dedent(
            f"""\
        def interrupt(frame, event, arg):
            code = frame.f_code
            if event == 'call' and code.co_name == 'recognise' and 'cudaguard' in code.co_filename:
                sys.settrace(None)
                raise KeyboardInterrupt
        import torch
        sys.settrace(interrupt); raise torch.AcceleratorError({ASSERT!r})
        raise torch.AcceleratorError({ASSERT!r})
        """
        )
        + GIVEN_BACK
        + "exit\n"
    )
    proc = terminal_ipython(script)
    out = proc.stdout + proc.stderr
    assert "Error in callback" not in out
    assert "nb_cudaguard: could not analyse this error (KeyboardInterrupt" in out
    assert "fd 2 reaches the terminal" in proc.stderr
    assert "given back: True True" in out
    assert "nb_cudaguard: A GPU kernel hit a device-side assert" in out  # the next error: a panel


def test_a_post_run_cell_without_a_result_escapes_nothing_and_fd2_is_given_back():
    # IPython 7.34 fires post_run_cell from a `finally`, with None, after its pre_run_cell.
    script = (
        FD2_WATCH
        + textwrap.dedent(
            """\
        ip.events.trigger('pre_run_cell', None); ip.events.trigger('post_run_cell', None)
        print('then')
        """
        )
        + GIVEN_BACK
        + "exit\n"
    )
    proc = terminal_ipython(script)
    out = proc.stdout + proc.stderr
    assert "Error in callback" not in out
    assert "then" in proc.stdout
    assert "fd 2 reaches the terminal" in proc.stderr
    assert "given back: True True" in out


def test_a_restart_in_an_in_process_kernel_is_refused_and_its_host_lives_on():
    # An in-process kernel has a kernel object but no process of its own to restart.
    code = textwrap.dedent(
        """\
        from ipykernel.inprocess.manager import InProcessKernelManager
        from IPython.core.error import UsageError
        import time, nb_cudaguard
        manager = InProcessKernelManager()
        manager.start_kernel()
        shell = manager.kernel.shell
        nb_cudaguard.load_ipython_extension(shell)
        try:
            shell.run_line_magic("cudaguard", "restart --no-blocking")
        except UsageError as error:
            print("refused:", error)
        time.sleep(1.5)
        print("host alive")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: cannot restart: this is not a Jupyter kernel" in proc.stdout
    assert "host alive" in proc.stdout


def test_the_extension_owns_every_hook_the_snapshots_included(shell):
    # `%cudaguard keep` takes its snapshots through the extension's own post_run_cell: IPython
    # sees one hook of ours, and unload leaves none behind.
    shell.run_line_magic("load_ext", "nb_cudaguard")
    ours = [
        cb
        for cb in shell.events.callbacks["post_run_cell"]
        if "nb_cudaguard" in getattr(cb, "__module__", "")
    ]
    shell.run_cell("import torch\nweights = torch.zeros(3)")
    with capture_output():
        shell.run_line_magic("cudaguard", "keep weights")
    after = [
        cb
        for cb in shell.events.callbacks["post_run_cell"]
        if "nb_cudaguard" in getattr(cb, "__module__", "")
    ]
    assert after == ours and len(ours) == 1
    shell.run_cell("weights += 1")
    with capture_output() as captured:
        shell.run_line_magic("cudaguard", "keep")
    assert "weights" in captured.stdout
    shell.run_line_magic("unload_ext", "nb_cudaguard")
    assert not [
        cb
        for cb in shell.events.callbacks["post_run_cell"]
        if "nb_cudaguard" in getattr(cb, "__module__", "")
    ]
