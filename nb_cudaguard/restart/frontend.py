"""Set the frontend's kernel status right after a restart the frontend did not start.

After a server-side restart JupyterLab 4 and Notebook 7 show "Starting" until the next execution
(docs/restart.md). Why: the new kernel publishes ``status: starting`` on IOPub, and the only status
messages that follow (busy/idle around the server's ``kernel_info_request``) have a parent whose
type is in the server's ``untracked_message_types``, which the frontend's kernel connection skips
(jupyter_server ``kernelmanager.py``; ``@jupyterlab/services`` ``kernel/default.ts``). Any shell
request outside that list makes the kernel publish busy then idle with a parent the frontend does
track: an ``is_complete_request`` is the one that runs no code, so a detached helper process sends
one to the new kernel as soon as it answers.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

HELPER_TIMEOUT_S = 60.0

_HELPER = """\
import os, sys, time
connection, old_pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:  # the old process still answers until it is gone
    try:
        os.kill(old_pid, 0)
    except OSError:
        break
    time.sleep(0.05)
from jupyter_client import BlockingKernelClient
client = BlockingKernelClient(connection_file=connection)
client.load_connection_file()
client.start_channels()
try:
    client.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
    client.is_complete("pass")
    client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
finally:
    client.stop_channels()
"""


def nudge_after_restart(connection: str | None, timeout: float = HELPER_TIMEOUT_S) -> None:
    """Start the helper (best effort, never raises): in its own session, so that the server's
    kill of this kernel's process group spares it, and silent."""
    if connection is None:
        return
    with contextlib.suppress(Exception):
        subprocess.Popen(
            [sys.executable, "-c", _HELPER, connection, str(os.getpid()), str(timeout)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
