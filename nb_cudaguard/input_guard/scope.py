"""The guard: check the inputs of assert-prone torch calls before their kernels launch.

While a guard is active (in any thread), the checked ops' entry points are replaced by thin
wrappers: the ``torch.nn.functional`` and ``torch`` functions and the ``torch.Tensor`` methods
(``x[idx]`` and ``x[idx] = v`` included) that ``ops.py`` names, and nothing else, so every other
torch call costs exactly what it costs bare. The first guard to start installs them, the last to
end puts torch's own objects back (``entries.py``). A wrapper called in a thread that is in no
guard, or from inside a checked call (the ``nll_loss`` inside ``cross_entropy``, the indexing
inside a check), calls the bare op at once.

References taken before the guard started: modules look their functions up at each call
(``nn.CrossEntropyLoss`` calls ``F.cross_entropy``), and the functional losses, embeddings and
``ctc_loss`` are also wrapped at the op they call inside (``torch._C._nn.cross_entropy_loss``,
``torch.embedding``...). Names bound to a checked op in the namespace the guard is given
(``from torch import gather``, ``take = torch.Tensor.take``: the notebook's namespace for
``%%cudacheck``, the caller's globals for ``guard()``, the test module's for the pytest plugin)
name its wrapper while the guard is active and torch's op again after it. Not seen: such a
reference in a function's local variables, or inside a container. Code compiled by TorchScript
or ``torch.compile`` is not checked: both compile torch's own op where they meet its wrapper
(``__prepare_scriptable__``, ``_torchdynamo_inline``), so a compiled model runs as compiled,
without a graph break, and the guard says once that compiled regions are not checked. A
``TorchFunctionMode`` would see every reference, but it is called for every torch call of a
step (~360), at about 1.1 us each: more than the guard's whole budget.

A wrapper of a module's function (``wrappers._ModuleOp``) pickles and copies as that function,
so objects built inside a guard can be saved, copied and sent to a spawned worker after it.

Whatever is installed leaves torch as it was, inside the block and after it: the C slots that
setting ``Tensor.__getitem__`` fills (``type_slots.py``), and torch's tables of its own
functions built meanwhile (``torch_caches.py``).

Two modes. ``strict`` reads each checked call's verdict back at once (on a GPU, one host
synchronisation per checked call) and raises before the kernel launches. ``deferred`` never
synchronises for a check: each check leaves a tiny summary on the device, the call itself runs
with its offending values replaced by valid ones (clamped indices, so no kernel can fault; the
output is garbage only where an input was bad), and the summaries are read together at the next
point where it is cheap or necessary: before any ``optimizer.step()`` (a global step pre-hook,
so weights are never updated from a bad batch), at a ``.item()``/``.tolist()`` the user's code
synchronises on anyway, and when the block ends. The first violation is then raised with the
same message as in strict mode.

On host memory there is nothing to defer: in both modes a violation is raised at the call, where
PyTorch's CPU op raises its own error (code that catches it behaves as without the guard), and
the message quotes that error. Where the CPU op rejects every value the CUDA kernel asserts on
(``ops.CPU_CHECKS``), draws no random number and the tensors are below ``HOST_FIRST_LINE``
elements, the call runs first and the rules only run when it raises (``judge.TRUST_HOST_OPS``).

This module ties the parts together: the wrappers (``wrappers.py``) and where they go
(``entries.py``), a call's verdict (``judge.py``), the deferred mode (``deferral.py``,
``step_hook.py``), the error (``report.py``), each thread's guards (``state.py``).

Module import needs torch: ``nb_cudaguard`` imports this lazily.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch

from . import step_hook
from .deferral import flush
from .entries import _Entries, _plan
from .ops import NAMES, entry_points
from .state import _STATE, _TRACED, GuardConfig
from .wrappers import make_wrapper

MODES = ("strict", "deferred")


def parse_names(names: Iterable[str] | str | None) -> frozenset[str] | None:
    """'loss,embedding' or ['loss'] -> frozenset; unknown names raise ValueError."""
    if names is None:
        return None
    if isinstance(names, str):
        names = [n for n in names.replace(",", " ").split() if n]
    chosen = frozenset(n.strip() for n in names)
    unknown = sorted(chosen - NAMES)
    if unknown:
        raise ValueError(
            f"unknown check(s) {', '.join(unknown)}; choose from: {', '.join(sorted(NAMES))}"
        )
    return chosen


_SYNC_POINTS = ("item", "tolist")
# The checked ops, while any guard is active; .item()/.tolist(), while a deferred one is (only
# it leaves verdicts to read there; an optimizer calls .item() once per parameter).
_ENTRIES = _Entries(lambda: _plan(entry_points()), make_wrapper)
# installed only while _ENTRIES is, whose own start and end keep torch's tables
_SYNC_ENTRIES = _Entries(
    lambda: [(torch.Tensor, attr, None) for attr in _SYNC_POINTS], make_wrapper, False
)


def _deferred_on() -> None:
    """A deferred guard's own: the optimizer's step hook and the ``.item()`` wrappers."""
    step_hook.hook_on()
    try:
        _SYNC_ENTRIES.acquire()
    except BaseException:
        step_hook.hook_off()
        raise


def _deferred_off() -> None:
    try:
        step_hook.hook_off()
    finally:
        _SYNC_ENTRIES.release()


# --- the public context manager ---------------------------------------------------------------
class Guard:
    """``with guard():`` checks every assert-prone call in the block; nested guards are safe.

    The outermost guard (of any thread) installs the wrappers over the checked ops' entry points,
    the last one to end removes them; an inner guard narrows or widens the selection of checks
    (and the mode) until it ends. All of it is undone in ``__exit__``, on exceptions and on
    KeyboardInterrupt alike, and for a guard inside a generator left open, when the generator is
    closed or collected.
    """

    def __init__(
        self, config: GuardConfig, sync: bool = False, namespace: dict[str, Any] | None = None
    ) -> None:
        self.config = config
        self.sync = sync
        self.namespace = namespace  # where early references to torch's ops are seen too
        self._entered = False
        self._configs: list[GuardConfig] = []
        self._thread = 0
        self._renamed: list[tuple[str, Any, Any]] = []  # (name, torch's op, our wrapper)

    def __enter__(self) -> Guard:
        if self._entered:
            raise RuntimeError("this guard is already active; create a new one with guard()")
        _ENTRIES.acquire()
        try:
            if self.config.deferred:
                _deferred_on()
        except BaseException:
            _ENTRIES.release()
            raise
        if self.namespace is not None:
            self._renamed = _ENTRIES.bind_early(self.namespace)
        # the list itself: a generator's guard may be closed from another thread
        self._configs = _STATE.configs
        self._thread = threading.get_ident()
        self._configs.append(self.config)
        self._entered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        __tracebackhide__ = True
        if not self._entered:
            return
        self._entered = False
        configs = self._configs
        here = self._thread == threading.get_ident()
        try:
            if self.sync and exc_type is None:
                _synchronize()
            # The block's deferred verdicts are read as it ends: after another error too (a bad
            # input is the likelier cause of what followed), but not on Ctrl-C or an exit.
            if not here:
                pass  # closed from another thread (a collected generator): not its verdicts
            elif exc_type is None or issubclass(exc_type, Exception):
                # a strict guard inside a deferred one leaves the outer one's verdicts to it
                if self.config.deferred or not any(
                    c.deferred for c in configs if c is not self.config
                ):
                    flush()
            else:
                _STATE.pending.clear()
        finally:
            # by identity, not the top: guards in generators end out of order
            for index in range(len(configs) - 1, -1, -1):
                if configs[index] is self.config:
                    del configs[index]
                    break
            if not configs and here:
                _STATE.pending.clear()
            if self.namespace is not None:
                _unbind_early(self.namespace, self._renamed)
                self._renamed = []
                if not configs and here:  # the last guard of this thread: no wrapper stays
                    _ENTRIES.unbind_all(self.namespace)
            _note_unchecked()
            try:
                if self.config.deferred:
                    _deferred_off()
            finally:
                _ENTRIES.release()


_NOTED: set[str] = set()


def _note_unchecked() -> None:
    _note_traced()
    _note_compiled_regions()


def _note_traced() -> None:
    """Once per process where torch.jit.trace recorded a checked op inside a guard."""
    if not _TRACED:
        return
    _TRACED.clear()
    if "traced" not in _NOTED:
        _NOTED.add("traced")
        print(
            "nb_cudaguard: torch.jit.trace ran checked ops unchecked (a trace records them as "
            "torch runs them); its example inputs were not checked, and the traced function "
            "runs unchecked.",
            file=sys.stderr,
        )


def _note_compiled_regions() -> None:
    """Once per process where torch.compile has compiled something: its regions run unchecked."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if "compiled" in _NOTED or not isinstance(counters, dict):
        return
    if counters.get("stats", {}).get("unique_graphs", 0):
        _NOTED.add("compiled")
        print(
            "nb_cudaguard: code compiled by torch.compile is not checked by the guard (it runs "
            "torch's ops as compiled); to check its inputs, run it uncompiled once.",
            file=sys.stderr,
        )


