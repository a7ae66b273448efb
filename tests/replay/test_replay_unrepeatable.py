"""What a replay cannot make the same (replay/unrepeatable.py): a set read in its order, the clock,
the process, the OS's randomness; and which names a plan rebuilds from them
(planner.with_unrepeatable). Pure: cells' texts in, facts and plans out."""

from __future__ import annotations

import ast
from dataclasses import replace

import pytest

from nb_cudaguard.replay.analysis import analyse
from nb_cudaguard.replay.planner import Step, plan_replay, with_unrepeatable
from nb_cudaguard.replay.unrepeatable import unrepeatable


@pytest.mark.parametrize(
    "code",
    [
        "chars = list(set(data))",
        "for w in {w.lower() for w in words}:\n    out.append(w)",
        "itos = [w for w in set(tokens)]",
        "order = dict.fromkeys(frozenset(names))",
        "joined = ' '.join(set(words))",
        "first = [*{'a', 'b', 'c'}]",
        "both = list(set(a) | set(b))",
        "common = list(set(a).intersection(b))",
        "ids = torch.tensor(list(set(labels)))",
    ],
)
def test_a_set_built_here_and_read_in_order_is_found(code):
    assert unrepeatable(ast.parse(code)).builds


@pytest.mark.parametrize(
    "code",
    [
        "chars = sorted(set(data))",
        "n = len(set(data))",
        "lowered = {w.lower() for w in set(words)}",
        "seen = set(words) | set(more)",
        "ok = 'a' in set(words)",
        "biggest = max(set(scores))",
        "small = list({1, 2, 3})",  # numbers: their order does not change
        "print(set(words))",
        "same = set(a) == set(b)",
        "sub = set(a).issubset(b)",
    ],
)
def test_a_set_read_in_no_order_is_not_found(code):
    assert not unrepeatable(ast.parse(code)).builds


def test_names_bound_to_sets_and_names_read_in_order():
    found = unrepeatable(ast.parse("vocab = set()\nseen: set = {'a', 'b'}\nitos = list(vocab)"))
    assert found.sets == {"vocab", "seen"}
    assert "vocab" in found.iterated
    popped = unrepeatable(ast.parse("item = pool.pop()"))
    assert popped.iterated == {"pool"}


@pytest.mark.parametrize(
    ("code", "read"),
    [
        ("started = time.time()", "the clock"),
        ("stamp = datetime.datetime.now().isoformat()", "the clock"),
        ("today = date.today()", "the clock"),
        ("from time import perf_counter\nt0 = perf_counter()", "the clock"),
        ("run_id = uuid.uuid4().hex", "the OS's randomness"),
        ("salt = os.urandom(8)", "the OS's randomness"),
        ("me = os.getpid()", "the process's id"),
        ("out = tempfile.mkdtemp()", "a temporary path"),
    ],
)
def test_values_that_differ_by_nature_are_found(code, read):
    assert read in unrepeatable(ast.parse(code)).varying


@pytest.mark.parametrize(
    "code", ["t = trainer.time()", "x = model.now", "d = os.path.join('a', 'b')", "t = 5"]
)
def test_other_calls_of_the_same_names_are_not(code):
    assert not unrepeatable(ast.parse(code)).varying


def _plan(cells: list[str], present: set[str] = frozenset(), **options):
    facts = [analyse(c) for c in cells]
    plan = plan_replay(facts, len(cells) - 1, present)

    def walk(index: int):  # a cell whose walk its text spared, walked where a set is held
        return unrepeatable(ast.parse(cells[index]))

    return with_unrepeatable(plan, facts, walk=walk, **options)


def test_the_plan_names_what_follows_a_sets_order_and_what_is_built_from_it():
    plan = _plan(
        [
            "data = 'hello world'",
            "chars = list(set(data))\nn = len(data)",
            "char_to_ix = {c: i for i, c in enumerate(chars)}\nsize = n * 2",
            "print(char_to_ix, size)",
        ]
    )
    assert plan.unrepeatable == ((1, "reads set(data) in order"),)
    # The reading cell's names all (its text cannot say which follow the order: ``n`` too, and
    # ``size`` built from it); a later cell's only where built from them.
    assert plan.unrepeatable_names == ("char_to_ix", "chars", "n", "size")


