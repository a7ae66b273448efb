"""What one cell binds, reads and changes, table-driven, through the real shell's own
``transform_cell`` exactly as the glue analyses a saved cell (``runnable_source`` first, then
``analyse_cell``). Each row states what must be among a fact set and what must not."""

from __future__ import annotations

import ast
from dataclasses import dataclass

import pytest

from nb_cudaguard.replay.analysis import (
    SKIPPED,
    CellFacts,
    analyse,
    analyse_cell,
    quick_transform,
    runnable_source,
)


@dataclass(frozen=True)
class Row:
    id: str
    cell: str
    defines: tuple[str, ...] = ()
    not_defines: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    not_uses: tuple[str, ...] = ()
    mutates: tuple[str, ...] = ()
    not_mutates: tuple[str, ...] = ()
    deletes: tuple[str, ...] = ()
    opaque: bool = False
    setup: bool = False


ROWS = [
    # --- IPython syntax, after the real transform ---------------------------------------------
    Row("time-line-magic-assigns", "%time x = f(a)", defines=("x",), uses=("f", "a")),
    Row(
        # an EMA update: the pairs are made by ``zip``, which holds nothing the loop changes
        "a-builtin-making-the-loop-pairs-is-not-changed",
        "for pe, p in zip(ema.parameters(), model.parameters()):\n    pe.mul_(0.9)",
        mutates=("ema",),
        not_mutates=("zip",),
        not_defines=("zip",),
    ),
    Row("time-line-magic-result-assigned", "x = %time f(a)", defines=("x",), uses=("f", "a")),
    Row(
        "time-cell-magic-body",
        "%%time\nmodel = build(cfg)",
        defines=("model",),
        uses=("build", "cfg"),
    ),
    Row(
        "time-line-magic-loop-changes",
        "%time for i in range(3): total += i",
        mutates=("total",),
        uses=("total",),
    ),
    Row("shell-output-assigned", "files = !ls $folder", defines=("files",), uses=("folder",)),
    Row(
        "shell-command-expands-braces",
        "!echo {prefix + suffix}",
        uses=("prefix", "suffix"),
        not_defines=("prefix",),
    ),
    Row("capture-binds-its-name-and-runs-its-body", "%%capture out\ny = 2", defines=("out", "y")),
    Row("capture-with-options", "%%capture --no-stderr out\ny = 2", defines=("out", "y")),
    Row("prun-body-is-python", "%%prun -s cumtime\nz = g()", defines=("z",), uses=("g",)),
    Row(
        "cudacheck-body-is-python", "%%cudacheck\ny = model(x)", defines=("y",), uses=("model", "x")
    ),
    Row("timeit-body-binds-nothing-here", "%%timeit\ny = 1", not_defines=("y",)),
    Row("bash-binds-nothing", "%%bash\necho hi", not_defines=("echo",)),
    Row("writefile-binds-nothing", "%%writefile f.py\nx = 1", not_defines=("x",)),
    Row("run-is-opaque", "%run setup.py", opaque=True),
    Row("store-r-is-opaque", "%store -r data", opaque=True),
    Row("unknown-cell-magic-is-opaque", "%%sql\nselect 1", opaque=True),
    Row("cd-is-setup", "%cd /tmp", setup=True),
    Row("env-set-is-setup", "%env A=1", setup=True),
    Row("help-syntax-binds-nothing", "x?", not_defines=("x",)),
    Row("load-ext-line-is-skipped", "%load_ext nb_cudaguard\nk = 1", defines=("k",)),
    # --- Python scopes ---------------------------------------------------------------------------
    Row("import-dotted-binds-the-package", "import a.b.c", defines=("a",), not_defines=("b", "c")),
    Row("import-as-binds-the-alias", "import a.b as ab", defines=("ab",), not_defines=("a",)),
    Row("walrus", "if (n := f()) > 1:\n    pass", defines=("n",)),
    Row(
        "walrus-in-comprehension-binds-outside",
        "[y := v for v in vs]",
        defines=("y",),
        not_defines=("v",),
    ),
    Row(
        "comprehension-target-is-local",
        "ys = [v * k for v in vs]",
        defines=("ys",),
        not_defines=("v",),
        uses=("vs", "k"),
    ),
    Row(
        "async-comprehension-target-is-local", "ys = [a async for a in agen()]", not_defines=("a",)
    ),
    Row("top-level-await", "r = await fetch(url)", defines=("r",), uses=("fetch", "url")),
    Row("del-removes", "del old", deletes=("old",), not_defines=("old",)),
    Row("del-item-changes", "del cache[k]", mutates=("cache",)),
    Row("augmented-name-changes-in-place", "t += 1", mutates=("t",), uses=("t",)),
    Row("augmented-attribute-changes", "model.steps += 1", mutates=("model",)),
    Row("for-target", "for row in rows:\n    pass", defines=("row",), uses=("rows",)),
    Row(
        "with-as-target",
        "with open(p) as fh:\n    data = fh.read()",
        defines=("fh", "data"),
        uses=("p",),
        not_uses=("fh",),
    ),
    Row("except-as", "try:\n    pass\nexcept E as err:\n    pass", defines=("err",), uses=("E",)),
    Row(
        "match-captures",
        "match cmd:\n    case {'lr': lr, **rest}:\n        pass\n"
        "    case [first, *others]:\n        pass\n    case Point(x=px) as pt:\n        pass",
        defines=("lr", "rest", "first", "others", "px", "pt"),
        uses=("cmd", "Point"),
    ),
    Row(
        "decorator-is-read",
        "@cache(size)\ndef f():\n    return w",
        defines=("f",),
        uses=("cache", "size"),
        not_uses=("w",),
    ),
    Row(
        "class-body-reads-now-binds-nothing-outside",
        "class C(Base):\n    k = scale * 2",
        defines=("C",),
        uses=("Base", "scale"),
        not_defines=("k",),
    ),
    Row(
        "function-globals-are-not-read-at-definition",
        "def f():\n    return w",
        defines=("f",),
        not_uses=("w",),
    ),
    Row(
        "global-in-a-function-binds-nothing-at-definition",
        "def f():\n    global g\n    g = 1",
        defines=("f",),
        not_defines=("g",),
    ),
    # --- changes through calls -----------------------------------------------------------------
    Row("method-call-changes", "opt.step()", mutates=("opt",)),
    Row("read-only-method-changes-nothing", "df.head()", not_mutates=("df",)),
    Row(
        "plain-function-changes-its-arguments", "train(model, loader)", mutates=("model", "loader")
    ),
    Row("builtin-reads-only", "print(model)\nlen(data)", not_mutates=("model", "data")),
    Row("next-advances-the-iterator", "batch = next(it)", mutates=("it",)),
    Row(
        "class-being-built-changes-nothing", "opt = SGD(model.parameters())", not_mutates=("model",)
    ),
    Row("in-place-by-name", "nn.init.zeros_(model.fc.weight)", mutates=("model",)),
    Row(
        "alias-changed-in-the-same-cell",
        "x = model.layer1\nx.weight.data.fill_(0)",
        mutates=("model",),
    ),
    Row("copy-then-change-leaves-the-original", "d = df.copy()\nd['a'] = 1", not_mutates=("df",)),
    # --- objects stored in others, changed through them (issue 13, item 4) -----------------------
    Row(
        "a-change-through-the-list-changes-what-was-appended",
        "models.append(model)\nmodels[0].fc.reset_parameters()",
        mutates=("models", "model"),
    ),
    Row(
        "a-change-through-the-dict-changes-what-was-stored",
        "d['m'] = model\nd['m'].to(dev)",
        mutates=("d", "model"),
        not_mutates=("dev",),
    ),
    Row(
        "a-change-through-the-attribute-changes-what-was-set",
        "holder.net = model\nholder.net.load_state_dict(sd)",
        mutates=("holder", "model"),
        not_mutates=("sd",),
    ),
    Row(
        "iterating-changes-the-elements",
        "models.extend([model, m2])\nfor m in models:\n    m.half()",
        mutates=("models", "model", "m2"),
    ),
    Row(
        "a-function-handed-the-container-changes-its-elements",
        "cfg.setdefault('model', model)\ntrain(cfg)",
        mutates=("cfg", "model"),
    ),
    Row(
        "an-element-taken-out-again-is-the-stored-object",
        "q.put(model)\nfirst = q.get()\nfirst.train()",
        mutates=("q", "model"),
    ),
    Row(
        "storing-changes-the-container-not-the-stored",
        "models.append(model)",
        mutates=("models",),
        not_mutates=("model",),
    ),
    Row(
        "storing-again-leaves-what-the-container-held",
        "models.append(model)\nmodels.insert(0, m2)\nmodels[1] = m3\nmodels += [m4]",
        mutates=("models",),
        not_mutates=("model", "m2", "m3", "m4"),
    ),
    Row(
        "setattr-and-heappush-store-without-changing-the-value",
        "setattr(holder, 'net', model)\nheappush(heap, item)",
        mutates=("holder", "heap"),
        not_mutates=("model", "item"),
    ),
    Row(
        "reading-through-the-container-changes-nothing",
        "models.append(model)\nprint(models[0].eval, len(models))\nmodels[0].state_dict()",
        not_mutates=("model",),
    ),
    Row(
        "a-copy-stored-is-not-the-original",
        "snaps.append(w.clone())\nsnaps.append(deepcopy(model))\nsnaps[0].zero_()",
        mutates=("snaps",),
        not_mutates=("w", "model"),
    ),
    # --- objects handed to the methods of others (issue 13, item 4) -----------------------------
    Row(
        "a-trainer-built-here-changes-the-model-it-fits",
        "trainer = pl.Trainer(max_epochs=3); trainer.fit(model, dm)",
        mutates=("model", "dm"),
    ),
    Row(
        "a-method-of-a-call-s-result-changes-what-it-is-handed",
        "get_trainer().fit(model)\npl.Trainer().fit(net)",
        mutates=("model", "net"),
    ),
    Row(
        "a-module-imported-here-only-reads-what-it-is-handed",
        "import numpy as np\nfrom torch import nn\nnp.mean(x)\nnn.functional.relu(t)",
        not_mutates=("x", "t"),
    ),
    Row(
        "readers-read-what-they-are-handed",
        "print(x)\n'-'.join(names)\ndf.head()\nmodel.to(dev)\nmodel.load_state_dict(sd)\n"
        "s = '{}'.format(v)",
        not_mutates=("x", "names", "df", "dev", "sd", "v"),
    ),
    Row(
        "a-name-from-an-earlier-cell-is-left-to-the-planner",
        "np.mean(x)\ntorch.cat([a, b])\nF.cross_entropy(out, y)\njson.dumps(cfg)\nscaler.step(opt)",
        not_mutates=("x", "a", "b", "out", "y", "cfg", "opt"),
    ),
    Row("exec-is-opaque", "exec(code)", opaque=True),
    Row("seed-is-setup", "torch.manual_seed(0)", setup=True),
    Row("a-warnings-filter-is-setup", "warnings.simplefilter('ignore')", setup=True),
    Row("a-thread-count-is-setup", "torch.set_num_threads(1)", setup=True),
    Row(
        "a-class-patched-through-type-of-an-instance-changes-the-instance",
        "type(model).forward = fwd\nsetattr(type(net), 'forward', fwd)\nn = type(x).__name__",
        mutates=("model", "net"),
        not_mutates=("type", "x"),
    ),
]


