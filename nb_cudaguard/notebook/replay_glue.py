"""IPython glue of the replay: save this kernel's cells at our restart, offer the replay in the
next process, plan it against the namespace as it is, and run the chosen cells.

The cells run through ``shell.run_cell`` (as ``%%capture`` runs its body), so every
``pre/post_run_cell`` hook, ours included, sees them and a failure shows the usual traceback and
our panel. They run with ``store_history=False``: a nested cell that stored history would share the
outer cell's execution count and shift IPython's input list. Which cells a replay ran is kept in
the extension's ``ReplayState`` instead, so that the next restart saves them in their place.
"""

from __future__ import annotations

import builtins
import contextlib
import html
import os
import re
import sys
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..diagnosis.render import (
    BAR_DONE,
    BAR_INFO,
    BAR_QUIET,
    BAR_WARN,
    TEXT_ERROR,
    inline_html,
    note_html,
)
from ..replay.analysis import CellFacts, analyse, analyse_cell, parse_cell, runnable_source
from ..replay.definitions import HOLDER, KeptDefinitions
from ..replay.flags import Reader, duration
from ..replay.history import Cell, SavedCells, discard, load_cells, save_cells
from ..replay.paths import file_uses
from ..replay.planner import (
    Plan,
    joined,
    numbered,
    plan_replay,
    with_files,
    with_own_modules,
    with_records,
    with_unrepeatable,
    with_unseen_handed,
)
from ..replay.prefix import part_facts, stopped_line, with_prefixes
from ..replay.record import CellRecord, Recorder
from ..replay.rng import restore_rng
from ..replay.settings import set_again
from ..replay.text import cell_label, plan_details, plan_lines, plan_summary
from ..replay.unrepeatable import Unrepeatable, unrepeatable
from ..runtime.blocking import BLOCKING
from ..runtime.nested_loop import NestedRunner, running_loop
from .actions import blocking_restart_button, does_blocking, does_note
from .cell_output import into_cell, showing_cell
from .locate import kernel_connection, profile_dirs

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from .actions import Restarter

REPLAY_LABEL = "Replay to the failing cell"
DOES_REPLAY = (
    "Replay to the failing cell: runs the cells listed above, then the failing cell, here; it "
    "stops at the first error."
)
COMMAND = "%cudaguard replay --yes"


@dataclass
class ReplayState:
    """What the loaded extension knows about replays in its shell (the extension object owns
    it: an unload forgets it, a second shell has its own)."""

    previous: SavedCells | None = None  # the previous kernel's cells, read at load
    why_none: str = "no cells were saved for this kernel"
    loaded: bool = False
    # Cells a replay ran, by how many inputs IPython's history held then (the cell that ran
    # them included: IPython stores a cell's input before running it).
    replayed: dict[int, list[Cell]] = field(default_factory=dict)
    running: bool = False
    # The extension's record of what each cell did (None: none): which restored names the user
    # changed since their restore, and the baseline a replay's own rebuilding moves.
    recorder: Recorder | None = None
    offered: bool = False
    facts: dict[str, CellFacts] = field(default_factory=dict)  # by source: plans are remade


# --- saving, in the old process ------------------------------------------------------------------


def own_cells(
    shell: InteractiveShell,
    outcomes: dict[int, bool],
    seconds: Mapping[int, float] | None = None,
    records: Mapping[int, CellRecord] | None = None,
    replay: ReplayState | None = None,
) -> list[tuple[Cell, bool]]:
    """This process's cells in the order they ran, each with whether a replay ran it (those
    stand right after the cell that ran them, or the last one before the click); ``seconds``:
    how long each ran, ``records``: what it did (``replay.record``), by execution count, where
    known; ``replay``: the extension's replay state (None: no replay ran). A cell that ran a
    replay has no record: what its replay did is the replayed cells'."""
    raw = _history(shell)
    seconds = seconds or {}
    records = records or {}
    replayed = replay.replayed if replay is not None else {}
    cells: list[tuple[Cell, bool]] = [(c, True) for c in replayed.get(1, [])]
    for count, source in enumerate(raw[1:], start=1):
        ok = outcomes.get(count)
        failed = None if ok is None else not ok
        record = None if count + 1 in replayed else records.get(count)
        cells.append((Cell(source, count, failed, seconds.get(count), record), False))
        cells.extend((c, True) for c in replayed.get(count + 1, []))
    return cells


def _history(shell: InteractiveShell) -> list[str]:
    """IPython's raw inputs: entry ``n`` is cell ``n`` (entry 0 is empty)."""
    return list(getattr(shell.history_manager, "input_hist_raw", [""]))