def test_a_set_held_in_a_name_counts_where_an_earlier_cell_or_the_namespace_holds_it():
    cells = ["vocab = set(text.split())", "first = list(vocab)[:3]", "print(first)"]
    assert _plan(cells, {"text"}).unrepeatable == ((1, "reads vocab, a set, in order"),)
    # (``vocab`` is a set: equal to the one before, whatever its order)
    assert _plan(cells, {"text"}).unrepeatable_names == ("first",)
    kept = _plan(["first = list(vocab)[:3]", "print(first)"], {"vocab"}, sets_here={"vocab"})
    assert kept.unrepeatable_names == ("first",)
    unknown = _plan(["first = list(vocab)[:3]", "print(first)"], {"vocab"})
    assert unknown.unrepeatable_names == ()


def test_with_string_hashing_fixed_only_what_differs_by_nature_is_named():
    cells = [
        "import time\nstarted = time.time()",
        "chars = list(set('abc'))",
        "print(chars, started)",
    ]
    plan = _plan(cells, orders_vary=False)
    assert plan.unrepeatable == ((0, "time.time() reads the clock"),)
    assert plan.unrepeatable_names == ("started",)


def test_what_calls_a_notebook_function_or_class_that_reads_a_set_is_named():
    plan = _plan(
        [
            "data = 'to be or not'",
            "def vocab_of(text):\n    return list(set(text))",
            "class Tok:\n    def __init__(self, text):\n        self.vocab = set(text)\n"
            "    def itos(self):\n        return list(self.vocab)",
            "chars = vocab_of(data)\nsize = len(data)",
            "tok = Tok(data)",
            "first = list(tok.vocab)[:2]",
            "print(chars, tok, first, size)",
        ]
    )
    reasons = dict(plan.unrepeatable)
    assert "calls vocab_of(), which reads set(text) in order" in reasons[3]
    assert "calls Tok(), which reads .vocab, a set, in order" in reasons[4]
    assert "reads .vocab, a set, in order" in reasons[5]  # an attribute a cell binds to a set
    # (and ``data``, which the text takes for changed by ``Tok(data)``: a run's record says not)
    assert {"chars", "first", "size", "tok"} <= set(plan.unrepeatable_names)


def test_a_function_reading_the_clock_is_named_where_called():
    plan = _plan(["import time\ndef stamp():\n    return time.time()", "t = stamp()", "print(t)"])
    assert plan.unrepeatable == ((1, "calls stamp(), which time.time() reads the clock"),)
    assert plan.unrepeatable_names == ("t",)


def test_a_strings_hash_kept_is_named_where_string_hashing_varies():
    cells = ["names = ['ada']", "buckets = {n: hash(n) % 8 for n in names}", "print(buckets)"]
    assert _plan(cells).unrepeatable_names == ("buckets",)
    assert _plan(cells, orders_vary=False).unrepeatable_names == ()


def test_a_cell_naming_no_set_hash_or_clock_is_walked_only_where_a_set_is_held():
    assert analyse("first = list(vocab)[:3]").unrepeatable.complete is False
    assert analyse("x = sorted(set(data))").unrepeatable.complete is True
    walked = []

    def walk(index):
        walked.append(index)
        return unrepeatable(ast.parse(cells[index]))

    cells = ["first = list(vocab)[:3]", "print(first)"]
    facts = [analyse(c) for c in cells]
    plan = plan_replay(facts, 1, {"vocab"})
    assert with_unrepeatable(plan, facts, walk=walk).unrepeatable_names == ()
    assert walked == []  # no set held anywhere: nothing to walk
    kept = with_unrepeatable(plan, facts, sets_here={"vocab"}, walk=walk)
    assert (kept.unrepeatable_names, walked) == (("first",), [0])


def test_only_what_is_bound_from_the_clock_is_named_not_what_a_timed_cell_trains():
    cells = [
        "import time\nlog = []\nnet = make()",
        "t0 = time.time()\nnet.fit(data)\nelapsed = time.time() - t0\nlog.append(time.time())\n"
        "per_step = elapsed / 10",
        "print(net, per_step, log)",
    ]
    plan = _plan(cells, {"make", "data"})
    assert plan.unrepeatable_names == ("elapsed", "log", "per_step", "t0")


