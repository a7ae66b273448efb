"""What keep and restore say: the restart's sentence, the offer, what a restore did."""

from __future__ import annotations

import time
from collections.abc import Iterable

from .manifest import Manifest, NotKept
from .restoring import Restored
from .select import human_size

SHOWN_SKIPPED = 8  # in the restart message
LISTED = 60  # in the offer, of each list


def kept_sentence(manifest: Manifest) -> str:
    kept = list(manifest.kept)
    if not kept and not manifest.skipped:
        return ""
    skipped = "; ".join(
        f"`{s.name}` ({_short(s.reason)})" for s in manifest.skipped[:SHOWN_SKIPPED]
    )
    if len(manifest.skipped) > SHOWN_SKIPPED:
        skipped += f"; and {len(manifest.skipped) - SHOWN_SKIPPED} more"
    if kept:
        text = (
            f"Kept {count(len(kept))} ({human_size(manifest.size)}) for the new kernel: "
            "its first cell offers to restore them."
        )
    else:
        text = "Nothing was kept."
    if not skipped:
        return text
    return f"{text} Not kept: {skipped}. Then re-run the cells that made what was not kept."


def _short(reason: str) -> str:
    return reason.split(": ")[0] if reason.startswith("holds GPU memory") else reason


def count(n: int) -> str:
    """``1 variable``, ``3 variables``."""
    return f"{n} variable" if n == 1 else f"{n} variables"


def offer_text(manifest: Manifest, now: float | None = None) -> str:
    age = max(0.0, (time.time() if now is None else now) - manifest.created)
    lines = [
        f"nb_cudaguard: the previous process of this kernel kept {count(len(manifest.kept))} "
        f"({human_size(manifest.size)}) {_ago(age)}:"
    ]
    width = min(24, max(len(k.name) for k in manifest.kept))
    for item in manifest.kept[:LISTED]:
        size = "" if item.kind == "module" else f", {human_size(item.size)}"
        what = "module, imported again" if item.kind == "module" else item.type
        if item.kind == "snapshot":
            note = f" ({item.note}: comes back on the CPU)"
        else:
            note = f" ({item.note})" if item.note else ""
        lines.append(f"  {item.name:<{width}}  {what}{size}{note}")
    if len(manifest.kept) > LISTED:
        lines.append(f"  ... and {len(manifest.kept) - LISTED} more")
    together = _together(manifest)
    if together:
        lines.append(f"Restored together (they share objects or memory): {together}.")
    if manifest.skipped:
        lines.append("Not kept:")
        width = min(24, max(len(s.name) for s in manifest.skipped))
        shown = manifest.skipped[:LISTED]
        lines.extend(f"  {s.name:<{width}}  {s.type}: {s.reason}" for s in shown)
        if len(manifest.skipped) > LISTED:
            lines.append(f"  ... and {len(manifest.skipped) - LISTED} more")
    if manifest.ipython_names:
        lines.append("IPython's own names (In, Out, _, _i1, ...) are not kept: it makes them anew.")
    lines.append(
        "Restore: `%cudaguard restore` (all) or `%cudaguard restore NAME ...`; "
        "`%cudaguard restore --discard` deletes them."
    )
    return "\n".join(lines)


def _together(manifest: Manifest) -> str:
    """The names that come back only together, each group once: ``a``, ``b``; ``c``, ``d``."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for item in manifest.kept:
        if item.file:
            groups.setdefault((item.file, item.ram), []).append(item.name)
    return "; ".join(", ".join(g) for g in groups.values() if len(g) > 1)


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _names(items: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in items)


def restored_text(done: Restored, seconds: float, now: float | None = None) -> str:
    parts = []
    if done.restored:
        size = done.read or sum(k.size for k in done.restored)
        parts.append(
            f"Restored {_names(k.name for k in done.restored)} ({human_size(size)}) "
            f"in {seconds:.1f} s."
        )
    if done.along:
        parts.append(
            f"{_names(k.name for k in done.along)} came too: they share state (the same objects "
            "or memory) with what you asked for, and come back only together."
        )
    if done.skipped:
        names = [k.name for k in done.skipped]
        parts.append(
            f"Left as you made them in this kernel: {_names(names)} (`%cudaguard restore --force "
            f"{' '.join(names)}` puts the kept ones back over them)."
        )
    held: dict[tuple[str, ...], list[str]] = {}
    for name, mates in done.held:
        held.setdefault(mates, []).append(name)
    for mates, names in held.items():
        parts.append(
            f"Not restored either: {_names(names)}, which share state with {_names(mates)} and "
            f"come back only with {'it' if len(mates) == 1 else 'them'} (with `--force`, all "
            "together)."
        )
    snapshots = [k for k in done.restored if k.kind == "snapshot"]
    for item in snapshots:
        if item.name.endswith("_state_dict"):
            parts.append(
                f"`{item.name}` is {item.note}, on the CPU: rebuild the object and call "
                f"`.load_state_dict({item.name})`, then move it with `.to('cuda')`."
            )
        elif "torch.optim." in item.type:
            parts.append(
                f"`{item.name}` is its {item.note}, on the CPU, and follows its model's "
                f"parameters: once the model is moved, "
                f"`{item.name}.load_state_dict({item.name}.state_dict())` moves its state to them."
            )
        else:
            parts.append(
                f"`{item.name}` is its {item.note}, on the CPU: `{item.name}.to('cuda')` moves it "
                "back to the GPU."
            )
    graphless = [k.name for k in done.restored if k.graph]
    if graphless:
        parts.append(
            f"{_names(graphless)} held tensors autograd computed: they came back as leaves, "
            "without the graph to what they were computed from (a `backward()` through them "
            "would reach nothing); a replay builds them again."
        )
    for name, why in done.failed:
        parts.append(f"`{name}` could not be restored: {why}.")
    for name, why in done.unbound:
        parts.append(f"`{name}` was restored, but {why}: the two are different objects now.")
    if done.already:
        age = max(0.0, (time.time() if now is None else now) - done.restored_at)
        verb = "was" if len(done.already) == 1 else "were"
        parts.append(f"{_names(k.name for k in done.already)} {verb} already restored {_ago(age)}.")
    if done.remaining:
        rest = _names(k.name for k in done.remaining)
        parts.append(f"Still kept: {rest} (`%cudaguard restore NAME`).")
    elif done.already and not done.restored:
        parts.append("Nothing else is kept.")
    return " ".join(parts) or "Nothing was restored."


def not_kept_text(error: NotKept) -> str:
    """``%cudaguard restore NAME`` for a NAME that was not kept: what was, and what was restored
    already."""
    text = f"not kept: {', '.join(error.unknown)}."
    if error.kept:
        text += f" Kept: {', '.join(error.kept)} (`%cudaguard restore NAME ...`)."
    if error.restored:
        text += f" Already restored: {', '.join(error.restored)}."
    if not error.kept:
        text += " Nothing else is kept."
    return text
