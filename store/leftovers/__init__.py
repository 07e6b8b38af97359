"""Every file a dead writer leaves behind, the one age rule per kind, and the one way to remove them.

In the shape of Gitaly's ``housekeeping/clean_stale_data.go``: one table of what may be left
(name pattern, where, how old before it goes, and why), one ``find_<kind>(repo, now=...)`` per
kind that lists what lies there and judges it, and one :func:`remove`. Finders change nothing;
callers remove what they decide to (``removable(found)`` for the table's verdict). Who runs them:

* a loose batch, as it begins: :func:`find_batch_markers` (one listing; the fan-out dirs are read
  only when a dead batch left a marker);
* a pack batch and every repack, before they write: the pack directory's kinds
  (``store/maintenance/leftovers.remove_stale_temp_files``); index-pack makes its quarantines
  through ``store/pack/quarantine.py``, whose stale ones are this table's;
* ``packyard gc`` / the ``packyard.gc`` job: every kind but ``.keep`` files;
* ``packyard janitor``: the kinds with an owner record, judged by the owner's job
  (``workers/commands/janitor.py``), then gc's pass for the rest;
* the maintenance statistics count ``removable`` leftovers with the same rules.

Liveness is :func:`..owner.liveness` (pid reuse, reboots, other hosts and PID namespaces). A name
that carries only a pid (``tmp_obj_<pid>_<tag>-…``) is judged as an owner without a start time: a
reused pid reads as alive, so its file is kept, never removed wrongly.

The table (:data:`RULES`; ages in seconds; "dead" = owner provably dead, "unjudged" = no owner
record and no pid in the name, or another host's)::

    kind              where                                          dead   unjudged
    loose_tmp         objects/xx/tmp_obj_*                            600   14 days
    batch_marker      packyard/batches/<pid>_<tag>-<rand>             600   14 days
    pack_tmp          objects/pack/tmp_{pack,idx,rev,...}_*             0   14 days
    orphan_pack       objects/pack/pack-*.{pack,rev,mtimes,bitmap}      -   600      (no .idx)
    half_preserved    objects/pack/pack-*.* whose .idx is in preserved/ -   0        (finish the move)
    orphan_idx        objects/pack/pack-*.idx without its .pack          -   600
    midx_lock         objects/pack/multi-pack-index.lock                0   600
    quarantine        objects/incoming-*/                             3600  3600     (untouched since)
    keep              objects/pack/pack-*.keep with an owner record     0   never    (janitor only)
    serving_lock      packed-refs.lock, commit-graph-chain.lock (+side) 0   600
    graph_tmp         objects/info/commit-graphs/tmp_{graph,chain}_*    0   14 days
    packed_refs_tmp   packyard/tmp/packed-refs-*                        -   600
    packed_refs_new   packed-refs.new (git's packed-refs writer)        -   600
    ref_claim         refs/**.lock, packyard/**.lock                    0   600
    ref_tmp           packyard/tmp/ref-*                                -   600
    preserved_mapped  objects/pack/preserved/{multi-pack-index,       -   3600     (the preserve time)
                      commit-graph,packed-refs,multi-pack-index-
                      <checksum>.{bitmap,rev},pack-<checksum>.<ext>}
                      -<hex>.old
    preserved_loose   objects/pack/preserved/loose-<hex>/              -   3600     (the preserve time)
    durable_tmp       {.,packyard,objects/info}/.tmp-<pid>-<name>       -   600
    pool_deleting     <pool>.deleting-<hex>/ beside the pool            -   600      (a killed pool delete)
    backup_tmp        <backup dir>/tmp_{pack,owner}_*, .tmp-<pid>-manifest.json  0   14 days
    restore_tmp       .<name>.{restoring,replaced}-<hex>/ beside a target  -   3600     (newest file)

A live owner's leftover is never removed by age. The table itself is :mod:`.table` (names, kinds,
rules), the finders :mod:`.find`; this module adds :func:`remove`. Each row's ``reason`` says why its ages are what
they are; ``docs/operating.md`` shows the table.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterable, Protocol

from .. import durable, fsparallel, lockfile
from .find import (
    FINDERS,
    create_batch_marker,
    find_backup_temps,
    find_batch_markers,
    find_durable_temps,
    find_graph_temps,
    find_half_preserved,
    find_keeps,
    find_loose_tmp,
    find_midx_lock,
    find_orphan_idx,
    find_orphan_packs,
    find_pack_temps,
    find_packed_refs_new,
    find_packed_refs_temps,
    find_pool_deletions,
    find_preserved_loose,
    find_preserved_mapped,
    find_quarantines,
    find_ref_claims,
    find_ref_temps,
    find_restore_temps,
    find_serving_locks,
    loose_tmp_verdict,
    remove_batch_marker,
)
from .table import (
    CLAIM_EXPIRE,
    DEAD_WRITER_AFTER,
    LOOSE_TMP_PREFIX,
    MIDX_SIDE_RE,
    PACK_FILE_RE,
    PRESERVED_LOOSE_PREFIX,
    PRESERVED_LOOSE_RE,
    PRESERVED_MAPPED,
    PRESERVED_MAPPED_RE,
    PRUNE_EXPIRE,
    QUARANTINE_OWNER,
    QUARANTINE_PREFIX,
    RULES,
    SERVING_LOCKS,
    Kind,
    Leftover,
    Rule,
    Verdict,
    removable,
)

# -- removal -------------------------------------------------------------------------------------

class _Checked(Protocol):
    def check(self) -> None: ...


_CLAIM_KINDS = frozenset({Kind.MIDX_LOCK, Kind.SERVING_LOCK, Kind.REF_CLAIM})




def remove_fanned_out(path: Path) -> bool:
    """A directory of fan-out directories (preserved loose files), its subdirectories' unlinks at once where they
    are round trips (:mod:`..fsparallel`: each unlink holds its own directory's lock)."""
    try:
        subdirs = [Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return False
    fsparallel.each(lambda d: shutil.rmtree(d, ignore_errors=True), subdirs, where=path)
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def remove(leftovers: Iterable[Leftover], lease: "_Checked | Callable[[], None] | None" = None) -> list[Leftover]:
    """Remove each of ``leftovers`` (as given: filter with :func:`removable` for the table's verdict); returns
    those removed. ``lease`` (a lease with ``check()``, or a fence callable) is checked before each one: a
    holder that lost its lease stops before deleting anything more.

    A claim file goes only if it still carries the owner record judged (:func:`..lockfile.remove_claim`,
    which renames it aside first: a fresh claim made meanwhile is never removed); a quarantine as a tree; a
    half-preserved pack is moved the rest of the way to preserved/; anything else file by file, the
    companions first and ``path`` (the owner record, the marker) last, so a crash midway leaves it to be
    judged again.
    """
    check = lease if lease is None or callable(lease) else lease.check
    done = []
    for item in leftovers:
        if check is not None:
            check()
        if item.kind in _CLAIM_KINDS:
            gone = lockfile.remove_claim(item.path, item.owner)
        elif item.kind in (Kind.QUARANTINE, Kind.POOL_DELETING, Kind.RESTORE_TMP):
            shutil.rmtree(item.path, ignore_errors=True)
            gone = not item.path.exists()
        elif item.kind is Kind.PRESERVED_LOOSE:
            gone = remove_fanned_out(item.path)
        elif item.kind is Kind.HALF_PRESERVED:
            from ..preserve import preserve_pack  # (below: preserve reads this package's table)

            gone = preserve_pack(item.path.parent, item.path.name.rpartition(".")[0]) > 0
        else:
            companions = [durable.unlink_if_present(f) for f in item.files]
            gone = durable.unlink_if_present(item.path) or any(companions)
        if gone:
            done.append(item)
    return done


__all__ = ["Kind", "Verdict", "Rule", "RULES", "Leftover", "FINDERS", "removable", "remove", "loose_tmp_verdict",
           "find_loose_tmp", "find_batch_markers", "find_pack_temps", "find_orphan_packs", "find_half_preserved",
           "find_orphan_idx", "find_midx_lock", "find_keeps", "find_quarantines", "find_serving_locks",
           "find_graph_temps", "find_packed_refs_temps", "find_packed_refs_new", "find_ref_claims", "find_ref_temps",
           "find_preserved_mapped", "find_preserved_loose", "find_durable_temps", "find_pool_deletions",
           "find_backup_temps", "find_restore_temps",
           "PRESERVED_LOOSE_PREFIX", "PRESERVED_LOOSE_RE",
           "PRESERVED_MAPPED", "PRESERVED_MAPPED_RE", "MIDX_SIDE_RE", "PACK_FILE_RE",
           "create_batch_marker", "remove_batch_marker", "remove_fanned_out", "LOOSE_TMP_PREFIX", "QUARANTINE_PREFIX",
           "QUARANTINE_OWNER",
           "SERVING_LOCKS", "PRUNE_EXPIRE", "CLAIM_EXPIRE", "DEAD_WRITER_AFTER"]