@pytest.mark.parametrize(
    ("code", "fresh"),
    [
        ("rng = np.random.default_rng()", True),
        ("rng = np.random.default_rng(0)", False),
        ("gen = random.Random()", True),
        ("gen = random.Random(42)", False),
        ("sysrand = random.SystemRandom()", True),
    ],
)
def test_a_generator_made_with_no_seed_reads_fresh_entropy(code, fresh):
    assert ("fresh entropy" in unrepeatable(ast.parse(code)).varying) is fresh


@pytest.mark.parametrize(
    ("code", "os_random"),
    [
        ("pick = secrets.choice(words)", True),
        ("n = secrets.randbelow(10)", True),
        ("bits = secrets.randbits(8)", True),
        ("pick = random.choice(words)", False),  # the global generator: its state is kept
        ("pick = np.random.choice(words)", False),
        ("pick = rng.choice(words)", False),
    ],
)
def test_what_secrets_draws_reads_the_os_randomness(code, os_random):
    # ``secrets`` draws from the OS (``SystemRandom``): anew in every process.
    assert ("the OS's randomness" in unrepeatable(ast.parse(code)).varying) is os_random


def test_a_token_drawn_by_secrets_or_a_system_random_is_named():
    cells = [
        "import random, secrets\nwords = ['a', 'b', 'c']\nsysrand = random.SystemRandom()",
        "pick = secrets.choice(words)\nroll = sysrand.randint(1, 6)",
        "print(pick, roll)",
    ]
    assert {"pick", "roll"} <= set(_plan(cells).unrepeatable_names)


@pytest.mark.parametrize(
    ("code", "fresh"),
    [
        ("torch.seed()", True),
        ("g.seed()", True),
        ("s = gen.seed()", True),
        ("random.seed()", True),
        ("np.random.seed(None)", True),
        ("torch.cuda.seed_all()", True),
        ("random.seed(0)", False),
        ("np.random.seed(seed=1)", False),
        ("g.manual_seed(0)", False),
    ],
)
def test_a_generator_seeded_again_with_no_seed_reads_fresh_entropy(code, fresh):
    # ``torch.seed()``, ``Generator.seed()``, ``random.seed()``, ``np.random.seed()``: seeded
    # from the OS (or the clock), anew in every process.
    assert ("fresh entropy" in unrepeatable(ast.parse(code)).varying) is fresh


def test_what_is_drawn_after_a_generator_is_seeded_from_the_os_is_named():
    cells = [
        "import torch\ng = torch.Generator()\ng.seed()\nperm = torch.randperm(6, generator=g)",
        "torch.seed()\nnoise = torch.rand(3)\nw = torch.ones(2)",
        "later = torch.randperm(3, generator=g)\nones = torch.ones(2)",
        "print(later)",
    ]
    plan = _plan(cells, set())
    # What the reseeding cell builds through torch (its text cannot tell ``rand`` from
    # ``ones``), and what is drawn from ``g`` later; not ``torch`` itself, whose generator the
    # replay sets back before each later cell, nor what later cells build through it.
    assert plan.unrepeatable_names == ("g", "later", "noise", "perm", "w")


def test_an_id_is_read_as_an_address_and_names_what_it_builds():
    found = unrepeatable(ast.parse("names = {id(p): n for n, p in net.named_parameters()}"))
    assert "id() reads an object's address" in found.varying
    assert found.differs == {"names"}
    plan = _plan(["names = {id(p): n for n, p in params}", "print(names)"], {"params"})
    assert plan.unrepeatable_names == ("names",)


def test_a_kept_name_made_from_ids_is_named():
    cells = ["names = {id(p): n for n, p in params}", "print(names)"]
    plan = _plan(cells, {"params", "names"})
    assert plan.kept == ("names",)
    assert plan.kept_foreign == (("names", 0, "object addresses"),)
    assert _plan(["names = {n: n for n in params}", "print(names)"], {"names"}).kept_foreign == ()


LOGGER = (
    "import threading, time\nmetrics = []\nstop = threading.Event()\n"
    "def logger():\n    while not stop.is_set():\n        metrics.append(len(metrics))\n"
    "        time.sleep(0.002)"
)


