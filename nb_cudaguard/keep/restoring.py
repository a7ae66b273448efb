"""Restore: kept values back into the namespace, whole files at a time."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..files.private import open_private
from . import pickling
from .manifest import Kept, NotKept, ram_of, read_manifest, write_manifest
from .own_modules import bind_back
from .places import StoreError, discard, keep_dir


@dataclass(frozen=True)
class Restored:
    """What a restore did. ``restored``: put into the namespace (the names asked for and those
    that came along); ``along``: restored without being asked for, because they share state
    with a name that was; ``skipped``: defined in the namespace already, left as they are (still
    kept); ``held``: (a name not restored, the names in ``skipped`` it shares state with: names
    that share state come back all together or not at all); ``already``: asked for, restored
    before."""

    restored: tuple[Kept, ...]
    failed: tuple[tuple[str, str], ...]  # (name, why)
    remaining: tuple[Kept, ...]
    along: tuple[Kept, ...] = ()
    skipped: tuple[Kept, ...] = ()
    held: tuple[tuple[str, tuple[str, ...]], ...] = ()
    already: tuple[Kept, ...] = ()
    restored_at: float = 0.0  # when ``already`` were last restored
    read: int = 0  # bytes of the files read (what names share counted once)
    unbound: tuple[tuple[str, str], ...] = ()  # (name, why): restored, not its module's again


def _defined(namespace: dict[str, Any], item: Kept) -> bool:
    """The notebook has ``item.name`` already (the same module, imported again, does not
    count: putting it back changes nothing)."""
    if item.name not in namespace:
        return False
    if item.kind == "module":
        value = namespace[item.name]
        return getattr(value, "__name__", None) != (item.module or item.name)
    return True


def restore(
    namespace: dict[str, Any],
    profile_location: str | os.PathLike[str],
    connection: str,
    names: Iterable[str] | None = None,
    *,
    force: bool = False,
) -> Restored:
    """Put the kept values (all, or ``names`` and the names they share state with) into
    ``namespace``; a name ``namespace`` has already is left as it is unless ``force``. Files of
    restored values are removed; the manifest stays, saying what was restored. Raises
    ``StoreError``, or ``NotKept`` naming the names that were not kept."""
    import importlib

    manifest = read_manifest(profile_location, connection)
    if manifest is None:
        raise StoreError("nothing was kept")
    directory = keep_dir(profile_location, connection)
    ram = ram_of(manifest, profile_location, connection)

    def path_of(file: str, in_ram: bool) -> Path:
        return (ram if in_ram and ram is not None else directory) / file

    known = {k.name: k for k in manifest.kept}
    before = {k.name: k for k in manifest.restored}
    wanted = list(dict.fromkeys(names)) if names is not None else list(known)
    unknown = [n for n in wanted if n not in known and n not in before]
    if unknown:
        raise NotKept(unknown, list(known), list(before))
    already = tuple(before[n] for n in wanted if n not in known)
    if names is None and not known:
        already = manifest.restored  # everything was
    files = {(known[n].file, known[n].ram) for n in wanted if n in known and known[n].file}
    chosen = [k for k in manifest.kept if k.name in wanted or (k.file and (k.file, k.ram) in files)]
    restored: list[Kept] = []
    skipped: list[Kept] = []
    held: list[tuple[str, tuple[str, ...]]] = []
    failed: list[tuple[str, str]] = []
    unbound: list[tuple[str, str]] = []  # restored, but not bound back to their module
    groups: dict[tuple[str, bool], list[Kept]] = {}  # one file: one pickle graph
    for item in chosen:
        groups.setdefault((item.file or f"module {item.name}", item.ram), []).append(item)
    read = 0
    for (file, in_ram), items in groups.items():
        remade = [k for k in items if not force and _defined(namespace, k)]
        if remade:  # the others would share state with what the notebook no longer has
            skipped.extend(remade)
            mates = tuple(k.name for k in remade)
            held.extend((k.name, mates) for k in items if k not in remade)
            continue
        if items[0].file is None:
            item = items[0]
            try:
                namespace[item.name] = importlib.import_module(item.module or item.name)
                restored.append(item)
            except Exception as error:
                failed.append((item.name, f"import {item.module} failed: {error}"))
            continue
        path = path_of(file, in_ram)
        try:
            with open_private(path) as handle:
                read += os.fstat(handle.fileno()).st_size
                values = pickling.load(handle, namespace)
            for item in items:
                namespace[item.name] = values[item.name]
                restored.append(item)
                if item.global_of is not None:
                    why = bind_back(item.global_of, values[item.name])
                    if why is not None:
                        unbound.append((item.name, why))
        except FileNotFoundError:
            where = "in RAM (the machine restarted since?)" if in_ram else "in the profile"
            failed.extend((item.name, f"its file {where} is gone") for item in items)
        except Exception as error:  # a class that no longer imports, a damaged file, ...
            text = str(error).splitlines()[0][:160] if str(error) else ""
            failed.extend((item.name, f"{type(error).__name__}: {text}") for item in items)
    done = {k.name for k in restored}
    remaining = tuple(k for k in manifest.kept if k.name not in done)
    along = tuple(k for k in restored if k.name not in wanted)
    now = time.time()
    if restored:
        still = {(k.file, k.ram) for k in remaining}
        for gone, in_ram in {(k.file, k.ram) for k in restored} - still:
            if gone:
                with contextlib.suppress(OSError):
                    path_of(gone, in_ram).unlink()
        total = 0
        for left, in_ram in still:
            if left:
                with contextlib.suppress(OSError):
                    total += path_of(left, in_ram).stat().st_size
        record = replace(
            manifest,
            kept=remaining,
            total=total,
            restored=(*manifest.restored, *restored),
            restored_at=now,
            ram=manifest.ram if any(k.ram for k in remaining) else None,
        )
        write_manifest(directory, record)  # what was restored, for a second restore to say so
        if ram is not None and record.ram is None:
            discard(ram)
    return Restored(
        tuple(restored),
        tuple(failed),
        remaining,
        along,
        tuple(skipped),
        tuple(held),
        already,
        manifest.restored_at,
        read,
        tuple(unbound),
    )
