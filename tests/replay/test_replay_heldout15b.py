"""Held-out cases, round 15b: state held in Python's and the standard library's own objects,
changed by a cell that then failed (or by one that succeeded), not met by the earlier rounds
(tests/replay/test_replay_heldout.py, whose harness this shares): a generator expression
advanced by a cell that succeeded and by one that failed; a ``functools.cache`` filled by a
failed cell; ``itertools.tee`` halves advanced by ``next`` and ``islice``; a ``defaultdict``
given a key by a read; ``Counter.update`` and a ``ChainMap`` write; a ``memoryview`` write and
``struct.pack_into`` into a ``bytearray``; an INSERT into an in-memory ``sqlite3`` database; a
``queue.Queue`` taken from and a ``heapq`` pushed to; a slotted dataclass and a
``SimpleNamespace`` changed by a helper; ``decimal.setcontext`` in a helper, then the precision
set by a failed cell; a stub module put in ``sys.modules`` and imported later; a ``hashlib``
digest updated and a ``BytesIO`` read.

Three found silent differences (or worse), fixed with this round: the INSERT into the
in-memory database went unnamed (a ``sqlite3.Connection`` is callable and written in C, and was
seen by identity, as a function is; replay/record.py now walks a C callable that is no function
as any other C object, not seen whole); ``v = stub.x`` after ``import stub15b`` differed unnamed
when a failed cell had changed the stub (what an import binds from a module a cell put in
``sys.modules`` is now linked to that cell's value, analysis.py ``registers``, planner.py
``with_registered``); with everything restored, ``view`` came back a ``bytes`` and the failing
cell's ``view.tolist()`` stopped the replay (keep/pickling.py now restores a view of a whole
object as a view of the restored object, and keeps no slice or cast). Probing in-process also
found ``decimal.setcontext`` and ``sys.setswitchinterval`` set inside a notebook function left
out of the replay unnamed (replay/settings.py now reads the standard library's own process
settings); the decimal case here replays the helper's context now (named, through ``decimal``,
before). The other cases passed as written; on the code before this round, the INSERT (both
runs), the stub (no restore) and the view (all restored) fail.

The bar is issue 32's: after restore + replay, the state the failing cell starts from equals the
state before the failure, or the plan names each name that may differ.
"""

from __future__ import annotations

import pytest
from heldout_harness import ALL, assert_no_silent_difference, run_case

# The next test's kernel starts while one runs: these cases change nothing a kernel's
# start reads (tests/conftest.py, server_kernel).
pytestmark = pytest.mark.kernels_ahead

OOM = "raise RuntimeError('CUDA out of memory')"


@ALL
def test_a_generator_expression_advanced_by_cells_and_a_failed_one(server, server_kernel, restore):
    # Batches drawn by hand from ``(x for x in ...)``: one in a cell, one more in a failed cell.
    kid, pid = server_kernel
    cells = (
        "gen = (i * i for i in range(10))",
        "first = next(gen)",
        f"second = next(gen)\n{OOM}",
    )
    fp = "{'gen': next(gen), 'first': first}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@ALL
def test_a_functools_cache_filled_by_a_failed_cell(server, server_kernel, restore):
    # ``@functools.cache`` on a feature function that logs its misses; a failed cell filled it.
    kid, pid = server_kernel
    cells = (
        "import functools\nmisses = []\n@functools.cache\ndef feature(k):\n"
        "    misses.append(k)\n    return k * k",
        f"feature(2)\n{OOM}",
        "feature(2)\nn = len(misses)",
    )
    fp = "{'n': n, 'misses': misses, 'feature': feature.cache_info().currsize}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_tee_halves_advanced_by_next_and_islice(server, server_kernel, restore):
    # ``train_it, peek_it = tee(...)``: a peek in one cell, an ``islice`` in a failed cell.
    kid, pid = server_kernel
    cells = (
        "import itertools\ntrain_it, peek_it = itertools.tee(iter(range(10)))",
        "peeked = next(peek_it)",
        f"batch = list(itertools.islice(train_it, 3))\n{OOM}",
    )
    fp = "{'train_it': next(train_it), 'peek_it': next(peek_it), 'peeked': peeked}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@ALL
