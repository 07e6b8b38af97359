"""The records benchmark's fill: a fleet's history as rows, loaded the fast way, its indexes built after.

:class:`Fill` generates realistic rows in id order (jobs over ``days`` days across ``repos`` repositories,
two lock events per job, one race event per 50 jobs) and the counters the recorder would have kept;
:func:`fill_database` loads them by bulk insert (COPY on PostgreSQL, executemany on SQLite) with the big
tables' secondary indexes dropped first and built after from the migrated database's own definitions,
checked against the migrations' (:func:`check_schema`). ``packyard bench records`` (:mod:`.records`) times
the service's queries over what this loads.
"""
from __future__ import annotations

import bisect
import json
import random
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterable, Iterator

KINDS = (("packyard.index_pack", 40), ("packyard.write_objects", 25), ("packyard.unpack_objects", 10),
         ("packyard.import_tree", 5), ("packyard.plan_maintenance", 10), ("packyard.repack", 5),
         ("packyard.gc", 2), ("packyard.verify_repo", 3))


class Fill:
    """Realistic rows, generated in id order, and the counters they add up to."""

    def __init__(self, jobs: int, repos: int, days: float, now: datetime, seed: int) -> None:
        self.jobs, self.repos, self.days, self.now = jobs, repos, days, now
        self.rng = random.Random(seed)
        self.start = now - timedelta(days=days)
        self.totals: dict[tuple[Any, ...], list[int]] = {}
        self.next_job_id = 1
        self.next_lock_id = 1
        self.next_race_id = 1
        from packyard.workers.records.models import DURATION_BUCKETS

        self.bounds = tuple(int(b * 1000) for b in DURATION_BUCKETS)   # the recorder's buckets, in ms

    def repo_path(self, i: int) -> str:
        return f"/srv/bench/{i // 1000:03d}/r{i:07d}.git"

    def repositories(self) -> Iterator[tuple[Any, ...]]:
        rng, now = self.rng, self.now
        for i in range(1, self.repos + 1):
            packs = max(1, int(rng.lognormvariate(1.5, 1.0)))
            loose = int(rng.lognormvariate(4.0, 2.0))
            full = None if rng.random() < 0.1 else now - timedelta(days=rng.uniform(0, 60))
            action = rng.choice(("geometric", "loose", "full", "gc")) if rng.random() < 0.1 else None
            planned = now - timedelta(hours=rng.uniform(0, 24))
            plan = {"at": planned.timestamp(), "trigger": "window",
                    "outcome": "nothing" if action is None else "queued", "action": action or "nothing",
                    "reasons": ["bench"], "stats": {"packs": packs, "loose_estimate": loose}}
            yield (i, self.repo_path(i), self.start, None, now - timedelta(minutes=rng.uniform(0, 600)),
                   rng.random() < 0.97, rng.randint(0, 200), full, full, planned, json.dumps(plan),
                   planned, packs, loose, action)

    REPO_COLUMNS = ("id", "path", "created_at", "last_verified_at", "last_job_at", "enabled", "ingests_since_repack",
                    "last_repack_at", "last_full_repack_at", "last_planned_at", "last_plan", "stats_at", "stat_packs",
                    "stat_loose_objects", "due_action")
    JOB_COLUMNS = ("id", "task_id", "kind", "repo_id", "state", "params", "queued_at", "started_at", "finished_at",
                   "duration_ms", "counters", "error", "error_type", "retries", "worker_hostname", "worker_pid",
                   "attempts", "first_started_at", "last_started_at")
    LOCK_COLUMNS = ("id", "repo_id", "job_id", "lock_name", "event", "fencing_token", "at", "waited_ms")
    RACE_COLUMNS = ("id", "repo_id", "job_id", "kind", "detail", "observed_at")

    def count(self, family: str, kind: str, state: str, at: datetime, duration_ms: int | None = None) -> None:
        """What the recorder's aggregates.add counts, per day (the totals are the days' sums)."""
        key = (at.date(), family, kind, state)
        acc = self.totals.get(key)
        if acc is None:
            acc = self.totals[key] = [0] * (3 + len(self.bounds))
        acc[0] += 1
        if duration_ms is not None:
            acc[1] += 1
            acc[2] += duration_ms
            i = bisect.bisect_left(self.bounds, duration_ms)
            if i < len(self.bounds):
                acc[3 + i] += 1

    def history(self, jobs: int, start: datetime, span: timedelta, pending_tail: bool = True,
                lo: int = 0, hi: int | None = None
                ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Jobs ``lo`` to ``hi`` of ``jobs`` spread over ``span`` from ``start`` (and their lock and race events)."""
        rng = self.rng
        names, weights = zip(*KINDS)
        hi = jobs if hi is None else hi
        kinds = rng.choices(names, weights, k=hi - lo)
        step = span / max(1, jobs)
        job_rows, lock_rows, race_rows = [], [], []
        params = json.dumps({"ref": "refs/heads/main"})
        counter_pool = [json.dumps({"objects": rng.randint(1, 5000), "bytes": rng.randint(100, 1 << 24)})
                        for _ in range(256)]
        for n, kind in enumerate(kinds, start=lo):
            jid = self.next_job_id
            self.next_job_id += 1
            repo = rng.randint(1, self.repos)
            queued = start + step * n
            dur = int(min(4 * 3600_000, rng.lognormvariate(6.5, 1.6)))
            started = queued + timedelta(milliseconds=rng.randint(5, 2000))
            finished = started + timedelta(milliseconds=dur)
            pending = pending_tail and n >= jobs - 50
            r = rng.random()
            state = ("STARTED" if pending and r < 0.5 else "QUEUED" if pending else
                     "FAILURE" if r < 0.02 else "LOST" if r < 0.025 else "SUCCESS")
            done = state in ("SUCCESS", "FAILURE")
            job_rows.append((
                jid, uuid.UUID(int=rng.getrandbits(128)).hex, kind, repo, state,
                params, queued, started if state != "QUEUED" else None,
                finished if done or state == "LOST" else None, dur if done else None,
                counter_pool[n & 255] if done else None,
                "bench failure" if state == "FAILURE" else None, "StoreError" if state == "FAILURE" else None,
                0, "worker@bench", 1000 + n % 64, 1, started, started))
            if done:
                self.count("job", kind, state, finished, dur)
            elif state == "LOST":   # marked LOST when the row says (its finished_at): the day's mark, the level
                self.count("job", kind, state, finished)
            lease = "packyard:lock:maint:" if kind in ("packyard.repack", "packyard.gc") else "packyard:lock:"
            name = lease + self.repo_path(repo)
            for event, at in (("acquired", started), ("released", finished)):
                lock_rows.append((self.next_lock_id, repo, job_rows[-1][1], name, event, jid, at, 0))
                self.next_lock_id += 1
                self.count("lock", "maintenance" if "maint:" in lease else "repo", event, at)
            if n % 50 == 0:
                kind_r = rng.choice(("relisted", "relisted", "preserved", "quick_absent"))
                race_rows.append((self.next_race_id, repo, job_rows[-1][1], kind_r, json.dumps({"oid": "0" * 40}),
                                  started))
                self.next_race_id += 1
                self.count("race", kind_r, "", started)
        return job_rows, lock_rows, race_rows

    def aggregate_rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """(record_totals rows, record_daily rows) as the recorder keeps them: the days' LOST marks add up to the
        LOST level in the totals (family ``level``; nothing of the fill leaves LOST)."""
        totals: dict[tuple[str, str, str], list[int]] = {}
        for (_day, f, k, s), v in self.totals.items():
            if (f, s) == ("job", "LOST"):
                f = "level"
            acc = totals.setdefault((f, k, s), [0] * len(v))
            for i, x in enumerate(v):
                acc[i] += x
        return ([(*key, *v) for key, v in totals.items()],
                [(day, f, k, s, *v) for (day, f, k, s), v in self.totals.items()])


# -- bulk insert --------------------------------------------------------------------------------------------

def bulk_insert(engine: Any, table: str, columns: tuple[str, ...], rows: Iterable[tuple[Any, ...]],
                chunk: int = 50_000) -> int:
    """COPY (PostgreSQL) or executemany in transactions of ``chunk`` rows (SQLite)."""
    n = 0
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "postgresql":
            with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    n += 1
        else:
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
            batch: list[tuple[Any, ...]] = []
            for row in rows:
                batch.append(tuple(_sqlite_value(v) for v in row))
                if len(batch) >= chunk:
                    cur.executemany(sql, batch)
                    raw.commit()
                    n += len(batch)
                    batch = []
            if batch:
                cur.executemany(sql, batch)
                n += len(batch)
        raw.commit()
    finally:
        raw.close()
    return n


def _sqlite_value(v: Any) -> Any:
    """What SQLAlchemy's SQLite types store: datetimes as 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC), bools as 0/1."""
    if isinstance(v, datetime):
        return v.astimezone(UTC).replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S.%f")
    if hasattr(v, "isoformat") and not isinstance(v, str):
        return v.isoformat()
    return v


# -- the fill: rows first, then the big tables' secondary indexes -------------------------------------------

#: The tables whose secondary indexes the fill drops before loading their rows and builds afterwards: an index
#: filled row by row in random key order (task ids, job ids, times of several kinds interleaved) outgrows a
#: server's buffers long before 10M rows, and every insert then reads and writes random index pages, each a
#: full-page image in the WAL after every checkpoint (a durable PostgreSQL with 128 MB of shared_buffers slowed
#: to 130 MB/min after 5 GB); built afterwards, each index is one sort and one sequential write. Their foreign
#: keys go too on PostgreSQL (a trigger per row, a lock record per repository and transaction): added back, each
#: is one join. The other tables are small and keep theirs.
BIG_TABLES = ("jobs", "lock_events", "race_events")
#: PostgreSQL's maintenance_work_mem for the fill's index builds (SET LOCAL: this transaction only); the
#: server's default, 64 MB, makes a 10M-entry sort spill in many runs.
INDEX_BUILD_MEMORY = "256MB"


@dataclass(frozen=True)
class Deferred:
    """A secondary index, UNIQUE constraint or foreign key of a big table, as the database defines it."""

    table: str
    name: str
    kind: str          # "index", "unique" (a constraint and its index) or "foreign key"
    definition: str    # the database's own DDL: pg_get_indexdef / pg_get_constraintdef, sqlite_master.sql

    def drop_sql(self) -> str:
        return f"DROP INDEX {self.name}" if self.kind == "index" else \
            f"ALTER TABLE {self.table} DROP CONSTRAINT {self.name}"

    def create_sql(self) -> str:
        return self.definition if self.kind == "index" else \
            f"ALTER TABLE {self.table} ADD CONSTRAINT {self.name} {self.definition}"


def deferred_schema(engine: Any, tables: tuple[str, ...] = BIG_TABLES) -> list[Deferred]:
    """What the fill builds after the rows of ``tables``, read from the database's catalog (what the migrations
    created; never a copy spelled out here that could drift from them): indexes and UNIQUE constraints by table
    and name, then the foreign keys.

    PostgreSQL: every index but the primary key's (a UNIQUE constraint's as the constraint), and the foreign
    keys. SQLite: the indexes with their own SQL; a UNIQUE constraint's index (``sqlite_autoindex_*``) and the
    foreign keys are part of the table's definition and stay."""
    from sqlalchemy import bindparam, text

    if engine.dialect.name == "postgresql":
        sql = text(
            "SELECT t.relname, i.relname, CASE WHEN con.oid IS NULL THEN 'index' ELSE 'unique' END, "
            "       COALESCE(pg_get_constraintdef(con.oid), pg_get_indexdef(x.indexrelid)), 0 "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "LEFT JOIN pg_constraint con ON con.conindid = x.indexrelid AND con.conrelid = x.indrelid "
            "     AND con.contype = 'u' "
            "WHERE t.relnamespace = CAST(current_schema() AS regnamespace) AND t.relname IN :tables "
            "  AND NOT x.indisprimary "
            "UNION ALL "
            "SELECT t.relname, con.conname, 'foreign key', pg_get_constraintdef(con.oid), 1 "
            "FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid "
            "WHERE t.relnamespace = CAST(current_schema() AS regnamespace) AND t.relname IN :tables "
            "  AND con.contype = 'f' "
            "ORDER BY 5, 1, 2")
    else:
        sql = text("SELECT tbl_name, name, 'index', sql, 0 FROM sqlite_master WHERE type = 'index' "
                   "AND tbl_name IN :tables AND sql IS NOT NULL ORDER BY tbl_name, name")
    with engine.connect() as c:
        rows = c.execute(sql.bindparams(bindparam("tables", expanding=True)), {"tables": list(tables)}).all()
    return [Deferred(t, n, k, d) for t, n, k, d, _order in rows]


def drop_deferred(engine: Any, deferred: list[Deferred]) -> None:
    from sqlalchemy import text

    with engine.begin() as c:
        for d in reversed(deferred):   # foreign keys first
            c.execute(text(d.drop_sql()))


def build_deferred(engine: Any, d: Deferred) -> None:
    from sqlalchemy import text

    with engine.begin() as c:
        if engine.dialect.name == "postgresql":
            c.execute(text(f"SET LOCAL maintenance_work_mem = '{INDEX_BUILD_MEMORY}'"))
        c.execute(text(d.create_sql()))


class SchemaMismatch(RuntimeError):
    """The filled database's indexes are not the migrations' (a fill must never time a different schema)."""


def check_schema(engine: Any, want: list[Deferred]) -> None:
    """The indexes (and constraints) after the fill are exactly those a fresh ``alembic upgrade head`` made
    (``want``, read from the database before the fill dropped them), and the schema is the models' (alembic's
    compare_metadata, as tests/workers/test_migrations.py checks it): raise SchemaMismatch, naming the
    difference, otherwise."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from packyard.workers.records import Base

    got = deferred_schema(engine)
    missing, extra = sorted(set(want) - set(got), key=str), sorted(set(got) - set(want), key=str)
    with engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    if missing or extra or diff:
        raise SchemaMismatch("the filled database's indexes differ from the migrations': "
                             f"missing {[d.name for d in missing]}, not the migrations' {[d.name for d in extra]}, "
                             f"models vs database {diff}")


class Phases:
    """The fill's phases with their times: printed to stderr as each ends (a 10M fill runs for many minutes),
    kept for the report."""

    def __init__(self, label: str = "fill") -> None:
        self.label = label
        self.done: list[dict[str, Any]] = []

    @contextmanager
    def __call__(self, name: str) -> Iterator[dict[str, Any]]:
        phase: dict[str, Any] = {"phase": name}
        t0 = time.perf_counter()
        yield phase
        phase["s"] = round(time.perf_counter() - t0, 1)
        self.done.append(phase)
        extra = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in phase.items()
                          if k not in ("phase", "s"))
        self.note(f"{name}: {phase['s']} s" + (f" ({extra})" if extra else ""))

    def note(self, line: str) -> None:
        print(f"[{self.label}] {line}", file=sys.stderr, flush=True)


def fill_database(engine: Any, fill: Fill, jobs: int, phases: Phases) -> None:
    """A fresh database (migrated to head) filled with ``fill``'s rows: the big tables' secondary indexes (and on
    PostgreSQL their foreign keys) dropped, every row loaded, the counters written, the indexes and keys built
    again from the catalog's own definitions and checked against the migrations', then ANALYZE (PostgreSQL; a
    service's SQLite database has no statistics, so neither has the benchmark's)."""
    deferred = deferred_schema(engine)
    with phases("drop the big tables' secondary indexes" + (" and foreign keys" if any(
            d.kind == "foreign key" for d in deferred) else "")) as ph:
        drop_deferred(engine, deferred)
        ph["dropped"] = len(deferred)
    with phases("rows: repositories") as ph:
        ph["rows"] = bulk_insert(engine, "repositories", Fill.REPO_COLUMNS, fill.repositories())
    with phases("rows: jobs, lock events, race events") as ph:
        ph.update(insert_history(engine, fill, jobs, fill.start, fill.now - fill.start, pending_tail=True,
                                  progress=phases.note))
    with phases("rows: counters (record_totals, record_daily)") as ph:
        ph["rows"] = _write_aggregates(engine, fill)
    for d in deferred:
        with phases(f"{d.kind} {d.name} on {d.table}"):
            build_deferred(engine, d)
    with phases("check: indexes and keys equal the migrations'") as ph:
        check_schema(engine, deferred)
        ph["checked"] = len(deferred)
    with phases("sequences, ANALYZE" if engine.dialect.name == "postgresql" else "sequences"):
        fix_sequences(engine)


def fix_sequences(engine: Any) -> None:
    """COPY with explicit ids leaves PostgreSQL's sequences at 1: move them past the rows."""
    if engine.dialect.name != "postgresql":
        return
    from sqlalchemy import text

    with engine.begin() as c:
        for table in ("repositories", "jobs", "lock_events", "race_events"):
            c.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                           f"COALESCE((SELECT max(id) FROM {table}), 1))"))
        c.execute(text("ANALYZE"))


