"""Counters kept as events are recorded: what the exporter and the dashboards read instead of history.

Every finished job, lock event and race event adds one to its row in ``record_totals`` (since the
records began) and in ``record_daily`` (per UTC day), in the same transaction that writes the event,
so the counters never disagree with the rows they counted. A scrape reads ``record_totals``: a few
dozen rows whatever the history holds; ``packyard records prune`` deletes old rows and the counters
(and the daily history) stay.

One kind of row is a level, not a count of events: ``record_totals``'s ``(level, kind, LOST)`` rows hold
how many job rows of ``kind`` are LOST now (:func:`move_level`), moved by +1 when the reconciler marks a job
LOST and by -1 (-N) when a LOST row is overwritten (the job is re-queued, retried, started or finished) or
pruned, each in the transaction that writes the row, so the exporter reads the LOST figure without reading
a LOST row. ``record_daily`` has no levels: its ``(job, kind, LOST)`` rows count the jobs marked LOST that
day (:func:`count_marked_lost`).

Each write is one ``INSERT ... ON CONFLICT DO UPDATE`` per table (SQLite and PostgreSQL spell it
the same), adding to every counted column at once.
"""
from __future__ import annotations

from datetime import date, datetime
from typing import Any, Iterable

from sqlalchemy import Table, bindparam, select, text
from sqlalchemy.orm import Session

from packyard.workers.records.models import (
    BUCKET_COLUMNS,
    COUNTED_COLUMNS,
    DURATION_BUCKETS,
    Family,
    JobState,
    record_daily,
    record_totals,
)

_BUCKETS_MS = tuple(int(b * 1000) for b in DURATION_BUCKETS)
#: The state whose job rows ``record_totals`` keeps as a level (Family.LEVEL).
LOST = JobState.LOST.value


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


def _upsert_sql(table: Table, keys: tuple[str, ...]) -> Any:
    """``INSERT ... ON CONFLICT (keys) DO UPDATE SET c = c + excluded.c`` for every counted column: one text
    statement, spelled the same on SQLite and PostgreSQL, built once (a Core upsert is rebuilt and re-keyed
    for the statement cache on every call: most of a job's recording time went there)."""
    cols = (*keys, *COUNTED_COLUMNS)
    sql = (f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)}) "
           f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
           + ", ".join(f"{c} = {table.name}.{c} + excluded.{c}" for c in COUNTED_COLUMNS))
    return text(sql).bindparams(*(bindparam(c, type_=table.c[c].type) for c in cols))


_TOTALS_UPSERT = _upsert_sql(record_totals, ("family", "kind", "state"))
_DAILY_UPSERT = _upsert_sql(record_daily, ("day", "family", "kind", "state"))


def _both_upsert_sql() -> Any:
    """PostgreSQL: both upserts in one statement, one round trip instead of two (SQLite has no DML in WITH).

    The day's row is inserted from the totals' RETURNING row, so the totals' upsert runs first: the same
    lock order as the two statements (an unreferenced data-modifying WITH would run after the main one).
    """
    keys = ("day", "family", "kind", "state")
    cols = (*keys, *COUNTED_COLUMNS)
    casts = {"day": "date", "family": "varchar", "kind": "varchar", "state": "varchar"}
    select_list = ", ".join(f"CAST(:{c} AS {casts.get(c, 'bigint')})" for c in cols)
    sql = (f"WITH totals AS ({_TOTALS_UPSERT.text} RETURNING 1) "
           f"INSERT INTO {record_daily.name} ({', '.join(cols)}) SELECT {select_list} FROM totals "
           f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET "
           + ", ".join(f"{c} = {record_daily.name}.{c} + excluded.{c}" for c in COUNTED_COLUMNS))
    return text(sql).bindparams(*(bindparam(c, type_=record_daily.c[c].type) for c in cols))


_BOTH_UPSERT = _both_upsert_sql()


def add(session: Session, family: Family, kind: str, state: str, at: datetime | date, *, events: int = 1,
        duration_ms: int | None = None) -> None:
    """Count ``events`` events (and a duration) in the totals and in ``at``'s day, in ``session``'s transaction."""
    values = {"family": family.value, "kind": kind[:64], "state": state[:32], **counted(events, duration_ms),
              "day": at.date() if isinstance(at, datetime) else at}
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_BOTH_UPSERT, values)
        return
    session.execute(_TOTALS_UPSERT, {k: v for k, v in values.items() if k != "day"})
    session.execute(_DAILY_UPSERT, values)


def move_level(session: Session, kind: str, state: str, by: int) -> None:
    """Move the level of job rows of ``kind`` in ``state`` by ``by`` (+1 a row entered it, -n rows left it), in
    ``session``'s transaction: the same transaction as the write that moved the rows."""
    if by:
        session.execute(_TOTALS_UPSERT, {"family": Family.LEVEL.value, "kind": kind[:64], "state": state[:32],
                                         **counted(by)})


def count_marked_lost(session: Session, kind: str, at: datetime) -> None:
    """A job of ``kind`` was marked LOST at ``at``: the level +1, and one event in that day's row."""
    move_level(session, kind, LOST, 1)
    session.execute(_DAILY_UPSERT, {"family": Family.JOB.value, "kind": kind[:64], "state": LOST, **counted(1),
                                    "day": at.date()})


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
