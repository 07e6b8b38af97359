"""Every query the service runs is served by an index: the statements are captured as the real code runs them
(status, status --repo, races, the reconciler, the janitor's job lookups, the planner, recording -- also of jobs
the reconciler marked LOST --, prune, a scrape), then the database explains each one; a full scan of a table
that grows with the fleet or its history fails the test.

* SQLite: ``EXPLAIN QUERY PLAN``; a ``SCAN <table>`` fails, unless the statement has a LIMIT and the plan
  needs no temporary B-tree to order it (then the scan stops after LIMIT rows, e.g. ``status``'s newest 20);
  so does a LIMIT that needs such a B-tree (every row the search found is read and sorted first).
* PostgreSQL (PACKYARD_TEST_POSTGRES_URL): ``EXPLAIN (FORMAT JSON)`` with ``enable_seqscan``,
  ``enable_hashjoin`` and ``enable_mergejoin`` off, so the planner takes an index (and joins by index
  lookups) whenever one can serve -- on a small test table it would otherwise prefer a scan; a ``Seq Scan``
  of such a table fails, and so does an index scan without an index condition (a whole index read) that no
  Limit node stops.

Two passes read every repository by design and are named below with their reason: the janitor visits every
registered repository, and a scrape's distributions count every enabled one (the fleet, never the history).
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import event

from recordsutil import finished_job

LARGE = ("jobs", "lock_events", "race_events", "repositories")
#: (phase, table) pairs allowed to read the whole table, and why.
WHOLE_TABLE_BY_DESIGN = {
    ("janitor: every registered repository", "repositories"): "the janitor visits each repository once per run",
    ("scrape", "repositories"): "distributions and counts over every enabled repository: O(fleet), not O(history)",
}


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


class Captured:
    def __init__(self) -> None:
        self.phase = ""
        self.statements: list[tuple[str, str, object]] = []


@contextmanager
def capturing(url):
    from packyard.workers.records import get_engine

    engine = get_engine(url)
    cap = Captured()

    def before(conn, cursor, statement, parameters, context, executemany):
        head = statement.lstrip().split(None, 1)[0].upper()
        if head in ("SELECT", "UPDATE", "DELETE") and not executemany:
            cap.statements.append((cap.phase, statement, parameters))

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield cap
    finally:
        event.remove(engine, "before_cursor_execute", before)


@contextmanager
def tracing_jobrows(cap):
    """Capture the statements ``status`` runs through its own driver (records/jobrows.py, no SQLAlchemy), as
    the engine listener captures the ORM's; yields the list of those statements, to show they ran."""
    from packyard.workers.records import jobrows

    real = jobrows._connect
    seen: list[str] = []

    class Cursor:
        def __init__(self, cur):
            self._cur = cur

        def execute(self, statement, parameters=()):
            cap.statements.append((cap.phase, statement, tuple(parameters)))
            seen.append(statement)
            return self._cur.execute(statement, parameters)

        def __getattr__(self, name):
            return getattr(self._cur, name)

    class Conn:
        def __init__(self, conn):
            self._conn = conn

        def cursor(self):
            return Cursor(self._conn.cursor())

        def __getattr__(self, name):
            return getattr(self._conn, name)

    def connect(url):
        found = real(url)
        return None if found is None else (Conn(found[0]), *found[1:])

    jobrows._connect = connect
    try:
        yield seen
    finally:
        jobrows._connect = real


def sqlite_full_scans(dbapi_conn, statement, parameters) -> list[str]:
    cur = dbapi_conn.cursor()
    rows = cur.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
    details = [r[3] for r in rows]
    ordered_by_index = not any("TEMP B-TREE FOR ORDER BY" in d for d in details)
    limited = re.search(r"\bLIMIT\b", statement, re.I) is not None
    bad = []
    for d in details:
        m = re.match(r"SCAN (\w+)", d)
        if m and m.group(1) in LARGE and not (limited and ordered_by_index):
            bad.append(d)
    # A LIMIT the plan must sort for reads every row its search finds first (a top N by a column no index
    # orders: all enabled repositories).
    # (A search of a unique key finds a row per value: sorting those is cheap.)
    searched = [re.match(r"SEARCH (\w+)", d) for d in details
                if "sqlite_autoindex" not in d and "PRIMARY KEY" not in d]
    if limited and not ordered_by_index and any(m and m.group(1) in LARGE for m in searched):
        bad.append("a LIMIT after sorting: " + "; ".join(details))
    return bad


