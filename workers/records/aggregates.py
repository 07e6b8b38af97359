"""Counters kept as events are recorded: what the exporter and the dashboards read instead of history.

Every finished job, lock event and race event adds one to its row in ``record_totals`` (since the
records began) and in ``record_daily`` (per UTC day), in the same transaction that writes the event,
so the counters never disagree with the rows they counted. A scrape reads ``record_totals``: a few
dozen rows whatever the history holds; ``packyard records prune`` deletes old rows and the counters
(and the daily history) stay.

Each write is one ``INSERT ... ON CONFLICT DO UPDATE`` per table (SQLite and PostgreSQL spell it
the same), adding to every counted column at once.
"""
from __future__ import annotations

from datetime import date, datetime
from typing import Any, Iterable

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from packyard.workers.records.models import (BUCKET_COLUMNS, COUNTED_COLUMNS, DURATION_BUCKETS, Family, record_daily,
                                             record_totals)

_BUCKETS_MS = tuple(int(b * 1000) for b in DURATION_BUCKETS)


def bucket_of(duration_ms: int) -> str | None:
    """The ``b<i>`` column a duration counts in (None: above the last bucket)."""
    for name, bound in zip(BUCKET_COLUMNS, _BUCKETS_MS):
        if duration_ms <= bound:
            return name
    return None


def counted(events: int = 1, duration_ms: int | None = None) -> dict[str, int]:
    """The values one row adds: ``events`` events, and one duration when given."""
    values = dict.fromkeys(COUNTED_COLUMNS, 0)
    values["events"] = events
    if duration_ms is not None:
        values["timed"] = 1
        values["duration_ms_sum"] = int(duration_ms)
        b = bucket_of(int(duration_ms))
        if b is not None:
            values[b] = 1
    return values


def _upsert(session: Session, table: Table, keys: dict[str, Any], values: dict[str, int]) -> None:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(table)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table)
    stmt = stmt.values(**keys, **values)
    stmt = stmt.on_conflict_do_update(index_elements=list(keys),
                                      set_={c: table.c[c] + stmt.excluded[c] for c in values if values[c]})
    session.execute(stmt)


def add(session: Session, family: Family, kind: str, state: str, at: datetime | date, *, events: int = 1,
        duration_ms: int | None = None) -> None:
    """Count ``events`` events (and a duration) in the totals and in ``at``'s day, in ``session``'s transaction."""
    values = counted(events, duration_ms)
    keys = {"family": family.value, "kind": kind[:64], "state": state[:32]}
    day = at.date() if isinstance(at, datetime) else at
    _upsert(session, record_totals, keys, values)
    _upsert(session, record_daily, {"day": day, **keys}, values)


def totals(session: Session, families: Iterable[Family] | None = None) -> list[dict[str, Any]]:
    """Every totals row (of ``families``), as dicts."""
    q = select(record_totals)
    if families is not None:
        q = q.where(record_totals.c.family.in_([f.value for f in families]))
    return [dict(r._mapping) for r in session.execute(q)]


def daily(session: Session, since: date | None = None) -> list[dict[str, Any]]:
    """Daily rows (from ``since`` on), oldest first."""
    q = select(record_daily).order_by(record_daily.c.day, record_daily.c.family, record_daily.c.kind,
                                      record_daily.c.state)
    if since is not None:
        q = q.where(record_daily.c.day >= since)
    return [dict(r._mapping) for r in session.execute(q)]


def lease_of(lock_name: str) -> str:
    """``maintenance`` or ``repo``, from a lock_events row's key name."""
    from packyard.workers.locks import LeaseKind

    return "maintenance" if lock_name.startswith(LeaseKind.MAINTENANCE.key_prefix) else "repo"
