"""Where a keep lives (the profile, a RAM filesystem), how much RAM it may take, and the
privacy checks on both."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..files.keys import kernel_key, state_dir
from ..files.private import NotPrivate, check_dir, check_file, private_dir

RAM_MARGIN = 64 * 1024**2  # left free on a RAM filesystem
RAM_SHARE = 0.5  # of the memory available: the most a keep may hold in RAM


class StoreError(Exception):
    """The store cannot be read: not ours, another kernel's, expired or damaged."""


def keep_dir(profile_location: str | os.PathLike[str], connection: str) -> Path:
    return state_dir(profile_location) / f"keep-{kernel_key(connection)}"


def kernel_path(connection: str) -> str:
    return os.path.realpath(os.path.abspath(connection))


def staging_of(directory: Path) -> Path:
    """Where a save writes before its keep takes ``directory``'s place."""
    return directory.with_name(f".{directory.name}-new-{os.getpid()}")


def check_private(path: Path, directory: bool) -> None:
    """``files.private``'s check, as the store's error."""
    try:
        (check_dir if directory else check_file)(path)
    except NotPrivate as error:
        raise StoreError(str(error)) from None


# --- the RAM place -------------------------------------------------------------------------------


RAM_ENV = "NB_CUDAGUARD_KEEP_RAM"  # the roots to use instead (os.pathsep between); empty: none


def ram_roots() -> list[Path]:
    """RAM-backed filesystems to try, best first: the user's own runtime directory (private by
    design), then ``/dev/shm``; or those ``$NB_CUDAGUARD_KEEP_RAM`` names. None off Linux-like
    systems."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return []
    chosen = os.environ.get(RAM_ENV)
    if chosen is not None:
        return [Path(p) for p in chosen.split(os.pathsep) if os.path.isabs(p)]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    roots = [Path(runtime)] if runtime and os.path.isabs(runtime) else []
    return [*roots, Path("/dev/shm")]


def ram_base(root: Path) -> Path:
    return root / f"nb_cudaguard-{os.geteuid()}"


def ram_dir(root: Path, profile_location: str | os.PathLike[str], connection: str) -> Path:
    """This kernel's RAM directory under ``root``: keyed by the profile as well as the kernel, as
    a RAM root is shared by every profile on the machine."""
    profile = os.path.realpath(os.path.abspath(profile_location))
    key = hashlib.sha256(f"{profile}\0{kernel_path(connection)}".encode()).hexdigest()[:24]
    return ram_base(root) / f"keep-{key}"


def memory_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo, in bytes; None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def ram_room(root: Path, available: int | None) -> int:
    """Bytes a keep may put under ``root``: its free space less ``RAM_MARGIN``, and at most
    ``RAM_SHARE`` of ``available`` memory (0 where either is unknown)."""
    if available is None:
        return 0
    try:
        info = os.statvfs(root)
    except OSError:
        return 0
    return max(0, min(info.f_bavail * info.f_frsize - RAM_MARGIN, int(available * RAM_SHARE)))


def make_ram_dir(directory: Path) -> bool:
    """Create ``directory`` 0700 under a 0700 per-user base in a shared, world-writable root: the
    base must be a real directory of ours that nobody else can enter, or nothing goes there."""
    try:
        private_dir(directory.parent, tighten=False)
        private_dir(directory, tighten=False)
    except (OSError, NotPrivate):
        return False
    return True


def ram_place(
    profile_location: str | os.PathLike[str], connection: str, roots: list[Path], needed: int
) -> tuple[Path | None, int]:
    """The RAM directory for this save and the bytes it may take there: the first root with room
    for ``needed`` (the arrays' and tensors' bytes), else the one with the most room."""
    available = memory_available()
    rooms = [(ram_room(root, available), root) for root in roots]
    rooms = [(room, root) for room, root in rooms if room > 0]
    if not rooms:
        return None, 0
    fits = [(room, root) for room, root in rooms if room >= needed]
    room, root = fits[0] if fits else max(rooms, key=lambda pair: pair[0])
    return ram_dir(root, profile_location, connection), room


def discard(directory: Path) -> None:
    """Remove a keep directory (ours: it is only ever called with one), or whatever is in its
    place."""
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