def test_a_defaultdict_given_a_key_by_a_read_in_a_failed_cell(server, server_kernel, restore):
    # ``if groups['val']:`` reads, and the read adds the key (``__missing__``).
    kid, pid = server_kernel
    cells = (
        "from collections import defaultdict\ngroups = defaultdict(list)\n"
        "groups['train'].append(1)",
        f"if groups['val']:\n    pass\n{OOM}",
        "n_groups = len(groups)",
    )
    fp = "{'groups': sorted(groups), 'n_groups': n_groups}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_counter_update_and_a_chainmap_write_in_a_failed_cell(server, server_kernel, restore):
    # Token counts updated, and an override written through a ``ChainMap`` of settings.
    kid, pid = server_kernel
    cells = (
        "from collections import ChainMap, Counter\ncounts = Counter('aab')\n"
        "defaults = {'lr': 1.0}\ncfg = ChainMap({}, defaults)",
        f"counts.update('bcc')\ncfg['lr'] = 0.1\n{OOM}",
        "top = counts.most_common(1)\nlr = cfg['lr']",
    )
    fp = "{'counts': dict(counts), 'top': top, 'cfg': dict(cfg.maps[0]), 'lr': lr}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_memoryview_and_pack_into_writing_a_bytearray(server, server_kernel, restore):
    # A frame buffer written through a ``memoryview`` and by ``struct.pack_into``.
    kid, pid = server_kernel
    cells = (
        "import struct\nframe = bytearray(8)\nview = memoryview(frame)\nhdr = bytearray(4)",
        f"view[0] = 7\nstruct.pack_into('<i', hdr, 0, 9)\n{OOM}",
        "total = sum(frame)",
    )
    fp = "{'frame': list(frame), 'view': view.tolist(), 'hdr': list(hdr), 'total': total}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_an_insert_into_an_in_memory_sqlite_database_in_a_failed_cell(
    server, server_kernel, restore
):
    # Results logged to ``sqlite3.connect(':memory:')``; a failed cell inserted one row.
    kid, pid = server_kernel
    cells = (
        "import sqlite3\ncon = sqlite3.connect(':memory:')\ncon.execute('create table runs(x)')",
        f"con.execute('insert into runs values (1)')\n{OOM}",
        "m = 1",
    )
    fp = "{'con': con.execute('select count(*) from runs').fetchone()[0], 'm': m}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_queue_taken_from_and_a_heap_pushed_to_in_a_failed_cell(server, server_kernel, restore):
    # A work queue and a priority heap of the best scores.
    kid, pid = server_kernel
    cells = (
        "import heapq, queue\njobs = queue.Queue()\njobs.put('a')\njobs.put('b')\n"
        "best = [5, 1]\nheapq.heapify(best)",
        f"job = jobs.get()\nheapq.heappush(best, 0)\n{OOM}",
        "m = 1",
    )
    fp = "{'jobs': list(jobs.queue), 'best': best, 'm': m}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_slotted_dataclass_and_a_namespace_changed_by_a_helper(server, server_kernel, restore):
    # ``tune(cfg, ns)`` sets a slot of ``@dataclass(slots=True)`` and a ``SimpleNamespace`` field.
    kid, pid = server_kernel
    cells = (
        "from dataclasses import dataclass\nfrom types import SimpleNamespace\n"
        "@dataclass(slots=True)\nclass Cfg:\n    lr: float = 1.0\n"
        "cfg = Cfg()\nns = SimpleNamespace(bs=8)\n"
        "def tune(c, n):\n    c.lr = 0.5\n    n.bs = 16",
        f"tune(cfg, ns)\n{OOM}",
        "m = 1",
    )
    fp = "{'cfg': cfg.lr, 'ns': vars(ns), 'm': m}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_decimal_context_set_by_a_helper_and_by_a_failed_cell(server, server_kernel, restore):
    # ``exact()`` installs a context of its own (``setcontext``); a failed cell then sets the
    # precision on it; a later cell divides.
    kid, pid = server_kernel
    cells = (
        "import decimal\nD = decimal.Decimal\n"
        "def exact():\n    decimal.setcontext(decimal.Context(prec=8, rounding='ROUND_DOWN'))",
        "exact()",
        f"decimal.getcontext().prec = 5\n{OOM}",
        "third = str(D(2) / D(3))",
    )
    fp = "{'third': third, 'decimal': [decimal.getcontext().prec, decimal.getcontext().rounding]}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(2,)))


@ALL
def test_a_fake_module_in_sys_modules_imported_later(server, server_kernel, restore):
    # A stub module registered by hand (to stand in for a missing package), imported later.
    kid, pid = server_kernel
    cells = (
        "import sys, types\nstub = types.ModuleType('stub15b')\nstub.x = 1\n"
        "sys.modules['stub15b'] = stub",
        f"stub.x = 2\n{OOM}",
        "import stub15b\nv = stub15b.x",
    )
    fp = "{'v': v, 'stub': stub.x}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))


@ALL
def test_a_digest_updated_and_a_bytesio_read_in_a_failed_cell(server, server_kernel, restore):
    # A running checksum of the data seen, and a header read from an in-memory file.
    kid, pid = server_kernel
    cells = (
        "import hashlib, io\ndigest = hashlib.sha256()\nraw = io.BytesIO(b'abcdef')",
        f"digest.update(b'x')\nhead = raw.read(2)\n{OOM}",
        "m = 1",
    )
    fp = "{'digest': digest.hexdigest(), 'raw': raw.tell(), 'm': m}"
    assert_no_silent_difference(run_case(server, kid, pid, cells, fp, restore=restore, errors=(1,)))
