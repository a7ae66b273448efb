"""Which environment a kernel runs in, from sys.modules, os.environ and its launch arguments."""

from __future__ import annotations

import pytest

from nb_cudaguard.restart.environment import (
    Environment,
    connection_file,
    detect,
    is_vscode_launch,
    kernel_id,
)

KERNEL = ["python", "-m", "ipykernel_launcher", "-f", "/run/jupyter/kernel-1234-ab.json"]
VSCODE = [
    "python",
    "-m",
    "ipykernel_launcher",
    "--ip=127.0.0.1",
    "--f=/tmp/tmp-9/kernel-v2-77abc.json",
]
COLAB = [
    "python3",
    "-m",
    "colab_kernel_launcher",
    "-f",
    "/root/.local/share/jupyter/runtime/kernel-5e1f.json",
]


def test_colab_is_detected_by_google_colab_in_sys_modules():
    modules = {"ipykernel", "google.colab"}
    assert detect(modules, {}, COLAB) is Environment.COLAB


def test_colab_is_not_detected_from_its_launcher_alone():
    assert detect({"ipykernel"}, {}, COLAB) is Environment.JUPYTER


def test_kaggle_is_detected_by_its_run_type_variable():
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    assert detect({"ipykernel"}, environ, KERNEL) is Environment.KAGGLE


def test_kaggle_wins_over_google_colab_loaded_in_its_image():
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}
    assert detect({"ipykernel", "google.colab"}, environ, KERNEL) is Environment.KAGGLE


def test_vscode_is_detected_by_its_kernel_v2_connection_file():
    assert detect({"ipykernel"}, {}, VSCODE) is Environment.VSCODE


def test_a_kernel_under_a_jupyter_server_is_jupyter():
    assert detect({"ipykernel"}, {}, KERNEL) is Environment.JUPYTER


def test_terminal_ipython_is_not_a_kernel():
    assert detect({"IPython"}, {}, ["python", "-m", "IPython"]) is Environment.TERMINAL


def test_a_script_with_its_own_f_flag_is_not_a_kernel():
    assert (
        detect({"argparse"}, {}, ["python", "train.py", "-f", "config.json"])
        is Environment.TERMINAL
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (KERNEL, "/run/jupyter/kernel-1234-ab.json"),
        (VSCODE, "/tmp/tmp-9/kernel-v2-77abc.json"),
        (["python", "-m", "ipykernel_launcher", "-f=/x/kernel-1.json"], "/x/kernel-1.json"),
        (["python", "-m", "ipykernel_launcher", "--f", "/x/kernel-2.json"], "/x/kernel-2.json"),
        (["python", "-m", "ipykernel_launcher"], None),
    ],
)
def test_connection_file_is_read_from_every_flag_spelling(argv, expected):
    assert connection_file(argv) == expected


def test_kernel_id_comes_from_the_server_connection_file_name():
    assert kernel_id("/run/kernel-d9c80405-47c2-4534-857c-55bc399bc465.json") == (
        "d9c80405-47c2-4534-857c-55bc399bc465"
    )


def test_a_connection_file_not_named_by_a_server_has_no_kernel_id():
    assert kernel_id("/tmp/my-connection.json") is None


def test_vscode_launch_needs_the_kernel_v2_name():
    assert is_vscode_launch(VSCODE)
    assert not is_vscode_launch(KERNEL)
