"""Which of the previous kernel's cells to run again, in their order, to reach the failing cell
with everything it needs, given what the namespace holds now.

Dependency-aware, as ipyflow and ElasticNotebook are, but from the cells' text alone
(``analysis``): start from the names the failing cell reads; a name the namespace has now is left
alone (it was kept, or restored); a missing one is rebuilt by the latest cell before its reader
that binds or changes it, whose own reads are then needed in turn (a mutation is a read and a
redefinition, so ``model.to(dev)`` pulls in the cell that built ``model``). A cell that calls a
notebook function changes what the function changes (``global``s it assigns, objects it steps).
A cell that hands an object to a method of a name that is not a module (only ever bound by
imports) changes it (``trainer.fit(model)``, ``scaler.step(opt)``; not ``np.mean(x)``).
An object rebuilt that later cells changed in place before the failing cell is changed again by
them, also through the names built from it (``opt = AdamW(model.parameters())`` then
``opt.step()``; ``x = model.layer1`` then ``x.weight.data.fill_(0)``: "changes model through
opt"), and through the containers it was stored in (``models.append(model)`` then
``models[0].train()`` or ``for m in models: m.half()``; not a second ``models.append(m2)``, which
only fills the container). Opaque cells (``exec``, star
imports, ``%run``...) may define anything: they are included where a missing name is looked up past
them, and the plan says why. Cells that set a seed, the directory or the environment before the
failing cell are included. A cell that failed is used only where no successful cell binds the name.
"""

from __future__ import annotations

import builtins
import re
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from .analysis import CellFacts, Effects
from .paths import FileUse, lies_in
from .record import CellRecord
from .unrepeatable import ADDRESS, Unrepeatable


