"""pytest plugin: name the test that poisoned the CUDA context, and stop the cascade after it.

Off unless ``--cudaguard`` is given: without it the plugin only declares its option and ini
setting, so pytest behaves as if it were absent. With it:

- after a test fails with a sticky CUDA error (or fails and a probe finds the context poisoned),
  its report carries a section naming it as the test that poisoned this process's context, with
  the diagnosis;
- later tests of that process that need CUDA (marked with one of ``cudaguard_markers``, default
  ``gpu`` and ``cuda``) fail at once with one line pointing there, without running; any other
  test that still fails with a CUDA error gets that one line instead of its traceback;
- under pytest-xdist the worker exits right after reporting, so xdist replaces it with a fresh
  process and a fresh context (what cuML's plugin does, cuml#7954);
- ``--cudaguard=strict`` also runs each test under ``nb_cudaguard.guard()``, so a bad input
  fails the test before its kernel can launch; ``--cudaguard=deferred`` under
  ``guard(mode="deferred")``: no synchronisation per checked call, the test fails before its next
  ``optimizer.step()``, at an ``.item()``, or as its body ends.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .diagnosis.model import Diagnosis

MODES = ("report", "strict", "deferred")
SECTION = "nb_cudaguard: this test poisoned the CUDA context"
_FAST_FAIL = "_nb_cudaguard_fast_failed"
NOT_RUN = "nb_cudaguard: not run:"
FALLOUT = "nb_cudaguard: fallout:"


def _mode(value: str) -> str:
    if value not in MODES:
        # `pytest --cudaguard tests/` would take the path as the mode: say how to write it.
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a mode ({', '.join(MODES)}); write --cudaguard=MODE, or put "
            "--cudaguard after the paths"
        )
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nb_cudaguard", "CUDA context poisoning (nb_cudaguard)")
    group.addoption(
        "--cudaguard",
        nargs="?",
        const="report",
        default=None,
        type=_mode,
        metavar="MODE",
        help="name the test that poisoned the CUDA context and fail later CUDA tests fast; "
        "=strict or =deferred also runs each test under nb_cudaguard.guard().",
    )
    parser.addini(
        "cudaguard_markers",
        type="args",
        default=["gpu", "cuda"],
        help="markers of tests that need CUDA: after a poisoning they fail without running",
    )


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("cudaguard", default=None)
    if mode is None:
        return
    if mode != "report":
        config.pluginmanager.register(GuardEachTest(_guard_factory(mode)), "nb_cudaguard-guard")
    config.pluginmanager.register(PoisonWatch(config), "nb_cudaguard-watch")


def _guard_factory(mode: str) -> Any:
    try:
        from .input_guard.scope import guard
    except ImportError as error:
        raise pytest.UsageError(f"--cudaguard={mode} needs torch ({error})") from None
    return lambda namespace: guard(mode=mode, namespace=namespace)


class GuardEachTest:
    """Runs every test body under the input guard; names the test module bound to torch's ops
    at import (``from torch import gather``) are checked too."""

    def __init__(self, make_guard: Any) -> None:
        self.make_guard = make_guard

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, None]:
        module = getattr(item, "module", None)
        with self.make_guard(vars(module) if module is not None else {}):
            yield


class PoisonWatch:
    """One process's view: which test broke its CUDA context, and what failed since."""

    def __init__(self, config: pytest.Config) -> None:
        self.markers = tuple(config.getini("cudaguard_markers"))
        self.worker = _xdist_worker(config)
        self.poisoned_by: str | None = None
        self.cascade: list[str] = []  # tests that failed because of it (any process)
        self.poisoners: dict[str, str] = {}  # nodeid -> one-line diagnosis (any process)

    def pointer(self, ran: bool) -> str:
        lead = FALLOUT if ran else NOT_RUN
        return (
            f"{lead} the CUDA context of this process was poisoned by {self.poisoned_by}; "
            "see its report."
        )

    def needs_cuda(self, item: pytest.Item) -> bool:
        return any(item.get_closest_marker(name) is not None for name in self.markers)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        if self.poisoned_by is not None and self.needs_cuda(item):
            setattr(item, _FAST_FAIL, True)
            pytest.fail(self.pointer(ran=False), pytrace=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        if call.excinfo is None or not report.failed or getattr(item, _FAST_FAIL, False):
            return
        from .diagnosis.engine import diagnose  # only once a test failed: pytest starts as fast

        error = call.excinfo.value
        try:
            diagnosis = diagnose(error, namespace={})  # evidence from the test's own frames
        except Exception:  # a diagnosis is a bonus: never cost the user their report
            diagnosis = None
        if self.poisoned_by is not None:
            if diagnosis is not None:  # the cascade: one line instead of the same traceback
                report.longrepr = self.pointer(ran=True)
            return
        poisoned = self._poisoned(diagnosis)
        if poisoned is None:
            return
        self.poisoned_by = item.nodeid
        report.sections.append((SECTION, _section_text(item.nodeid, poisoned)))

    @staticmethod
    def _poisoned(diagnosis: Diagnosis | None) -> Diagnosis | None:
        """The diagnosis when the context is (most likely) broken: a sticky error the probe
        does not contradict, or a probe that finds it broken after any failure."""
        from dataclasses import replace

        from .diagnosis.model import ContextState, Diagnosis
        from .runtime.probe import probe_context

        context = probe_context()
        if diagnosis is not None and diagnosis.sticky and context is not ContextState.HEALTHY:
            return replace(diagnosis, context=context)
        if context is ContextState.POISONED:
            return Diagnosis(
                cause=diagnosis.cause if diagnosis else "other-sticky",
                sticky=True,
                title="The CUDA context was found broken after this test failed",
                explanation="A probe after this test's failure found the context poisoned.",
                context=context,
            )
        return None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Reports from every process pass here (xdist's controller sees its workers'), so the
        # summary is built from them rather than from this process's state.
        for name, content in report.sections:
            if name == SECTION:
                self.poisoners[report.nodeid] = content.splitlines()[0]
        longrepr = str(report.longrepr) if report.failed else ""
        if NOT_RUN in longrepr or longrepr.startswith(FALLOUT):
            self.cascade.append(report.nodeid)
        if (
            self.worker is not None
            and report.failed
            and report.nodeid == self.poisoned_by
            and any(name == SECTION for name, _ in report.sections)
        ):
            # xdist's own hook has sent the report by now (trylast): end this worker so xdist
            # starts a fresh one; its teardown would only meet the broken context again.
            sys.stderr.flush()
            os._exit(1)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.poisoners:
            return
        terminalreporter.section("nb_cudaguard")
        for nodeid, line in self.poisoners.items():
            terminalreporter.line(f"{nodeid} poisoned the CUDA context: {line}")
        if self.cascade:
            terminalreporter.line(
                f"{len(self.cascade)} later CUDA test(s) failed because of it: "
                + ", ".join(self.cascade)
            )
        if self.worker is None:
            terminalreporter.line(
                "Fix the first one; the others may pass once it does (with pytest-xdist, "
                "a poisoned worker is replaced by a fresh process)."
            )


def _xdist_worker(config: pytest.Config) -> str | None:
    """This process's pytest-xdist worker id, or None. xdist gives its workers
    ``config.workerinput``; the PYTEST_XDIST_WORKER variable is no proof, since every process a
    worker starts inherits it (a test that runs pytest or a script in a subprocess)."""
    workerinput = getattr(config, "workerinput", None)
    return None if workerinput is None else str(workerinput.get("workerid"))


def _section_text(nodeid: str, diagnosis: Diagnosis) -> str:
    import shlex

    from .diagnosis.advice import script
    from .diagnosis.render import to_text

    # A test process, not a kernel: the advice is to run this test again in blocking mode.
    setting = script(f"python -m pytest {shlex.quote(nodeid)}", probed=True)
    return (
        f"{diagnosis.cause}: {diagnosis.title}\n"
        f"{nodeid} broke the CUDA context of this process: later CUDA tests here fail with a "
        "pointer to this report.\n" + to_text(diagnosis, setting=setting)
    )