def _facts(shell, cell: str) -> CellFacts:
    return analyse_cell(runnable_source(cell), shell.transform_cell)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_cell_s_facts_through_ipython_s_own_transform(shell, row: Row):
    facts = _facts(shell, row.cell)
    assert set(row.defines) <= facts.defines, facts
    assert not set(row.not_defines) & facts.defines, facts
    assert set(row.uses) <= facts.uses, facts
    assert not set(row.not_uses) & facts.uses, facts
    assert set(row.mutates) <= facts.mutates, facts
    assert not set(row.not_mutates) & facts.mutates, facts
    assert set(row.deletes) <= facts.deletes, facts
    assert bool(facts.opaque) is row.opaque, facts
    assert bool(facts.setup) is row.setup, facts


def test_a_class_patched_through_an_instance_is_a_change_no_record_sees(shell):
    # The record reads the instance, not its class: the text's change stands (``untracked``).
    for cell in (
        "type(model).forward = fwd",
        "setattr(type(model), 'f', g)",
        "model.__class__.f = g",
    ):
        facts = _facts(shell, cell)
        assert "model" in facts.mutates and "model" in facts.untracked, (cell, facts)
    assert not _facts(shell, "model.fc.bias = b").untracked


def test_a_setup_call_is_named_with_its_module(shell):
    # A failed cell's note says what this process lacks: ``sys``'s limit, not a bare function.
    facts = _facts(shell, "import sys\nsys.setrecursionlimit(5000)\nfrom torch import manual_seed")
    assert facts.setup == "calls sys.setrecursionlimit()"
    assert _facts(shell, "manual_seed(0)").setup == "calls manual_seed()"


