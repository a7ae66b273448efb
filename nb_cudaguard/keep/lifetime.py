"""What a restart kept lives as long as the kernel it was kept for.

A keep is made for the next process of a kernel. If that process never restores it (the
notebook closed and its kernel shut down, the server stopped), nothing else would free it
before it expires a day later, and in RAM (``/dev/shm``) that is memory held for nobody. The
new process may never load nb_cudaguard, so the keep is watched from outside it: ``watch``
starts a small process of its own per keep, detached from the kernel (a session of its own: a
kernel's process group is killed at shutdown), which

- discards the keep once the kernel is gone: its connection file removed (Jupyter removes it
  when a kernel is shut down or its server stops; a restart, ours or the Kernel menu's, keeps
  it) and no process running with it;
- ends once the keep is gone (discarded, expired) or replaced by a newer one, which has its own.

It polls (a ``stat`` a second); nothing is read from the kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import store

POLL_S = 1.0
_ENV = "NB_CUDAGUARD_KEEP_WATCH"  # the watcher's arguments (not on its command line, where
# looking for the kernel's process would find the watcher itself)


def watch(profile_location: str, connection: str, created: float) -> bool:
    """Start the watcher of the keep this kernel's save made at ``created``; False where it
    could not be started (the keep then expires as before). Never raises."""
    if os.name != "posix":
        return False
    env = dict(os.environ)
    env[_ENV] = json.dumps([str(profile_location), connection, created])
    # This very package, wherever the kernel found it.
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH", "")]))
    try:
        # Through a shell that starts it in the background and exits at once: the watcher is
        # nobody's child to reap, whatever the kernel does next (exit, or execve in place).
        start = '"$0" -m nb_cudaguard.keep.lifetime </dev/null >/dev/null 2>&1 &'
        launcher = subprocess.Popen(
            ["/bin/sh", "-c", start, sys.executable],
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        return launcher.wait(timeout=10) == 0
    except Exception:
        return False


def kernel_process(connection: str) -> int | None:
    """The pid of a kernel running with this connection file (one whose launcher removed the
    file early is still running), or None. A kernel names it after ``-f`` (ipykernel's,
    Colab's launcher, VS Code's ``--f=``); other processes that name it (a client) do not count."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(Exception):
            if connection in _connection_flags(process.info["cmdline"] or []):
                return int(process.pid)
    return None


def _connection_flags(argv: list[str]) -> set[str]:
    found = set()
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag in ("-f", "--f"):
            value = value if equals else (argv[index + 1] if index + 1 < len(argv) else "")
            found.add(os.path.realpath(os.path.abspath(value)) if value else "")
    return found


def run(
    profile_location: str,
    connection: str,
    created: float,
    poll: float = POLL_S,
    ram: list[Path] | None = None,
) -> str:
    """Watch the keep made at ``created`` until one of the ends above; returns which:
    ``discarded``, ``gone``, ``replaced``, ``expired`` or ``unreadable``."""
    import psutil

    manifest_path = store.keep_dir(profile_location, connection) / store.MANIFEST
    seen: tuple[int, int] | None = None
    kernel: int | None = None  # a process running with the connection file, once it is gone
    while True:
        try:
            info = os.stat(manifest_path)
        except FileNotFoundError:
            return "gone"
        except OSError:
            return "unreadable"
        if (info.st_ino, info.st_mtime_ns) != seen:  # read again only once it changed
            seen = (info.st_ino, info.st_mtime_ns)
            try:
                # Its age is judged below, by this keep's own time: a manifest changed since
                # (a newer keep) is not this watcher's to remove.
                manifest = store.read_manifest(profile_location, connection, check_age=False)
            except store.StoreError:
                return "unreadable"
            if manifest is None:
                return "gone"
            if manifest.created != created:
                return "replaced"
        if time.time() - created > store.TTL_S:
            store.discard_keep(profile_location, connection, ram=ram)
            return "expired"
        if not os.path.exists(connection):
            if kernel is None or not psutil.pid_exists(kernel):
                kernel = kernel_process(os.path.realpath(os.path.abspath(connection)))
            if kernel is None:
                store.discard_keep(profile_location, connection, ram=ram)
                return "discarded"
        time.sleep(poll)


def main() -> None:
    with contextlib.suppress(Exception):
        profile_location, connection, created = json.loads(os.environ.get(_ENV, "null"))
        run(str(profile_location), str(connection), float(created))


if __name__ == "__main__":
    main()
