"""packyard bench records: the records database at fleet scale -- every query the service runs, timed.

Fills a fresh database (a throwaway PostgreSQL database when ``--postgres URL`` or
PACKYARD_BENCH_POSTGRES_URL names a server, else a SQLite file) with ``--jobs`` job rows over
``--days`` days across ``--repos`` registered repositories, two lock events per job, one race
event per 50 jobs and the counters the recorder would have kept (bulk inserts: COPY on
PostgreSQL, executemany on SQLite; the rows of ``jobs``, ``lock_events`` and ``race_events`` are
loaded before their secondary indexes, which are then built from the migrated database's own
definitions and checked against the migrations'; each phase is printed to stderr with its time),
then times, each the best of ``--runs``:

* ``status`` (the newest 20 jobs and the reconciler's pending rows), ``status --repo`` (the
  repository's row and its newest 20 jobs), ``races`` (1 day, all and one repository), the
  janitor's job lookup, the planner's queries (the window's due list, and per repository its
  row, the in-flight check, the claim and the recorded plan; the pass over every registered
  repository is that per-repository cost times ``--repos`` plus the due list);
* recording one job (queued, started, finished) and one lock event, per job, in milliseconds;
* one metrics scrape (seconds, and the number of series it printed);
* prune (the rows older than the retention), and the database's size before and after; with
  ``--steady-days D``, D more days of the same load, each followed by a prune, to show the size
  stays bounded.

There is no git side to compare with: the figures are absolute, next to the issue's goals.
"""
from __future__ import annotations

import argparse
import bisect
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from packyard.workers.cli.bench.common import best_of as best

KINDS = (("packyard.index_pack", 40), ("packyard.write_objects", 25), ("packyard.unpack_objects", 10),
         ("packyard.import_tree", 5), ("packyard.plan_maintenance", 10), ("packyard.repack", 5),
         ("packyard.gc", 2), ("packyard.verify_repo", 3))
GOALS = {"status": 0.3, "status --repo": 0.2, "scrape": 0.5, "record started": 0.005, "record finished": 0.005}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("records", help="the records database at fleet scale (queries, recording, scrape)",
                              description="Fill a fresh records database with realistic rows and time every query "
                                          "the service runs, the recording of a job, a metrics scrape and prune.")
    p.add_argument("--jobs", type=int, default=1_000_000, help="job rows (default 1,000,000)")
    p.add_argument("--repos", type=int, default=10_000, help="registered repositories (default 10,000)")
    p.add_argument("--days", type=float, default=40.0,
                   help="the history's span in days (default 40: prune has 10 days to delete)")
    p.add_argument("--postgres", metavar="URL", default=os.environ.get("PACKYARD_BENCH_POSTGRES_URL"),
                   help="a PostgreSQL server to create a throwaway database in (default: "
                        "PACKYARD_BENCH_POSTGRES_URL; none: SQLite)")
    p.add_argument("--runs", type=int, default=5, help="best of N runs per query (default 5)")
    p.add_argument("--sample", type=int, default=200, help="jobs recorded / repositories planned (default 200)")
    p.add_argument("--steady-days", type=int, default=0, metavar="D",
                   help="then D more days of load, each followed by a prune (the size stays bounded)")
    p.add_argument("--compare-jobs", type=int, default=0, metavar="N",
                   help="also fill a second database with N job rows (the same repositories) and time the scrape "
                        "on both in alternating rounds: the same load for both sizes")
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=run, logs=False)


# -- the rows ---------------------------------------------------------------------------------------------

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
        ph.update(_insert_history(engine, fill, jobs, fill.start, fill.now - fill.start, pending_tail=True,
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


def db_size(engine: Any, url: str) -> int:
    from sqlalchemy import text

    if engine.dialect.name == "postgresql":
        with engine.connect() as c:
            return int(c.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)
    path = Path(url.split("///", 1)[1])
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# -- timing ---------------------------------------------------------------------------------------------

def per_call(fn: Callable[[int], object], n: int) -> tuple[float, float, float]:
    """(median, p95, median CPU of this process) seconds of ``fn(i)`` over ``n`` calls (the CPU time is the
    client's share, what a worker pays; on a loaded machine the wall time mostly waits for a core)."""
    times, cpu = [], []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(i)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))], statistics.median(cpu)


