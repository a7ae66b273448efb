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
