"""Two passes over the leftovers table for maintenance: the pack directory's (run by every repack and
pack batch before it writes, and by ``packyard gc``) and the commit-graph's and pack-refs' (gc).

The names, ages and verdicts are :mod:`packyard.store.leftovers`' (the one table); these are only the
sets of its kinds that lie there. Expired preserved packs are :func:`.preserved.expire_preserved`'s.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from .. import leftovers as lo


def remove_stale_temp_files(pack_dir: Path, *, now: float | None = None, stale_after: float | None = None,
                            foreign_after: float | None = None,
                            fence: Callable[[], None] | None = None, orphans: bool = True) -> int:
    """Remove what the table says goes among ``objects/pack``'s leftovers; returns how many files.

    Writer temp files (:data:`~..leftovers.RULES` ``pack_tmp``), the multi-pack-index's claim
    (``midx_lock``) and, unless ``orphans=False`` (an ingesting job, which holds no maintenance
    lease: installed names are left to the maintenance jobs), packs without their idx (``orphan_pack``;
    ``half_preserved`` ones are moved the rest of the way) and idx files without their pack
    (``orphan_idx``). ``stale_after`` replaces the age of what nobody can judge among the installed
    names and the claim (10 minutes); ``foreign_after`` that of unattributable temp files (14 days).
    ``fence()`` (a job's maintenance-lease check) runs before each removal.
    """
    git_dir = Path(pack_dir).parent.parent
    now = time.time() if now is None else now
    R = lo.RULES
    found = lo.find_midx_lock(git_dir, now=now, rule=R[lo.Kind.MIDX_LOCK].aged(unjudged_after=stale_after))
    found += lo.find_pack_temps(git_dir, now=now, rule=R[lo.Kind.PACK_TMP].aged(unjudged_after=foreign_after))
    if orphans:
        found += lo.find_half_preserved(git_dir, now=now)
        found += lo.find_orphan_packs(git_dir, now=now, rule=R[lo.Kind.ORPHAN_PACK].aged(unjudged_after=stale_after))
        found += lo.find_orphan_idx(git_dir, now=now, rule=R[lo.Kind.ORPHAN_IDX].aged(unjudged_after=stale_after))
    return sum(item.count for item in lo.remove(lo.removable(found), fence))


def remove_serving_leftovers(git_dir: Path, *, now: float | None = None, stale_after: float | None = None,
                             fence: Callable[[], None] | None = None) -> int:
    """Leftovers of dead commit-graph and pack-refs writers (``serving_lock``, ``graph_tmp``,
    ``packed_refs_tmp`` and ``packed_refs_new`` in the table); returns how many files were removed.
    ``stale_after`` replaces the age of a claim nobody can judge and of an orphaned ``packed-refs-*`` or
    ``packed-refs.new`` (10 minutes)."""
    now = time.time() if now is None else now
    R = lo.RULES
    found = lo.find_serving_locks(git_dir, now=now, rule=R[lo.Kind.SERVING_LOCK].aged(unjudged_after=stale_after))
    found += lo.find_graph_temps(git_dir, now=now)
    found += lo.find_packed_refs_temps(git_dir, now=now,
                                       rule=R[lo.Kind.PACKED_REFS_TMP].aged(unjudged_after=stale_after))
    found += lo.find_packed_refs_new(git_dir, now=now, rule=R[lo.Kind.PACKED_REFS_NEW].aged(unjudged_after=stale_after))
    return sum(item.count for item in lo.remove(lo.removable(found), fence))


__all__ = ["remove_stale_temp_files", "remove_serving_leftovers"]