@pytest.mark.parametrize(
    "cell",
    [
        "signal.signal(signal.SIGUSR1, on_usr1)",  # skipped, a later os.kill ends the kernel
        "sys.setprofile(count_calls)",
        "sys.settrace(trace)",
        "signal.setitimer(signal.ITIMER_REAL, 0.5)",
    ],
)
def test_a_handler_or_hook_a_cell_installs_is_setup(shell, cell):
    # Process state no name holds: what later cells do (a signal sent, calls counted) needs it.
    assert _facts(shell, f"import signal, sys\n{cell}").setup


def test_an_env_magic_is_named_as_os_environ(shell):
    # A failed cell's ``%set_env MODE=debug`` is missing from this process's ``os.environ``:
    # the note says where, so a reader (and ``os.environ.get`` in a later cell) finds it.
    assert _facts(shell, "%set_env MODE=debug").setup == "%set_env MODE=debug (os.environ)"
    assert _facts(shell, "%env LEVEL 3").setup == "%env LEVEL 3 (os.environ)"
    assert _facts(shell, "%cd data").setup == "%cd data"


def test_lines_that_make_magics_run_again_as_setup(shell):
    # ``%load_ext autoreload`` then ``%autoreload 2``: skipped, the next line finds no magic.
    header = "%load_ext autoreload\n%autoreload 2\nimport numpy as np"
    assert runnable_source(header) == header
    assert runnable_source("%load_ext nb_cudaguard").startswith(SKIPPED)
    assert _facts(shell, header).setup == "%load_ext autoreload"
    assert _facts(shell, "%alias mk mkdir -p %s").setup == "%alias mk"
    assert _facts(shell, "%alias_magic t timeit").setup == "%alias_magic t"


