"""Preserved packs: a replaced pack goes to ``objects/pack/preserved/`` instead of being unlinked.

A reader on another host may have listed ``objects/pack`` before the repack and open the old
pack a moment later (over NFS an unlinked file is gone for a client that had not opened it,
and ESTALE for one that had). JGit keeps replaced packs in ``preserved/`` for a while; so does
packyard: a reader that misses everywhere looks there before it says "missing"
(:mod:`packyard.store.objdir`). git reads no object from the subdirectory (fsck and gc say nothing
of it); only ``git count-objects -v`` counts it, as one "garbage found" entry (README, "Operating safely").

Moving a pack: its ``.idx`` first (no new reader discovers the pack once the idx is gone),
then ``.pack``, ``.rev``, ``.mtimes``, ``.bitmap``; the moved idx's mtime is set to the time
of the move, which is what expiry measures. Expiry removes the idx first, then the rest.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from ..faults import fault_point
from ..objdir import PRESERVED_DIR

#: JGit's default: replaced packs stay readable in preserved/ for an hour.
DEFAULT_PRESERVE_SECONDS = 3600.0
_EXTS = (".idx", ".pack", ".rev", ".mtimes", ".bitmap")


def preserved_dir(pack_dir: Path) -> Path:
    return Path(pack_dir) / PRESERVED_DIR


def preserve_pack(pack_dir: Path, name: str, *, now: float | None = None) -> int:
    """Move ``pack-<sha>.*`` into preserved/ (idx first); returns the files moved."""
    pack_dir = Path(pack_dir)
    dest = preserved_dir(pack_dir)
    dest.mkdir(exist_ok=True)
    moved = 0
    for ext in _EXTS:
        src = pack_dir / f"{name}{ext}"
        try:
            os.replace(src, dest / src.name)
        except FileNotFoundError:
            continue
        moved += 1
        if ext == ".idx":
            # The move's time is what expiry measures (a rename keeps the pack's old mtime).
            t = time.time() if now is None else now
            os.utime(dest / src.name, (t, t))
            fault_point("repack.after_idx_preserved")
    return moved


def remove_pack_files(directory: Path, name: str) -> int:
    """Unlink ``name``'s files in ``directory``, the idx first; returns how many were removed."""
    removed = 0
    for ext in _EXTS:
        try:
            os.unlink(Path(directory) / f"{name}{ext}")
            removed += 1
        except FileNotFoundError:
            continue
    return removed


def expire_preserved(pack_dir: Path, older_than: float = DEFAULT_PRESERVE_SECONDS, *,
                     now: float | None = None, fence: Callable[[], None] | None = None) -> list[str]:
    """Remove preserved packs moved there more than ``older_than`` seconds ago; returns their names.

    A file left without its idx (a crash between two moves) expires by its own mtime. ``fence()``
    (a job's maintenance-lease check) runs before each pack is removed.
    """
    d = preserved_dir(pack_dir)
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(d))
    except FileNotFoundError:
        return []
    ages: dict[str, float] = {}
    idx_ages: dict[str, float] = {}
    for e in entries:
        stem, dot, ext = e.name.rpartition(".")
        if not dot or not stem.startswith("pack-") or f".{ext}" not in _EXTS:
            continue
        try:
            age = now - e.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if ext == "idx":
            idx_ages[stem] = age
        ages[stem] = max(ages.get(stem, age), age)
    removed = []
    for stem in sorted(ages):
        age = idx_ages.get(stem, ages[stem])
        if age >= older_than:
            if fence is not None:
                fence()
            remove_pack_files(d, stem)
            removed.append(stem)
    return removed


__all__ = ["DEFAULT_PRESERVE_SECONDS", "preserve_pack", "expire_preserved", "remove_pack_files", "preserved_dir"]