def cells_to_save(
    shell: InteractiveShell,
    outcomes: dict[int, bool],
    after_cell: int | None,
    seconds: Mapping[int, float] | None = None,
    records: Mapping[int, CellRecord] | None = None,
    replay: ReplayState | None = None,
) -> tuple[list[Cell], int | None]:
    """(cells, index of the failing one). The previous kernel's cells come first while they
    were not replayed here (a restart that only switches blocking mode on keeps them). The
    failing cell is ``after_cell`` (the CUDA error explained here); else the previous kernel's
    (a NameError here, where its variables are gone, is no better target); else the last cell
    here that failed. ``replay``: the extension's replay state (None: nothing read or run)."""
    replay = ReplayState() if replay is None else replay
    carried: list[Cell] = []
    carried_failing: int | None = None
    previous = replay.previous
    if previous is not None and not replay.replayed:
        carried, carried_failing = list(previous.cells), previous.failing
    own = own_cells(shell, outcomes, seconds, records, replay)
    # A cell that ran a replay fails where the replay did: the cell it replayed is the target.
    ran_replay = {count - 1 for count in replay.replayed}
    found = [
        i
        for i, (c, replayed) in enumerate(own)
        if c.count == after_cell and c.failed and not replayed and c.count not in ran_replay
    ]
    cells = carried + [c for c, _ in own]
    if found:
        return cells, len(carried) + found[-1]
    if carried_failing is not None:
        return cells, carried_failing
    # Not a CUDA error, or one in a replayed cell (run outside the history).
    failed = [
        i
        for i, (c, replayed) in enumerate(own)
        if c.failed and (replayed or c.count not in ran_replay)
    ]
    return cells, len(carried) + failed[-1] if failed else None


@contextlib.contextmanager
def cells_kept_for_restart(
    shell: InteractiveShell,
    outcomes: dict[int, bool],
    after_cell: int | None,
    seconds: Mapping[int, float] | None = None,
    records: Mapping[int, CellRecord] | None = None,
    replay: ReplayState | None = None,
) -> Iterator[None]:
    """Around our restart: save this kernel's cells for its next process; discard them again if
    the restart could not be asked for. Saving never stands in the restart's way."""
    profile, connection = profile_dirs(shell), kernel_connection(shell)
    saved = False
    if profile is not None and connection is not None:
        try:
            cells, failing = cells_to_save(shell, outcomes, after_cell, seconds, records, replay)
            save_cells(profile[0], connection, cells, failing)
            saved = True
        except Exception as error:
            print(
                f"nb_cudaguard: could not keep the cells for a replay ({error}).", file=sys.stderr
            )
    try:
        yield
    except BaseException:
        if saved and profile is not None and connection is not None:
            discard(profile[0], connection)
        raise


# --- reading, in the new process -----------------------------------------------------------------


def previous_cells(shell: InteractiveShell, replay: ReplayState) -> tuple[SavedCells | None, str]:
    """The previous kernel's cells (read once, the file consumed, then kept in ``replay``)."""
    if not replay.loaded:
        profile, connection = profile_dirs(shell), kernel_connection(shell)
        if profile is None or connection is None:
            replay.why_none = "this is not a Jupyter kernel"
        else:
            replay.previous, why = load_cells(profile[0], connection)
            replay.why_none = why or replay.why_none
        replay.loaded = True
    return replay.previous, replay.why_none


def replayable(shell: InteractiveShell, saved: SavedCells) -> SavedCells:
    """``saved`` with what each failed cell ran before the statement that raised, as a cell of
    its own (replay/prefix.py); the plan and the run both count in these cells."""
    return with_prefixes(saved, lambda source: str(shell.transform_cell(source)))


def _raised(cells: Sequence[Cell], index: int) -> CellRecord | None:
    """The record of the failed cell that part-cell ``index`` ran before, where it follows it
    (a part replayed in an earlier kernel stands alone: its record holds a random state only)."""
    after = cells[index + 1] if index + 1 < len(cells) else None
    if after is None or not after.failed or after.count != cells[index].count:
        return None
    return after.record


