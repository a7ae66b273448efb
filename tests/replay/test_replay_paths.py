"""The files a cell reads and writes (replay/paths.py), and what a plan says of files a replay
finds otherwise than the cells first did (planner.with_files). Pure: texts in, plans out."""

from __future__ import annotations

import ast

import pytest

from nb_cudaguard.replay.analysis import analyse, quick_transform
from nb_cudaguard.replay.paths import file_uses, path_events
from nb_cudaguard.replay.planner import plan_replay, with_files


def _uses(*cells: str):
    return file_uses([path_events(ast.parse(c), c) for c in cells])


@pytest.mark.parametrize(
    ("code", "reads", "writes", "appends"),
    [
        ("text = open('notes.txt').read()", {"notes.txt"}, set(), set()),
        ("with open('log.csv', 'a') as f:\n    f.write('x')", set(), set(), {"log.csv"}),
        ("json.dump(cfg, open('cfg.json', mode='w'))", set(), {"cfg.json"}, set()),
        ("torch.save(model.state_dict(), 'ckpt/best.pt')", set(), {"ckpt/best.pt"}, set()),
        ("np.save('feats.npy', x)", set(), {"feats.npy"}, set()),
        ("w = torch.load('ckpt/./best.pt')", {"ckpt/best.pt"}, set(), set()),
        ("df.to_csv('out.csv', mode='a')", set(), set(), {"out.csv"}),
        ("Path('a') / 'b.txt'\nPath('a', 'b.txt').write_text('x')", set(), {"a/b.txt"}, set()),
        ("x = np.load(os.path.join('data', 'x.npy'))", {"data/x.npy"}, set(), set()),
        ("x = np.load(folder + name)", set(), set(), set()),  # built otherwise: not followed
    ],
)
def test_paths_read_and_written_are_found(code, reads, writes, appends):
    (use,) = _uses(code)
    assert (use.reads, use.writes, use.appends) == (reads, writes, appends)


def test_a_name_bound_to_a_path_in_an_earlier_cell_names_it():
    _, second, third = _uses("CKPT = 'runs/model.pt'", "torch.save(net, CKPT)", "torch.load(CKPT)")
    assert second.writes == third.reads == {"runs/model.pt"}


def test_a_cells_own_write_read_back_is_no_read():
    # What it finds is what it just wrote, whatever other cells did to the file.
    (use,) = _uses("torch.save(net, 'm.pt')\nnet2 = torch.load('m.pt')\nx = np.load('x.npy')")
    assert (use.writes, use.reads) == ({"m.pt"}, {"x.npy"})


def _plan(cells: list[str], present: set[str] = frozenset()):
    facts = [analyse(c) for c in cells]
    plan = plan_replay(facts, len(cells) - 1, present)
    return with_files(plan, facts, _uses(*cells))


def test_a_file_read_before_a_later_cell_wrote_over_it_is_named():
    plan = _plan(
        [
            "import torch\nnet = torch.nn.Linear(2, 2)",
            "net.load_state_dict(torch.load('w.pt'))\nscale = 2",
            "torch.save(net.state_dict(), 'w.pt')",
            "print(net, scale)",
        ]
    )
    assert dict(plan.unrepeatable) == {
        1: "reads w.pt, which a later cell wrote over since it first ran"
    }
    assert {"net", "scale"} <= set(plan.unrepeatable_names)


def test_a_file_appended_to_again_is_named_with_what_reads_it_later():
    plan = _plan(
        [
            "epoch = 1\nwith open('log.txt', 'a') as f:\n    f.write('epoch 1\\n')",
            "lines = open('log.txt').read().splitlines()\ncount = len(lines)",
            "print(count, epoch)",
        ]
    )
    assert plan.files_changed == (
        ("log.txt", "appended to again by a cell run again (it holds those lines twice)"),
    )
    assert plan.unrepeatable_names == ("count", "lines")


def test_files_a_replay_finds_as_they_were_say_nothing():
    plan = _plan(["import numpy as np\nx = np.load('x.npy')", "np.save('y.npy', x)", "print(x)"])
    assert (plan.unrepeatable, plan.files_changed) == ((), ())


def test_a_file_written_again_by_a_cell_run_before_its_reader_is_as_it_was():
    # The plan runs the cell that wrote w.pt first again: the reader finds what it first found.
    cells = [
        "import torch\nnet = torch.nn.Linear(2, 2)\ntorch.save(net.state_dict(), 'w.pt')",
        "net.load_state_dict(torch.load('w.pt'))",
        "torch.save({}, 'w.pt')\nlater = 1",
        "print(net, later)",
    ]
    plan = _plan(cells)
    assert plan.indices == (0, 1, 2, 3)
    assert (plan.unrepeatable, plan.files_changed) == ((), ())


