"""Retention of a repository's backups: keep the newest N full chains; expire an older chain only once a newer full
backup is verified.

:func:`plan_retention` is the rule alone (a pure function of the manifest, tested with a table); each chain's
verdict comes with its reason. :func:`apply_retention` rewrites the manifest first (durably, without the expired
entries), then removes their bundles, then bundles no entry names that are older than :data:`ORPHAN_AFTER` (a
backup killed between its bundle's rename and its manifest entry, or an earlier apply killed after its manifest
was rewritten); fault point ``backup.retention.after_manifest`` between the two. Killed at any step, no entry of
the manifest names a removed file.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import durable
from ..errors import InvalidInputError
from ..faults import fault_point
from .manifest import BackupEntry, Manifest, load_manifest, save_manifest
from .run import orphan_bundles

#: A bundle no entry names goes once it is this old (a backup renames its bundle milliseconds before its entry).
ORPHAN_AFTER = 600.0


@dataclass(frozen=True)
class RetentionPlan:
    keep: tuple[str, ...]      # entry ids kept
    expire: tuple[str, ...]    # entry ids expired
    reasons: tuple[str, ...]   # one line per chain, oldest first


def _full_of(chain: list[BackupEntry]) -> BackupEntry | None:
    return next((e for e in chain if e.kind == "full" and e.id == e.chain), None)


def plan_retention(manifest: Manifest, keep_full: int) -> RetentionPlan:
    """Keep the newest ``keep_full`` chains (a chain: a full entry and its incrementals); an older chain expires
    only when a full entry of a kept chain is verified (else it stays, the reason says why)."""
    if keep_full < 1:
        raise InvalidInputError(f"retention keeps at least one full chain, not {keep_full}")
    chains = manifest.chains()
    kept_chains = chains[-keep_full:]
    older = chains[:-keep_full] if len(chains) > keep_full else []
    verified_newer = [f for f in (_full_of(c) for c in kept_chains) if f is not None and f.verified]
    keep: list[str] = []
    expire: list[str] = []
    reasons: list[str] = []
    for chain in older:
        ids = [e.id for e in chain]
        head = chain[0].chain
        if verified_newer:
            expire += ids
            reasons.append(f"chain {head}: expired ({len(ids)} backups; older than the newest {keep_full} chains, "
                           f"and the newer full backup {verified_newer[-1].id} is verified)")
        else:
            keep += ids
            reasons.append(f"chain {head}: kept ({len(ids)} backups) although older than the newest {keep_full} "
                           f"chains: no newer full backup is verified yet")
    for chain in kept_chains:
        keep += [e.id for e in chain]
        note = "" if _full_of(chain) is not None else " (its full backup is not in the manifest)"
        reasons.append(f"chain {chain[0].chain}: kept ({len(chain)} backups; among the newest {keep_full}){note}")
    return RetentionPlan(keep=tuple(keep), expire=tuple(expire), reasons=tuple(reasons))


def apply_retention(backup_dir: Path, plan: RetentionPlan, *, now: float | None = None) -> list[Path]:
    """Carry ``plan`` out in ``backup_dir``: the manifest without the expired entries (durably), then their
    bundles removed, then old orphan bundles; returns the files removed."""
    backup_dir = Path(backup_dir)
    manifest = load_manifest(backup_dir)
    doomed = set(plan.expire)
    files = [backup_dir / e.file for e in manifest.entries if e.id in doomed]
    left = manifest.without(doomed)
    if len(left.entries) != len(manifest.entries):
        save_manifest(backup_dir, left)
    fault_point("backup.retention.after_manifest")
    removed = [p for p in files if durable.unlink_if_present(p)]
    t = time.time() if now is None else now
    for p in orphan_bundles(backup_dir, left):
        try:
            old = t - os.stat(p).st_mtime >= ORPHAN_AFTER
        except FileNotFoundError:
            continue
        if old and durable.unlink_if_present(p):
            removed.append(p)
    if removed:
        durable.fsync_dir(backup_dir)
    return removed


__all__ = ["RetentionPlan", "plan_retention", "apply_retention", "ORPHAN_AFTER"]