@pytest.mark.parametrize(
    "start",
    [
        "t = threading.Thread(target=logger, daemon=True)\nt.start()",
        "threading.Timer(0.5, logger).start()",
        "future = pool.submit(logger)",
        "task = asyncio.ensure_future(logger())",
        "task = asyncio.get_event_loop().create_task(logger())",
    ],
)
def test_what_a_thread_or_task_changes_beside_the_cells_is_named(start):
    # The record sees the logger's appends at the end of whichever cell ran while it did: "n"
    # counts them at the time the cells and the user took, which a replay does not take again.
    cells = [LOGGER, start, "total = 1", "stop.set()\nn = len(metrics)", "print(metrics, n)"]
    plan = _plan(cells, {"pool", "asyncio"})
    # From the text alone a library call handed ``logger`` is not run again: what its thread
    # changed is rebuilt from the other cells and named; a task's ``logger()`` call is.
    named = set(plan.unrepeatable_names) | {n for n, i in plan.kept_running if i == 1}
    assert {"metrics", "n"} <= named
    # Run again (where its record saw the logger's first appends), it is named as it runs.
    facts = [analyse(c) for c in cells]
    run = plan_replay(facts, len(cells) - 1, {"pool", "asyncio"})
    run = replace(run, steps=(Step(1, ("changes metrics",)), *run.steps))
    plan = with_unrepeatable(
        replace(run, steps=tuple(sorted(run.steps, key=lambda s: s.index))), facts
    )
    assert [i for i, _ in plan.unrepeatable] == [1]
    assert "runs on beside the cells" in plan.unrepeatable[0][1]
    assert {"metrics", "n"} <= set(plan.unrepeatable_names)


def test_a_function_that_starts_a_thread_is_named_where_called():
    cells = [
        LOGGER + "\ndef start_logging():\n    threading.Thread(target=logger).start()",
        "start_logging()",
        "n = len(metrics)",
        "print(n)",
    ]
    plan = _plan(cells)
    assert {"metrics", "n"} <= {n for n, i in plan.kept_running if i == 1}


def test_a_name_kept_that_a_thread_not_run_again_changed_is_named():
    # Restored as the previous kernel left it; there the logger went on, here nothing runs it.
    cells = [
        LOGGER,
        "t = threading.Thread(target=logger, daemon=True)\nt.start()",
        "print(metrics)",
    ]
    plan = _plan(cells, {"metrics", "threading", "time", "stop", "logger"})
    assert 1 not in [s.index for s in plan.steps]
    assert plan.kept_running == (("metrics", 1),)
    assert (
        _plan(["metrics = [1]", "metrics.append(2)", "print(metrics)"], {"metrics"}).kept_running
        == ()
    )


def test_a_cell_that_reads_the_whole_namespace_is_named_with_what_it_builds():
    # ``names = %who_ls int`` lists what the namespace holds when it runs: in a replay, the
    # restored names too, and not those no planned cell rebuilds.
    plan = _plan(
        ["a = 1", "names = get_ipython().run_line_magic('who_ls', 'int')\nn = len(names)", "b = 2",
         "print(n)"]
    )  # fmt: skip
    assert dict(plan.unrepeatable)[1] == "reads the whole namespace, which holds other names here"
    assert {"names", "n"} <= set(plan.unrepeatable_names)


def test_a_name_no_cell_rebuilds_is_named_with_what_is_built_from_it():
    # ``note = _i``: IPython's previous input here is this kernel's (a ``%cudaguard`` line).
    plan = _plan(["lr = 0.1", "note = _i\nshort = note[:3]", "print(short)"])
    assert plan.unresolved == ("_i",)
    assert dict(plan.unrepeatable)[1] == "reads _i, not rebuilt"
    assert {"note", "short"} <= set(plan.unrepeatable_names)


def test_a_timeit_result_reads_the_clock():
    # ``res = %timeit -o stmt``: the times it holds are measured anew in every run.
    source = "res = get_ipython().run_line_magic('timeit', '-o -q -n 1 sum(x)')\nbest = res.best"
    reads = unrepeatable(ast.parse(source), source)
    assert (reads.varying, reads.differs) == ("%timeit -o reads the clock", {"res", "best"})
    plain = "get_ipython().run_line_magic('timeit', 'sum(x)')"
    assert not unrepeatable(ast.parse(plain), plain).varying