@dataclass(frozen=True)
class Step:
    """One cell of the plan, and why it runs."""

    index: int  # its position in the saved cells
    reasons: tuple[str, ...]
    failing: bool = False
    # Names the namespace has that the cell binds anew: the ones here are put back after it.
    keeps: tuple[str, ...] = ()
    # Those of them it binds by ``class`` or ``def``: the ones here from that statement on
    # (replay/definitions.py), so that what the cell makes is of them.
    defs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    unresolved: tuple[str, ...] = ()  # names needed that no earlier cell binds
    kept: tuple[str, ...] = ()  # names needed that the namespace already has
    # Restored names the plan changes again though they have those changes already: no earlier
    # cell builds them anew.
    twice: tuple[str, ...] = ()
    unseeded: tuple[int, ...] = ()  # cells it runs that draw random numbers with no seed set
    # Names the cells before the failing one deleted last (``del raw``): gone again before it.
    drop: tuple[str, ...] = ()
    # Cells it runs that ran before nb_cudaguard was loaded: planned from their text alone.
    unrecorded: tuple[int, ...] = ()
    # Names it rebuilds not seen whole when they ran (too large, or holding state Python cannot
    # read): a change inside may be missed.
    unseen: tuple[str, ...] = ()
    # Restored names the user changed since the restore, and names the user bound in this
    # kernel that no restore brought (a setup cell run again by hand, ``scale = 10``), kept as
    # they are: (name, why the plan would have built it again, or "").
    yours: tuple[tuple[str, str], ...] = ()
    # Of ``yours``, those no restore brought: bound by the user's own cells since the restart.
    bound_here: tuple[str, ...] = ()
    # Restored names the user changed since the restore that the plan builds again all the
    # same (what is built from them here would not match them otherwise): (name, why).
    overwritten: tuple[tuple[str, str], ...] = ()
    # Names the plan rebuilds from those the user changed since the restore: they follow the
    # user's change, not the state before the failure.
    from_yours: tuple[str, ...] = ()
    # Cells that failed when they ran, after binding or changing names the plan rebuilds: not
    # run again (they would fail again), so those names lack what they did; and the names the
    # plan's later cells build from them, which differ with them. (index, names, built from)
    failed_changes: tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...] = ()
    # Cells that failed when they ran, after setting process state (an environment variable, a
    # torch setting, the directory): not run again, so this process lacks it, and what the
    # plan's later cells make may differ with it. (index, what it set, those names)
    failed_setup: tuple[tuple[int, str, tuple[str, ...]], ...] = ()
    # What the cells it runs read that a new process cannot read the same (replay/unrepeatable.py):
    # (cell, what it reads: a set in its order, the clock...) and the names they, and the
    # cells built on them, make.
    unrepeatable: tuple[tuple[int, str], ...] = ()
    unrepeatable_names: tuple[str, ...] = ()
    # Names kept as the previous kernel left them that hold what meant something in that
    # process only (``{id(p): name}``: its objects' addresses): (name, the cell, what it read).
    kept_foreign: tuple[tuple[str, int, str], ...] = ()
    # Names kept or rebuilt that a thread or asyncio task changed, started by a cell not run
    # again: (name, that cell)
    kept_running: tuple[tuple[str, int], ...] = ()
    # Files the cells it runs leave otherwise than the previous kernel did: (path, how).
    files_changed: tuple[tuple[str, str], ...] = ()
    # Restored names that held a tensor autograd computed, a leaf since (``loss.backward()``
    # would reach nothing): those the failing cell reads, built again by the cell that made
    # them; and the others, left so, with why: (name, why not built again).
    graphless: tuple[str, ...] = ()
    graph_lost: tuple[tuple[str, str], ...] = ()
    # Cells that failed when they ran, not run again, whose environment variables and working
    # directory the replay sets again from their record, before the next cell it runs:
    # (index, what: "os.environ TOK, HOME", "the working directory").
    set_again: tuple[tuple[int, str], ...] = ()
    # Restored names it builds again from the cells (the restored ones give way).
    rebuilt: tuple[str, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(s.index for s in self.steps)


_BUILTINS = frozenset(dir(builtins))
CHANGED_ALREADY = "the one restored has this cell's change already"
READ_BEFORE_CHANGED = (
    "the one restored has what a later cell did to it, and a cell of the plan reads it before"
)
MAX_REASONS = 3  # rebuilt names a change is said to go to


def plan_replay(
    facts: Sequence[CellFacts],
    failing: int,
    present: Collection[str],
    failed: Collection[int] = (),
    restored: Collection[str] = (),
    after_failure: Collection[str] = (),
    own_modules: Collection[str] = (),
    changed_here: Collection[str] = (),
    fresh: Collection[str] = (),
    iterators: Collection[str] = (),
    graphless: Collection[str] = (),
) -> Plan:
    """The cells to run, in order, ending with ``failing`` (an index into ``facts``).

    ``present``: the names the user namespace has now; ``failed``: indices of cells that raised;
    ``restored``: the present names a restore put back, as the previous kernel left them (every
    change its cells made is in them); ``after_failure``: those of them kept after the failing
    cell ran (its changes too); ``own_modules``: the top-level modules the notebook imports
    that are its own (a ``helpers.py`` beside it), not libraries; ``changed_here``: the
    restored names the user re-bound or changed in this kernel since their restore (a fix), and
    present names the user's own cells bound since the restart (no restore brought them):
    never built again for a change they already had, and named where built again at all;
    ``fresh``: restored names that came back as they were at their import, not as the cells
    left them (the notebook's own modules, and what the namespace holds from them: their
    globals are the module's file's): every cell that changed them runs again;
    ``iterators``: present names that hold an iterator (``zip``, ``iter(xs)``), which any read
    may advance (``list(it)``, ``for x in it``); ``graphless``: restored names that held a
    tensor autograd computed, restored as a leaf (its graph to the model is lost).
    """
    if not 0 <= failing < len(facts):
        raise ValueError(f"failing cell {failing} is not among the {len(facts)} cells")
    facts = with_registered(facts)
    modules = module_names(facts, own_modules)
    facts = with_setters(with_calls(with_handed(facts, modules), modules), modules)
    present = set(present)
    restored = set(restored) & present
    yours = set(changed_here) & present
    planner = _Planner(
        facts, failing, present, set(failed), modules, restored, yours, set(fresh) & restored
    )
    plan = planner.run(set(after_failure) & restored, set(iterators), set(graphless) & restored)
    bound_here = tuple(sorted(n for n, _ in plan.yours if n not in restored))
    return replace(plan, drop=deleted_before(facts, failing), bound_here=bound_here)


def deleted_before(facts: Sequence[CellFacts], failing: int) -> tuple[str, ...]:
    """The names whose last binding before ``failing`` was a ``del`` (a cell that binds and
    deletes a name, ``raw = load(); data = prep(raw); del raw``, leaves it deleted)."""
    gone: dict[str, bool] = {}
    for cell in facts[:failing]:
        gone.update(dict.fromkeys(cell.defines - cell.deletes, False))
        gone.update(dict.fromkeys(cell.deletes, True))
    return tuple(sorted(n for n, deleted in gone.items() if deleted))


def module_names(facts: Sequence[CellFacts], own_modules: Collection[str] = ()) -> set[str]:
    """Names only ever bound by imports (``np``, ``F``, ``nn``) from libraries (not from
    ``own_modules``: ``from helpers import trainer``), and builtins no cell binds (``str.join``):
    calling their functions changes no object of ours."""
    imported = {n for f in facts for n in f.imports if f.imported_from.get(n) not in own_modules}
    others = {n for f in facts for n in f.defines - f.imports - f.mutates}
    for cell in facts:
        if cell.effects:  # what a function assigns (``global``), where it is called
            for effects in cell.effects.values():
                others |= effects.assigns
    return (imported | _BUILTINS) - others


def with_registered(facts: Sequence[CellFacts]) -> list[CellFacts]:
    """Each cell's facts with what it imports from a module an earlier cell put in
    ``sys.modules`` (``sys.modules["stub"] = m``, then ``import stub as s``, ``from stub import
    x``) built from that cell's object, not imported afresh: a change to ``m`` is ``s``'s and
    ``x``'s, and a new process has no such module until that cell runs."""
    out, registered = list(facts), dict[str, frozenset[str]]()
    for index, cell in enumerate(facts):
        links = {}
        for name, dotted in cell.imported_as.items():
            for module, sources in registered.items():
                if sources and (dotted == module or dotted.startswith(module + ".")):
                    links[name] = sources
        if links:
            joined = {**cell.links}
            for name, sources in links.items():
                joined[name] = joined.get(name, frozenset()) | sources
            out[index] = replace(cell, imports=cell.imports - links.keys(), links=joined)
        registered.update(cell.registers)
    return out


def with_setters(facts: Sequence[CellFacts], modules: Collection[str]) -> list[CellFacts]:
    """Each cell's facts, setting up what the library setters it calls on ``modules`` set
    (``torch.hub.set_dir(p)``): that state lives in the library, gone with the old process."""
    out = []
    for cell in facts:
        calls = [how for root, how in cell.setters.items() if root in modules]
        if calls:
            cell = replace(cell, setup="; ".join(filter(None, [cell.setup, *calls])))
        out.append(cell)
    return out


def with_handed(facts: Sequence[CellFacts], modules: Collection[str]) -> list[CellFacts]:
    """Each cell's facts with what it hands to the methods of objects (``trainer.fit(model)``,
    ``scaler.step(opt)``) changed, as a call of a notebook function changes its arguments, and
    computed from the object and the rest it is handed: ``r.shuffle(order)`` orders ``order`` by
    ``r``'s state; what it hands to a module's functions (``np.mean(x)``) only read."""
    out = list(facts)
    for index, cell in enumerate(facts):
        if not cell.handed:
            continue
        changed: set[str] = set()
        derives = dict(cell.derives)
        for receiver, names in cell.handed.items():
            if receiver in modules:
                continue
            changed |= names
            for name in names:
                sources = (names | {receiver}) - {name}
                derives[name] = derives.get(name, frozenset()) | sources
        if changed:
            out[index] = replace(
                cell,
                defines=cell.defines | changed,
                mutates=cell.mutates | changed,
                uses=cell.uses | changed,
                filled=cell.filled - changed,
                derives={n: s for n, s in derives.items() if s},
            )
    return out


def with_calls(facts: Sequence[CellFacts], modules: Collection[str] = ()) -> list[CellFacts]:
    """Each cell's facts with what the notebook functions it calls do (the latest definition of
    each before or in the cell): a call assigns the globals the function assigns and changes
    what it changes (what it hands to the methods of globals that are not ``modules`` too),
    and through this cell's links what those were built from. What the cell builds from what
    they return derives from the globals they read."""
    table: dict[str, Effects] = {}
    instances: dict[str, frozenset[str]] = {}
    # the globals each function, lambda or class reads (those of its cell's)
    reads: dict[str, frozenset[str]] = {}
    reach: dict[str, Effects] = {}  # what holds them (``use_tanh = partial(set_act, "tanh")``)
    out = []
    for cell in facts:
        for name in cell.defines - cell.mutates:
            table.pop(name, None)
            reads.pop(name, None)
            reach.pop(name, None)
        table.update(cell.effects)
        reads.update(dict.fromkeys(cell.callables | cell.effects.keys(), cell.deferred))
        cell = _with_returns(cell, reads)
        # Called through what holds them: what the record cannot see (a patch, a setter) counts.
        via = (cell.calls | cell.uses) & reach.keys()
        if via:
            held = _closure(frozenset().union(*(reach[n].calls for n in via)), table, modules)
            cell = replace(
                cell,
                patches=cell.patches | held.patches,
                class_patches=cell.class_patches | held.class_patches,
                setters={**held.setters, **cell.setters},
            )
        reach.update(_reaching(cell, table, reach))
        called = (cell.calls & table.keys()) | _methods_called(cell, table, instances)
        if not called:
            out.append(cell)
            continue
        done = _closure(called, table, modules)
        assigns, mutates = done.assigns, done.mutates
        bound = cell.defines - cell.mutates  # its own new objects: not a change
        changed = mutates - bound
        for name in mutates & bound:  # built here from older objects: those change
            changed |= cell.links.get(name, frozenset()) - bound
        if cell.stores:  # and what the cell stored in them
            for name in mutates & cell.stores.keys():
                changed |= cell.stores[name] - bound
        # What the calls set may be computed from what the cell hands them and from the globals
        # the functions read (``global mean; mean = sum(hist) / len(hist)``).
        sources = cell.uses.union(*(reads.get(n, frozenset()) for n in called))
        derives = dict(cell.derives)
        for name in assigns | mutates | changed:  # bound in this cell or not
            derives[name] = derives.get(name, frozenset()) | (sources - {name})
        new = replace(
            cell,
            defines=cell.defines | assigns | changed,
            mutates=cell.mutates | changed,
            uses=cell.uses | changed,
            derives=derives,
            # (what a notebook function patches: a module's attribute, a class's, which the
            # record sees by identity alone)
            patches=cell.patches | done.patches,
            class_patches=cell.class_patches | done.class_patches,
            setters={**done.setters, **cell.setters},
        )
        if cell.filled:  # a function changed them: not only filled
            new = replace(new, filled=cell.filled - mutates - changed)
        out.append(new)
    return out


def with_own_modules(
    facts: Sequence[CellFacts], sources: Mapping[str, CellFacts]
) -> list[CellFacts]:
    """``facts`` (from the cells' text), where a cell imports from a module of the notebook's own
    (``sources``: each such module's text, analysed as a cell's): its functions and classes
    come with what they do that the record cannot see, as the notebook's own would (their
    patches of a library, its setters, changes through ``.data`` to what they are handed). A
    whole module imported (``import helpers``) counts as a class: a cell that uses it may call
    any of them. What they do to the module's own globals is the module's, not the notebook's
    (the record reads those)."""
    spelled = {n: d for f in facts for n, d in f.imported_as.items()}
    out = []
    for cell in facts:
        found: dict[str, Effects] = {}
        for name in sorted(cell.imports):
            source = sources.get(cell.imported_from.get(name, ""))
            if source is None:
                continue
            attr = cell.imported_as.get(name, "").partition(".")[2]
            names = [attr] if attr else sorted(source.effects)
            folded = [_own_effects(source, n, spelled) for n in names if n in source.effects]
            if any(e.unseen_by_record() for e in folded):
                found[name] = Effects(
                    patches=frozenset().union(*(e.patches for e in folded)),
                    untracked_handed=any(e.untracked_handed for e in folded),
                    class_handed=any(e.class_handed for e in folded),
                    setters={k: v for e in folded for k, v in e.setters.items()},
                    of_class=not attr or any(e.of_class for e in folded),
                )
        if found:
            cell = replace(cell, effects={**cell.effects, **found})
        out.append(cell)
    return out


def _own_effects(source: CellFacts, name: str, spelled: Mapping[str, str]) -> Effects:
    """What ``name``, a function or class of a notebook's own module (``source``), does with
    the functions of the module it calls: the libraries it patches or sets up, named as the
    notebook names them (the module's ``F`` is torch.nn.functional: the notebook's ``F``, or
    ``torch``)."""
    done = _closure({name}, source.effects, ())

    def here(local: str) -> set[str]:
        dotted = source.imported_as.get(local)
        if dotted is None:
            return set()
        return {n for n, d in spelled.items() if dotted == d or dotted.startswith(d + ".")}

    return Effects(
        patches=frozenset().union(*(here(p) for p in done.patches)),
        untracked_handed=done.untracked_handed,
        class_handed=done.class_handed,
        setters={n: how for root, how in done.setters.items() for n in here(root)},
        of_class=source.effects[name].of_class,
    )


def with_unseen_handed(facts: Sequence[CellFacts]) -> list[CellFacts]:
    """``facts`` (from the cells' text, before their records join them), where a cell calls a
    notebook function that changes what it is handed through ``.data`` or ``.numpy()``
    (``def shrink(m): m.weight.data *= 0.5``) or through its class (``def patch(m):
    type(m).forward = f``): what the cell hands its calls, which the text takes for changed, is
    changed where no version counter counts, so the record cannot overrule it; through its
    class, the cell patches what a restore imports afresh, so it runs again."""
    table: dict[str, Effects] = {}
    instances: dict[str, frozenset[str]] = {}
    out = []
    for cell in facts:
        for name in cell.defines - cell.mutates:
            table.pop(name, None)
        table.update(cell.effects)
        called = (cell.calls & table.keys()) | _methods_called(cell, table, instances)
        table.update(_reaching(cell, table))
        done = _closure(called, table, ())
        if done.untracked_handed or done.class_handed:
            cell = replace(cell, untracked=cell.untracked | cell.mutates)
        if done.class_handed:  # their classes are changed: as by ``type(model).forward = f``
            cell = replace(
                cell,
                patches=cell.patches | cell.mutates,
                class_patches=cell.class_patches | cell.mutates,
            )
        out.append(cell)
    return out


def _reaching(
    cell: CellFacts, table: Mapping[str, Effects], held: Mapping[str, Effects] | None = None
) -> dict[str, Effects]:
    """The names ``cell`` builds or fills from notebook functions or classes of ``table``
    (``half = partial(shrink, f=0.5)``, ``callbacks = [Shrinker()]``, ``ops = {"s": shrink}``),
    each as a class whose methods are those: a later cell that uses it (``half(model)``, ``for cb
    in callbacks: cb.on_end(model)``, ``ops["s"](model)``) may call them, though its text
    names none. ``held``: those found before (``table``'s own by default), which a cell that
    fills one (``callbacks.append(Shrinker())``) adds to."""
    held = table if held is None else held
    found = {}
    for name in (cell.defines | cell.mutates) - cell.effects.keys():
        sources = cell.links.get(name, frozenset()) | cell.stores.get(name, frozenset())
        sources |= cell.derives.get(name, frozenset())
        reached = frozenset(n for n in sources if n in table and n != name)
        if reached:
            before = held.get(name) if name in cell.mutates else None
            calls = reached | (before.calls if before is not None else frozenset())
            found[name] = Effects(calls=calls, of_class=True)
    return found


def _methods_called(
    cell: CellFacts, table: Mapping[str, Effects], instances: dict[str, frozenset[str]]
) -> set[str]:
    """The notebook classes (with effects the record cannot see) that ``cell`` uses, or whose
    instances it uses: their methods may be what it calls (``p = Patcher()`` earlier,
    ``p.apply()`` now).
    ``instances``, each name made by calling such a class, is brought up to date."""
    for name in cell.defines - cell.mutates:
        instances.pop(name, None)
    for name in cell.defines:
        made = cell.derives.get(name, frozenset()) & cell.calls
        classes = frozenset(m for m in made if m in table and table[m].of_class)
        if classes:
            instances[name] = classes
    used = cell.mutates | cell.uses
    found = {n for n in used if n in table and table[n].of_class}  # (``Patcher.apply()``)
    return found.union(*(instances[n] for n in used & instances.keys()))


def _with_returns(cell: CellFacts, reads: Mapping[str, frozenset[str]]) -> CellFacts:
    """``cell``, whose names built from what a notebook function or class returns (``s =
    score()``, ``r = Report()``) derive from the globals it reads (``sum(hist)``)."""
    called = cell.calls & reads.keys()
    if not called:
        return cell
    derives = dict(cell.derives)
    for name in cell.defines - cell.imports - cell.callables:
        sources = cell.links.get(name, frozenset()) | cell.derives.get(name, frozenset())
        for function in sorted(sources & called):
            derives[name] = derives.get(name, frozenset()) | (reads[function] - {name})
    return replace(cell, derives=derives)


def _closure(
    called: Collection[str], table: Mapping[str, Effects], modules: Collection[str]
) -> Effects:
    """What calling ``called`` does, with the functions they call in turn, as one function's
    effects: the globals they bind, those they change (and hand to the methods of globals that
    are not ``modules``), those whose attributes or class they set, the setters they call,
    whether they change what they are handed through ``.data``."""
    assigns: set[str] = set()
    mutates: set[str] = set()
    patches: set[str] = set()
    class_patches: set[str] = set()
    setters: dict[str, str] = {}
    untracked = class_handed = False
    seen: set[str] = set()
    stack = list(called)
    while stack:
        name = stack.pop()
        if name in seen or name not in table:
            continue
        seen.add(name)
        effects = table[name]
        assigns |= effects.assigns
        mutates |= effects.mutates
        patches |= effects.patches
        class_patches |= effects.class_patches
        untracked |= effects.untracked_handed
        class_handed |= effects.class_handed
        for root, how in effects.setters.items():
            setters.setdefault(root, how)
        for receiver, handed in effects.handed.items():
            if receiver not in modules:
                mutates |= handed
        stack.extend(effects.calls)
    return Effects(
        assigns=frozenset(assigns - mutates),
        mutates=frozenset(mutates),
        patches=frozenset(patches),
        class_patches=frozenset(class_patches),
        untracked_handed=untracked,
        class_handed=class_handed,
        setters=setters,
    )


class _Planner:
    def __init__(
        self,
        facts: Sequence[CellFacts],
        failing: int,
        present: set[str],
        failed: set[int],
        modules: set[str],
        restored: set[str] = frozenset(),  # type: ignore[assignment]
        changed_here: set[str] = frozenset(),  # type: ignore[assignment]
        fresh: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        self.facts = facts
        self.restored = restored
        self.failing = failing
        self.present = present
        self.failed = failed
        self.reasons: dict[int, list[str]] = {}
        self.seen: set[tuple[str, int, int]] = set()
        self.unresolved: set[str] = set()
        self.kept: set[str] = set()
        self.stale: dict[str, str] = {}  # kept names to build again -> why
        self.changed_here = changed_here  # restored then changed, or bound, by the user
        self.fresh = fresh  # restored as imported, without the cells' changes
        self.yours: dict[str, str] = {}  # of those, kept though stale -> why they were
        self.pending: list[tuple[str, int, int]] = []  # (name, needed before, deferred reads at)
        self.modules = modules  # calling their functions changes no object of ours
        # The cells that bind, change, delete or build from each name, in order: a search for
        # a name visits these (and the opaque cells) only, not every earlier cell, so a name
        # that no cell binds costs nothing per reader.
        self.touch: dict[str, list[int]] = {}
        for index, cell in enumerate(facts):
            names = cell.defines | cell.deletes
            for sources in cell.links.values():
                names = names | sources
            for name in names:
                self.touch.setdefault(name, []).append(index)
        self.opaque_cells = [i for i, f in enumerate(facts) if f.opaque]
        self.functions = frozenset().union(*(f.callables for f in facts))
        self.setup_cells = [i for i, f in enumerate(facts[:failing]) if f.setup]
        self.seed_cells = [i for i in self.setup_cells if "seed" in facts[i].setup]
        # Cells that set attributes of a library's module (``np.float = float``): the patch is
        # process state, gone with the old process and not restorable (modules come back as
        # imports), so the cell runs again, as a setup cell does.
        # (and cells that patch the class of an instance we have: ``type(model).forward = f``)
        self.patch_cells = {
            i: sorted(f.patches & modules | f.class_patches & present)
            for i, f in enumerate(facts[:failing])
            if f.patches and (f.patches & modules or f.class_patches & present)
        }
        self.unseeded: set[int] = set()

    def run(
        self,
        after_failure: Collection[str] = (),
        iterators: Collection[str] = (),
        graphless: Collection[str] = (),
    ) -> Plan:
        target = self.facts[self.failing]
        rebuilt_graphs, graph_lost = self._regraph(graphless, target)
        # A restored value kept after the failing cell has what that cell did to it before it
        # failed (``history.append(loss)``, ``labels -= 1``): built again, so that the cell
        # starts from the state before the failure.
        for name in sorted(target.uses & target.defines & set(after_failure)):
            self._build_again(name, "the one restored has the failing cell's change already")
        # So is an iterator the failing cell reads in any way: ``list(pairs)`` or ``for b in
        # it`` advance it as ``next(it)`` does, and the one kept is where the cell left it.
        read = target.uses & set(iterators) & set(after_failure) - target.defines
        for name in sorted(read):
            why = "an iterator the failing cell reads: the one restored is where it left it"
            self._build_again(name, why)
        for name in sorted(target.uses | target.deferred):  # a stable order of reasons
            self.need(name, self.failing, self.failing)
        for name in sorted(self.fresh):
            for index in sorted(self._touching(name, self.failing)):
                facts = self.facts[index]
                if index not in self.failed and name in facts.mutates and self._counts(name, facts):
                    self._include(
                        index,
                        f"changes {name} again (a module of the notebook's own, and what it "
                        "holds, come back from a restore as the file sets them)",
                        index,
                    )
        while True:
            before = set(self.reasons)
            self.drain()
            # An object we rebuild that a later cell (before the failing one) changed in place
            # is changed again (``model.to(dev)``, ``lst.append(v)``), also through the names
            # built from it (``opt.step()``). A later plain rebinding is not needed: whoever
            # read the old value has it. (A function, class or module holds no object of ours.)
            self._propagate()
            self.drain()
            # Process state the rebuilt values may depend on: seeds, the directory, the env.
            for index in self.setup_cells:
                facts = self.facts[index]
                if index not in self.failed and index not in self.reasons:
                    self._include(index, f"sets up: {facts.setup}", index)
            for index, patched in self.patch_cells.items():
                if index not in self.failed and index not in self.reasons:
                    self._include(
                        index,
                        f"patches {', '.join(patched)} (a library's module or the class of "
                        "an instance here: imported afresh here, without the patch)",
                        index,
                    )
            self.drain()
            self._protect()
            self.drain()
            self._draws()
            self.drain()
            if set(self.reasons) == before:
                break
        steps = [self._step(i, r) for i, r in sorted(self.reasons.items()) if i != self.failing]
        steps.append(Step(self.failing, ("the failing cell",), failing=True))
        steps = self._with_later_definitions(steps)
        return Plan(
            tuple(steps),
            tuple(sorted(self.unresolved - self.stale.keys())),
            tuple(sorted(self.kept - self.stale.keys())),
            tuple(sorted(self.unresolved & self.stale.keys())),
            tuple(sorted(self.unseeded)),
            yours=tuple(
                sorted((n, self.yours.get(n, "")) for n in self.changed_here - self.stale.keys())
            ),
            overwritten=tuple(
                sorted((n, why) for n, why in self.stale.items() if n in self.changed_here)
            ),
            from_yours=self._from_yours(steps),
            failed_changes=self._failed_changes(steps),
            failed_setup=self._failed_setup(steps),
            graphless=tuple(sorted(n for n in rebuilt_graphs if n in self.stale)),
            graph_lost=graph_lost,
            rebuilt=tuple(sorted(self.stale.keys() & self.restored)),
        )

    def _regraph(
        self, graphless: Collection[str], target: CellFacts
    ) -> tuple[set[str], tuple[tuple[str, str], ...]]:
        """Restored names that lost their autograd graph: those the failing cell reads
        (``loss.backward()``) are built again by the cell that bound them, where that cell
        changes no other name here (a forward pass); else, or where not read, they stay leaves,
        named: re-running a training step would step the restored model once more."""
        rebuilt, lost = set(), []
        kept = self.present - set(graphless)  # (what a re-run must leave as it is)
        for name in sorted(graphless):
            if name not in target.uses:
                lost.append((name, "the failing cell does not read it"))
                continue
            binder = next(
                (
                    i
                    for i in self._touching(name, self.failing)
                    if name in self.facts[i].defines - self.facts[i].mutates
                ),
                None,
            )
            if binder is None or binder in self.failed:
                lost.append((name, "no cell that ran to its end made it"))
                continue
            made = self.facts[binder]
            others = sorted(made.mutates & kept)
            # What it read as restored is as the later cells left it (``opt.step()`` after
            # the loss was computed): built again from that, it would not be the same.
            read = made.uses & kept
            moved = sorted(
                {n for f in self.facts[binder + 1 : self.failing] for n in f.mutates & read}
            )
            if others:
                lost.append((name, f"the cell that made it also changes {', '.join(others[:6])}"))
            elif moved:
                lost.append((name, f"what it was made from changed later: {', '.join(moved[:6])}"))
            elif self._build_again(name, "restored without its autograd graph"):
                rebuilt.add(name)
        return rebuilt, tuple(lost)

    def _with_later_definitions(self, steps: list[Step]) -> list[Step]:
        """``steps``, where a cell calls a notebook function or class the namespace has that a
        later cell before the failing one bound anew (a helper edited after it was used): the
        one here is the later one, so the cell does what that one does, not what it did when
        it ran. Named, with what the cell makes and what is built from it."""
        rebuilt = self._rebuilt(steps)
        out = []
        for step in steps:
            facts = self.facts[step.index]
            later = sorted(
                name
                for name in facts.calls - facts.defines
                if name in self.present
                and not rebuilt.get(name, self.failing) < step.index
                and any(
                    name in f.defines - f.mutates for f in self.facts[step.index + 1 : self.failing]
                )
            )
            if step.failing or not later:
                out.append(step)
                continue
            made = sorted((facts.defines | facts.mutates) - facts.imports - facts.callables)
            made += self._built_from(made, steps, step.index)
            why = (
                f"calls {', '.join(later)} as a later cell defined "
                f"{'it' if len(later) == 1 else 'them'} anew, not as when it ran"
                + (f": these may differ: {', '.join(made[:12])}" if made else "")
            )
            out.append(replace(step, reasons=(*step.reasons, why)))
        return out

    def _rebuilt(self, steps: Sequence[Step], imports: bool = False) -> dict[str, int]:
        """The names the plan's cells (not the failing one) bind anew, by the first of them;
        with ``imports``, those they import too."""
        found: dict[str, int] = {}
        for step in steps:
            if step.failing:
                continue
            facts = self.facts[step.index]
            for name in (
                facts.defines - (frozenset() if imports else facts.imports) - set(step.keeps)
            ):
                found.setdefault(name, step.index)
        return found

    def _from_yours(self, steps: Sequence[Step]) -> tuple[str, ...]:
        yours = self.changed_here - self.stale.keys()
        if not yours:
            return ()
        # What the plan's cells build from them, and from those in turn (``n = len(losses)``,
        # then ``rate = total / n``).
        followed = set(yours)
        for step in steps:
            facts = self.facts[step.index]
            made = built_on(facts, followed, self.modules) - facts.imports
            made -= facts.callables - facts.derives.keys()  # a class's attributes follow
            followed |= made - set(step.keeps)
        return tuple(sorted(followed - yours))

    def _failed_changes(
        self, steps: Sequence[Step]
    ) -> tuple[tuple[int, tuple[str, ...], tuple[str, ...]], ...]:
        # Imports too: a new process imports a class or module afresh, without what a failed
        # cell set on it (``tqdm.monitor_interval = 0``, ``Registry.add(x)``).
        rebuilt = self._rebuilt(steps, imports=True)
        chosen = {s.index for s in steps}
        found = []
        for index in sorted(self.failed):
            if index in chosen or index >= self.failing:
                continue
            facts = self.facts[index]
            changed = (facts.defines - facts.imports) | self._sharing(facts.mutates, index)
            # An attribute it set (``cfg.lr = 0.5``) the record may not have seen change the
            # object: a property's setter or a descriptor keeps it elsewhere (a global dict),
            # yet reading it back gives what was set.
            changed |= facts.patches - self.modules
            # A class or module put back is one imported afresh (pickled by reference): what
            # the failed cell set on it is not put back with it.
            imported = set().union(*(f.imports for f in self.facts[:index])) & self.present
            # So is the class of an instance put back (``type(model).forward = f``), and of what
            # was made from a library's module the cell patched (``torch.nn.GELU.forward = f``,
            # then ``act``, a ``GELU``): a module the record sees by identity alone.
            patched = facts.patches & self.modules
            through = patched | self._sharing(patched, index)
            imported |= (facts.class_patches | through) & self.present
            # A name only it bound, missing here, that a later cell of the plan reads through
            # ``globals()`` (``globals()[f"lr_{k}"] = v``, then ``sorted(globals())``): no text
            # names it, so no cell is planned for it, and that cell finds it missing.
            absent: Collection[str] = ()
            if any(self.facts[s.index].reads_all for s in steps if s.index > index):
                absent = changed - self.present - rebuilt.keys()
            names = sorted(
                n
                for n in changed | facts.class_patches | through
                if (n in rebuilt and rebuilt[n] < index) or n in imported or n in absent
            )
            if names:
                found.append((index, tuple(names), self._built_from(names, steps, index)))
        return tuple(found)

    def _sharing(self, names: Collection[str], before: int) -> set[str]:
        """The names the cells before ``before`` linked to ``names``, either way and in turn
        (``a = t.numpy()``, ``t = torch.from_numpy(a)``): a change to one, in place, is the
        other's (``a += 1`` moves no version counter of ``t``, which the record would see)."""
        found: set[str] = set()
        todo = list(names)
        while todo:
            name = todo.pop()
            for facts in self.facts[:before]:
                linked = set(facts.links.get(name, ()))
                linked.update(t for t, sources in facts.links.items() if name in sources)
                # (not through a module: ``np.arange`` and ``np.random`` share nothing)
                for other in linked - found - set(names) - facts.imports - self.modules:
                    found.add(other)
                    todo.append(other)
        return found

    def _failed_setup(self, steps: Sequence[Step]) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
        found = []
        for index in self.setup_cells:
            setup = self.facts[index].setup
            # A seed only: each cell the replay runs that drew starts from the state it had.
            if index not in self.failed or all("seed" in p for p in setup.split("; ")):
                continue
            made: set[str] = set()
            for step in steps:
                facts = self.facts[step.index]
                if not step.failing and step.index > index:
                    made |= (facts.defines | facts.mutates) - facts.imports - facts.callables
                    made -= set(step.keeps)
            found.append((index, spelled_here(setup, self.facts[:index]), tuple(sorted(made))))
        return tuple(found)

    def _built_from(
        self, names: Sequence[str], steps: Sequence[Step], after: int
    ) -> tuple[str, ...]:
        """The names the plan's cells after ``after`` build from ``names`` (``total =
        sum(rows)``), and from those in turn: they differ with them."""
        followed, found = set(names), []
        for step in steps:
            facts = self.facts[step.index]
            if step.failing or step.index <= after:
                continue
            made = built_on(facts, followed, self.modules)
            if facts.reads_all:  # (``found = sorted(globals())``: from every name)
                made |= facts.defines
            made -= followed | set(step.keeps) | facts.imports
            made -= facts.callables - facts.derives.keys()  # a class's attributes follow
            followed |= made
            found += sorted(made)
        return tuple(found)

    def _mark_stale(self, name: str, why: str) -> bool:
        """Build ``name`` again for a change the restored one has already, unless the user
        changed it since the restore (then it stays theirs, and the plan says so)."""
        if name in self.changed_here:
            self.yours.setdefault(name, why)
            return False
        self.stale[name] = why
        return True

    def _build_again(self, name: str, why: str) -> bool:
        """``name`` built again from the cells up to the failing one, for ``why``; False where
        it stays the user's (``_mark_stale``)."""
        if not self._mark_stale(name, why):
            return False
        self.need(name, self.failing, self.failing)
        return True

    def _protect(self) -> None:
        """What the namespace has stays as it is, unless the plan says it is built again. A
        restored object that a cell of the plan changes in place already has that change (the
        previous kernel made it before the restart): built again from the cells before, or it
        would have it twice. A name a cell of the plan binds anew is put back after the cell
        (``Step.keeps``), unless a name the cell rebuilds is built from the new one (``ds =
        TensorDataset(x, labels)`` after ``labels = ...``): then the restored one gives way."""
        for index in sorted(self.reasons):
            if index == self.failing:
                continue
            facts = self.facts[index]
            for name in sorted(facts.mutates & self.restored - self.stale.keys()):
                if self._counts(name, facts) and self._mark_stale(name, CHANGED_ALREADY):
                    # Looked up again: it was found kept before it was stale.
                    self.pending.append((name, index, index))
            rebuilt = facts.defines - facts.imports - (self.present - self.stale.keys())
            for name in sorted(self._rebound(facts) - facts.callables):
                # Put back after this cell, the one here would be what the cells of the plan
                # up to a later change read (``steps = 0``, then ``step()`` bumping it): built
                # again instead, with that change.
                if self._read_before_changed(name, index) and self._build_again(
                    name, READ_BEFORE_CHANGED
                ):
                    continue
                built = sorted(n for n in rebuilt if name in facts.links.get(n, ()))
                if built:
                    self.stale[name] = "the one here gave way"
                    self.reasons[index].append(
                        f"defines {name} again ({', '.join(built[:MAX_REASONS])} "
                        "built from it here; the one here gives way)"
                    )

    def _read_before_changed(self, name: str, index: int) -> bool:
        """Whether a cell of the plan after ``index`` may read ``name`` before the last cell
        that changes it again (itself included): by name, or through a function it calls."""
        last = self._changed_from(name, index + 1)
        if last is None:
            return False
        for later in sorted(self.reasons):
            if later <= index:
                continue
            if later > last:
                break
            facts = self.facts[later]
            if name in facts.uses or facts.reads_all or facts.opaque:
                return True
            if facts.calls and not facts.calls.isdisjoint(self.functions):
                return True  # a function or class of the notebook's (it may read the name)
        return False

    def _rebound(self, facts: CellFacts) -> set[str]:
        """The names the namespace has (and keeps) that ``facts`` binds anew."""
        bound = facts.defines - facts.mutates - facts.imports
        return set(bound & self.present - self.stale.keys())

    def _step(self, index: int, reasons: list[str]) -> Step:
        facts = self.facts[index]
        keeps = tuple(sorted(self._rebound(facts)))
        # Put back from its class/def on, unless the cell sets attributes on it after
        # (``log_step.n = 0``, ``CFG.lr = 1``): those would reset the kept one's; it is put
        # back after the cell, as it is.
        defs = tuple(n for n in keeps if n in facts.callables and n not in facts.patches)
        return Step(index, tuple(dict.fromkeys(reasons)), keeps=keeps, defs=defs)

    def _draws(self) -> None:
        """After a seed, what a cell draws depends on every draw before it: the cells between
        the seed and a cell of the plan that draws, which the plan skips, draw again (a cell
        run twice, a peek at a batch). Without a seed the draws differ anyway: said."""
        drawing = [i for i in sorted(self.reasons) if self.facts[i].draws]
        for index in drawing:
            seed = self.seed_cells[: bisect_left(self.seed_cells, index)]
            if not seed or seed[-1] in self.failed:
                self.unseeded.add(index)
                continue
            for skipped in range(seed[-1] + 1, index):
                facts = self.facts[skipped]
                if facts.draws and skipped not in self.reasons and skipped not in self.failed:
                    self._include(
                        skipped,
                        f"draws random numbers ({facts.draws}) after the seed: the later "
                        "draws follow it",
                        self.failing,
                    )

    def _propagate(self) -> None:
        """One pass over the cells before the failing one: which objects are rebuilt (a name
        a chosen cell binds, not kept), which names hold them or were built from them (the
        cells' links), which containers hold them (the cells' stores), and the cells that
        change one of those: they are chosen too. Linear in the cells and their links, whatever
        the number of names followed."""
        holds: dict[str, set[str]] = {}  # name -> the rebuilt names its object is linked to
        inside: dict[str, set[str]] = {}  # container -> the rebuilt names stored in it
        for index in range(self.failing + 1):
            facts = self.facts[index]
            changed = facts.mutates & holds.keys() if holds else frozenset()
            if inside:
                changed |= facts.mutates & inside.keys()
            if changed and index not in self.failed and index != self.failing:
                for name in sorted(changed):
                    if self._counts(name, facts):
                        reached = _reached(name, facts, holds, inside) if inside else holds[name]
                        for rebuilt in sorted(reached):
                            through = "" if rebuilt == name else f" through {name}"
                            self._include(index, f"changes {rebuilt}{through}", self.failing)
            if changed and (index in self.reasons or index == self.failing):
                # A kept (restored) object built from one we rebuild is the old one's partner:
                # ``opt.step()`` on it would step the old model's parameters; a kept list that
                # held the old model would train that one. Built again.
                for name in sorted(changed & self.present):
                    reached = _reached(name, facts, holds, inside)
                    if reached and name not in self.stale:
                        self.stale[name] = (
                            f"the one here was built from the {min(reached)} replaced"
                        )
                        self.need(name, index, index)
            if index == self.failing:
                break
            rebuilt_here: frozenset[str] = frozenset()
            if index in self.reasons:
                rebuilt_here = facts.defines - facts.callables - facts.imports
                rebuilt_here -= self.present - self.stale.keys()
            if inside or facts.stores:
                self._carry_held(holds, inside, facts, rebuilt_here)
            else:
                self._carry(holds, facts, rebuilt_here)

    def _carry(self, holds: dict[str, set[str]], facts: CellFacts, rebuilt: frozenset[str]) -> None:
        """What the names hold after a cell: a name the cell rebuilds holds itself; a name bound
        anew holds what its sources held (``opt = AdamW(model.parameters())``, ``model =
        model.to(dev)``), or nothing."""
        for name in facts.deletes:
            holds.pop(name, None)
        for name in rebuilt:
            holds[name] = {name}
        if not holds:
            return
        for name in facts.defines - facts.mutates:
            sources = facts.links.get(name, frozenset())
            linked = {name} if name in rebuilt else set()
            if name not in self.modules:
                for source in sources & holds.keys():
                    linked |= holds[source]
            if linked:
                # A few are enough to say why; the choice only needs one.
                holds[name] = set(sorted(linked)[:MAX_REASONS])
            else:
                holds.pop(name, None)  # a new object from here on

    def _carry_held(
        self,
        holds: dict[str, set[str]],
        inside: dict[str, set[str]],
        facts: CellFacts,
        rebuilt: frozenset[str],
    ) -> None:
        """``_carry``, where containers hold rebuilt objects or the cell stores into one: a
        name built from a container also holds what it held (``first = models[0]``); a
        container the cell stores into holds the stored objects too (``models.append(model)``),
        as they were before the cell rebinds any (``models.append(model)`` then ``model =
        Net()`` stores the old one) and after."""
        bound = facts.defines - facts.mutates
        stored = {c: self._held(v, holds, inside) for c, v in facts.stores.items()}
        taken = self._taken(bound, facts, inside)
        self._carry(holds, facts, rebuilt)
        for name, held in taken.items():
            if name not in self.modules:
                holds[name] = set(sorted(holds.get(name, set()) | held)[:MAX_REASONS])
        for name in bound | facts.deletes:
            inside.pop(name, None)  # a new object: it holds nothing yet
        for container, values in facts.stores.items():
            held = stored[container] | self._held(values, holds, inside)
            if held and container not in self.modules:
                held |= inside.get(container, set())
                inside[container] = set(sorted(held)[:MAX_REASONS])

    @staticmethod
    def _taken(
        bound: frozenset[str], facts: CellFacts, inside: dict[str, set[str]]
    ) -> dict[str, set[str]]:
        """For each name bound anew: the rebuilt names held by the containers it was built
        from (``first = models[0]``, ``for m in models``), as they were before the cell."""
        taken: dict[str, set[str]] = {}
        for name in bound:
            for source in facts.links.get(name, frozenset()) & inside.keys():
                taken.setdefault(name, set()).update(inside[source])
        return taken

    @staticmethod
    def _held(
        names: Collection[str], holds: dict[str, set[str]], inside: dict[str, set[str]]
    ) -> set[str]:
        """The rebuilt names the objects of ``names`` are linked to or hold."""
        found: set[str] = set()
        for name in names:
            if name in holds:
                found |= holds[name]
            if name in inside:
                found |= inside[name]
        return found

    def _touching(self, name: str, before: int, opaque: bool = False) -> Iterator[int]:
        """The cells before ``before`` that touch ``name`` (and, with ``opaque``, the opaque
        ones), latest first."""
        cells = self.touch.get(name, [])
        found = cells[: bisect_left(cells, before)]
        if opaque:
            others = self.opaque_cells[: bisect_left(self.opaque_cells, before)]
            found = sorted(set(found) | set(others)) if others else found
        return reversed(found)

    def need(self, name: str, before: int, deferred_at: int) -> None:
        if (name, before, deferred_at) not in self.seen:
            self.seen.add((name, before, deferred_at))
            self.pending.append((name, before, deferred_at))

    def drain(self) -> None:
        while self.pending:
            self._resolve(*self.pending.pop())

    def _include(self, index: int, reason: str, deferred_at: int) -> None:
        first = index not in self.reasons
        self.reasons.setdefault(index, []).append(reason)
        facts = self.facts[index]
        for name in sorted(facts.deferred):  # what the functions it defines read, when called
            self.need(name, deferred_at, deferred_at)
        if first and index != self.failing:
            for name in sorted(facts.uses):
                self.need(name, index, index)

    def _counts(self, name: str, facts: CellFacts) -> bool:
        """Whether this cell binds or changes ``name`` as far as the plan cares."""
        if name not in facts.defines:
            return False
        only_mutated = name in facts.mutates and name not in facts.defines - facts.mutates
        return not (only_mutated and name in self.modules)  # torch.manual_seed(0) & co.

    def _binds(self, name: str, before: int) -> bool:
        return any(self._counts(name, self.facts[i]) for i in self._touching(name, before))

    def _changed_from(self, name: str, start: int) -> int | None:
        """The last cell from ``start`` on, before the failing one, that binds or changes
        ``name``, where a restore brought back the value that cell left; None if none does
        (then what the restore brought back is what ``start`` met), and for a notebook
        function or class (kept as defined: replay/definitions.py; a later definition is
        named, ``_with_later_definitions``)."""
        if name not in self.restored:
            return None
        if name in self.functions:
            return None
        cells = self.touch.get(name, [])
        for index in reversed(cells[bisect_left(cells, start) : bisect_left(cells, self.failing)]):
            if self._counts(name, self.facts[index]):
                return index
        return None

    def _reads(self, name: str, index: int) -> bool:
        """Whether cell ``index`` (before the failing one) may read the ``name`` it met: not
        where it binds the name without reading it first (then what needed the name is a
        function the cell defines, which reads it when called, whatever it is then)."""
        if index >= self.failing:
            return False
        facts = self.facts[index]
        return name in facts.uses or name not in facts.defines

    def _resolve(self, name: str, before: int, deferred_at: int) -> None:
        if name in self.present and name not in self.stale:
            # The one here is as the last cell before the failing one left it: a cell of the
            # plan that read it before that cell (``old = cfg['lr']`` before ``cfg = {...}``,
            # ``steps = steps + 1``) would read the later value. It is built again for it.
            later = self._changed_from(name, before) if self._reads(name, before) else None
            if later is not None and self._build_again(
                name, CHANGED_ALREADY if later == before else READ_BEFORE_CHANGED
            ):
                self._resolve(name, before, deferred_at)
                return
            self.kept.add(name)
            # A kept function still reads its globals when it is called.
            for index in self._touching(name, before):
                facts = self.facts[index]
                if name in facts.defines - facts.mutates:
                    for other in sorted(facts.deferred):
                        self.need(other, deferred_at, deferred_at)
                    break
            return
        if name in _BUILTINS and not self._binds(name, before):
            return
        fallback: int | None = None
        for index in self._touching(name, before, opaque=True):
            facts = self.facts[index]
            if name in facts.deletes:
                return  # it did not exist at this point: nothing to rebuild
            if facts.opaque and index not in self.failed:
                self._include(index, f"may define {name} ({facts.opaque})", deferred_at)
            if not self._counts(name, facts):
                continue
            if index in self.failed:  # it may have raised before binding it
                fallback = index if fallback is None else fallback
                continue
            reason = _reason(name, facts)
            if name in self.stale:
                reason += f" again ({self.stale[name]})"
            self._include(index, reason, deferred_at)
            return
        if fallback is not None:
            self._include(fallback, f"rebuilds {name} (this cell failed before)", deferred_at)
        elif bisect_left(self.opaque_cells, before) == 0 and not _binds_plainly(
            name, self.facts[before]
        ):
            # (A function that cell calls may read what the cell itself bound before the call.)
            self.unresolved.add(name)


def spelled_here(setup: str, facts: Sequence[CellFacts]) -> str:
    """``setup`` with the notebook's own names for the modules it names: the record reads a
    setting by the library's name (``numpy.set_printoptions``, even when a notebook method set
    it), which the cells know as ``np``."""
    spelled: dict[str, set[str]] = {}
    for cell in facts:
        for name, dotted in cell.imported_as.items():
            if name != dotted and re.search(rf"(?<![\w.]){re.escape(dotted)}\.", setup):
                spelled.setdefault(dotted, set()).add(name)
    if not spelled:
        return setup
    return "; ".join(
        [setup, *(f"{m} is {' and '.join(sorted(n))} here" for m, n in sorted(spelled.items()))]
    )


def _reached(
    name: str, facts: CellFacts, holds: dict[str, set[str]], inside: dict[str, set[str]]
) -> set[str]:
    """The rebuilt names that ``facts``' change of ``name`` changes: what ``name``'s object is
    linked to, and what it holds unless the cell only stored into it."""
    reached = holds.get(name, set())
    if name in inside and name not in facts.filled:
        reached = reached | inside[name]
    return reached


def _binds_plainly(name: str, facts: CellFacts) -> bool:
    return name in facts.defines and name not in facts.mutates


def _reason(name: str, facts: CellFacts) -> str:
    if name in facts.imports:
        return f"imports {name}"
    if name in facts.mutates and name not in facts.defines - facts.mutates:
        return f"changes {name}"
    return f"defines {name}"


def joined(facts: CellFacts, record: CellRecord | None) -> CellFacts:
    """A cell's facts from its text, joined with what it was seen to do when it ran: the names it
    bound, changed in place (``train_result = trainer.train()`` changed ``model``; what it did
    not change, though its text suggests so, is dropped) or deleted,
    the settings it changed (then it always runs again, as a seed does). Its draws count only
    where its random state was not kept: a replay starts it from that state."""
    if record is None:
        return facts
    # A name a call wrote into that the record could not see whole is a stream it wrote to
    # (``torch.save(sd, buf)`` into an ``io.BytesIO``); one seen whole is a path, unchanged.
    changed = record.changed | (facts.written & record.unseen)
    setup = facts.setup
    settings = record.settings
    if record.environ or record.cwd:  # a failed cell's, set again from the record: not named
        setup = _without_set_again(setup, record)
        settings = tuple(s for s in settings if s not in record.set_again)
    if settings:
        setup = "; ".join(filter(None, [setup, "changes " + ", ".join(settings)]))
    draws = facts.draws
    if record.rng or not record.drew:
        draws = ""
    elif not draws:
        draws = "drew from " + ", ".join(record.drew) + " when it ran"
    # What the text took for a change in place (``labels.add_(offset)`` hands ``offset`` to a
    # method) of a name the record saw whole and unchanged was none: the record wins. Names it
    # does not see (``_x``, IPython's) and those it could not see whole keep the text's guess,
    # as do changes through ``.data`` or ``.numpy()``, which no version counter counts.
    guessed = facts.mutates - changed - record.bound - record.unseen - record.deleted
    guessed -= facts.untracked
    unchanged = {n for n in guessed if n[:1] != "_"}
    assigned = facts.defines - facts.mutates  # bound by an assignment: not a guess
    return replace(
        facts,
        defines=(facts.defines - (unchanged - assigned)) | record.bound | changed,
        uses=facts.uses | changed,  # a change in place is a read and a redefinition
        mutates=(facts.mutates - unchanged) | changed,
        deletes=facts.deletes | record.deleted,
        setup=setup,
        draws=draws,
    )


# What the text says of a cell's environment and directory (analysis.py's setup parts): all
# of it is in the record of a failed cell that changed them (the record reads every variable).
# Not ``%cd``, ``%pushd``, ``%popd``: IPython keeps their directories in ``_dh`` and its stack
# too (``%cd -`` goes back by them), which the directory set again does not fill.
_ENVIRON_PARTS = re.compile(r".*\bos\.environ\)?$|%env\b.*|%set_env\b.*")
_CWD_PARTS = re.compile(r"calls (os\.)?chdir\(\)")


def _without_set_again(setup: str, record: CellRecord) -> str:
    covered = []
    if record.environ:
        covered.append(_ENVIRON_PARTS)
    if record.cwd:
        covered.append(_CWD_PARTS)
    parts = [p for p in setup.split("; ") if p and not any(c.fullmatch(p) for c in covered)]
    return "; ".join(parts)


def numbered(facts: Sequence[CellFacts], counts: Sequence[int | None]) -> list[CellFacts]:
    """The cells' facts with the history names each binds by its number in the previous kernel
    (``_i3``; ``_3`` where it showed a value), which a replay binds again."""
    out = []
    for cell, count in zip(facts, counts, strict=True):
        if count is not None:
            names = {f"_i{count}", f"_{count}"} if "_" in cell.defines else {f"_i{count}"}
            cell = replace(cell, defines=cell.defines | names)
        out.append(cell)
    return out


def with_records(
    plan: Plan, facts: Sequence[CellFacts], records: Sequence[CellRecord | None]
) -> Plan:
    """``plan``, saying which of its cells were planned from their text alone (no record) and
    which names it rebuilds could not be compared whole when they ran."""
    unrecorded = tuple(s.index for s in plan.steps if records[s.index] is None)
    rebuilt = {n for s in plan.steps for n in facts[s.index].defines}
    unseen = {n for r in records if r is not None for n in r.unseen} & rebuilt
    run, last = set(plan.indices), max(plan.indices, default=-1)
    set_again = tuple(
        (index, _what_is_set(record))
        for index, record in enumerate(records)
        if record is not None
        and (record.environ or record.cwd)
        and index not in run
        and index < last
    )
    return replace(plan, unrecorded=unrecorded, unseen=tuple(sorted(unseen)), set_again=set_again)


def _what_is_set(record: CellRecord) -> str:
    parts = []
    if record.environ:  # the variables' names only: their values may be secrets
        parts.append("os.environ " + ", ".join(key for key, _ in record.environ[:12]))
    if record.cwd:
        parts.append("the working directory")
    return "; ".join(parts)


def built_on(cell: CellFacts, names: Collection[str], modules: Collection[str] = ()) -> set[str]:
    """The names ``cell`` builds from ``names``: by its links (``total = sum(rows)``), by what
    it derives without a link (``n = len(rows)``, ``if rows: ok = True``; not ``modules``,
    whose functions keep nothing of what they are handed: ``torch.save(w, path)``), and the
    containers it stores them in (``runs.append(t0)``)."""
    made: set[str] = set()
    followed = set(names)
    while True:  # and what it builds from those in turn (``rng.shuffle(perm)``, ``k = perm[0]``)
        found = {n for n, sources in cell.links.items() if not sources.isdisjoint(followed)}
        found |= {
            n
            for n, sources in cell.derives.items()
            if n not in modules and not sources.isdisjoint(followed)
        }
        found |= {n for n, held in cell.stores.items() if not held.isdisjoint(followed)}
        if found <= made:
            return made
        made |= found
        followed |= found


def with_unrepeatable(
    plan: Plan,
    facts: Sequence[CellFacts],
    sets_here: Collection[str] = (),
    orders_vary: bool = True,
    walk: Callable[[int], Unrepeatable] | None = None,
) -> Plan:
    """``plan``, saying which of its cells read what a new process cannot read the same: the
    clock, the process's id, the OS's randomness; and, where ``orders_vary`` (string hashing
    is not fixed), a set in its order (one they build, a name that holds one: bound to a set by
    an earlier cell, or ``sets_here``, the namespace's; or an attribute some cell binds to a
    set); or call a notebook function or class that does; and which names the plan rebuilds
    follow them: what those cells bind or change, and what the plan's later cells build from
    that. ``walk``: a cell's reads found whole, for the cells whose walk was spared
    (``Unrepeatable.complete``), where some name or attribute holds a set."""
    before = facts[: plan.steps[-1].index]
    modules = module_names(facts)
    sets = set(sets_here).union(*(c.unrepeatable.sets for c in before))
    attributes = set().union(*(c.unrepeatable.attribute_sets for c in before))
    walked: dict[int, Unrepeatable] = {}

    def reads_of(index: int) -> Unrepeatable:
        reads = facts[index].unrepeatable
        if reads.complete or walk is None or not orders_vary or not (sets or attributes):
            return reads
        if index not in walked:
            walked[index] = walk(index)
        return walked[index]

    def why(reads: Unrepeatable, inner: bool) -> list[str]:
        varying = reads.varying_when_called if inner else reads.varying
        concurrent = reads.concurrent_when_called if inner else reads.concurrent
        found = [r for r in (varying, concurrent) if r]
        if orders_vary:
            builds = reads.builds_when_called if inner else reads.builds
            found += [builds] if builds else []
            if not inner:
                found += [f"reads {n}, a set, in order" for n in sorted(reads.iterated & sets)]
            read = reads.attributes_iterated_when_called if inner else reads.attributes_iterated
            found += [f"reads .{a}, a set, in order" for a in sorted(read & attributes)]
        return found

    # The notebook's functions and classes that read one when called, and what they read.
    callables: dict[str, str] = {}
    starters: set[str] = set()  # those of them that start a thread or a task when called
    for index, cell in enumerate(before):
        if not cell.callables:
            continue
        reads = reads_of(index)
        inner = why(reads, inner=True)
        if inner:
            callables.update(dict.fromkeys(cell.callables, "; ".join(inner)))
            if reads.concurrent_when_called:
                starters.update(cell.callables)
            else:
                starters.difference_update(cell.callables)
    chosen = {s.index: s for s in plan.steps if not s.failing}
    found: list[tuple[int, str]] = []
    names: set[str] = set()

    def run_beside(index: int) -> set[str]:
        """What the functions a cell that starts a thread or task hands out or calls change
        (``Thread(target=log)``, ``ensure_future(tick())``): its record sees their changes
        only at the end of whichever cell ran while they did, often another."""
        cell = facts[index]
        then: dict[str, Effects] = {}  # the notebook's functions, as defined before the cell
        for earlier in facts[:index]:
            then.update(earlier.effects)
        started = cell.calls.union(*cell.handed.values()) & then.keys()
        while True:  # (and what the functions they call hand out: ``Thread(target=log)``)
            more = {n for f in started for h in then[f].handed.values() for n in h} & then.keys()
            if more <= started:
                done = _closure(started, then, modules)
                return set(done.assigns | done.mutates) - modules
            started |= more

    # A thread or task started by a cell the plan does not run ran on in the previous kernel
    # (maybe past the failure): what it changed is kept as it was then, or rebuilt by the
    # cells whose ends saw its changes, and nothing here runs it (``threading.Thread(target=
    # log).start()``, then a restore of ``metrics``); so is what the plan builds from those.
    here = set(plan.kept).union(*(facts[i].defines | facts[i].mutates for i in chosen))
    running: dict[str, int] = {}
    for index, cell in enumerate(before):
        if index in chosen or not (cell.unrepeatable.concurrent or cell.calls & starters):
            continue
        if reads_of(index).concurrent or cell.calls & starters:
            changed = (cell.defines | cell.mutates | run_beside(index)) - cell.imports
            for name in sorted(changed - cell.callables - modules):
                running.setdefault(name, index)
    for index in sorted(chosen):
        cell = facts[index]
        reads = reads_of(index)
        reasons = why(reads, inner=False)
        reasons += [
            f"calls {n}(), which {callables[n]}" for n in sorted(cell.calls) if n in callables
        ]
        # The namespace itself (``%who_ls``, ``sorted(globals())``): here it holds what was kept
        # or restored, and lacks what no planned cell rebuilds, unlike when the cell first ran.
        if cell.reads_all:
            reasons.append("reads the whole namespace, which holds other names here")
        # This kernel's names no cell rebuilds (IPython's ``_i``, ``_ii``: its own inputs).
        reasons += [f"reads {n}, not rebuilt" for n in sorted(cell.uses & set(plan.unresolved))]
        if reasons:
            found.append((index, "; ".join(reasons)))
            if reads.concurrent:
                own = set(cell.defines | cell.mutates) | run_beside(index)
            elif reads.varying and reasons == [reads.varying]:
                # The clock's value alone: not what the cell timed. Not a module a call
                # reseeded (``torch.seed()``): the replay sets its generator's state back
                # before each later cell; what this cell drew from it is named.
                own = set(reads.differs) - modules
            else:  # which of them follow a set's order, its text cannot say
                own = set(cell.defines | cell.mutates)
        else:
            own = set()
        made = own | built_on(cell, names, modules)
        made -= cell.imports | reads.sets | set(chosen[index].keeps)
        made -= cell.callables - cell.derives.keys()  # a class's attributes follow
        names |= made
        if running:
            first = min(running.values())
            for name in built_on(cell, running.keys(), modules) - made - cell.imports:
                running.setdefault(name, first)
    # A kept value equals the one before the failure, but one made from object addresses (or
    # string hashes, where those vary) no longer matches the objects and strings of this
    # process: ``names[id(p)]`` misses for the restored ``p``.
    foreign = []
    for name in plan.kept:
        last = next((j for j in reversed(range(len(before))) if name in before[j].defines), None)
        if last is None:
            continue
        reads = reads_of(last)
        if not reads.complete and walk is not None:
            reads = walked.setdefault(last, walk(last))
        hashed = orders_vary and "string hashing" in reads.builds
        if (ADDRESS in reads.varying and name in reads.differs) or hashed:
            what = "object addresses" if ADDRESS in reads.varying else "string hashes"
            foreign.append((name, last, what))
    return replace(
        plan,
        unrepeatable=tuple(found),
        unrepeatable_names=tuple(sorted(names)),
        kept_foreign=tuple(foreign),
        kept_running=tuple((n, i) for n, i in sorted(running.items()) if n in here - names),
    )


def with_files(plan: Plan, facts: Sequence[CellFacts], uses: Sequence[FileUse]) -> Plan:
    """``plan``, saying also which of its cells find a file otherwise than when they first ran
    (``uses``: each cell's, ``paths.file_uses``), and which files it leaves otherwise than the
    previous kernel did. A cell reads what the last cell to write the path before it wrote: in
    the replay, the last of the plan's cells before it; where none, the last cell of the
    previous kernel's. What a cell that finds a file otherwise makes may differ, and so does
    what the plan's later cells build from it. So does what a cell makes from a file that a
    cell run again wrote anew from a name that may differ (``torch.save(w, p)`` after a failed
    cell changed ``w``, then ``w2 = torch.load(p)``): the file carries the difference. A path
    appended to by a cell run again holds those lines twice."""
    failing = plan.steps[-1].index
    chosen = {s.index: s for s in plan.steps if not s.failing}
    modules = module_names(facts)
    differ = {n for _, changed, built in plan.failed_changes for n in (*changed, *built)}
    differ |= {n for n, _ in (*plan.yours, *plan.overwritten)}
    differ |= {n for n, _, _ in plan.kept_foreign}
    differ |= {n for n, _ in plan.kept_running}
    differ |= {*plan.from_yours, *plan.twice}
    carried: dict[str, set[str]] = {}  # path -> the names that may differ it was written from

    def writers(path: str, cells: Iterable[int]) -> list[int]:
        return [j for j in cells if path in uses[j].writes | uses[j].appends]

    def left_by(path: str, before: int) -> tuple[int | None, bool]:
        """The cell whose write a reader at ``before`` finds in the replay, and whether the
        replay appended to the path by then."""
        replayed = writers(path, (j for j in sorted(chosen) if j < before))
        if replayed:
            return replayed[-1], any(path in uses[j].appends for j in replayed)
        last = writers(path, range(failing))
        return (last[-1] if last else None), False

    found = dict(plan.unrepeatable)
    names = set(plan.unrepeatable_names)
    for index in sorted(chosen):
        cell = facts[index]
        why = []
        for path in sorted(uses[index].reads):
            first = writers(path, range(index))
            writer, appended = left_by(path, index)
            if appended:
                why.append(f"reads {path}, which a cell run again appended to again")
            elif writer != (first[-1] if first else None):
                why.append(f"reads {path}, which a later cell wrote over since it first ran")
            elif writer in chosen and carried.get(path):
                written_from = ", ".join(sorted(carried[path]))
                why.append(f"reads {path}, which a cell run again wrote anew from {written_from}")
        for directory in sorted(uses[index].lists):
            # A listing (``glob``, ``os.listdir``) finds the files later cells added to the
            # directory before the failure: they are on disk when the replay lists it again.
            earlier = {p for j in range(index) for p in uses[j].writes | uses[j].appends}
            added = sorted(
                p
                for j in range(index + 1, failing)
                for p in uses[j].writes | uses[j].appends
                if lies_in(p, directory) and p not in earlier
            )
            removed = sorted(
                p
                for j in range(index + 1, failing)
                for p in uses[j].removes
                if lies_in(p, directory) or p == directory
            )
            if added:
                why.append(f"lists {directory}, where a later cell put {added[0]} since it ran")
            elif removed:
                why.append(f"lists {directory}, where a later cell removed {removed[0]} since")
        # A program another cell ran (``!python gen.py``) may have written what this one
        # reads: one run after it before the failure (the file holds its writes), or one the
        # replay runs again before it (it writes them again). (A module's ``.py`` aside.)
        runners = [j for j in range(failing) if uses[j].runs and j != index]
        runner = next((j for j in runners if j > index or j in chosen), None)
        files = sorted(p for p in uses[index].reads | uses[index].lists if not p.endswith(".py"))
        if runner is not None and files:
            program = sorted(uses[runner].runs)[0]
            why.append(f"reads {files[0]}, which another cell's program ({program}) may write")
        if why:
            found[index] = "; ".join(filter(None, [found.get(index, ""), *why]))
            made = set(cell.defines | cell.mutates) - cell.imports - cell.callables
        else:
            made = built_on(cell, names, modules)
        names |= made - set(chosen[index].keeps)
        # What it writes now is written from what it reads (the names, or another file)
        read = cell.uses & (differ | names)
        read |= {n for p in uses[index].reads for n in carried.get(p, ())}
        for path in uses[index].writes | uses[index].appends:
            if path in uses[index].writes:
                carried[path] = set()
            carried.setdefault(path, set()).update(read)
    changed = []
    for path in sorted({p for j in chosen for p in uses[j].writes | uses[j].appends}):
        writer, appended = left_by(path, failing)
        last = writers(path, range(failing))[-1]
        if appended:
            changed.append(
                (path, "appended to again by a cell run again (it holds those lines twice)")
            )
        elif writer != last:
            changed.append((path, "written again by a cell run again, not as later cells left it"))
    return replace(
        plan,
        unrepeatable=tuple(sorted(found.items())),
        unrepeatable_names=tuple(sorted(names)),
        files_changed=tuple(changed),
    )