def _unbind_early(namespace: dict[str, Any], renamed: list[tuple[str, Any, Any]]) -> None:
    """Each name back to torch's own op, where it still names our wrapper (one the user bound
    to something else meanwhile is theirs)."""
    for name, op, wrapper in renamed:
        if namespace.get(name) is wrapper:
            namespace[name] = op


def _synchronize() -> None:
    """Surface an asynchronous CUDA error of this block here, not in a later cell."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def guard(
    only: Iterable[str] | str | None = None,
    skip: Iterable[str] | str | None = None,
    sync: bool = False,
    mode: str = "strict",
    namespace: dict[str, Any] | None = None,
) -> Guard:
    """Check the inputs of assert-prone torch calls in a ``with`` block before they run.

    ``mode="strict"`` (default): each checked call's verdict is read at once, and a bad input
    raises before its kernel launches (on a GPU: one synchronisation per checked call).
    ``mode="deferred"``: no synchronisation per call; the call runs on clamped (safe) values and
    the first violation is raised before the next ``optimizer.step()``, at the next ``.item()``
    or ``.tolist()``, or when the block ends, whichever comes first (tensors in host memory:
    at the bad call, as PyTorch's CPU op raises there).

    ``only``/``skip``: op names (``"cross_entropy"``, ``"getitem"``) or families (``"loss"``,
    ``"embedding"``, ``"sampling"``, ``"gather_scatter"``, ``"index"``, ``"one_hot"``,
    ``"repeat_interleave"``, ``"unpool"``). ``sync``: synchronise CUDA when the block ends
    without an error, so an asynchronous error from an unchecked op is reported there.
    A bad input raises :class:`nb_cudaguard.GuardError` before its kernel runs.

    ``namespace``: where names bound to torch's ops before the block (``from torch import
    gather``) are checked too, and put back as the block ends; default: the caller's globals.
    """
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    config = GuardConfig(
        only=parse_names(only),
        skip=parse_names(skip) or frozenset(),
        deferred=mode == "deferred",
    )
    return Guard(config, sync=sync, namespace=namespace)


def active() -> bool:
    return bool(_STATE.configs)
