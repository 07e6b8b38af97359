"""gc as a plain function: remove what crashed writers and finished repacks left behind.

The one cleanup behind ``packyard gc`` (in-process) and the ``packyard.gc`` job a maintenance
plan queues:

* temp files of crashed batch writes (``objects/xx/tmp_obj_*``) and their batch markers
  (``store/batch/loose.py``'s age rules: a dead pid on this host after 10 minutes, anything else
  after 14 days);
* index-pack quarantines (``objects/incoming-*``) untouched for ``quarantine_after`` seconds;
* pack writers' temp files (``objects/pack/tmp_*``: ours as soon as their writer is dead, others
  after 14 days, ``git prune``'s rule) and packs left half-moved or half-installed;
* preserved packs (``objects/pack/preserved/``) older than ``preserve_for`` seconds;
* ref and fence claim files (``refs/**.lock``, ``packyard/*.lock``) whose owner is provably
  dead, or that nobody can judge and are older than 10 minutes, and orphaned ref temp files.

``lease`` (store/lease.py: the job's maintenance lease) is checked before each step that deletes, so a
job that lost its lease stops before deleting anything more.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from packyard.store.lease import Lease
from packyard.store.maintenance.stats import QUARANTINE_AFTER

Progress = Callable[[str, int, "int | None"], None]
PRESERVE_FOR = 3600.0


def run_gc(repo: str | Path, *, stale_after: float | None = None, foreign_after: float | None = None,
           quarantine_after: float = QUARANTINE_AFTER, preserve_for: float = PRESERVE_FOR,
           lease: Lease | None = None, progress: Progress | None = None) -> dict[str, Any]:
    from packyard.store.batch import loose as bulk
    from packyard.store.pack.indexpack import remove_stale_quarantines
    from packyard.store.maintenance.leftovers import remove_stale_temp_files
    from packyard.store.maintenance.preserved import expire_preserved
    from packyard.store.refs import remove_dead_claims
    from packyard.store.repo import Repository

    check = lease.check if lease is not None else (lambda: None)
    r = Repository.open(repo)
    steps = 5

    def step(n: int, name: str) -> None:
        if progress:
            progress("gc", n, steps)
        check()

    step(0, "tmp objects")
    tmp = bulk.gc_stale_tmp(r, stale_after=bulk.STALE_AFTER if stale_after is None else stale_after,
                            foreign_after=bulk.FOREIGN_STALE_AFTER if foreign_after is None else foreign_after)
    step(1, "quarantines")
    quarantines = [f"objects/{p.name}" for p in remove_stale_quarantines(r, older_than=quarantine_after)]
    step(2, "pack temps")
    pack_dir = r.objects.path / "pack"
    pack_temps = remove_stale_temp_files(pack_dir, fence=check)
    step(3, "preserved packs")
    preserved = expire_preserved(pack_dir, preserve_for, fence=check)
    step(4, "dead claims")
    dead_locks = [c.as_dict() for c in remove_dead_claims(r.path)]
    from packyard.store.maintenance.leftovers import remove_serving_leftovers

    serving = remove_serving_leftovers(r.path, fence=check)   # commit-graph and pack-refs locks and temps
    if progress:
        progress("gc", steps, steps)
    return {
        "repo": str(r.path),
        "counters": {**tmp, "stale_quarantines_removed": len(quarantines),
                     "stale_pack_temps_removed": pack_temps, "preserved_packs_expired": len(preserved),
                     "dead_locks_removed": len(dead_locks), "serving_leftovers_removed": serving},
        "removed": {"quarantines": quarantines, "pack_temps": pack_temps, "preserved_packs": preserved,
                    "dead_locks": dead_locks},
    }


def remove_unowned_leftovers(git_dir: str | Path, *, quarantine_after: float = QUARANTINE_AFTER,
                             fence: Callable[[], None] | None = None) -> dict[str, int]:
    """gc's age rules for what ``packyard janitor`` cannot judge by owner: tmp objects by pid and age,
    quarantines WITHOUT an owner record untouched for ``quarantine_after``, pack writers' temp files by
    pid and age (and half-moved or half-installed packs), claim files by owner liveness and age. Not the
    preserved packs' expiry: that is maintenance (``packyard gc``). Run under the maintenance lease."""
    import shutil
    import time

    from packyard.store.batch import loose as bulk
    from packyard.store.maintenance.leftovers import remove_stale_temp_files
    from packyard.store.owner import read_owner
    from packyard.store.pack.indexpack import QUARANTINE_OWNER, QUARANTINE_PREFIX
    from packyard.store.refs import remove_dead_claims
    from packyard.store.repo import Repository

    check = fence or (lambda: None)
    r = Repository.open(git_dir)
    check()
    tmp = bulk.gc_stale_tmp(r)
    now = time.time()
    quarantines = 0
    for q in sorted(p for p in (r.objects.path).glob(f"{QUARANTINE_PREFIX}*") if p.is_dir()):
        if read_owner(q / QUARANTINE_OWNER) is not None:
            continue   # the janitor judged it by its owner
        try:
            newest = max([q.stat().st_mtime] + [f.stat().st_mtime for f in q.iterdir()])
        except FileNotFoundError:
            continue
        if now - newest >= quarantine_after:
            check()
            shutil.rmtree(q, ignore_errors=True)
            quarantines += 1
    pack_temps = remove_stale_temp_files(r.objects.path / "pack", fence=check)
    claims = len(remove_dead_claims(r.path))
    from packyard.store.maintenance.leftovers import remove_serving_leftovers

    serving = remove_serving_leftovers(r.path, fence=check)
    return {"age_rule_serving": serving,
            "age_rule_tmp_objects": tmp["stale_tmp_removed"], "age_rule_markers": tmp["stale_markers_removed"],
            "age_rule_quarantines": quarantines, "age_rule_pack_temps": pack_temps, "age_rule_claims": claims}