def run(args: argparse.Namespace) -> int:
    if args.postgres:
        return _with_postgres(args)
    with tempfile.TemporaryDirectory(prefix="packyard-bench-records-") as tmp:
        return measure(args, f"sqlite:///{Path(tmp) / 'records.db'}",
                       f"sqlite:///{Path(tmp) / 'compare.db'}" if args.compare_jobs else None, Path(tmp))


def _with_postgres(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(args.postgres)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    names = [f"packyard_bench_{uuid.uuid4().hex[:10]}" for _ in range(2 if args.compare_jobs else 1)]
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        for name in names:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    urls = [url.set(database=name).render_as_string(hide_password=False) for name in names]
    try:
        with tempfile.TemporaryDirectory(prefix="packyard-bench-records-") as tmp:
            return measure(args, urls[0], urls[1] if len(urls) > 1 else None, Path(tmp))
    finally:
        from packyard.workers.records.db import dispose_all

        dispose_all()
        with admin.connect() as c:
            for name in names:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _load() -> str:
    """The machine's load average (1, 5, 15 min), as ``uptime`` prints it."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def planner_pass(settings: Any, state: Path, window_start: float) -> dict[str, Any]:
    """The window's real pass (commands/plan_maintenance.sweep, paged) over every registered repository. The
    bench's repositories are not on disk: each one's statistics fail (UNREADABLE, a stat of a missing path),
    and is claimed and recorded like any other, so the time is the pass's database work and its round trips."""
    from sqlalchemy import event

    from packyard.workers.commands.plan_maintenance import sweep
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.records import get_engine
    from packyard.workers.slots import FleetSlots

    statements = commits = 0

    def on_statement(*_a: Any) -> None:
        nonlocal statements
        statements += 1

    def on_commit(*_a: Any) -> None:
        nonlocal commits
        commits += 1

    engine = get_engine(settings.database_url)
    redis = EmbeddedRedis(state / "redis").start()
    try:
        slots = FleetSlots(redis.client(), settings.maintenance_concurrency, 3600.0, key="packyard:bench:slots")
        event.listen(engine, "before_cursor_execute", on_statement)
        event.listen(engine, "commit", on_commit)
        t0, c0 = time.perf_counter(), time.process_time()
        result = sweep(settings=settings, send=lambda *job: None, slots=slots, window_start=window_start,
                       window_end=time.time() + 86400)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_commit)
        redis.stop()
    c = result["counters"]
    return {"s": round(wall, 2), "cpu_s": round(cpu, 2), "due": c["due"], "planned": c["unreadable"],
            "statements": statements, "transactions": commits, "page": settings.planner_page}


def compare_scrapes(args: argparse.Namespace, settings: Any, url: str, fill: Fill, runs: int) -> dict[str, Any]:
    """A second database of ``--compare-jobs`` rows (the same repositories and span), and the scrape timed on
    both in alternating rounds, so both sizes are measured at the same load."""
    from dataclasses import replace as _replace

    from prometheus_client import generate_latest

    from packyard.workers.metrics import make_registry
    from packyard.workers.records import get_engine, upgrade_database

    upgrade_database(url)
    engine = get_engine(url)
    small = Fill(args.compare_jobs, args.repos, args.days, fill.now, args.seed)
    t0 = time.perf_counter()
    fill_database(engine, small, args.compare_jobs, Phases("fill, comparison database"))
    filled = round(time.perf_counter() - t0, 1)
    regs = {"big": make_registry(settings), "small": make_registry(_replace(settings, database_url=url))}
    times: dict[str, list[float]] = {"big": [], "small": []}
    series = {k: sum(1 for line in generate_latest(r).decode().splitlines() if line and not line.startswith("#"))
              for k, r in regs.items()}
    load_before = _load()
    for _ in range(max(3, runs * 2)):
        for k in ("small", "big"):
            t1 = time.perf_counter()
            generate_latest(regs[k])
            times[k].append(time.perf_counter() - t1)
    return {"jobs": {"big": fill.jobs, "small": args.compare_jobs}, "filled_s": filled,
            "scrape_ms": {k: {"best": round(min(v) * 1000, 1), "median": round(statistics.median(v) * 1000, 1)}
                          for k, v in times.items()},
            "series": series, "rounds": len(times["big"]), "load": f"{load_before} -> {_load()}"}