def test_aimport_imports_and_binds_its_modules(shell):
    # autoreload's ``%aimport a, b.c`` imports each and pushes its top-level name.
    facts = _facts(shell, "%aimport helpers, pkg.mod, -skipme")
    assert facts.defines >= {"helpers", "pkg"} and facts.imports >= {"helpers", "pkg"}
    assert "skipme" not in facts.defines
    assert facts.imported_from["helpers"] == "helpers"


def test_line_magics_that_show_a_value_bind_underscore(shell):
    # ``%time x * 5`` shows (and keeps as ``_``) the expression's value; ``%time y = f()`` and
    # ``%matplotlib inline`` show nothing.
    for cell, shows in (
        ("%time x * 5", True),
        ("%time y = x", False),
        ("%timeit -o f()", True),
        ("%matplotlib inline", False),
        ("names = 1\n%who_ls", True),
    ):
        assert ("_" in _facts(shell, cell).defines) is shows, cell


def test_who_ls_reads_the_whole_namespace(shell):
    assert _facts(shell, "names = %who_ls int").reads_all
    assert not _facts(shell, "%ls").reads_all


def test_globals_inside_a_comprehension_reads_the_whole_namespace(shell):
    # ``[n for n in names if n not in globals()]``: a clean-up check, the module's namespace.
    facts = _facts(shell, "gone = sorted(n for n in ('a', 'b') if n not in globals())")
    assert facts.reads_all and facts.opaque


