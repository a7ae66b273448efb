"""What a restart kept lives as long as the kernel it was kept for: one watcher per user.

A keep is made for the next process of a kernel. If that process never restores it (the
notebook closed and its kernel shut down, the server stopped), nothing else would free it
before it expires a day later, and in RAM (``/dev/shm``) that is memory held for nobody. The
new process may never load nb_cudaguard, so keeps are watched from outside it: ``watch``
registers the kernel's IPython profile in the user's private state directory
(``files.keys.user_state_dir``) and starts one small process per user, whatever the profiles
(a lock there says whether one runs already), detached from the kernel (a kernel's process
group is killed at shutdown). Each poll (a ``stat`` a second) it looks at every keep of every
registered profile and

- discards one whose kernel has been gone for ``GRACE_S``: its connection file removed
  (Jupyter removes it when a kernel is shut down or its server stops; a restart keeps it) and
  no process running with it. The grace covers a restart by a launcher that removed the file
  early (the old process gone, the new one not yet started: 0.05 to 0.14 s measured through
  ``jupyter_client``'s restart on a loaded 2-core machine);
- discards one past its age (``store.TTL_S``);
- drops a profile with no keep left from the register, and ends once no keep is left to
  watch (all restored, discarded or expired).

It runs from the user's state directory (it holds no notebook's working directory) with the standard
library ahead of every other path, site-packages included.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ..files.keys import state_dir, user_state_dir
from ..files.private import make_dirs, read_private, write_atomic
from . import store

POLL_S = 1.0
# A kernel gone this long is shut down, not restarting (see above); the variable shortens it.
GRACE_S = float(os.environ.get("NB_CUDAGUARD_KEEP_GRACE", 30.0))
LOCK = "keep-watcher.lock"  # in the user's state directory; holds the running watcher's pid
PROFILES = "keep-watcher.profiles"  # there: the profiles to watch (JSON), changed under
REGISTER_LOCK = "keep-watcher.profiles.lock"  # this lock
_ENV = "NB_CUDAGUARD_KEEP_WATCH"  # the watcher's arguments (not on its command line, where
# looking for the kernel's process would find the watcher itself)

# Started with -I (no PYTHONPATH, no user site, no working directory on sys.path); the package
# and psutil are found after the standard library, never ahead of it.
_BOOT = (
    "import json, os, sys, sysconfig\n"
    "extra = json.loads(os.environ['NB_CUDAGUARD_KEEP_WATCH'])\n"
    "std = {os.path.realpath(sysconfig.get_paths()[k]) for k in ('stdlib', 'platstdlib')}\n"
    "def is_std(p):\n"
    "    p = os.path.realpath(p)\n"
    "    return any(p == s or p.startswith(s + os.sep) for s in std) or p.endswith('.zip')\n"
    "at = max((i + 1 for i, p in enumerate(sys.path) if is_std(p)), default=len(sys.path))\n"
    "sys.path[at:at] = [p for p in extra if p not in sys.path[:at]]\n"
    "from nb_cudaguard.keep.lifetime import main\n"
    "main()\n"
)


def watch(profile_location: str | os.PathLike[str]) -> bool:
    """Make sure this profile's keeps are watched: register the profile, and start the user's
    watcher unless one runs. False where it could not be started (the keeps then expire as
    before). Never raises."""
    if os.name != "posix":
        return False
    try:
        place = user_state_dir()
        register(str(profile_location))
        if _running(place):
            return True
        here = str(Path(__file__).resolve().parents[2])  # this very package, where it was found
        extra = [here]
        with contextlib.suppress(Exception):
            import psutil

            extra.append(str(Path(psutil.__file__).resolve().parents[1]))
        env = dict(os.environ)
        env[_ENV] = json.dumps(extra)
        # Through a shell that starts it in the background and exits at once: the watcher is
        # nobody's child to reap, whatever the kernel does next (exit, or execve in place).
        start = '"$0" -I -c "$1" </dev/null >/dev/null 2>&1 &'
        launcher = subprocess.Popen(
            ["/bin/sh", "-c", start, sys.executable, _BOOT],
            cwd=place,
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


def watcher_pid() -> int | None:
    """The pid of the user's running watcher, or None."""
    place = user_state_dir()
    if not _running(place):
        return None
    with contextlib.suppress(OSError, ValueError):
        return int((place / LOCK).read_text().strip())
    return None


def registered() -> list[str]:
    """The profiles the watcher looks at."""
    with contextlib.suppress(Exception):
        found = json.loads(read_private(user_state_dir() / PROFILES).decode("utf-8"))
        if isinstance(found, list):
            return [p for p in found if isinstance(p, str)]
    return []


def register(profile_location: str) -> None:
    """Add a profile to the ones watched (after its keep is saved: see ``_forget``)."""
    with _register_lock():
        profiles = registered()
        if profile_location not in profiles:
            write_atomic(user_state_dir() / PROFILES, json.dumps([*profiles, profile_location]))