def make_plan(
    shell: InteractiveShell, saved: SavedCells, replay: ReplayState | None = None
) -> Plan:
    """The plan against the namespace as it is now (whatever was kept or restored is there);
    ``replay``: where the cells' analyses are kept, for the plans made again."""
    assert saved.failing is not None
    failing = saved.failing
    cells = saved.cells[: failing + 1]
    known = replay.facts if replay is not None else {}

    def transform(source: str) -> str:
        return str(shell.transform_cell(source))

    texts = []
    for cell in cells:
        found = known.get(cell.source)
        if found is None:
            found = known[cell.source] = analyse_cell(runnable_source(cell.source), transform)
        texts.append(found)
    modules = {m for f in texts for m in f.imported_from.values()}
    own = own_modules(modules)
    texts = with_own_modules(texts, _module_texts(own))
    from .keep_glue import restored_names

    restored, after_failure, graphless = restored_names(shell)
    handed = with_unseen_handed(texts)
    failed = {i for i, c in enumerate(cells) if c.failed and i != failing}
    recorder = replay.recorder if replay is not None else None
    changed_here = recorder.changed_since_put_back(shell.user_ns) if recorder is not None else ()
    changed_here = (*changed_here, *_bound_since_restart(shell, replay, restored))
    # A part that changed a restored name does not run (the restored one has its change),
    # unless the plan builds that name again: then it is planned once more, the part with it.
    raised = {i: _raised(cells, i) for i, c in enumerate(cells) if c.ran_before}

    def facts_with(kept: frozenset[str]) -> list[CellFacts]:
        found = [
            part_facts(f, raised[i], kept) if i in raised else joined(f, c.record)
            for i, (f, c) in enumerate(zip(handed, cells, strict=True))
        ]
        # (a part binds no history name: ``_i3`` is the whole cell's text)
        return numbered(found, [None if c.ran_before else c.count for c in cells])

    def plan_of(facts: list[CellFacts]) -> Plan:
        return plan_replay(
            facts,
            failing,
            {n for n in shell.user_ns if n in restored or not _OUTPUTS.fullmatch(n)},
            failed,
            restored=restored,
            after_failure=after_failure,
            own_modules=own,
            changed_here=changed_here,
            fresh=[n for n in restored if _from_module(shell.user_ns.get(n)) in own],
            iterators=[n for n in restored if isinstance(shell.user_ns.get(n), Iterator)],
            graphless=graphless,
        )

    kept_as_restored = frozenset(restored)
    facts = facts_with(kept_as_restored)
    plan = plan_of(facts)
    for _ in range(2):  # (a part let run may make the plan build another name again)
        given_way = kept_as_restored & set(plan.rebuilt)
        if not raised or not given_way:
            break
        kept = kept_as_restored - given_way
        again = facts_with(kept)
        if again == facts:
            break
        kept_as_restored, facts = kept, again
        plan = plan_of(facts)
    plan = with_records(plan, facts, [c.record for c in cells])
    sets_here = [n for n, v in shell.user_ns.items() if isinstance(v, set | frozenset)]

    def walk(index: int) -> Unrepeatable:
        tree = parse_cell(runnable_source(cells[index].source), transform)
        return unrepeatable(tree) if tree is not None else facts[index].unrepeatable

    plan = with_unrepeatable(plan, facts, sets_here, _orders_vary(), walk)
    return with_files(plan, facts, file_uses([f.paths for f in facts], [f.mutates for f in facts]))


def _orders_vary() -> bool:
    """Whether a set of strings may be ordered otherwise than in the previous kernel: unless
    ``PYTHONHASHSEED`` fixes string hashing (the kernel's environment, which a restart keeps),
    every process draws its own secret."""
    seed = os.environ.get("PYTHONHASHSEED", "random")
    return not seed.isdigit()


# IPython's output and input history (``_``, ``__``, ``___``, ``_3``, ``Out``, ``_oh``; ``_i``,
# ``_ii``, ``_iii``, ``_i3``, ``In``, ``_ih``: IPython/core/history.py's ``store_inputs``):
# this kernel's, not the previous one's; a replayed cell that shows a value binds ``_`` again.
_OUTPUTS = re.compile(r"_{1,3}|_\d+|Out|_oh|_i{1,3}|_i\d+|In|_ih")


def _from_module(value: Any) -> str | None:
    """The top-level module a module, function or class is (or comes from): a restore brings
    these back by importing them again, so with what the module's file sets, not what the
    cells did to its globals since; None for anything else (restored as it was)."""
    if isinstance(value, types.ModuleType):
        return value.__name__.partition(".")[0]
    if isinstance(value, type | types.FunctionType):
        module = getattr(value, "__module__", None)
        return module.partition(".")[0] if isinstance(module, str) else None
    return None


def _module_texts(names: Iterable[str]) -> dict[str, CellFacts]:
    """The notebook's own modules among ``names`` that are one ``.py`` file (a ``helpers.py``
    beside it, as ``%%writefile`` leaves it), each analysed as a cell's text: located and read,
    never imported. One that cannot be found, read or parsed is left out."""
    import importlib.util

    found = {}
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None and spec.has_location else None
            if origin and origin.endswith(".py") and os.path.getsize(origin) < _MODULE_TEXT:
                with open(origin, encoding="utf-8") as f:
                    found[name] = analyse(f.read())
        except (ImportError, ValueError, OSError, SyntaxError, UnicodeDecodeError):
            continue
    return found


