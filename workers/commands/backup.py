"""Backups and restores as plain functions (issue 38): the store's bundle chain (store/backup), with the
leases, the backup root's layout, the full-or-incremental choice, verification and retention around it.

Where a repository's backups live: ``<PACKYARD_BACKUP_ROOT>/<storage name>/<path inside the storage>``
(:func:`backup_dir_for`), so the directory is found again from the repository's address alone -- after the
repository is gone, which is when it is needed. A repository outside every storage root (the CLI's
in-process commands accept one) goes under ``_outside/<its absolute path>``.

One backup, in order (:func:`backup`), under the repository's maintenance lease (the caller's ``lease``:
one backup per repository at a time, and no repack deletes a pack while the bundle is read):

1. ``snapshot``: the refs read once under the repository lease (``snapshot_lock``), so no push's ref
   transaction is seen half done; pushes go on while the bundle is written;
2. ``decide``: the same refs and HEAD as the newest entry -> ``unchanged`` (no file written); no entry, a
   ``full`` request, or a chain whose full backup is older than PACKYARD_BACKUP_FULL_INTERVAL -> a new full
   chain; otherwise an incremental on the newest entry;
3. ``write``: the store writes the bundle (temp, flush, rename, directory fsync) and appends the manifest
   entry last;
4. ``verify``: the file read back (sha256, header refs, pack trailer) and marked verified;
5. ``retain``: chains beyond PACKYARD_BACKUP_KEEP_FULL expire, only behind a newer verified full one
   (store/backup/retention.py's rule).

A failure at any step raises the store's typed error; the manifest never names a partial bundle.
"""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager

from packyard.store.errors import InvalidInputError
from packyard.store.lease import Lease
from packyard.store.progress import Progress
from packyard.workers.settings import Settings, get_settings

SnapshotLock = Callable[[], ContextManager[Any]]
OUTSIDE = "_outside"


def backup_dir_for(repo: str | os.PathLike[str], settings: Settings | None = None) -> Path:
    """The directory holding ``repo``'s bundles and manifest (it need not exist, nor the repository)."""
    from packyard.workers.confine import Confinement

    settings = settings or get_settings()
    spelled = Confinement.from_settings(settings).spelled_path(str(repo)) if not os.path.isabs(str(repo)) \
        else Path(repo)
    real = Path(os.path.realpath(spelled))
    for name, root in settings.storage_roots:
        root_real = Path(os.path.realpath(root))
        if root_real in real.parents:
            return settings.backup_path / name / real.relative_to(root_real)
    return settings.backup_path / OUTSIDE / str(real).lstrip("/")


def _same_refs(entry: Any, snapshot: Any) -> bool:
    return entry.refs == {n: oid.hex() for n, oid in snapshot.refs.items()} and entry.head == snapshot.head


def _chain_start(manifest: Any, entry: Any) -> Any:
    return next((e for e in manifest.entries if e.id == entry.chain), None)


def choose_kind(manifest: Any, snapshot: Any, *, full: bool, now: float, full_interval: float) -> tuple[str, str]:
    """``(kind, reason)``: ``unchanged``, ``full`` or ``incremental`` -- the backup's "should we?" apart from
    the writing, as a pure function of the manifest, the snapshot and the clock."""
    latest = manifest.latest()
    if latest is None:
        return "full", "no backup yet"
    if full:
        return "full", "a full backup was asked for"
    start = _chain_start(manifest, latest)
    if start is None:
        return "full", f"the newest entry's chain {latest.chain} has no full backup in the manifest"
    if now - start.created >= full_interval:
        return "full", (f"the chain's full backup {start.id} is {int(now - start.created)} s old "
                        f"(PACKYARD_BACKUP_FULL_INTERVAL {int(full_interval)} s)")
    if _same_refs(latest, snapshot):
        return "unchanged", f"the refs and HEAD are those of {latest.id}"
    return "incremental", f"on {latest.id}"