def _forget(profile_location: str) -> bool:
    """Drop a profile with no keep left; under the register's lock, where a keep saved
    meanwhile is seen (``register`` runs after the save), so none is dropped unwatched."""
    with _register_lock():
        if any(_keeps(profile_location)):
            return False
        profiles = registered()
        if profile_location in profiles:
            profiles.remove(profile_location)
            write_atomic(user_state_dir() / PROFILES, json.dumps(profiles))
        return True


@contextlib.contextmanager
def _register_lock() -> Iterator[None]:
    import fcntl

    with _open_lock(user_state_dir(), REGISTER_LOCK) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _running(place: Path) -> bool:
    """A watcher holds the lock (it is released by the kernel when its process ends)."""
    lock = _lock(place)
    if lock is None:
        return (place / LOCK).exists()
    lock.close()
    return False


def _lock(place: Path) -> IO[str] | None:
    """The lock, held open; None where another process holds it."""
    import fcntl

    handle = _open_lock(place, LOCK)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _open_lock(place: Path, name: str) -> IO[str]:
    """A lock file of ours in ``place`` (made 0600, never through a link), open, not locked."""
    make_dirs(place)
    fd = os.open(place / name, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    return os.fdopen(fd, "r+")


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


def _keeps(profile_location: str) -> Iterator[tuple[str, store.Manifest]]:
    """(connection file, manifest) of each keep in the profile with something still kept."""
    for directory in sorted(state_dir(profile_location).glob("keep-*")):
        with contextlib.suppress(Exception):
            manifest = store.Manifest.from_json(
                read_private(directory / store.MANIFEST).decode("utf-8")
            )
            # The manifest names its kernel; a directory not under that kernel's name is not
            # a keep of ours to act on.
            if store.keep_dir(profile_location, manifest.kernel) == directory and manifest.kept:
                yield manifest.kernel, manifest


class _Watch:
    """The state of one watcher: since when each keep's kernel has been seen gone."""

    def __init__(self, profile_location: str, grace: float, ram: list[Path] | None) -> None:
        self.profile, self.grace, self.ram = profile_location, grace, ram
        self.gone_since: dict[str, float] = {}
        self.kernels: dict[str, int] = {}  # a process running with a removed connection file
        self.created: dict[str, float] = {}

    def poll(self) -> int:
        """Discard what is no longer needed; returns how many keeps are left to watch."""
        import psutil

        left = 0
        for connection, manifest in list(_keeps(self.profile)):
            # Aged from the newest date seen: a manifest dated back since (by another writer)
            # is the store's to judge when it is read, not this watcher's to remove.
            created = max(self.created.get(connection, manifest.created), manifest.created)
            self.created[connection] = created
            if time.time() - created > store.TTL_S:
                store.discard_keep(self.profile, connection, ram=self.ram)
                continue
            alive = os.path.exists(connection)
            if not alive:
                pid = self.kernels.get(connection)
                if pid is None or not psutil.pid_exists(pid):
                    pid = kernel_process(connection)
                alive = pid is not None
                if pid is not None:
                    self.kernels[connection] = pid
            if alive:
                self.gone_since.pop(connection, None)
            else:
                since = self.gone_since.setdefault(connection, time.monotonic())
                if time.monotonic() - since >= self.grace:
                    store.discard_keep(self.profile, connection, ram=self.ram)
                    self.gone_since.pop(connection, None)
                    continue
            left += 1
        return left


def run(
    profile_location: str | None = None,
    poll: float = POLL_S,
    grace: float = GRACE_S,
    ram: list[Path] | None = None,
) -> str:
    """Watch the registered profiles' keeps (``profile_location``'s too: registered first)
    until none is left; returns ``done``, or ``running`` where another watcher has them."""
    if profile_location is not None:
        register(profile_location)
    place = user_state_dir()
    lock = _lock(place)
    if lock is None:
        return "running"
    watches: dict[str, _Watch] = {}
    while True:
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        while _poll(watches, grace, ram):
            time.sleep(poll)
        # A keep saved while this one decided to end found the lock held and did not start a
        # watcher of its own: look once more with the lock released.
        lock.close()
        if not any(any(_keeps(p)) for p in registered()):
            return "done"
        lock = _lock(place)
        if lock is None:
            return "running"  # a new watcher has them


def _poll(watches: dict[str, _Watch], grace: float, ram: list[Path] | None) -> int:
    """One look at every registered profile; how many keeps are left to watch."""
    left = 0
    for profile in registered():
        watching = watches.get(profile)
        if watching is None:
            watching = watches[profile] = _Watch(profile, grace, ram)
        found = watching.poll()
        if not found and _forget(profile):
            del watches[profile]
        left += found
    return left


def main() -> None:
    with contextlib.suppress(Exception):
        run()