def test_links_name_what_a_value_was_built_from(shell):
    facts = _facts(shell, "opt = torch.optim.AdamW(model.parameters(), lr=lr)\nx = opt\ny = x")
    assert facts.links["opt"] == {"torch", "model", "lr"}
    # Through names bound in the same cell: those too, and what they were built from.
    assert facts.links["y"] == {"x", "opt", "torch", "model", "lr"}


def test_copies_name_what_a_value_was_computed_from_through_a_copy(shell):
    # No object shared (no link), but the value follows its source's.
    facts = _facts(
        shell,
        "n = len(log)\nc = cfg.copy()\nnorms.append(g.item())\nstats['n'] = int(total)\n"
        "m = c\nk = len(log)\nk = 5",
    )
    assert "n" not in facts.links and "log" in facts.derives["n"]
    assert facts.derives["c"] == {"cfg"}
    assert facts.derives["norms"] == {"g"}
    assert "total" in facts.derives["stats"]
    assert facts.derives["m"] == {"cfg"}  # through a name copied earlier in the cell
    assert "k" not in facts.derives  # bound again to a constant


def test_what_a_call_changes_in_its_arguments_derives_from_all_it_reads(shell):
    # The order ``r.shuffle`` leaves is drawn from ``r``; ``copyto`` writes ``src`` into ``dst``.
    facts = _facts(shell, "r.shuffle(order)\nnp.copyto(dst, src * k)\nheapq.heappush(heap, item)")
    assert facts.derives["order"] >= {"r"}
    assert facts.derives["dst"] >= {"src", "k"}
    assert facts.derives["heap"] >= {"item"}


def test_what_is_bound_under_a_test_derives_from_what_the_test_reads(shell):
    facts = _facts(
        shell,
        "stop = False\nif bad >= 1:\n    stop = True\nfor v in losses:\n    count += 1\n"
        "match mode:\n    case 'fast':\n        lr = 0.1\nwhile len(q) < 3:\n    q.append(0)\n"
        "flag = stop",
    )
    assert facts.derives["stop"] == {"bad"}
    assert facts.derives["count"] == {"losses"}  # how many times the loop ran
    assert facts.derives["lr"] == {"mode"}
    assert "len" in facts.derives["q"]
    assert facts.derives["flag"] >= {"bad"}  # read from a name that derives from it


def test_a_method_s_object_derives_from_what_it_is_handed(shell):
    facts = _facts(shell, "stopper.step(hist[-1])\nmodel.load_state_dict(sd)\nopt.step()")
    assert facts.derives["stopper"] == {"hist"}
    assert facts.derives["model"] == {"sd"}
    assert "opt" not in facts.derives


def test_what_is_bound_in_a_try_derives_from_what_its_body_reads(shell):
    facts = _facts(
        shell,
        "try:\n    x = 1 / (len(hist) - 2)\n    ok = True\nexcept ZeroDivisionError:\n"
        "    ok = False",
    )
    assert "hist" in facts.derives["ok"]


