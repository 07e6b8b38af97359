"""The pool jobs as plain functions: a fork network's life (store/maintenance/pool), with its records.

Each function does the store's step (ordered and restartable there: a redelivered job finds the work done and
says ``already``), then writes the rows of :mod:`packyard.workers.records.pools` -- after the disk, never
before, so the records can lag the disk by one killed job and never claim what is not there.

Repositories are opened the one way workers open them (:func:`~packyard.workers.repos.open_repository`): a
repository inside a storage root may borrow only from inside one, and a pool's source, when the pool lies in a
root, must lie in one too (:func:`~packyard.workers.repos.open_beside`). The leases are the caller's
(``lease=``: a :class:`~packyard.store.lease.Joint` of the leases in
:func:`~packyard.workers.locks.pool_lease_order`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packyard.store import leftovers as lo
from packyard.store.errors import InvalidInputError
from packyard.store.lease import Lease
from packyard.store.maintenance.pool import lifecycle
from packyard.store.maintenance.pool.layout import (
    is_pool,
    member_key,
    read_marker,
    read_members,
    source_key,
)
from packyard.store.maintenance.repack.options import RepackOptions
from packyard.store.maintenance.serving.bitmap import BitmapOptions
from packyard.store.progress import Progress
from packyard.store.repo import Repository
from packyard.workers.repos import open_beside, open_repository
from packyard.workers.settings import get_settings


def _result(step: str, pool: Path, result: lifecycle.PoolResult, **extra: Any) -> dict[str, Any]:
    return {"pool": str(pool), "step": step, "outcome": result.step.value, **extra, "counters": result.as_counters()}


def prepare_pool_dir(repo: str | Path, *, progress: Progress | None = None) -> dict[str, Any]:
    """Lay out the (empty, bare) repository a pool is made in, so its maintenance fence has a home before the
    lease is taken. Idempotent; refused over a directory that is neither empty nor a repository."""
    r = Repository.init(Path(repo))
    return {"pool": str(r.path), "counters": {}}


def create(repo: str | Path, source: str | Path, *, key: str | None = None, lease: Lease | None = None,
           progress: Progress | None = None) -> dict[str, Any]:
    """Make the pool ``repo`` from ``source``: its objects, and its refs under ``refs/virtual/<key>/``."""
    settings = get_settings()
    src = open_beside(source, repo, settings)
    result = lifecycle.create_pool(Path(repo), src, key=key, lease=lease, progress=progress)
    pool = open_repository(repo, settings)
    from packyard.workers.records.pools import record_fetched

    record_fetched(settings, pool.path, src.path)
    return _result("create", pool.path, result, source=str(src.path), key=result.key)


def fetch(repo: str | Path, source: str | Path | None = None, *, key: str | None = None,
          lease: Lease | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Bring ``source``'s new objects and refs into the pool ``repo`` (default: the source it was made from;
    another member's refs go under that member's own namespace)."""
    settings = get_settings()
    pool = open_repository(repo, settings)
    if not is_pool(pool.path):
        raise InvalidInputError("not an object pool (no packyard/pool marker)", path=pool.path)
    src = open_beside(source if source is not None else read_marker(pool.path).get("source", ""), pool.path,
                      settings)
    result = lifecycle.fetch_into_pool(pool, src, key=key, lease=lease, progress=progress)
    from packyard.workers.records.pools import record_fetched

    record_fetched(settings, pool.path, src.path if source is None else None)
    return _result("fetch", pool.path, result, source=str(src.path), key=result.key)


def _repack_options() -> RepackOptions:
    settings = get_settings()
    return RepackOptions(preserve_for=float(settings.maintenance_preserve_for),
                         bitmap_options=BitmapOptions(lookup_table=settings.bitmap_lookup_table,
                                                      prefer_tips=settings.bitmap_prefer_tips))


def link(repo: str | Path, pool: str | Path, *, lease: Lease | None = None,
         progress: Progress | None = None) -> dict[str, Any]:
    """Make ``repo`` a member of ``pool``: the members file, the alternates, then a local-only repack."""
    settings = get_settings()
    p = open_beside(pool, repo, settings)
    member = open_repository(repo, settings)
    result = lifecycle.link_member(member, p, lease=lease, repack_options=_repack_options(), progress=progress)
    from packyard.workers.records.pools import record_member

    record_member(settings, p.path, member.path, member_key(member.path))
    return _result("link", p.path, result, member=str(member.path))


def pool_of(member: Repository) -> Path:
    """The pool ``member`` borrows from, by its alternates file (InvalidInputError if it borrows from none or
    from a directory that is not a pool's objects)."""
    paths = member.alternates.paths
    if not paths:
        raise InvalidInputError("the repository borrows from no pool (no objects/info/alternates)", path=member.path)
    git_dir = Path(paths[0]).parent
    if not is_pool(git_dir):
        raise InvalidInputError(f"the repository borrows from {paths[0]}, which is not a pool's objects directory",
                                path=member.path)
    return git_dir


def disconnect(repo: str | Path, pool: str | Path | None = None, *, lease: Lease | None = None,
               progress: Progress | None = None) -> dict[str, Any]:
    """Make ``repo`` whole again and leave ``pool`` (default: the pool its alternates name): copy back, verify
    without the pool, then remove the alternates and the membership."""
    settings = get_settings()
    member = open_repository(repo, settings)
    p = open_beside(pool if pool is not None else pool_of(member), repo, settings)
    result = lifecycle.disconnect_member(member, p, lease=lease, progress=progress)
    from packyard.workers.records.pools import forget_member

    forget_member(settings, member.path)
    return _result("disconnect", p.path, result, member=str(member.path))


def delete(repo: str | Path, *, lease: Lease | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Delete the pool ``repo``; refused while its members file or the records name a member. A delete killed
    after its rename finishes here (the renamed directory is removed; the records forget the pool)."""
    from packyard.workers.records.pools import forget_pool, members_of

    settings = get_settings()
    path = Path(os.path.realpath(repo))
    if not path.exists():
        # (the leftovers table's pool_deleting kind, judged here at age 0: this is the delete finishing)
        rule = lo.RULES[lo.Kind.POOL_DELETING].aged(unjudged_after=0.0)
        removed = len(lo.remove(lo.removable(lo.find_pool_deletions(path, rule=rule)), lease))
        forget_pool(settings, path)
        return {"pool": str(path), "step": "delete", "outcome": lifecycle.PoolStep.ALREADY.value,
                "counters": {"step": lifecycle.PoolStep.ALREADY.value, "leftovers_removed": removed}}
    pool = open_repository(path, settings)
    recorded = [Path(m) for m in members_of(settings, pool.path)]
    result = lifecycle.delete_pool(pool, recorded_members=recorded, lease=lease)
    forget_pool(settings, pool.path)
    return _result("delete", pool.path, result)


def describe(repo: str | Path) -> dict[str, Any]:
    """What the disk says about a pool (for ``pool list --check``): its source and its members file."""
    pool = Repository.open(repo)
    if not is_pool(pool.path):
        raise InvalidInputError("not an object pool (no packyard/pool marker)", path=pool.path)
    marker = read_marker(pool.path)
    return {"pool": str(pool.path), "source": marker.get("source"), "source_key": source_key(marker),
            "members": [str(m) for m in read_members(pool.path)]}


__all__ = ["create", "delete", "describe", "disconnect", "fetch", "link", "pool_of", "prepare_pool_dir"]