def measure(args: argparse.Namespace, url: str, compare_url: str | None = None, state: Path | None = None) -> int:
    from prometheus_client import generate_latest
    from sqlalchemy import select, text

    from packyard.workers.cli import races, status
    from packyard.workers.metrics import make_registry
    from packyard.workers.records import Job, JobState, get_engine, registry, session_scope, upgrade_database, utcnow
    from packyard.workers.records.models import LockEventKind
    from packyard.workers.records.recorder import (
        PENDING_STATES,
        job_state,
        record_finished,
        record_lock_event,
        record_queued,
        record_started,
    )
    from packyard.workers.records.retention import prune
    from packyard.workers.settings import Settings

    out: dict[str, Any] = {"database": "postgresql" if url.startswith("postgresql") else "sqlite",
                           "jobs": args.jobs, "repos": args.repos, "days": args.days, "load at start": _load()}
    settings = replace(Settings.from_env(), database_url=url)
    upgrade_database(url)
    engine = get_engine(url)
    now = utcnow()
    fill = Fill(args.jobs, args.repos, args.days, now, args.seed)
    t0 = time.perf_counter()
    phases = Phases()
    fill_database(engine, fill, args.jobs, phases)
    out["fill_s"] = round(time.perf_counter() - t0, 1)
    out["fill phases"] = phases.done
    out["size_mb"] = round(db_size(engine, url) / 1e6, 1)
    with session_scope(url) as s:
        some = list(s.execute(select(Job.task_id, Job.repo_id).where(Job.id.in_(
            [1 + (i * 7919) % args.jobs for i in range(20)]))))
    repo = fill.repo_path(int(some[0][1] or 1))
    task = some[0][0]
    runs = args.runs
    t: dict[str, float] = {}

    def pending_rows() -> object:
        with session_scope(url) as s:
            return s.execute(select(Job.id, Job.task_id, Job.kind, Job.unseen_since)
                             .where(Job.state.in_(PENDING_STATES))).all()

    t["status"] = best(lambda: (status.fetch(settings, None, 20), pending_rows()), runs)
    t["status --repo"] = best(lambda: (registry.get(settings, repo), status.fetch(settings, repo, 20)), runs)
    since = now - timedelta(days=1)
    t["races"] = best(lambda: races.fetch(settings, None, since, 20), runs)
    t["races --repo"] = best(lambda: races.fetch(settings, repo, since, 20), runs)
    t["reconciler pending rows"] = best(pending_rows, runs)
    t["janitor job lookup"] = best(lambda: job_state(settings, task), runs)
    window = now.timestamp() - 3600
    t["planner due list (window open 1h)"] = best(lambda: registry.due_for_planning(settings, window), runs)
    t["planner due list (every repository)"] = best(lambda: registry.due_for_planning(settings, now.timestamp()),
                                                    max(1, runs // 2))
    paths = [fill.repo_path(1 + (i * 104729) % args.repos) for i in range(args.sample)]

    def plan_one(i: int) -> None:
        path = paths[i]
        row = registry.get(settings, path)
        registry.maintenance_in_flight(settings, path)
        if row is not None:
            registry.claim_for_planning(settings, row["id"], now.timestamp() + 1, now.timestamp() + 2)
        registry.record_plan(settings, path, {"action": "nothing", "outcome": "nothing", "stats": {"packs": 3}},
                             now.timestamp() + 2)

    med, p95, cpu = per_call(plan_one, len(paths))
    out["planner per repository ms"] = {"median": round(med * 1000, 2), "p95": round(p95 * 1000, 2),
                                        "cpu": round(cpu * 1000, 2)}
    out["planner pass over every repository s (DB)"] = round(
        t["planner due list (every repository)"] + med * args.repos, 2)
    for key in ("queued", "started", "finished", "lock event"):
        out[f"record {key} ms"] = {}
    ids = [f"bench-{uuid.uuid4().hex}" for _ in range(args.sample)]
    for step, fn in (
            ("queued", lambda i: record_queued(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i])),
            ("started", lambda i: record_started(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i],
                                                 params=None, hostname="bench", pid=1)),
            ("finished", lambda i: record_finished(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i],
                                                   state=JobState.SUCCESS, counters={"objects": 1}, error=None,
                                                   error_type=None)),
            ("lock event", lambda i: record_lock_event(url, repo=paths[i], job_id=ids[i],
                                                       lock_name=f"packyard:lock:{paths[i]}",
                                                       event=LockEventKind.ACQUIRED, token=i))):
        med, p95, cpu = per_call(fn, args.sample)
        out[f"record {step} ms"] = {"median": round(med * 1000, 2), "p95": round(p95 * 1000, 2),
                                    "cpu": round(cpu * 1000, 2)}
        if step in ("started", "finished"):
            t[f"record {step}"] = med
    reg = make_registry(settings)
    text_out = generate_latest(reg).decode()
    t["scrape"] = best(lambda: generate_latest(reg), runs)
    out["scrape series"] = sum(1 for line in text_out.splitlines() if line and not line.startswith("#"))
    with session_scope(url) as s:   # the counters add up to the rows (the fill's own check), the LOST level too
        rows = s.execute(text("SELECT count(*) FROM jobs WHERE state IN ('SUCCESS', 'FAILURE')")).scalar()
        counted = s.execute(text("SELECT sum(events) FROM record_totals WHERE family = 'job'")).scalar()
        lost_rows = {k: int(n) for k, n in s.execute(text(
            "SELECT kind, count(*) FROM jobs WHERE state = 'LOST' GROUP BY kind"))}
        lost_level = {k: int(n) for k, n in s.execute(text(
            "SELECT kind, events FROM record_totals WHERE family = 'level' AND state = 'LOST' AND events <> 0"))}
    out["counters equal rows"] = int(rows or 0) == int(counted or 0) and lost_rows == lost_level
    out["timings s"] = {k: round(v, 4) for k, v in t.items()}
    out["goals met"] = {k: t[k] <= v for k, v in GOALS.items() if k in t}
    out["goals met"]["series <= 2000"] = out["scrape series"] <= 2000
    out["load after the queries"] = _load()
    if compare_url is not None:
        out["same-load scrape"] = compare_scrapes(args, settings, compare_url, fill, runs)
    if state is not None:   # after the scrapes: it claims and records a plan on every repository
        out["planner pass (paged sweep)"] = planner_pass(settings, state, now.timestamp() + 3)

    before = db_size(engine, url)
    t0 = time.perf_counter()
    report = prune(settings, now=now)
    out["prune"] = {"s": round(time.perf_counter() - t0, 2), **report.counters(),
                    "size_mb_before": round(before / 1e6, 1)}
    _vacuum(engine)
    out["prune"]["size_mb_after"] = round(db_size(engine, url) / 1e6, 1)
    out["after prune: status s"] = round(best(lambda: (status.fetch(settings, None, 20), pending_rows()), runs), 4)
    out["after prune: scrape s"] = round(best(lambda: generate_latest(reg), runs), 4)
    per_day = int(args.jobs / args.days)
    steady = []
    with session_scope(url) as s:   # the rows recorded above took ids after the fill's
        fill.next_job_id = int(s.execute(text("SELECT max(id) FROM jobs")).scalar() or 0) + 1
        fill.next_lock_id = int(s.execute(text("SELECT max(id) FROM lock_events")).scalar() or 0) + 1
        fill.next_race_id = int(s.execute(text("SELECT max(id) FROM race_events")).scalar() or 0) + 1
    for d in range(1, args.steady_days + 1):
        day0 = now + timedelta(days=d - 1)
        _insert_history(engine, fill, per_day, day0, timedelta(days=1), pending_tail=False)
        t0 = time.perf_counter()
        r = prune(settings, now=day0 + timedelta(days=1))
        _vacuum(engine)
        steady.append({"day": d, "prune_s": round(time.perf_counter() - t0, 2), "jobs_removed": r.jobs_removed,
                       "size_mb": round(db_size(engine, url) / 1e6, 1)})
    if steady:
        out["steady"] = steady
    print(json.dumps(out, default=str) if args.json else render(out))
    return 0