def test_a_walrus_in_a_comprehension_derives_from_what_it_reads(shell):
    facts = _facts(shell, "d = [last := v * 2 for v in xs]\nok = any((hit := v) > k for v in ys)")
    assert facts.links["last"] == {"xs"}  # an item's object, maybe
    assert facts.derives["last"] == {"xs"}
    assert {"ys", "k"} <= facts.derives["hit"]


def test_a_function_s_effects_outside_it(shell):
    facts = _facts(
        shell,
        "def step(batch):\n    global steps\n    steps += 1\n    local = []\n    local.append(1)\n"
        "    opt.step()\n    history['loss'] = 1\n    helper(batch)\n    return batch",
    )
    effects = facts.effects["step"]
    assert effects.mutates == {"steps", "opt", "history"}
    assert effects.calls == {"helper"}


ESCAPED = [
    "%time x = f(a)",
    "x = %time f(a)",
    "files = !ls $folder",
    "a, b = !ls",
    "!!ls {path}",
    "import a\n%matplotlib inline\ny = 1",
    "if ok:\n    !echo {name}\n    %time z = g()",
    "%%time\nmodel = build(cfg)",
    "%%capture --no-stderr out\ny = 2",
    "%%bash\necho $HOME",
    "%%time\n%time inner = f()\n!ls",
    "d['k'] = !ls",  # not a plain name: the real transform
    "x?",  # help: the real transform
    "x = (1 +\n     2)\n%env A=$val",
]


@pytest.mark.parametrize("cell", ESCAPED)
def test_the_quick_rewrite_of_escapes_finds_what_ipython_s_transform_finds(shell, cell: str):
    by_ipython = analyse(shell.transform_cell(runnable_source(cell)), shell.transform_cell)
    assert _facts(shell, cell) == by_ipython


def _quick_parses(cell: str) -> bool:
    try:
        ast.parse(quick_transform(cell) or "?")
    except SyntaxError:
        return False
    return True


@pytest.mark.parametrize("cell", [c for c in ESCAPED if _quick_parses(c)])
def test_the_quick_rewrite_writes_what_ipython_writes(shell, cell: str):
    assert quick_transform(cell) == shell.transform_cell(cell)


def test_cells_the_quick_rewrite_leaves_to_ipython():
    assert [c for c in ESCAPED if not _quick_parses(c)] == ["d['k'] = !ls", "x?"]


def test_a_function_hands_to_the_methods_of_globals_what_it_is_given_or_built(shell):
    facts = _facts(
        shell,
        "def epoch():\n    loss = crit(model(x), y)\n    scaler.scale(loss).backward()\n"
        "    scaler.step(opt)\n    F.relu(w)\n    cache.append(net)\n    Trainer().fit(m2)",
    )
    effects = facts.effects["epoch"]
    # What it hands to globals is left to the planner (``F`` may be a module); what it stores
    # is not changed; what it hands to an object it built is changed.
    assert effects.handed == {"scaler": {"crit", "model", "x", "y", "opt"}, "F": {"w"}}
    assert "m2" in effects.mutates and "net" not in effects.mutates


def test_a_function_changes_what_its_locals_were_built_from(shell):
    facts = _facts(
        shell,
        "def epoch():\n    for x, y in loader:\n        loss = crit(model(x), y)\n"
        "        loss.backward()\n    head = model.fc\n    head.weight.data.zero_()\n"
        "    fresh = []\n    fresh.append(1)",
    )
    assert facts.effects["epoch"].mutates == {"crit", "model", "loader"}


