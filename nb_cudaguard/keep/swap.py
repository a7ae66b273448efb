"""The atomic swap: a new keep takes the earlier one's place only once it is complete,
carrying over what the earlier one kept and the notebook has not made again."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from ..files.private import create, open_private
from .manifest import Kept, Manifest, ram_of, read_manifest, write_manifest
from .places import StoreError, check_private, discard, keep_dir, ram_base, ram_dir


def remove_unfinished(
    profile_location: str | os.PathLike[str], connection: str, roots: list[Path]
) -> None:
    """What an earlier save of this kernel left half done (its process ended while it wrote,
    or while it swapped): one kernel saves one at a time, so nothing of it is in use."""
    directory = keep_dir(profile_location, connection)
    places = [directory.parent]
    for root in roots:
        base = ram_base(root)
        with contextlib.suppress(StoreError, OSError):
            check_private(base, directory=True)
            places.append(base)
    names = (directory.name, ram_dir(Path("/"), profile_location, connection).name)
    for place in places:
        for name in names:
            for pattern in (f".{name}-new-*", f".{name}-earlier-*"):
                for leftover in place.glob(pattern):
                    discard(leftover)


def put_in_place(
    profile_location: str | os.PathLike[str],
    connection: str,
    manifest: Manifest,
    staging: Path,
    places: tuple[Path, Path] | None,
    names_now: set[str],
    roots: list[Path],
) -> Manifest:
    """Carry the earlier keep's names not defined now into the new one, write its manifest, and
    only then put it in the earlier one's place. Raises, leaving the earlier keep as it was,
    where any of that fails."""
    directory = keep_dir(profile_location, connection)
    earlier, earlier_ram = None, None
    with contextlib.suppress(StoreError, OSError):
        earlier = read_manifest(profile_location, connection, now=manifest.created)
        earlier_ram = None if earlier is None else ram_of(earlier, profile_location, connection)
    if earlier is not None and earlier.kept:
        manifest = _carry_over(
            earlier, directory, earlier_ram, manifest, staging, places, names_now
        )
    write_manifest(staging, manifest)
    undo_ram = None
    if places is not None:
        undo_ram = _swap(places[1], places[0])
    try:
        done = _swap(directory, staging)
    except BaseException:
        if undo_ram is not None:
            undo_ram()
        raise
    done.commit()
    if undo_ram is not None:
        undo_ram.commit()
    # This kernel's RAM directories elsewhere (the earlier keep's, under another root, or a
    # save that never finished): nothing names them now.
    others = {ram_dir(root, profile_location, connection) for root in roots}
    others |= {earlier_ram} if earlier_ram is not None else set()
    for other in others - {None if places is None else places[1]}:
        if other is not None:
            with contextlib.suppress(StoreError, OSError):
                check_private(other.parent, directory=True)
                discard(other)
    return manifest


@dataclass
class _Swap:
    """``staging`` renamed into ``final``'s place, the earlier ``final`` set aside: undone by a
    call, made final by ``commit`` (the earlier one removed)."""

    final: Path
    staging: Path
    aside: Path | None

    def __call__(self) -> None:
        with contextlib.suppress(OSError):
            self.final.rename(self.staging)
            if self.aside is not None:
                self.aside.rename(self.final)

    def commit(self) -> None:
        if self.aside is not None:
            discard(self.aside)


def _swap(final: Path, staging: Path) -> _Swap:
    aside = None
    if final.exists() or final.is_symlink():
        aside = final.with_name(f".{final.name}-earlier-{os.getpid()}")
        discard(aside)
        final.rename(aside)
    try:
        staging.rename(final)
    except BaseException:
        if aside is not None:
            aside.rename(final)
        raise
    return _Swap(final, staging, aside)


def _carry_over(
    earlier: Manifest,
    directory: Path,
    earlier_ram: Path | None,
    manifest: Manifest,
    staging: Path,
    places: tuple[Path, Path] | None,
    names_now: set[str],
) -> Manifest:
    """Add the earlier keep's names that are not defined now: their files linked into the new
    keep (in RAM where they were in RAM and this keep's RAM directory is on the same
    filesystem), else copied into the profile. Raises where a file cannot be carried."""
    carried: list[Kept] = []
    linked: dict[tuple[str, bool], tuple[str, bool]] = {}
    written = 0
    for item in earlier.kept:
        if item.name in names_now:
            continue  # the notebook has a newer value, kept (or not) just now
        file, in_ram = item.file, item.ram
        if file is not None:
            if (file, in_ram) not in linked:
                source = ((earlier_ram if in_ram else None) or directory) / file
                try:
                    check_private(source, directory=False)
                except (StoreError, FileNotFoundError):
                    continue  # lost (a reboot emptied RAM) or not ours: nothing to carry
                new_name = f"c{len(linked)}.bin"
                linked[(file, in_ram)], copied = _link(source, new_name, staging, places)
                written += copied
            file, in_ram = linked[(file, in_ram)]
        note = item.note or "kept at an earlier restart"
        mates = [
            k.name for k in earlier.kept if k.file == item.file and k.file and k.name in names_now
        ]
        if mates:
            names = ", ".join(f"`{m}`" for m in mates)
            note += f"; it shares state with the {names} of then, not with the one kept now"
        carried.append(replace(item, file=file, note=note, ram=in_ram))
    if not carried:
        return manifest
    total = manifest.total
    for file, in_ram in linked.values():
        place = places[0] if in_ram and places is not None else staging
        with contextlib.suppress(OSError):
            total += (place / file).stat().st_size
    return replace(
        manifest, kept=(*manifest.kept, *carried), total=total, written=manifest.written + written
    )


def _link(
    source: Path, name: str, staging: Path, places: tuple[Path, Path] | None
) -> tuple[tuple[str, bool], int]:
    """Link ``source`` into the new keep under ``name``: into RAM or the profile, whichever is
    on its filesystem; else copied into the profile. Returns (name, in RAM) and the bytes
    copied."""
    for target, in_ram in ((None if places is None else places[0], True), (staging, False)):
        if target is not None:
            try:
                os.link(source, target / name)
                return (name, in_ram), 0
            except OSError as error:
                if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
    with open_private(source) as data, create(staging / name) as out:
        shutil.copyfileobj(data, out, 16 * 1024**2)
        return (name, False), out.tell()