_MODULE_TEXT = 1_000_000  # bytes: a module larger than this is not read


def own_modules(names: Iterable[str]) -> set[str]:
    """The top-level modules of ``names`` that are the notebook's own (a ``helpers.py`` beside
    it, a package of the user's): found outside the standard library and site-packages, or not
    found at all (nothing says it is a library). Located, never imported."""
    import importlib.util
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    with contextlib.suppress(Exception):  # a virtualenv's old site module may lack these
        roots += [*site.getsitepackages(), site.getusersitepackages()]
    libraries = tuple(os.path.join(os.path.realpath(r), "") for r in roots)
    own = set()
    for name in names:
        module = sys.modules.get(name)
        try:
            spec = getattr(module, "__spec__", None) or importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            own.add(name)
            continue
        places = [spec.origin] if spec.has_location and spec.origin else []
        places += list(spec.submodule_search_locations or [])
        if places and not all(os.path.realpath(p).startswith(libraries) for p in places):
            own.add(name)
    return own


def nothing_to_replay(why: str) -> str:
    return (
        f"nothing to replay: {why}. nb_cudaguard keeps a kernel's cells when it restarts the "
        "kernel itself (its restart button, `%cudaguard restart`), for the next process only."
    )


# --- showing and asking ---------------------------------------------------------------------------


def plan_flags(
    shell: InteractiveShell, plan: Plan, cells: tuple[Cell, ...]
) -> dict[int, tuple[str, ...]]:
    """What each cell of the plan does beyond the namespace (shell commands, installs, writes,
    a long run before), by index: for the user's consent. Every cell up to the last step is
    read in order, so a name means what the cells before bound it to (``import os as o``)."""

    def transform(source: str) -> str:
        return str(shell.transform_cell(source))

    steps = {step.index for step in plan.steps}
    reader = Reader(transform)
    flags = {}
    for index, cell in enumerate(cells[: max(steps, default=-1) + 1]):
        found = reader.read(cell.source, cell.seconds)
        if found and index in steps:
            flags[index] = found
    return flags


@dataclass(frozen=True)
class PlanView:
    """The plan as static output: what will run (each cell's whole code, and what it does
    beyond the namespace), and the command that runs it."""

    plan: Plan
    cells: tuple[Cell, ...]
    blocking_on: bool
    asking: bool = True  # False: they run now
    flags: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def _head(self) -> str:
        head = f"nb_cudaguard: {plan_summary(self.plan, self.cells)}"
        flagged = [self.cells[s.index] for s in self.plan.steps if s.index in self.flags]
        if flagged:
            head += (
                f" Look before running: {', '.join(cell_label(c) for c in flagged)} "
                f"{'does' if len(flagged) == 1 else 'do'} more than compute (marked !)."
            )
        known = [self.cells[s.index].seconds for s in self.plan.steps]
        seconds = [x for x in known if x is not None]
        if seconds and sum(seconds) >= 1:
            head += f" They took {duration(sum(seconds))} before."
        return head

    def _tail(self) -> list[str]:
        lines = [
            f"Run them: `{COMMAND}` (it stops at the first error)."
            if self.asking
            else "Running them now; the replay stops at the first error."
        ]
        if not self.blocking_on:
            lines.append(BLOCKING_OFF)
        return lines

    def text(self) -> str:
        lines = [self._head()]
        lines += [f"  {line}" for line in plan_details(self.plan, self.cells, self.flags)]
        return "\n".join(lines + self._tail())

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        items = []
        for step, line in zip(self.plan.steps, plan_lines(self.plan, self.cells), strict=True):
            cell = self.cells[step.index]
            flags = "".join(
                f"<div style='color:{TEXT_ERROR}'>! {html.escape(flag)}</div>"
                for flag in self.flags.get(step.index, ())
            )
            lines = len(cell.source.splitlines())
            code = (
                f"<details><summary>its code ({lines} line{'s' if lines != 1 else ''})"
                f"</summary><pre style='margin:2px 0'>{html.escape(cell.source)}</pre></details>"
            )
            items.append(f"<li><code>{inline_html(line)}</code>{flags}{code}</li>")
        page = (
            f"<div class='nb-cudaguard-replay' style='border-left:4px solid {BAR_INFO};"
            f"padding:2px 8px;margin:4px 0;font-family:sans-serif'>{inline_html(self._head())}"
            f"<ol style='margin:2px 0'>{''.join(items)}</ol>"
            + "".join(f"<div>{inline_html(x)}</div>" for x in self._tail())
            + "</div>"
        )
        return {"text/plain": self.text(), "text/html": page}