def backup(repo: str | Path, *, full: bool = False, lease: Lease | None = None,
           snapshot_lock: SnapshotLock | None = None, progress: Progress | None = None,
           now: float | None = None) -> dict[str, Any]:
    """Back ``repo`` up into its backup directory (see the module's steps). Returns the job's result, with
    ``outcome`` (``written``, ``unchanged`` or ``skipped`` for a pool, whose members' bundles are complete
    without it) and the counters the job row keeps (``entry`` and ``checksum`` move the registry)."""
    from packyard.store.backup.manifest import load_manifest
    from packyard.store.backup.retention import apply_retention, plan_retention
    from packyard.store.backup.run import backup_repository, snapshot_refs, verify_backup
    from packyard.store.maintenance.pool.layout import is_pool
    from packyard.workers.repos import open_repository

    settings = get_settings()
    r = open_repository(repo, settings)
    dest = backup_dir_for(r.path, settings)
    base: dict[str, Any] = {"repo": str(r.path), "backup_dir": str(dest)}
    if is_pool(r.path):
        return {**base, "outcome": "skipped", "reason": "an object pool: its members' backups do not need it",
                "counters": {"skipped": 1}}
    t0 = time.monotonic()
    with snapshot_lock() if snapshot_lock is not None else nullcontext():
        snapshot = snapshot_refs(r)
    manifest = load_manifest(dest)
    kind, reason = choose_kind(manifest, snapshot, full=full, now=time.time() if now is None else now,
                               full_interval=settings.backup_full_interval)
    latest = manifest.latest()
    if kind == "unchanged" and latest is not None:
        return {**base, "outcome": "unchanged", "reason": reason, "entry": latest.id, "kind": latest.kind,
                "counters": {"entry": latest.id, "checksum": latest.checksum, "refs": len(latest.refs),
                             "objects": 0, "bytes": 0, "unchanged": 1}}
    if lease is not None:
        lease.check()
    t1 = time.monotonic()
    entry = backup_repository(r, dest, snapshot, full=kind == "full", progress=progress, now=now)
    t2 = time.monotonic()
    entry = verify_backup(dest, entry.id)
    t3 = time.monotonic()
    plan = plan_retention(load_manifest(dest), settings.backup_keep_full)
    if plan.expire:
        if lease is not None:
            lease.check()
        apply_retention(dest, plan)
    return {**base, "outcome": "written", "reason": reason, "entry": entry.id, "kind": entry.kind,
            "file": entry.file, "expired": list(plan.expire), "retention": list(plan.reasons),
            "counters": {"entry": entry.id, "checksum": entry.checksum, "refs": len(entry.refs),
                         "objects": entry.objects, "bytes": entry.size, "full": int(entry.kind == "full"),
                         "expired": len(plan.expire), "elapsed_us_snapshot": int((t1 - t0) * 1e6),
                         "elapsed_us_write": int((t2 - t1) * 1e6), "elapsed_us_verify": int((t3 - t2) * 1e6)}}


def restore(target: str | Path, source: str | Path, *, entry: str | None = None, force: bool = False,
            backup_dir: str | Path | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Restore the backups of the repository ``source`` (by its address: it may be gone) into the new
    repository ``target``: the chain up to ``entry`` (default: the newest), each bundle through index-pack's
    checks, refs last; the repository appears whole or not at all. ``backup_dir``: read another directory
    than ``source``'s (the CLI's ``--backup-dir``: a copy brought from elsewhere). An existing non-empty
    ``target`` is refused unless ``force``."""
    from packyard.store.backup.restore import restore_repository

    settings = get_settings()
    src_dir = Path(backup_dir) if backup_dir is not None else backup_dir_for(source, settings)
    if not (src_dir / "manifest.json").exists():
        raise InvalidInputError("no backups of this repository (no manifest.json)", path=src_dir)
    result = restore_repository(src_dir, Path(target), upto=entry, force=force, progress=progress)
    return {"repo": str(result.target), "source": str(source), "backup_dir": str(src_dir), "entry": result.entry,
            "checksum": result.checksum,
            "counters": {"entry": result.entry, "checksum": result.checksum, "refs": len(result.refs),
                         "objects": result.objects}}


def list_backups(repo: str | Path, *, backup_dir: str | Path | None = None) -> dict[str, Any]:
    """The manifest of ``repo``'s backups as chains (oldest first), for ``packyard backup --list``."""
    from packyard.store.backup.manifest import load_manifest

    src_dir = Path(backup_dir) if backup_dir is not None else backup_dir_for(repo)
    manifest = load_manifest(src_dir)
    return {"repo": str(repo), "backup_dir": str(src_dir),
            "chains": [[{"id": e.id, "kind": e.kind, "file": e.file, "size": e.size, "objects": e.objects,
                         "refs": len(e.refs), "checksum": e.checksum, "created": e.created,
                         "verified": e.verified} for e in chain] for chain in manifest.chains()]}


# -- the fleet (beat's nightly entry) ------------------------------------------------------------------

Send = Callable[[str, dict[str, Any], str], None]


def fleet_task_id(path: str, day: str) -> str:
    """One backup job id per repository and night: a redelivered fleet run queues the same ids, and the job
    rows (``abort_if_finished``) keep a second delivery from backing up twice."""
    import hashlib

    return f"backup-{day}-{hashlib.sha1(path.encode()).hexdigest()[:20]}"


def queue_fleet(*, settings: Settings, send: Send, now: float | None = None,
                progress: Progress | None = None) -> dict[str, Any]:
    """Queue one ``packyard.backup`` per enabled registered repository, a page at a time (keyset on the
    path, PACKYARD_PLANNER_PAGE rows), bounded by the count read first (and one page found meanwhile)."""
    from datetime import UTC, datetime

    from packyard.workers.records import registry

    day = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%d")
    total = registry.count_enabled(settings)
    queued, after = 0, None
    for _ in range(total // max(1, settings.planner_page) + 2):
        page = registry.enabled_paths_page(settings, after, settings.planner_page)
        if not page:
            break
        for path in page:
            send("packyard.backup", {"repo": path}, fleet_task_id(path, day))
            queued += 1
        if progress is not None:
            progress("queueing backups", queued, total)
        after = page[-1]
    return {"queued": queued, "day": day, "counters": {"queued": queued, "repositories": total, "day": day}}


__all__ = ["backup", "backup_dir_for", "choose_kind", "fleet_task_id", "list_backups", "queue_fleet", "restore"]