def postgres_full_scans(dbapi_conn, statement, parameters) -> list[str]:
    cur = dbapi_conn.cursor()
    off = ("enable_seqscan", "enable_hashjoin", "enable_mergejoin")
    for name in off:
        cur.execute(f"SET {name} = off")
    try:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
        (plan,) = cur.fetchone()
    finally:
        for name in off:
            cur.execute(f"RESET {name}")
    bad: list[str] = []

    def walk(node, under_limit):
        table = node.get("Relation Name")
        kind = node["Node Type"]
        if table in LARGE:
            if kind == "Seq Scan":
                bad.append(f"Seq Scan on {table}")
            elif kind in ("Index Scan", "Index Only Scan") and "Index Cond" not in node and not under_limit:
                bad.append(f"{kind} of all of {node.get('Index Name')} on {table}")
        for child in node.get("Plans", []):
            walk(child, under_limit or kind == "Limit")

    walk(plan[0]["Plan"], False)
    return bad


def run_the_service(url, cap, redis_client):
    """Each phase runs the real code paths against the database (a small fleet's rows)."""
    from packyard.workers.app import app
    from packyard.workers.cli import races, status
    from packyard.workers.commands.janitor import JobOracle, repositories_in_roots
    from packyard.workers.commands.plan_maintenance import prune_finished_slots
    from packyard.workers.metrics import make_registry
    from packyard.workers.reconcile import reconcile
    from packyard.workers.records import JobState, registry, utcnow
    from packyard.workers.records.models import LeaseOutcome, LockEventKind
    from packyard.workers.records.recorder import (
        job_state,
        record_finished,
        record_lease,
        record_lock_event,
        record_queued,
        record_race_event,
        record_retry,
        record_started,
    )
    from packyard.workers.records.registry import annotate_job
    from packyard.workers.records.retention import prune
    from packyard.workers.settings import Settings
    from packyard.workers.slots import FleetSlots

    settings = replace(Settings.from_env(), database_url=url)
    repo = "/srv/idx/r0.git"
    for i in range(6):
        finished_job(url, f"seed-{i}", "packyard.index_pack", f"/srv/idx/r{i % 3}.git", days_ago=i * 10)
    record_race_event(url, repo=repo, job_id="seed-0", kind="lost", detail={"oid": "x"})

    cap.phase = "recording"
    record_queued(url, task_id="t1", kind="packyard.repack", repo=repo, params={"mode": "full"})
    record_started(url, task_id="t1", kind="packyard.repack", repo=repo, params=None, hostname="w", pid=1)
    record_retry(url, task_id="t1", kind="packyard.repack", repo=repo, reason="test")
    record_started(url, task_id="t1", kind="packyard.repack", repo=repo, params=None, hostname="w", pid=1)
    record_lease(url, "t1", LeaseOutcome.WAITED, 10)
    record_lock_event(url, repo=repo, job_id="t1", lock_name=f"packyard:lock:maint:{repo}",
                      event=LockEventKind.ACQUIRED, token=1)
    record_race_event(url, repo=repo, job_id="t1", kind="relisted")
    annotate_job(url, "t1", plan={"action": "full"})
    record_finished(url, task_id="t1", kind="packyard.repack", repo=repo, state=JobState.SUCCESS,
                    counters={"packs_merged": 2, "packs_written": 1}, error=None, error_type=None)
    record_queued(url, task_id="t2", kind="packyard.index_pack", repo=repo)

    cap.phase = "status"
    with tracing_jobrows(cap) as direct:     # status reads its rows through the driver, not the ORM
        status.fetch(settings, None, 20)
        status.fetch(settings, None, 20, task_ids=["t1", "t2"])
    assert len(direct) == 2, "status did not read its rows through records/jobrows.py"
    cap.phase = "status --repo"
    status.fetch(settings, repo, 20)
    registry.get(settings, repo)
    cap.phase = "races"
    since = utcnow() - timedelta(days=1)
    races.fetch(settings, None, since, 20)
    races.fetch(settings, repo, since, 20)
    cap.phase = "reconciler"
    reconcile(settings, app, redis_client, inspect_timeout=0.2, lost_after=0.0)
    reconcile(settings, app, redis_client, inspect_timeout=0.2, lost_after=0.0)   # marks the unseen job LOST
    assert job_state(url, "t2") is JobState.LOST
    cap.phase = "recording: a LOST job redelivered"   # its row leaves LOST: the guarded UPDATEs, the level's upsert
    record_queued(url, task_id="t2", kind="packyard.index_pack", repo=repo)
    assert job_state(url, "t2") is JobState.QUEUED
    record_queued(url, task_id="t3", kind="packyard.index_pack", repo=repo)
    cap.phase = "reconciler"
    reconcile(settings, app, redis_client, inspect_timeout=0.2, lost_after=0.0)
    reconcile(settings, app, redis_client, inspect_timeout=0.2, lost_after=0.0)
    assert job_state(url, "t2") is JobState.LOST and job_state(url, "t3") is JobState.LOST
    cap.phase = "recording: a LOST job redelivered"
    record_started(url, task_id="t2", kind="packyard.index_pack", repo=repo, params=None, hostname="w", pid=1)
    record_retry(url, task_id="t2", kind="packyard.index_pack", repo=repo, reason="test")
    record_finished(url, task_id="t3", kind="packyard.index_pack", repo=repo, state=JobState.FAILURE,
                    counters=None, error="late", error_type="X")
    cap.phase = "janitor: every registered repository"
    repositories_in_roots(settings)
    cap.phase = "janitor"
    oracle = JobOracle(settings, None)
    oracle.verdict("t1")
    oracle.verdict("no-such-job")
    cap.phase = "planner"
    now = time.time()
    registry.register(settings, repo)
    registry.due_for_planning(settings, now - 3600)
    row = registry.get(settings, repo)
    registry.maintenance_in_flight(settings, repo)
    registry.maintenance_in_flight(settings)
    registry.claim_for_planning(settings, row["id"], now - 3600, now)
    registry.count_due(settings, now - 3600)                       # the paged pass (plan_maintenance.sweep)
    registry.due_page(settings, now - 3600, None, 10)
    registry.due_page(settings, now - 3600, registry.DueCursor(None, "/srv"), 10)
    registry.due_page(settings, now - 3600, registry.DueCursor(registry.from_epoch(now - 7200), "/srv"), 10)
    registry.in_flight_of(settings, [row["id"]])
    registry.claim_page(settings, [row["id"]], now - 3600, now)
    registry.record_plans(settings, [(row["id"], {"action": "nothing", "outcome": "nothing"}, now)])
    registry.unclaim(settings, [(row["id"], None)], now)
    registry.record_plan(settings, repo, {"action": "nothing", "outcome": "nothing", "stats": {"packs": 1}}, now)
    slots = FleetSlots(redis_client, 2, 60.0, key=f"packyard:test:slots:{time.monotonic_ns()}")
    slots.try_acquire("t1", now)
    prune_finished_slots(settings, slots)
    cap.phase = "prune"
    prune(settings, batch=2, max_batches=10)
    cap.phase = "scrape"
    from prometheus_client import generate_latest

    generate_latest(make_registry(settings))


