"""Where a log's or a pasted traceback's CUDA error surfaced: the last frame of the user's code.

The tracebacks are in the shapes Python and IPython print them (CPython's traceback module, 3.11's
``^^^^`` markers; IPython >= 8's ``Cell In[n], line m`` and ``File path:line, in f`` frames with
numbered source lines; IPython 7's ``<ipython-input-n-...> in <module>``), with torchrun's prefixes.
"""

from __future__ import annotations

import pytest
from pytorch_texts import ASSERT_2_0, ASSERT_2_9, H100_TORCH_2_11

from nb_cudaguard import diagnose
from nb_cudaguard.diagnosis.advice import setting_of_text
from nb_cudaguard.diagnosis.where import where_in_text

LINE = H100_TORCH_2_11["cross-entropy-label"][0] + "\n"

PYTHON = (
    "Traceback (most recent call last):\n"
    '  File "/home/me/proj/train.py", line 120, in <module>\n'
    "    main()\n"
    '  File "/home/me/proj/train.py", line 88, in main\n'
    "    running_loss += loss.item()\n"
    "                    ^^^^^^^^^^^\n"
    f"torch.AcceleratorError: {ASSERT_2_9}\n"
)
IPYTHON_8 = (
    "---------------------------------------------------------------------------\n"
    "RuntimeError                              Traceback (most recent call last)\n"
    "Cell In[12], line 4\n"
    "      2 for x, y in loader:\n"
    "      3     out = model(x.cuda())\n"
    "----> 4     loss = criterion(out, y.cuda())\n"
    "\n"
    "File ~/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1751, in "
    "Module._wrapped_call_impl(self, *args, **kwargs)\n"
    "   1749     return self._compiled_call_impl(*args, **kwargs)  # type: ignore[misc]\n"
    "   1750 else:\n"
    "-> 1751     return self._call_impl(*args, **kwargs)\n"
    "\n"
    f"RuntimeError: {ASSERT_2_0}\n"
)
IPYTHON_7 = (
    "---------------------------------------------------------------------------\n"
    "RuntimeError                              Traceback (most recent call last)\n"
    "<ipython-input-5-b6d1f4c2e3a1> in <module>\n"
    "      2 for x, y in loader:\n"
    "      3     loss = step(x, y)\n"
    "----> 4     print(loss.item())\n"
    "\n"
    "RuntimeError: CUDA error: device-side assert triggered\n"
)
TORCHRUN = "".join(
    f"[rank1]: {line}\n"
    for line in (
        "Traceback (most recent call last):",
        '  File "/workspace/train_ddp.py", line 61, in <module>',
        "    optimizer.step()",
        '  File "/usr/lib/python3/dist-packages/torch/optim/optimizer.py", line 493, in wrapper',
        "    out = func(*args, **kwargs)",
        "torch.AcceleratorError: CUDA error: device-side assert triggered",
    )
)
# An error re-raised from the CUDA one: the CUDA error's own traceback says where it surfaced.
CHAINED = (
    PYTHON + "\nThe above exception was the direct cause of the following exception:\n\n"
    "Traceback (most recent call last):\n"
    '  File "/home/me/proj/run.py", line 9, in <module>\n'
    "    raise SystemExit('training failed') from error\n"
    "RuntimeError: training failed\n"
)

CASES = {
    "python": (PYTHON, "`running_loss += loss.item()` (train.py, line 88), an operation"),
    "ipython 8": (IPYTHON_8, "`loss = criterion(out, y.cuda())` (cell [12], line 4): the"),
    "ipython 7": (IPYTHON_7, "`print(loss.item())` (cell [5], line 4), an operation"),
    "torchrun": (TORCHRUN, "`optimizer.step()` (train_ddp.py, line 61): the failing kernel"),
    "chained": (CHAINED, "`running_loss += loss.item()` (train.py, line 88)"),
}


@pytest.mark.parametrize(("text", "expected"), CASES.values(), ids=CASES.keys())
def test_where_names_the_last_frame_of_the_users_code(text: str, expected: str):
    where = where_in_text(LINE + text)
    assert where is not None and f"It surfaced at {expected}" in where
    diagnosis = diagnose(LINE + text)
    assert diagnosis is not None and diagnosis.where == where


def test_a_traceback_with_only_library_frames_has_no_where():
    text = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main\n'
        "    return _run_code(code, main_globals, None,\n"
        '  File "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py", line 40, in item\n'
        "    return self._item()\n"
        f"RuntimeError: {ASSERT_2_9}\n"
    )
    assert where_in_text(text) is None


def test_a_bare_error_line_has_no_where():
    diagnosis = diagnose(f"RuntimeError: {ASSERT_2_9}")
    assert diagnosis is not None and diagnosis.where is None


@pytest.mark.parametrize(
    ("text", "kind", "command"),
    [
        (PYTHON, "script", "CUDA_LAUNCH_BLOCKING=1 python /home/me/proj/train.py ..."),
        (TORCHRUN, "script", "CUDA_LAUNCH_BLOCKING=1 python /workspace/train_ddp.py ..."),
        (IPYTHON_8, "notebook", "nb-cudaguard run --blocking-rerun NOTEBOOK -o OUT.ipynb"),
        (IPYTHON_7, "notebook", "nb-cudaguard run --blocking-rerun NOTEBOOK -o OUT.ipynb"),
        # ipykernel's compiled cell, as traceback.print_exc() in a notebook prints it
        (
            PYTHON.replace("/home/me/proj/train.py", "/tmp/ipykernel_4121/2871352.py"),
            "notebook",
            "nb-cudaguard run --blocking-rerun NOTEBOOK -o OUT.ipynb",
        ),
        (f"RuntimeError: {ASSERT_2_9}", "script", "CUDA_LAUNCH_BLOCKING=1 python ..."),
    ],
    ids=["script", "torchrun", "ipython 8", "ipython 7", "ipykernel file", "no traceback"],
)
def test_the_setting_of_a_text_is_read_from_its_traceback(text: str, kind: str, command: str):
    setting = setting_of_text(text)
    assert (setting.kind, setting.command) == (kind, command)