@pytest.mark.parametrize(
    ("code", "lists"),
    [
        ("files = sorted(glob.glob('shards/*.txt'))", {"shards"}),
        ("files = glob('data/train/*/*.png')", {"data/train"}),
        ("names = os.listdir('data')", {"data"}),
        ("names = os.listdir()", {"."}),
        ("imgs = list(Path('imgs').glob('*.jpg'))", {"imgs"}),
        ("imgs = list(Path('imgs').iterdir())", {"imgs"}),
        ("root = 'data'\nfiles = glob.glob(os.path.join(root, '*.csv'))", {"data"}),
        ("files = glob.glob('*.csv')", {"."}),
    ],
)
def test_directories_listed_are_found(code, lists):
    (use,) = _uses(code)
    assert use.lists == lists


def test_a_listing_a_later_cell_added_a_file_to_is_named():
    plan = _plan(
        [
            "import glob\nopen('d/a.txt', 'w').write('a')",
            "files = sorted(glob.glob('d/*.txt'))\nn = len(files)",
            "open('d/b.txt', 'w').write('b')",
            "print(n)",
        ]
    )
    assert dict(plan.unrepeatable) == {1: "lists d, where a later cell put d/b.txt since it ran"}
    assert {"files", "n"} <= set(plan.unrepeatable_names)


def test_a_listing_whose_files_later_cells_only_rewrite_says_nothing():
    plan = _plan(
        [
            "import glob\nopen('d/a.txt', 'w').write('a')",
            "files = sorted(glob.glob('d/*.txt'))",
            "open('elsewhere/b.txt', 'w').write('b')",
            "print(files)",
        ]
    )
    assert plan.unrepeatable == ()


def test_a_listing_a_later_cell_removed_a_file_from_is_named():
    plan = _plan(
        [
            "import glob, os\nfiles = sorted(glob.glob('d/*.txt'))",
            "os.remove('d/a.txt')\nPath('d/b.txt').unlink()",
            "print(files)",
        ]
    )
    assert dict(plan.unrepeatable) == {0: "lists d, where a later cell removed d/a.txt since"}
    assert _uses("shutil.rmtree('d')\nos.remove(p)")[0].removes == {"d"}


def test_a_copy_reads_its_source_and_writes_its_target():
    (use,) = _uses("shutil.copy('run/last.pt', 'run/best.pt')\nos.replace('tmp.pt', 'w.pt')")
    assert (use.reads, use.writes) == ({"run/last.pt", "tmp.pt"}, {"run/best.pt", "w.pt"})


def test_a_file_written_anew_from_a_failed_cells_change_carries_it_to_its_reader():
    # The failed cell's change is not made again; the save cell runs again (for ``norm``) and
    # writes ``w`` without it; what the later cells load from the file, or its copy, lacks it.
    cells = [
        "import shutil, torch\nw = torch.zeros(3)",
        "w.add_(1)\nraise RuntimeError",
        "torch.save(w, 'w.pt')\nnorm = w.norm().item()\nshutil.copy('w.pt', 'best.pt')",
        "w2 = torch.load('w.pt')\nbest = torch.nn.Linear(3, 1)",
        "best.load_state_dict(torch.load('best.pt'))",
        "print(w2, best, norm)",
    ]
    facts = [analyse(c) for c in cells]
    plan = with_files(plan_replay(facts, 5, set(), {1}), facts, _uses(*cells))
    assert plan.failed_changes == ((1, ("w",), ("norm",)),)
    assert dict(plan.unrepeatable) == {
        3: "reads w.pt, which a cell run again wrote anew from w",
        4: "reads best.pt, which a cell run again wrote anew from w",
    }
    assert {"w2", "best"} <= set(plan.unrepeatable_names)


@pytest.mark.parametrize(
    "mapping",
    [
        "emb = np.load('emb.npy', mmap_mode='r+')",
        "emb = np.memmap('emb.npy', dtype='float32')",  # ``r+`` unless told
        "emb = np.lib.format.open_memmap('emb.npy', 'r+')",
    ],
)
def test_a_change_in_place_of_a_writable_memory_map_writes_its_file(mapping):
    # Scaled in place, the array's file holds the change: the mapping cell run again finds it
    # (and the change run again applies it twice), so what it and the later cells make may differ.
    cells = [f"import numpy as np\n{mapping}", "emb /= 255.0", "total = float(emb.sum())", "total"]
    facts = [analyse(c) for c in cells]
    uses = file_uses([f.paths for f in facts], [f.mutates for f in facts])
    assert uses[1].writes == {"emb.npy"}
    plan = with_files(plan_replay(facts, 3, set()), facts, uses)
    assert dict(plan.unrepeatable) == {
        0: "reads emb.npy, which a later cell wrote over since it first ran"
    }
    assert {"emb", "total"} <= set(plan.unrepeatable_names)