STORES = [
    ("models.append(model)", "models", {"model"}),
    ("models.insert(0, model)", "models", {"model"}),
    ("models.extend([model, m2])", "models", {"model", "m2"}),
    ("d['m'] = model", "d", {"model"}),
    ("d.update(m=model)", "d", {"model"}),
    ("d.setdefault('m', model)", "d", {"model"}),
    ("s.add(model)", "s", {"model"}),
    ("holder.net = model", "holder", {"model"}),
    ("cfg['model'] = model", "cfg", {"model"}),
    ("q.put(model)", "q", {"model"}),
    ("lst += [model]", "lst", {"model"}),
    ("setattr(holder, 'net', model)", "holder", {"model"}),
    ("net.add_module('fc', layer)", "net", {"layer"}),
    ("models = [model, opt]", "models", {"model", "opt"}),
    ("d['k'].append(model)", "d", {"model"}),  # into what d holds: d holds it
    ("d.setdefault(key, model)", "d", {"model"}),  # the key is read, not held
    ("models.insert(i, model)", "models", {"model"}),
    ("x = model.fc\nparts.append(x)", "parts", {"x", "model"}),  # and what x was built from
]


@pytest.mark.parametrize(("cell", "container", "stored"), STORES, ids=[s[0] for s in STORES])
def test_a_store_makes_the_container_hold_the_stored_names(shell, cell, container, stored):
    facts = _facts(shell, cell)
    assert facts.stores[container] == stored, facts


NOT_STORED = [
    "lst.append(3)",
    "d['k'] = 'text'",
    "lst.append(w.clone())",
    "lst.append(copy.deepcopy(model))",
    "d['n'] = len(data)",
    "lst += [x.item()]",
    "models = [m.clone() for m in old]",  # a comprehension builds from old: a link, no store
]


@pytest.mark.parametrize("cell", NOT_STORED)
def test_values_that_share_nothing_are_not_stored(shell, cell):
    assert not _facts(shell, cell).stores


def test_a_plain_store_only_fills_the_container(shell):
    facts = _facts(shell, "models.append(model)\nd['m'] = model\nholder.net.fc = layer")
    # holder.net.fc = ... changes holder.net, which may be something holder holds.
    assert facts.filled == {"models", "d"}
    assert "holder" in facts.mutates


HANDED = [
    (
        "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()",
        {"scaler": {"loss", "opt"}},
    ),
    ("accelerator.backward(loss)", {"accelerator": {"loss"}}),
    ("engine.run(model, loader)", {"engine": {"model", "loader"}}),
    ("swa_model.update_parameters(model)", {"swa_model": {"model"}}),
    ("np.concatenate(x)\ntorch.stack(ts)", {"np": {"x"}, "torch": {"ts"}}),
    ("torch.nn.functional.relu(x)", {"torch": {"x"}}),  # a chain: its root decides
    # Through this cell's links: handing x hands what x was built from.
    ("x = model.layer1\nhelper.fit(x)", {"helper": {"model"}}),
    ("models.append(model)\nrunner.run(models)", {"runner": {"models", "model"}}),
]


@pytest.mark.parametrize(("cell", "handed"), HANDED, ids=[h[0] for h in HANDED])
def test_what_a_cell_hands_to_the_methods_of_earlier_names(shell, cell, handed):
    assert _facts(shell, cell).handed == handed


NOT_HANDED = [
    "import numpy as np\nnp.mean(x)",  # imported here: a module
    "trainer = Trainer()\ntrainer.fit(model)",  # built here: an object, changed at once
    "'-'.join(names)\n'{}'.format(v)",
    "df.head()\nmodel.to(dev)\nmodel.load_state_dict(sd)",
    "nn.init.zeros_(w)",  # in place by name: changed at once
    "opt.step()",
]


@pytest.mark.parametrize("cell", NOT_HANDED)
def test_what_is_not_left_to_the_planner(shell, cell):
    assert not _facts(shell, cell).handed