def _insert_history(engine: Any, fill: Fill, jobs: int, start: datetime, span: timedelta, *, pending_tail: bool,
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


def _vacuum(engine: Any) -> None:
    """PostgreSQL: what autovacuum does after a prune (the freed tuples become reusable); SQLite reuses the
    freed pages by itself (the file does not shrink, it stops growing)."""
    if engine.dialect.name != "postgresql":
        return
    from sqlalchemy import text

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE"))


def render(out: dict[str, Any]) -> str:
    buf = io.StringIO()
    buf.write(f"records bench: {out['database']}, {out['jobs']:,} jobs over {out['days']:g} days, "
              f"{out['repos']:,} repositories; filled in {out['fill_s']} s, {out['size_mb']} MB; load "
              f"{out['load at start']} at start, {out['load after the queries']} after the queries\n")
    for ph in out.get("fill phases", []):
        extra = ", ".join(f"{k} {v:,}" for k, v in ph.items() if k not in ("phase", "s"))
        buf.write(f"  fill: {ph['phase']:50} {ph['s']:8.1f} s" + (f"   ({extra})" if extra else "") + "\n")
    for k, v in out["timings s"].items():
        goal = GOALS.get(k)
        buf.write(f"  {k:40} {v * 1000:10.2f} ms" + (f"   (goal {goal * 1000:g} ms)" if goal else "") + "\n")
    for k in ("planner per repository ms", "record queued ms", "record started ms", "record finished ms",
              "record lock event ms"):
        buf.write(f"  {k:40} median {out[k]['median']} p95 {out[k]['p95']} (CPU of this process "
                  f"{out[k]['cpu']})\n")
    buf.write(f"  {'planner pass over every repository':40} {out['planner pass over every repository s (DB)']} s "
              "(database part)\n")
    pp = out.get("planner pass (paged sweep)")
    if pp:
        buf.write(f"  {'planner pass, paged sweep (all unreadable)':40} {pp['s']} s wall, {pp['cpu_s']} s CPU, "
                  f"{pp['planned']:,} of {pp['due']:,} planned in {pp['transactions']:,} transactions / "
                  f"{pp['statements']:,} statements (page {pp['page']})\n")
    buf.write(f"  scrape: {out['scrape series']} series; counters equal rows: {out['counters equal rows']}\n")
    cmp_ = out.get("same-load scrape")
    if cmp_:
        ms = cmp_["scrape_ms"]
        buf.write(f"  same-load scrape, {cmp_['rounds']} alternating rounds (load {cmp_['load']}): "
                  f"{cmp_['jobs']['small']:,} jobs best {ms['small']['best']} / median {ms['small']['median']} ms, "
                  f"{cmp_['jobs']['big']:,} jobs best {ms['big']['best']} / median {ms['big']['median']} ms; "
                  f"series {cmp_['series']['small']} / {cmp_['series']['big']}\n")
    p = out["prune"]
    buf.write(f"  prune: {p['jobs_removed']:,} jobs, {p['lock_events_removed']:,} lock events, "
              f"{p['race_events_removed']:,} race events in {p['s']} s ({p['batches']} batches); size "
              f"{p['size_mb_before']} -> {p['size_mb_after']} MB\n")
    buf.write(f"  after prune: status {out['after prune: status s'] * 1000:.2f} ms, scrape "
              f"{out['after prune: scrape s'] * 1000:.2f} ms\n")
    for d in out.get("steady", []):
        buf.write(f"  steady day {d['day']}: prune {d['prune_s']} s, {d['jobs_removed']:,} jobs removed, "
                  f"{d['size_mb']} MB\n")
    buf.write(f"  goals met: {out['goals met']}\n")
    return buf.getvalue()