@pytest.mark.parametrize(
    "mapping",
    [
        "emb = np.load('emb.npy', mmap_mode='r')",
        "emb = np.load('emb.npy', mmap_mode='c')",  # copy-on-write: the file stays
        "emb = np.load('emb.npy')",
        "emb = np.memmap('emb.npy', dtype='float32', mode='r')",
    ],
)
def test_a_change_in_place_of_an_array_not_mapped_writable_writes_no_file(mapping):
    cells = [f"import numpy as np\n{mapping}", "emb /= 255.0", "emb = emb * 2\nemb += 1"]
    facts = [analyse(c) for c in cells]
    uses = file_uses([f.paths for f in facts], [f.mutates for f in facts])
    assert not uses[1].writes and not uses[2].writes


def _typed(*cells: str) -> list[str]:
    """Cells as typed (``!cmd``, ``%%writefile``), as IPython's transform writes them."""
    return [quick_transform(c) or c for c in cells]


@pytest.mark.parametrize(
    ("typed", "kinds"),
    [
        ("%%writefile helpers.py\ndef f():\n    return 1\n", {"writes": {"helpers.py"}}),
        ("%%writefile -a cfg.txt\nlr=0.1\n", {"appends": {"cfg.txt"}}),
        ("!echo a > log.txt 2>/dev/null", {"writes": {"log.txt"}}),
        ("!echo b >> log.txt", {"appends": {"log.txt"}}),
        ("%%bash\nfor i in 1 2; do echo $i >> n.txt; done", {"appends": {"n.txt"}}),
        ("!mkdir -p d && rm -f d/* && touch d/x.csv", {"removes": {"d"}, "writes": {"d/x.csv"}}),
        ("files = !ls -1 d", {"lists": {"d"}}),
        ("!cp a.txt b.txt; wget -q -O c.zip http://x", {"reads": {"a.txt"},
                                                        "writes": {"b.txt", "c.zip"}}),
        ("!echo $x > {out}", {}),  # paths IPython expands: not followed
        ("import helpers\nfrom utils.io import load", {"reads": {"helpers.py", "utils.py"}}),
        ("%aimport helpers", {"reads": {"helpers.py"}}),
    ],
)  # fmt: skip
def test_ipython_escapes_and_imports_read_and_write_files(typed, kinds):
    (use,) = _uses(*_typed(typed))
    found = {k: getattr(use, k) for k in ("reads", "writes", "appends", "lists", "removes")}
    assert {k: v for k, v in found.items() if v} == kinds


def test_a_module_imported_before_a_writefile_rewrote_it_is_named():
    # ``%autoreload 2`` notebooks: helpers.py edited by ``%%writefile`` after ``a`` was made
    # from it; a replay imports today's file, so ``a`` may differ.
    plan = _plan(
        _typed(
            "%%writefile ar.py\ndef f():\n    return 1\n",
            "import ar\na = ar.f()",
            "%%writefile ar.py\ndef f():\n    return 2\n",
            "print(a)",
        )
    )
    assert "a" in plan.unrepeatable_names
    assert (
        dict(plan.unrepeatable)[1]
        == "reads ar.py, which a later cell wrote over since it first ran"
    )


def test_a_shell_listing_a_later_shell_command_added_a_file_to_is_named():
    plan = _plan(_typed("files = !ls d\nn = len(files)", "!touch d/y.csv", "print(n)"))
    assert dict(plan.unrepeatable) == {0: "lists d, where a later cell put d/y.csv since it ran"}
    assert {"files", "n"} <= set(plan.unrepeatable_names)


def test_programs_run_are_found():
    (use,) = _uses(*_typed("!python gen.py --n 2 && ls out"))
    assert (use.runs, use.lists) == ({"python gen.py --n 2"}, {"out"})
    assert _uses(*_typed("%run train.py"))[0].runs == {"%run train.py"}
    assert _uses(*_typed("%%script python\nprint(1)\n"))[0].runs == {"%%script python"}
    assert not _uses(*_typed("!nvidia-smi"))[0].runs


def test_a_file_a_later_cells_program_may_have_written_is_named():
    # ``!python gen.py`` appends to gen.txt; a failed cell ran it again after ``rows`` read it.
    plan = _plan(
        _typed(
            "!python gen.py",
            "rows = open('gen.txt').read().split()",
            "!python gen.py",
            "print(rows)",
        )
    )
    assert dict(plan.unrepeatable)[1] == (
        "reads gen.txt, which another cell's program (python gen.py) may write"
    )
    assert "rows" in plan.unrepeatable_names


def test_unpackers_downloads_and_pythons_own_runners_may_write_any_file():
    for typed in (
        "!tar -xf data.tar -C out",
        "!unzip -q data.zip -d out",
        "!wget -q http://x/data.zip",
        "import subprocess\nsubprocess.run(['python', 'gen.py'], check=True)",
        "import os\nos.system('bash prep.sh')",
    ):
        assert _uses(*_typed(typed))[0].runs, typed
    (use,) = _uses("import subprocess\nsubprocess.run(['touch', 'd/a.txt'])")
    assert (use.runs, use.writes) == (frozenset(), {"d/a.txt"})