@pytest.mark.parametrize(
    "cell, generator",
    [
        ("x = float(rng.random())", "rng"),
        ("print(r.random())", "r"),
        ("i = cfg.rng.integers(9)", "cfg"),
    ],
)
def test_a_draw_from_a_generator_held_in_a_name_may_advance_it(shell, cell, generator):
    # left to the planner: the name may be a module (``np.random.rand()``)
    assert generator in _facts(shell, cell).handed.get(generator, ())


@pytest.mark.parametrize(
    "cell, untracked",
    [
        ("t.numpy()[5] = 3.0", "t"),
        ("w.data[7] = 2.0", "w"),
        ("w.data.mul_(2)", "w"),
    ],
)
def test_a_change_through_data_or_numpy_is_one_no_version_counter_sees(shell, cell, untracked):
    facts = _facts(shell, cell)
    assert untracked in facts.mutates and untracked in facts.untracked


def test_a_plain_change_in_place_is_one_a_version_counter_sees(shell):
    assert not _facts(shell, "t[0] = 1\nt.mul_(2)").untracked


@pytest.mark.parametrize(
    ("cell", "shows"),
    [
        ("sorted(base)", True),
        ("x = 1\nx + 1", True),
        ("sorted(base);", False),
        ("print(base)", False),
        ("x = 1", False),
        ("%time f(a)", True),  # ``%time`` returns the expression's value (execution.py)
        ("%time y = f(a)", False),
    ],
)
def test_a_cell_that_shows_a_value_binds_underscore(shell, cell: str, shows: bool):
    # IPython's displayhook keeps what a cell shows as ``_``: a replayed cell shows it again.
    assert ("_" in _facts(shell, cell).defines) is shows


@pytest.mark.parametrize(
    ("cell", "reads"),
    [
        ("y = Out[3] + 1", {"_3"}),
        ("y = _oh[12]", {"_12"}),
        ("y = _3 + Out[4]", {"_3", "_4"}),
        ("y = Out[-1]", {"Out"}),  # by position: whatever this kernel's last output is
        ("y = Out[k]", {"Out", "k"}),
        ("y = In[3]", {"In"}),  # this kernel's own inputs: a replay cannot put the old ones in
    ],
)
def test_an_output_read_by_number_is_a_read_of_its_name(shell, cell: str, reads: set[str]):
    # ``Out[3]`` is what ``_3`` is (IPython/core/displayhook.py's ``update_user_ns``): the
    # cell that ran as number 3 binds it again when replayed.
    assert _facts(shell, cell).uses == reads


@pytest.mark.parametrize(
    ("code", "mutates", "setup", "reads_all"),
    [
        # a stream's reads move it on, a result used or not; one the cell opened is its own
        ("first = f.readline()", {"f"}, "", False),
        ("n = buf.write('x')", {"buf"}, "", False),
        ("with open(p) as g:\n    h = g.readline()", set(), "", False),
        ("x = sys.path.index(p)", set(), "", False),
        ("sys.path.insert(0, p)", {"sys"}, "changes sys.path", False),
        ("sys.path += [p]", {"sys"}, "changes sys.path", False),
        ("found = sorted(globals())", set(), "", True),
        ("keys = sorted(vars(cfg))", {"cfg"}, "", False),
    ],
)
def test_streams_sys_path_and_whole_namespace_reads(code, mutates, setup, reads_all):
    facts = analyse(code)
    assert set(facts.mutates) == mutates
    assert (facts.setup, facts.reads_all) == (setup, reads_all)


@pytest.mark.parametrize(
    ("code", "written"),
    [
        ("torch.save(net.state_dict(), buf)", {"buf"}),
        ("np.save(f, x)", {"f"}),
        ("pickle.dump(stats, f)", {"f"}),
        ("print(msg, file=log)", {"log"}),
        ("torch.save(w, 'w.pt')", set()),
        ("buf = io.BytesIO()\ntorch.save(w, buf)", set()),  # its own new buffer
    ],
)
def test_what_a_call_writes_into(code, written):
    assert set(analyse(code).written) == written