def plan_view(
    shell: InteractiveShell, plan: Plan, saved: SavedCells, blocking_on: bool, asking: bool = True
) -> PlanView:
    return PlanView(plan, saved.cells, blocking_on, asking, plan_flags(shell, plan, saved.cells))


BLOCKING_OFF = (
    "Blocking mode is off in this kernel: the traceback may still point at a later line than the "
    "one that failed. `%cudaguard restart` starts a kernel in blocking mode; replay there."
)


BLOCKING_THEN_REPLAY = (
    "The cells stay saved: the new kernel offers the replay again at its first cell, and its "
    "traceback points at the line that failed."
)


PLAN_GREW = (
    "The namespace changed since this plan was made, and the new plan above runs cells the old "
    "one did not. Click again to run it."
)
PLAN_SHRANK = (
    "The namespace changed since this plan was made (a restore): the plan above is the new "
    "one, with fewer cells to run again. Running it."
)


class ReplayOffer:
    """The plan, a button that runs it, whose output goes to the real outputs of the cell that
    showed the plan (``cell_output.py``: saved with the notebook; an ``Output`` widget where
    there is no such cell). Where blocking mode
    is off and this kernel can restart itself (``restart``: the extension's own restart, the
    panel's), a second button restarts in blocking mode first: the cells are saved again for the
    next process, which offers the replay there. Both are secondary: the one primary button of a
    new kernel's offers is Restore, where something was kept (``keep_glue.RestoreOffer``); a
    sentence under them says what each does."""

    def __init__(
        self,
        shell: InteractiveShell,
        saved: SavedCells,
        view: PlanView,
        restart: Restarter | None = None,
        replay: ReplayState | None = None,
        keeps: bool = True,
    ) -> None:
        import ipywidgets as widgets

        self.shell, self.saved, self.view = shell, saved, view
        self.replay = ReplayState() if replay is None else replay
        self._restart = restart
        self.button = widgets.Button(
            description=REPLAY_LABEL, tooltip=DOES_REPLAY, layout=widgets.Layout(width="auto")
        )
        self.buttons = [self.button]
        sentences = [DOES_REPLAY]
        self.blocking_button: Any = None
        if restart is not None and not view.blocking_on:
            self.blocking_button = blocking_restart_button(
                primary=False, then_replay=True, keeps=keeps
            )
            self.blocking_button.on_click(self._restart_clicked)
            self.buttons.insert(0, self.blocking_button)
            sentences.insert(0, does_blocking(then_replay=True, keeps=keeps))
        self.note = does_note(sentences)
        from .actions import button_row, listing

        self.status = widgets.HTML(value="")
        self.output = widgets.Output()  # where a frontend routes no output to the cell
        self.cell = showing_cell(shell)  # the replay's output goes to its real outputs
        self.button.on_click(self._clicked)
        self.plan = listing(view._repr_mimebundle_()["text/html"])
        self.widget = widgets.VBox(
            [self.plan, button_row(self.buttons), self.note, self.status, self.output]
        )

    def _restart_clicked(self, _button: Any) -> None:
        from .actions import after_restart_text

        assert self._restart is not None
        for each in self.buttons:
            each.disabled = True
        self.note.value = ""
        self.status.value = note_html(
            "nb-cudaguard-replay-restart",
            BAR_QUIET,
            "Keeping the CPU variables, then restarting...",
        )
        try:
            plan = self._restart(blocking=True)
        except Exception as error:
            for each in self.buttons:
                each.disabled = False
            self.status.value = note_html(
                "nb-cudaguard-replay-restart",
                BAR_WARN,
                f"Could not restart from here ({error}). `{COMMAND}` replays in this kernel, "
                "without blocking mode.",
            )
            return
        kept = " ".join(x for x in (plan.kept, BLOCKING_THEN_REPLAY) if x)
        said = after_restart_text(plan.method.value, True, warning=plan.warning, kept=kept)
        self.status.value = note_html("nb-cudaguard-replay-restart", BAR_DONE, said)

    def _clicked(self, _button: Any) -> None:
        plan = make_plan(self.shell, self.saved, self.replay)
        if plan != self.view.plan:  # something was restored or bound meanwhile
            shown = {step.index for step in self.view.plan.steps}
            self.view = plan_view(self.shell, plan, self.saved, self.view.blocking_on)
            self.plan.value = self.view._repr_mimebundle_()["text/html"]
            if not {step.index for step in plan.steps} <= shown:
                # Cells the user has not seen in the plan: they look before they run.
                self.status.value = note_html("nb-cudaguard-replay-changed", BAR_WARN, PLAN_GREW)
                return
            # A restore only takes work away: the cells left were all in the plan clicked.
            self.status.value = note_html("nb-cudaguard-replay-changed", BAR_QUIET, PLAN_SHRANK)
        for each in self.buttons:
            each.disabled = True
        self.note.value = ""
        with into_cell(self.shell, self.cell, fallback=self.output):
            said = run_plan(self.shell, self.saved, plan, self.view.blocking_on, self.replay)
        self.status.value = note_html("nb-cudaguard-replay-done", BAR_INFO, said)

    def _repr_mimebundle_(
        self, include: object = None, exclude: object = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from .actions import live_bundle

        return live_bundle(self.view._repr_mimebundle_(), self.widget)


def _restarter(restart: Restarter | None) -> Restarter | None:
    """The extension's own restart (keep, cells saved, blocking mode), as the panel's buttons
    call it; None where there is no kernel to restart."""
    from ..restart.environment import Environment, detect

    return None if restart is None or detect() is Environment.TERMINAL else restart


def offer(
    shell: InteractiveShell,
    saved: SavedCells,
    blocking_on: bool,
    restart: Restarter | None = None,
    replay: ReplayState | None = None,
    buttons: bool = True,
    keeps: bool = True,
) -> None:
    """Show the plan with a button where widgets work (and ``buttons``), the command everywhere;
    with blocking mode off, also a button that ``restart``s in blocking mode first (``keeps``:
    whether that restart keeps the CPU variables, ``CudaGuard.keep_on_restart``)."""
    from IPython.display import display

    saved = replayable(shell, saved)
    view = plan_view(shell, make_plan(shell, saved, replay), saved, blocking_on)
    if not buttons:
        display(view)
        return
    try:
        restart = None if blocking_on else _restarter(restart)
        display(ReplayOffer(shell, saved, view, restart, replay, keeps))
    except Exception:  # no ipywidgets, or no comm: the command in the text still works
        display(view)


def offer_after_restart(
    shell: InteractiveShell,
    replay: ReplayState,
    blocking_on: bool,
    restart: Restarter | None = None,
    *,
    buttons: bool = True,
    keeps: bool = True,
) -> None:
    """At load (at the first cell, where our restart's startup file loaded the extension) in the
    process our restart started: the plan, if a cell failed (``buttons``, ``keeps``: as
    ``offer``)."""
    saved, _ = previous_cells(shell, replay)
    if saved is None or saved.failing is None or replay.offered or replay.replayed:
        return
    replay.offered = True
    offer(shell, saved, blocking_on, restart, replay, buttons, keeps)


# --- running --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    said: str  # what happened, in a sentence
    stopped: bool  # a cell raised: the replay stopped there


@contextlib.contextmanager
def labelled(shell: InteractiveShell, count: int | None) -> Iterator[None]:
    """A cell run here gets ``count`` (the replayed cell's number in the previous kernel) as
    its traceback label, "Cell In[count]", instead of the number of the cell that ran the
    replay. IPython labels a frame by the number it handed ``compile.cache`` for that code
    (``CachingCompiler.format_code_name``); only that number changes, not the execution count
    that the hooks and the history see."""
    compiler = getattr(shell, "compile", None)
    cache = getattr(compiler, "cache", None)
    if count is None or compiler is None or cache is None:
        yield
        return

    def cache_as_replayed(transformed: str, number: int = 0, raw_code: str | None = None) -> str:
        return str(cache(transformed, count, raw_code=raw_code))

    patched_before = vars(compiler).get("cache")  # another tool's own patch, if any
    compiler.cache = cache_as_replayed
    try:
        yield
    finally:
        if patched_before is not None:
            compiler.cache = patched_before
        else:
            del compiler.cache  # the class's method again


@contextlib.contextmanager
def awaits_served(shell: InteractiveShell) -> Iterator[None]:
    """A replayed cell's top-level ``await`` served by the event loop that runs the replay
    (ipykernel's), which IPython's own asyncio runner refuses while it runs
    (``runtime/nested_loop.py``). Other runners (``%autoawait trio``) are left as they are."""
    loop = running_loop()
    runner = shell.loop_runner
    if loop is None or str(runner) != "asyncio":  # (IPython's ``_AsyncIORunner``)
        yield
        return
    shell.loop_runner = NestedRunner(loop)
    try:
        yield
    finally:
        shell.loop_runner = runner


def run_plan(
    shell: InteractiveShell,
    saved: SavedCells,
    plan: Plan,
    blocking_on: bool,
    replay: ReplayState | None = None,
) -> str:
    """Run the plan's cells in order, stopping at the first error; returns what happened, also
    printed. ``replay``: where the cells it ran are kept, for the next restart to save."""
    return run_steps(shell, saved, plan, blocking_on, replay=replay).said


@contextlib.contextmanager
def kept_definitions(
    shell: InteractiveShell, here: dict[str, Any], names: Sequence[str]
) -> Iterator[None]:
    """While a replayed cell runs, its ``class``/``def`` of ``names`` binds the ones ``here``
    at once (replay/definitions.py), through IPython's AST transformers."""
    names = [n for n in names if n in here]
    if not names:
        yield
        return
    transformer = KeptDefinitions(names)
    shell.user_ns[HOLDER] = {n: here[n] for n in names}
    shell.ast_transformers.append(transformer)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # IPython drops a transformer that raised
            shell.ast_transformers.remove(transformer)
        shell.user_ns.pop(HOLDER, None)


def run_steps(
    shell: InteractiveShell,
    saved: SavedCells,
    plan: Plan,
    blocking_on: bool,
    say: bool = True,
    replay: ReplayState | None = None,
) -> Outcome:
    """``run_plan``, saying also whether a cell raised (``say``: printing what happened). What
    the namespace has that a cell binds anew (``Step.keeps``) is put back after it, failed or
    not."""
    replay = ReplayState() if replay is None else replay
    if replay.running:
        return Outcome("A replay is already running.", stopped=True)
    replay.running = True
    # Not the execution count: IPython 9 moves it on for a nested run_cell too.
    position = len(_history(shell))
    present = set(shell.user_ns)
    before = dict(shell.user_ns)  # references only: what the replay binds anew shows by identity
    ran: list[Cell] = []
    said = ""
    ok = True
    stream = sys.stdout
    pending = list(plan.set_again)  # in the cells' order, as the plan lists them
    try:
        for number, step in enumerate(plan.steps, start=1):
            cell = saved.cells[step.index]
            while pending and pending[0][0] < step.index:
                _set_again_from(saved.cells[pending.pop(0)[0]], stream)
            _PRINT(
                f"nb_cudaguard replay ({number}/{len(plan.steps)}): cell {cell_label(cell)}",
                file=stream,
                flush=True,
            )
            here = {n: shell.user_ns[n] for n in step.keeps if n in shell.user_ns}
            if step.failing:  # deleted before it failed (``del raw``), made again by the replay
                for name in plan.drop:
                    if name not in present:
                        shell.user_ns.pop(name, None)
            if cell.record is not None and cell.record.rng:
                try:
                    restore_rng(cell.record.rng)  # it draws as it did when it ran
                except Exception as internal:  # a kept state this torch cannot take: say so
                    _PRINT(
                        f"nb_cudaguard: cell {cell_label(cell)}'s random state could not be "
                        f"set again ({type(internal).__name__}: {internal}); its draws may "
                        "differ from the previous kernel's.",
                        file=stream,
                        flush=True,
                    )
            started = time.perf_counter()
            try:
                with (
                    labelled(shell, cell.count),
                    kept_definitions(shell, here, step.defs),
                    awaits_served(shell),
                ):
                    result = shell.run_cell(runnable_source(cell.source), store_history=False)
            finally:
                shell.user_ns.update(here)
            ok = bool(getattr(result, "success", False))
            if ok and not cell.ran_before:  # (part of a cell: not what its number names)
                _number_as_replayed(shell, cell, getattr(result, "result", None))
            seconds = time.perf_counter() - started
            ran.append(Cell(cell.source, cell.count, not ok, seconds, cell.record, cell.ran_before))
            if not ok and not step.failing and (line := _failed_as_before(shell, cell, result)):
                # What it did before it raised is what the previous kernel's later cells began
                # from: the replay goes on from there, as that kernel did.
                _PRINT(
                    f"nb_cudaguard replay: cell {cell_label(cell)} raised at line {line} again, "
                    "where it raised in the previous kernel; the replay goes on from what it did "
                    "before that, as the previous kernel did.",
                    file=stream,
                    flush=True,
                )
                continue
            if not ok:
                said = (
                    f"Replay stopped at cell {cell_label(cell)} of the previous kernel"
                    + (", the failing cell" if step.failing else " (before the failing cell)")
                    + ": its traceback is in this cell's output."
                )
                break
        else:
            said = (
                f"Replay done: cell {cell_label(saved.cells[plan.steps[-1].index])} ran without "
                "an error this time."
            )
    finally:
        replay.running = False
        replay.replayed.setdefault(position, []).extend(ran)
        if replay.recorder is not None:  # what the replay rebuilt is no change of the user's
            with contextlib.suppress(Exception):
                known = replay.recorder.put_back_names
                rebuilt = [n for n in rebuilt_by(shell.user_ns, before) if n in known]
                replay.recorder.put_back(rebuilt, shell.user_ns)
    if not blocking_on:
        said += " " + BLOCKING_OFF
    if say or ok:
        _PRINT(f"nb_cudaguard: {said}", file=stream, flush=True)
    return Outcome(said, stopped=not ok)


_OUR_MAGIC = re.compile(r"^%cudaguard\b", re.MULTILINE)


def _bound_since_restart(
    shell: InteractiveShell, replay: ReplayState | None, restored: Sequence[str]
) -> list[str]:
    """The names the user's own cells bound in this kernel and still hold, that no restore
    brought (``scale = 10``, a setup cell run again by hand): the user's, not the state before
    the failure. Not what a replay's cells bound, nor a restore's (``%cudaguard`` cells), nor a
    module (imported again, it is the one it was)."""
    recorder = replay.recorder if replay is not None else None
    if replay is None or recorder is None:
        return []
    raw = _history(shell)
    bound: set[str] = set()
    for count, record in recorder.records.items():
        if count + 1 in replay.replayed:  # (IPython stores a cell's input before it runs)
            continue
        if 0 < count < len(raw) and not _OUR_MAGIC.search(raw[count]):
            bound |= record.bound
    here = shell.user_ns
    return sorted(
        name
        for name in bound.difference(restored)
        if name in here and not isinstance(here[name], types.ModuleType)
    )


def _failed_as_before(shell: InteractiveShell, cell: Cell, result: Any) -> int:
    """The line of the top-level statement ``cell``, run again whole, raised from, where it is
    the one its record says it raised from in the previous kernel; else 0."""
    record = cell.record
    if not cell.failed or cell.ran_before or record is None or not record.stopped:
        return 0
    line = stopped_line(getattr(result, "error_in_exec", None), shell.user_ns)
    return line if line == record.stopped else 0


def _set_again_from(cell: Cell, stream: Any) -> None:
    """What a failed cell (not run again) set in ``os.environ`` and the directory it moved to,
    set again from its record; the restart's ``CUDA_LAUNCH_BLOCKING`` stays as it is."""
    record = cell.record
    if record is None:
        return
    try:
        set_again(record.environ, record.cwd, keep=frozenset(BLOCKING))
    except Exception as internal:  # a directory gone since: say so, and go on
        _PRINT(
            f"nb_cudaguard: what cell {cell_label(cell)} set before it failed could not be set "
            f"again ({type(internal).__name__}: {internal}).",
            file=stream,
            flush=True,
        )


def _number_as_replayed(shell: InteractiveShell, cell: Cell, shown: Any) -> None:
    """Bind the history names the replayed cell had in the previous kernel, which a later cell
    may read by number: ``_i3`` its text, ``_3`` and ``Out[3]`` what it showed (IPython's
    displayhook binds them by the number of the cell running, here the replay's own)."""
    if cell.count is None:
        return
    ns = shell.user_ns
    ns[f"_i{cell.count}"] = cell.source
    if shown is not None:
        ns[f"_{cell.count}"] = shown
        outputs = ns.get("Out")
        if isinstance(outputs, dict):
            outputs[cell.count] = shown


def rebuilt_by(namespace: Mapping[str, Any], before: Mapping[str, Any]) -> list[str]:
    """The names of ``namespace`` bound anew since ``before`` (a copy of it)."""
    return [n for n, v in namespace.items() if before.get(n, _ABSENT) is not v]


_ABSENT = object()
# The replay's own lines go out through the print and the stream there were when it began, not
# through a ``builtins.print`` or a ``sys.stdout`` a replayed cell puts in place (a logging
# ``print``, a tee): those would take our lines for the notebook's (``printed``, ``tee.lines``).
_PRINT = builtins.print


def replay_command(
    shell: InteractiveShell,
    replay: ReplayState,
    yes: bool,
    blocking_on: bool,
    restart: Restarter | None = None,
    buttons: bool = True,
    keeps: bool = True,
) -> None:
    """``%cudaguard replay [--yes]`` (``buttons``, ``keeps``: as ``offer``)."""
    from IPython.core.error import UsageError
    from IPython.display import display

    if replay.running:
        raise UsageError("a replay is already running")
    saved, why = previous_cells(shell, replay)
    if saved is None:
        raise UsageError(nothing_to_replay(why))
    if saved.failing is None:
        raise UsageError(
            nothing_to_replay("no cell of the previous kernel failed before the restart")
        )
    if not yes:
        offer(shell, saved, blocking_on, restart, replay, buttons, keeps)
        return
    saved = replayable(shell, saved)
    plan = make_plan(shell, saved, replay)
    display(plan_view(shell, plan, saved, blocking_on, asking=False))
    outcome = run_steps(shell, saved, plan, blocking_on, say=False, replay=replay)
    if outcome.stopped:  # the cell fails as the replayed one did: Run All stops here
        raise UsageError(outcome.said)