def test_every_service_query_is_served_by_an_index(url, redis_client):
    from packyard.workers.records import get_engine

    with capturing(url) as cap:
        run_the_service(url, cap, redis_client)
    phases = {p for p, _s, _a in cap.statements}
    assert {"status", "status --repo", "races", "reconciler", "janitor", "planner", "recording", "prune",
            "scrape"} <= phases, phases
    failures = []
    explained = 0
    with get_engine(url).connect() as conn:
        dbapi = conn.connection.dbapi_connection
        check = postgres_full_scans if url.startswith("postgresql") else sqlite_full_scans
        for phase, statement, parameters in cap.statements:
            if phase == "":
                continue
            bad = check(dbapi, statement, parameters)
            explained += 1
            bad = [b for b in bad if not any((phase, t) in WHOLE_TABLE_BY_DESIGN and t in b for t in LARGE)]
            if bad:
                failures.append(f"[{phase}] {' '.join(statement.split())}\n    -> {bad}")
        conn.rollback()
    assert explained > 40
    assert not failures, "full scans:\n" + "\n".join(failures)


def test_the_check_finds_a_full_scan(url):
    """The checker is not blind: a query on an unindexed column is reported."""
    from packyard.workers.records import get_engine

    with get_engine(url).connect() as conn:
        dbapi = conn.connection.dbapi_connection
        if url.startswith("postgresql"):
            bad = postgres_full_scans(dbapi, "SELECT id FROM jobs WHERE error_type = %s", ("X",))
            ok = postgres_full_scans(dbapi, "SELECT id FROM jobs WHERE task_id = %s", ("X",))
        else:
            bad = sqlite_full_scans(dbapi, "SELECT id FROM jobs WHERE error_type = ?", ("X",))
            ok = sqlite_full_scans(dbapi, "SELECT id FROM jobs WHERE task_id = ?", ("X",))
        conn.rollback()
    assert bad and not ok
