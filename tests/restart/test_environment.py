"""Which environment a kernel runs in: its connection file (asked of ipykernel), sys.modules and
os.environ."""

from __future__ import annotations

import subprocess
import sys

from nb_cudaguard.restart.environment import (
    Environment,
    detect,
    is_vscode_connection,
    kernel_id,
    running_kernel_connection,
)

SERVER_CONNECTION = "/run/jupyter/kernel-1234-ab.json"
VSCODE_CONNECTION = "/tmp/tmp-9/kernel-v2-77abc.json"
COLAB_CONNECTION = "/root/.local/share/jupyter/runtime/kernel-5e1f.json"


def test_colab_is_detected_by_google_colab_in_sys_modules():
    modules = {"ipykernel", "google.colab"}
    assert detect(modules, {}, COLAB_CONNECTION) is Environment.COLAB


def test_colab_is_not_detected_from_its_launcher_alone():
    assert detect({"ipykernel"}, {}, COLAB_CONNECTION) is Environment.JUPYTER


def test_kaggle_is_detected_by_its_run_type_variable():
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    assert detect({"ipykernel"}, environ, SERVER_CONNECTION) is Environment.KAGGLE


def test_kaggle_wins_over_google_colab_loaded_in_its_image():
    environ = {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}
    assert detect({"ipykernel", "google.colab"}, environ, SERVER_CONNECTION) is Environment.KAGGLE


def test_vscode_is_detected_by_its_kernel_v2_connection_file():
    assert detect({"ipykernel"}, {}, VSCODE_CONNECTION) is Environment.VSCODE


def test_a_kernel_under_a_jupyter_server_is_jupyter():
    assert detect({"ipykernel"}, {}, SERVER_CONNECTION) is Environment.JUPYTER


def test_without_a_connection_file_it_is_not_a_kernel_whatever_is_imported():
    # ipywidgets 7.7 imports ipykernel in terminal IPython; Colab's and Kaggle's images too.
    modules = {"ipykernel", "ipykernel.kernelapp", "google.colab"}
    assert detect(modules, {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, None) is Environment.TERMINAL


def test_a_process_that_imported_ipykernel_is_not_a_kernel():
    code = (
        "import ipykernel.kernelapp, ipykernel.comm\n"
        "from nb_cudaguard.restart.environment import detect, running_kernel_connection\n"
        "print(running_kernel_connection(), detect().value)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["None", "terminal"]


def test_this_test_process_is_not_a_kernel():
    assert running_kernel_connection() is None


def test_a_real_kernel_names_its_own_connection_file(kernel):
    out = kernel.execute(
        "from nb_cudaguard.restart.environment import running_kernel_connection\n"
        "print(running_kernel_connection())"
    )
    connection = kernel.manager.connection_file
    assert out.stream.strip() == connection


def test_kernel_id_comes_from_the_server_connection_file_name():
    assert kernel_id("/run/kernel-d9c80405-47c2-4534-857c-55bc399bc465.json") == (
        "d9c80405-47c2-4534-857c-55bc399bc465"
    )


def test_a_connection_file_not_named_by_a_server_has_no_kernel_id():
    assert kernel_id("/tmp/my-connection.json") is None


def test_vscode_needs_the_kernel_v2_name():
    assert is_vscode_connection(VSCODE_CONNECTION)
    assert not is_vscode_connection(SERVER_CONNECTION)
