"""Object pools in the records (migration 0008): which repositories borrow from which pool.

The disk is the truth: a pool's ``packyard/members`` file and each member's ``objects/info/alternates``
(store/maintenance/pool). The pool jobs (workers/commands/pool.py) write these rows after each step has
landed on disk, so a row can lag the disk by one killed job, never lead it: a redelivered job finds the
disk step done (``already``) and writes the row then. Every write here is idempotent for that reason.

What reads them: ``packyard pool list`` and ``packyard status`` (membership), ``pool delete`` (refused while a
recorded member remains, even one whose disk entry was lost), and the nightly planner (when to fetch into a pool).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from packyard.workers.records.db import session_scope
from packyard.workers.records.models import Pool, PoolMember, Repository, utcnow
from packyard.workers.records.models import normalize_repo_path as normalize
from packyard.workers.settings import Settings


@dataclass(frozen=True)
class PoolRow:
    """One pool as the records know it."""

    path: str
    source: str | None
    created_at: datetime
    last_fetched_at: datetime | None
    fetches: int
    members: tuple[str, ...] = field(default=())


def _repo_id(s: Session, path: str | Path) -> int:
    from packyard.workers.records.recorder import repository_id

    rid = repository_id(s, path)
    assert rid is not None
    return rid


def _pool_id(s: Session, pool: str | Path) -> int | None:
    return s.scalar(select(Pool.id).join(Repository, Pool.repo_id == Repository.id)
                    .where(Repository.path == normalize(pool)))


def record_pool(settings: Settings | str, pool: str | Path, source: str | Path | None) -> None:
    """The pool exists (created, or found made by a job killed before its row): its row, with its source."""
    with session_scope(settings) as s:
        rid = _repo_id(s, pool)
        source_id = None if source is None else _repo_id(s, source)
        row = s.scalar(select(Pool).where(Pool.repo_id == rid))
        if row is None:
            s.add(Pool(repo_id=rid, source_id=source_id, created_at=utcnow()))
        elif source_id is not None:
            row.source_id = source_id


def record_fetched(settings: Settings | str, pool: str | Path, source: str | Path | None = None) -> None:
    """A fetch into the pool landed (also a create's first fetch)."""
    record_pool(settings, pool, source)
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.repo_id == _repo_id(s, pool))
                  .values(last_fetched_at=utcnow(), fetches=Pool.fetches + 1))


def record_member(settings: Settings | str, pool: str | Path, member: str | Path, key: str) -> None:
    """``member`` borrows from ``pool`` now (its alternates are written). A repository has one pool at most: a
    row naming another pool is moved (the disk, where the link refused a second pool, is the truth)."""
    record_pool(settings, pool, None)
    with session_scope(settings) as s:
        pid = _pool_id(s, pool)
        assert pid is not None, "record_pool wrote the row"
        rid = _repo_id(s, member)
        row = s.scalar(select(PoolMember).where(PoolMember.repo_id == rid))
        if row is None:
            s.add(PoolMember(pool_id=pid, repo_id=rid, key=key, linked_at=utcnow()))
        elif row.pool_id != pid or row.key != key:
            row.pool_id, row.key, row.linked_at = pid, key, utcnow()


def forget_member(settings: Settings | str, member: str | Path) -> bool:
    """``member`` no longer borrows (disconnected); False if no row said it did."""
    with session_scope(settings) as s:
        rid = s.scalar(select(Repository.id).where(Repository.path == normalize(member)))
        if rid is None:
            return False
        return bool(s.execute(delete(PoolMember).where(PoolMember.repo_id == rid)).rowcount)  # type: ignore[attr-defined]


def forget_pool(settings: Settings | str, pool: str | Path) -> bool:
    """The pool is deleted from disk: its row goes (its members' rows with it; ``pool delete`` refused while
    there were any). Its repository row stays, with its job history."""
    with session_scope(settings) as s:
        pid = _pool_id(s, pool)
        if pid is None:
            return False
        s.execute(delete(PoolMember).where(PoolMember.pool_id == pid))
        s.execute(delete(Pool).where(Pool.id == pid))
        return True


def members_of(settings: Settings | str, pool: str | Path) -> tuple[str, ...]:
    """The recorded members' paths, sorted."""
    with session_scope(settings) as s:
        pid = _pool_id(s, pool)
        if pid is None:
            return ()
        return tuple(s.scalars(select(Repository.path).join(PoolMember, PoolMember.repo_id == Repository.id)
                               .where(PoolMember.pool_id == pid).order_by(Repository.path)))


def pool_of(settings: Settings | str, member: str | Path) -> str | None:
    """The path of the pool ``member`` borrows from, by the records (None: none)."""
    with session_scope(settings) as s:
        pool_repo = Repository.__table__.alias("pool_repo")
        return s.scalar(select(pool_repo.c.path)
                        .select_from(PoolMember)
                        .join(Repository, PoolMember.repo_id == Repository.id)
                        .join(Pool, PoolMember.pool_id == Pool.id)
                        .join(pool_repo, Pool.repo_id == pool_repo.c.id)
                        .where(Repository.path == normalize(member)))


def get_pool(settings: Settings | str, pool: str | Path) -> PoolRow | None:
    """The recorded pool at ``pool`` (its first LIST_MEMBERS members), or None."""
    with session_scope(settings) as s:
        pid = _pool_id(s, pool)
        if pid is None:
            return None
        row = s.get(Pool, pid)
        assert row is not None
        source = None if row.source_id is None else s.scalar(select(Repository.path)
                                                             .where(Repository.id == row.source_id))
        members = tuple(s.scalars(select(Repository.path).join(PoolMember, PoolMember.repo_id == Repository.id)
                                  .where(PoolMember.pool_id == pid).order_by(Repository.path).limit(LIST_MEMBERS)))
        return PoolRow(normalize(pool), source, row.created_at, row.last_fetched_at, row.fetches or 0, members)


#: ``pool list`` shows at most this many members per pool (the count is always whole).
LIST_MEMBERS = 1000


def list_pools(settings: Settings | str, *, limit: int = 1000) -> list[tuple[PoolRow, int]]:
    """Every recorded pool (by path, at most ``limit``) with up to LIST_MEMBERS member paths and the full count."""
    out: list[tuple[PoolRow, int]] = []
    with session_scope(settings) as s:
        source_repo = Repository.__table__.alias("source_repo")
        rows = s.execute(select(Pool.id, Repository.path, source_repo.c.path, Pool.created_at, Pool.last_fetched_at,
                                Pool.fetches)
                         .join(Repository, Pool.repo_id == Repository.id)
                         .outerjoin(source_repo, Pool.source_id == source_repo.c.id)
                         .order_by(Repository.path).limit(limit)).all()
        for pid, path, source, created, fetched, fetches in rows:
            count = s.scalar(select(func.count()).select_from(PoolMember).where(PoolMember.pool_id == pid)) or 0
            members = tuple(s.scalars(select(Repository.path).join(PoolMember, PoolMember.repo_id == Repository.id)
                                      .where(PoolMember.pool_id == pid).order_by(Repository.path)
                                      .limit(LIST_MEMBERS)))
            out.append((PoolRow(path, source, created, fetched, fetches or 0, members), count))
    return out


__all__ = ["LIST_MEMBERS", "PoolRow", "forget_member", "forget_pool", "get_pool", "list_pools", "members_of", "pool_of",
           "record_fetched", "record_member", "record_pool"]