def insert_history(engine: Any, fill: Fill, jobs: int, start: datetime, span: timedelta, *, pending_tail: bool,
                    chunk: int = 100_000, progress: Callable[[str], None] | None = None) -> dict[str, int]:
    """The history in chunks of ``chunk`` jobs (a 10M-row fill never holds more than one chunk in memory); the
    rows written per table. ``progress``: a line about every tenth of the jobs."""
    n = {"jobs": 0, "lock_events": 0, "race_events": 0}
    t0 = time.perf_counter()
    step = max(chunk, (jobs // 10 + chunk - 1) // chunk * chunk)
    for lo in range(0, jobs, chunk):
        job_rows, lock_rows, race_rows = fill.history(jobs, start, span, pending_tail, lo, min(jobs, lo + chunk))
        n["jobs"] += bulk_insert(engine, "jobs", Fill.JOB_COLUMNS, job_rows)
        n["lock_events"] += bulk_insert(engine, "lock_events", Fill.LOCK_COLUMNS, lock_rows)
        n["race_events"] += bulk_insert(engine, "race_events", Fill.RACE_COLUMNS, race_rows)
        if progress is not None and (lo + chunk) % step == 0 and lo + chunk < jobs:
            progress(f"  {n['jobs']:,} of {jobs:,} jobs in {time.perf_counter() - t0:.0f} s")
    return n


def _write_aggregates(engine: Any, fill: Fill) -> int:
    from packyard.workers.records.models import COUNTED_COLUMNS

    totals, daily = fill.aggregate_rows()
    return (bulk_insert(engine, "record_totals", ("family", "kind", "state", *COUNTED_COLUMNS), totals)
            + bulk_insert(engine, "record_daily", ("day", "family", "kind", "state", *COUNTED_COLUMNS), daily))
