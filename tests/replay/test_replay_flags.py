"""What a cell does beyond the namespace, flagged for the user's consent before a replay."""

from __future__ import annotations

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from nb_cudaguard.replay.flags import LONG_S, cell_flags

_transform = TransformerManager().transform_cell


@pytest.mark.parametrize(
    ("cell", "flag"),
    [
        ("!pip install -q timm", "installs packages (!pip install -q timm)"),
        ("%pip install timm", "installs packages (%pip install timm; not run again)"),
        ("%conda install -y faiss", "installs packages (%conda install -y faiss; not run again)"),
        ("!apt-get install -y ffmpeg", "installs packages (!apt-get install -y ffmpeg)"),
        ("files = !ls data", "runs shell commands (!ls data)"),
        ("%%bash\nrm -rf /tmp/x\n", "runs shell commands (%%bash: rm -rf /tmp/x)"),
        ("out = %sx ls", "runs shell commands (%sx ls)"),
        ("import subprocess\nsubprocess.run(['ls'])", "runs shell commands (subprocess.run)"),
        ("import os\nos.system('ls')", "runs shell commands (os.system)"),
        ("import shutil\nshutil.rmtree('runs')", "writes or deletes files (shutil.rmtree)"),
        ("import os\nos.remove('a.txt')", "writes or deletes files (os.remove)"),
        ("df.to_csv('out.csv')", "writes or deletes files (df.to_csv)"),
        ("torch.save(model.state_dict(), 'm.pt')", "writes or deletes files (torch.save)"),
        ("with open('log.txt', 'a') as f:\n    f.write('x')", "writes or deletes files"),
        ("Path('x.txt').open(mode='w')", "writes or deletes files (open(..., 'w'))"),
        ("%%writefile train.py\nprint(1)\n", "writes or deletes files (%%writefile train.py)"),
        ("import requests\nrequests.post(url, json=d)", "sends over the network (requests.post)"),
        ("model.push_to_hub('me/model')", "sends over the network (model.push_to_hub)"),
    ],
)
def test_a_cell_doing_more_than_compute_is_flagged(cell, flag):
    found = cell_flags(cell, _transform, None)
    assert any(f.startswith(flag) for f in found), found


@pytest.mark.parametrize(
    "cell",
    [
        "import pandas as pd\ndf = pd.read_csv('in.csv')",
        "with open('in.txt') as f:\n    text = f.read()",
        "lst.remove(3)",
        "model = torch.load('m.pt')",
        "print('!pip install x')",
    ],
)
def test_a_cell_that_only_reads_and_computes_is_not_flagged(cell):
    assert cell_flags(cell, _transform, None) == ()


def test_a_long_run_is_flagged_a_short_one_not():
    assert cell_flags("x = 1", None, LONG_S + 95) == ("ran 2 min 5 s before",)
    assert cell_flags("x = 1", None, LONG_S - 1) == ()


@pytest.mark.parametrize(
    ("earlier", "cell", "flag"),
    [
        ((), "import os as o\no.system('ls')", "runs shell commands (o.system = os.system)"),
        (("import os as o",), "o.system('ls')", "runs shell commands (o.system = os.system)"),
        (("from os import remove",), "remove(p)", "writes or deletes files (remove = os.remove)"),
        (("from subprocess import run as go",), "go(['ls'])", "runs shell commands (go = "),
        (("import shutil as sh",), "sh.rmtree('runs')", "writes or deletes files (sh.rmtree = "),
        (
            ("from pathlib import Path",),
            "Path('a.txt').rename('b.txt')",
            "writes or deletes files (Path(...): pathlib.Path.rename)",
        ),
        (
            ("from pathlib import Path", "out = Path('runs') / 'x.pt'"),
            "out.unlink()",
            "writes or deletes files",
        ),
        (
            ("import sqlite3", "con = sqlite3.connect('db')", "cur = con.cursor()"),
            "cur.execute('DELETE FROM runs WHERE id = 3')",
            "writes or deletes files (cur.execute: SQL DELETE)",
        ),
        ((), "cur.execute('drop table runs')", "writes or deletes files (cur.execute: SQL DROP)"),
        (
            ("q = 'TRUNCATE runs'",),
            "conn.execute(q)",
            "writes or deletes files (conn.execute: SQL TRUNCATE)",
        ),
        (
            ("f = open(p, 'w')", "x = 1"),
            "f.write('hello')",
            "writes or deletes files (f.write: a file opened for writing)",
        ),
        (
            ("log = open('log.txt', mode='a')",),
            "print('step', file=log)",
            "writes or deletes files (print(..., file=): a file opened for writing)",
        ),
    ],
)
def test_a_call_is_flagged_by_what_its_name_resolves_to_through_earlier_cells(earlier, cell, flag):
    found = cell_flags(cell, _transform, None, earlier)
    assert any(f.startswith(flag) for f in found), found


@pytest.mark.parametrize(
    ("earlier", "cell"),
    [
        (("import pandas as pd", "df = pd.DataFrame()"), "df = df.rename(columns={'a': 'b'})"),
        (("f = open(p)",), "f.read()"),
        (("f = open(p, 'w')", "f = open(p)"), "f.readline()"),
        (("import sqlite3", "cur = sqlite3.connect('db').cursor()"), "cur.execute('SELECT 1')"),
        (("from os import path",), "path.join('a', 'b')"),
        (("o = [1, 2]",), "o.remove(1)"),
        (("import os as o", "o = [1]"), "o.remove(1)"),
    ],
)
def test_a_name_that_resolves_to_something_harmless_is_not_flagged(earlier, cell):
    assert cell_flags(cell, _transform, None, earlier) == ()


def test_a_file_opened_and_written_in_one_cell_is_flagged_once_at_its_open():
    found = cell_flags("with open('log.txt', 'w') as f:\n    f.write('x')", _transform, None)
    assert found == ("writes or deletes files (open(..., 'w'))",)
