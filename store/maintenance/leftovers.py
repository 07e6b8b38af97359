"""What a ``gc`` plan removes beyond ``packyard gc``'s temp files: old pack temps and expired preserved packs.

Both are leftovers no reader or writer can still need:

* ``objects/pack/tmp_*`` older than two weeks — a pack writer that died (git's ``pack-objects``
  or ours) left them; ``git prune`` removes them with the same age rule;
* preserved packs (``objects/pack/preserved/``) moved aside by a repack longer ago than the
  preservation delay: a reader on another host that still had the old pack open has had that
  long to re-list. The idx goes first, so a reader never finds an idx whose pack is gone.

Each removal calls ``fence()`` first (the worker passes its maintenance lease's check), so a
holder that lost its lease stops before deleting anything more.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from ..repo import Repository
from .stats import PACK_TEMP_AFTER, preserved_packs

# Within one preserved pack: the idx first (readers find packs by their idx), then the rest.
_SUFFIX_ORDER = (".idx", ".old-idx", ".rev", ".mtimes", ".pack", ".old-pack")


def _order(path: Path) -> int:
    suffix = path.name[path.name.find("."):] if "." in path.name else ""
    return _SUFFIX_ORDER.index(suffix) if suffix in _SUFFIX_ORDER else len(_SUFFIX_ORDER)


def remove_stale_pack_temps(repo: Repository, *, older_than: float = PACK_TEMP_AFTER, now: float | None = None,
                            fence: Callable[[], None] | None = None) -> list[str]:
    """Delete ``objects/pack/tmp_*`` files older than ``older_than``; the names removed."""
    now = time.time() if now is None else now
    pack_dir = repo.objects.path / "pack"
    removed = []
    try:
        with os.scandir(pack_dir) as it:
            candidates = [e for e in it if e.name.startswith("tmp_") and e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return removed
    for e in candidates:
        try:
            if now - e.stat(follow_symlinks=False).st_mtime < older_than:
                continue
            if fence is not None:
                fence()
            os.unlink(e.path)
        except FileNotFoundError:
            continue
        removed.append(f"objects/pack/{e.name}")
    return removed


def expire_preserved_packs(repo: Repository, *, preserve_for: float, now: float | None = None,
                           fence: Callable[[], None] | None = None) -> list[str]:
    """Delete preserved packs moved aside at least ``preserve_for`` seconds ago; the pack names removed."""
    now = time.time() if now is None else now
    removed = []
    for stem, (at, files) in sorted(preserved_packs(repo.objects.path / "pack").items()):
        if now - at < preserve_for:
            continue
        if fence is not None:
            fence()
        for path in sorted(files, key=_order):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        removed.append(stem)
    return removed
