"""gc as a plain function: remove what crashed writers and finished repacks left behind.

The one cleanup behind ``packyard gc`` (in-process) and the ``packyard.gc`` job a maintenance
plan queues:

* temp files of crashed batch writes (``objects/xx/tmp_obj_*``) and their batch markers;
* index-pack quarantines (``objects/incoming-*``) untouched for ``quarantine_after`` seconds
  (a live owner's never);
* pack writers' temp files (``objects/pack/tmp_*``), the multi-pack-index's claim, and packs left
  half-moved or half-installed;
* preserved packs (``objects/pack/preserved/``) older than ``preserve_for`` seconds, and the old
  multi-pack-index, commit-graph and packed-refs files kept there for readers that map them;
* ref and fence claim files (``refs/**.lock``, ``packyard/*.lock``), orphaned ref temp files, and
  the commit-graph's and pack-refs' claims and temp files.

Which of them go, and when, is the one table of :mod:`packyard.store.leftovers` (names, ages and
why); gc only picks the kinds and passes the operator's ages on.

``lease`` (store/lease.py: the job's maintenance lease) is checked before each step that deletes, so a
job that lost its lease stops before deleting anything more.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from packyard.store.lease import Lease
from packyard.store.leftovers import RULES, Kind
from packyard.store.progress import Progress

#: ``--quarantine-after``'s default: the table's hour.
QUARANTINE_AFTER = RULES[Kind.QUARANTINE].unjudged_after or 0.0
PRESERVE_FOR = 3600.0


def run_gc(repo: str | Path, *, stale_after: float | None = None, foreign_after: float | None = None,
           quarantine_after: float = QUARANTINE_AFTER, preserve_for: float = PRESERVE_FOR,
           lease: Lease | None = None, progress: Progress | None = None) -> dict[str, Any]:
    from packyard.store.leftovers.passes import remove_serving_leftovers, remove_stale_temp_files
    from packyard.store.maintenance.preserved.loose import expire_preserved_loose
    from packyard.store.maintenance.preserved.packs import expire_preserved, expire_preserved_mapped
    from packyard.store.pack.quarantine import remove_stale_quarantines
    from packyard.store.refs import remove_dead_claims
    from packyard.workers.repos import open_repository

    check = lease.check if lease is not None else (lambda: None)
    r = open_repository(repo)
    steps = 5

    def step(n: int, name: str) -> None:
        if progress:
            progress("gc", n, steps)
        check()

    step(0, "tmp objects")
    tmp = remove_dead_batches(r, stale_after=stale_after, foreign_after=foreign_after, fence=check)
    step(1, "quarantines")
    quarantines = [f"objects/{p.name}" for p in remove_stale_quarantines(r, older_than=quarantine_after)]
    step(2, "pack temps")
    pack_dir = r.objects.path / "pack"
    pack_temps = remove_stale_temp_files(pack_dir, fence=check)
    step(3, "preserved packs")
    preserved = expire_preserved(pack_dir, preserve_for, fence=check)
    preserved_mapped = expire_preserved_mapped(pack_dir, preserve_for, fence=check)
    preserved_loose = expire_preserved_loose(pack_dir, preserve_for, fence=check)
    step(4, "dead claims")
    dead_locks = [c.as_dict() for c in remove_dead_claims(r.path)]
    serving = remove_serving_leftovers(r.path, fence=check)   # commit-graph and pack-refs locks and temps
    durable_temps = _remove_durable_temps(r, check)
    if progress:
        progress("gc", steps, steps)
    return {
        "repo": str(r.path),
        "counters": {**tmp, "stale_quarantines_removed": len(quarantines),
                     "stale_pack_temps_removed": pack_temps, "preserved_packs_expired": len(preserved),
                     "preserved_mapped_expired": len(preserved_mapped),
                     "preserved_loose_expired": len(preserved_loose),
                     "dead_locks_removed": len(dead_locks), "serving_leftovers_removed": serving,
                     "durable_temps_removed": durable_temps},
        "removed": {"quarantines": quarantines, "pack_temps": pack_temps, "preserved_packs": preserved,
                    "preserved_mapped": preserved_mapped, "preserved_loose": preserved_loose,
                    "dead_locks": dead_locks},
    }


def _remove_durable_temps(r: Any, fence: Callable[[], None] | None) -> int:
    """write_file_durably's orphaned temps (alternates, pool files, fence) past the table's age."""
    from packyard.store import leftovers as lo

    return len(lo.remove(lo.removable(lo.find_durable_temps(r)), fence))


def remove_dead_batches(r: Any, *, stale_after: float | None = None, foreign_after: float | None = None,
                         fence: Callable[[], None] | None = None) -> dict[str, int]:
    """The loose batches' leftovers (``batch_marker`` with its tmp objects first, then lone ``loose_tmp``
    files); ``stale_after`` / ``foreign_after`` replace the table's dead / unjudged ages."""
    from packyard.store import leftovers as lo

    markers = lo.remove(lo.removable(lo.find_batch_markers(r, rule=RULES[Kind.BATCH_MARKER].aged(
        dead_after=stale_after, unjudged_after=foreign_after))), fence)
    loose = lo.remove(lo.removable(lo.find_loose_tmp(r, rule=RULES[Kind.LOOSE_TMP].aged(
        dead_after=stale_after, unjudged_after=foreign_after))), fence)
    return {"stale_tmp_removed": len(loose) + sum(len(m.files) for m in markers),
            "stale_markers_removed": len(markers)}


def remove_unowned_leftovers(git_dir: str | Path, *, quarantine_after: float = QUARANTINE_AFTER,
                             fence: Callable[[], None] | None = None) -> dict[str, int]:
    """gc's age rules for what ``packyard janitor`` cannot judge by owner: tmp objects and batch markers,
    quarantines WITHOUT an owner record untouched for ``quarantine_after``, pack writers' temp files (and
    half-moved or half-installed packs), claim files, the commit-graph's and pack-refs' leftovers. Not the
    preserved packs' expiry: that is maintenance (``packyard gc``). Run under the maintenance lease."""
    from packyard.store import leftovers as lo
    from packyard.store.leftovers.passes import remove_serving_leftovers, remove_stale_temp_files
    from packyard.store.refs import remove_dead_claims
    from packyard.workers.repos import open_repository

    check = fence or (lambda: None)
    r = open_repository(git_dir)
    check()
    tmp = remove_dead_batches(r, fence=check)
    rule = RULES[Kind.QUARANTINE].aged(dead_after=quarantine_after, unjudged_after=quarantine_after)
    unowned = [q for q in lo.removable(lo.find_quarantines(r, rule=rule)) if q.owner is None]   # owned: judged
    quarantines = len(lo.remove(unowned, check))
    pack_temps = remove_stale_temp_files(r.objects.path / "pack", fence=check)
    claims = len(remove_dead_claims(r.path))
    serving = remove_serving_leftovers(r.path, fence=check)
    return {"age_rule_serving": serving, "age_rule_durable_temps": _remove_durable_temps(r, check),
            "age_rule_tmp_objects": tmp["stale_tmp_removed"], "age_rule_markers": tmp["stale_markers_removed"],
            "age_rule_quarantines": quarantines, "age_rule_pack_temps": pack_temps, "age_rule_claims": claims}
