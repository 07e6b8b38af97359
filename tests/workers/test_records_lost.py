"""The LOST jobs as a level (issue 21): ``record_totals``' ``(level, kind, LOST)`` rows equal
``SELECT kind, count(*) FROM jobs WHERE state = 'LOST' GROUP BY kind`` after every write that marks a job
LOST, overwrites a LOST row or prunes one, and the exporter serves the LOST figure from the level without
reading a LOST row.

Real SQLite and PostgreSQL (PACKYARD_TEST_POSTGRES_URL; skipped without it). Two tests make a concurrent
write happen at a chosen point of a finish: another connection writes and commits from the engine's
``before_cursor_execute`` hook, just before the finish's statement is sent.
"""
from __future__ import annotations

import random
import re

import pytest
from sqlalchemy import event, select, text, update

from recordsutil import age, scrape, settings_for

A, B, C = "packyard.index_pack", "packyard.repack", "packyard.verify_repo"


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


def level(url) -> dict[str, int]:
    """The LOST level per kind (rows at 0 left out: a kind whose LOST rows are all gone)."""
    from packyard.workers.records import session_scope

    with session_scope(url) as s:
        got = s.execute(text("SELECT kind, events FROM record_totals WHERE family = 'level' AND state = 'LOST'"))
        return {k: int(n) for k, n in got if n}


def lost_rows(url) -> dict[str, int]:
    from packyard.workers.records import session_scope

    with session_scope(url) as s:
        return {k: int(n) for k, n in s.execute(text("SELECT kind, count(*) FROM jobs WHERE state = 'LOST' "
                                                     "GROUP BY kind"))}


def marks(url) -> dict[str, int]:
    """Jobs marked LOST, per kind, summed over record_daily's days (events: they never go down)."""
    from packyard.workers.records import session_scope

    with session_scope(url) as s:
        return {k: int(n) for k, n in s.execute(text(
            "SELECT kind, sum(events) FROM record_daily WHERE family = 'job' AND state = 'LOST' GROUP BY kind"))}


def check(url) -> dict[str, int]:
    got, want = level(url), lost_rows(url)
    assert got == want, f"LOST level {got} != LOST rows {want}"
    return got


def job_id(url, tid):
    from packyard.workers.records import Job, session_scope

    with session_scope(url) as s:
        return s.scalar(select(Job.id).where(Job.task_id == tid))


def mark(url, tid) -> bool:
    """The reconciler's two passes: unseen, then LOST (only a pending row is marked)."""
    from packyard.workers.records import Job, session_scope, utcnow
    from packyard.workers.records.recorder import mark_unseen, record_lost

    jid = job_id(url, tid)
    mark_unseen(url, jid, utcnow())
    with session_scope(url) as s:
        unseen = s.scalar(select(Job.unseen_since).where(Job.id == jid))
    return unseen is not None and record_lost(url, jid, unseen, "test: no queue holds its message")


def queue(url, tid, kind=A):
    from packyard.workers.records.recorder import record_queued

    record_queued(url, task_id=tid, kind=kind, repo=None)


def start(url, tid, kind=A):
    from packyard.workers.records.recorder import record_started

    return record_started(url, task_id=tid, kind=kind, repo=None, params=None, hostname="w", pid=1)


def finish(url, tid, kind=A, ok=True):
    from packyard.workers.records import JobState
    from packyard.workers.records.recorder import record_finished

    return record_finished(url, task_id=tid, kind=kind, repo=None, state=JobState.SUCCESS if ok else JobState.FAILURE,
                           counters={}, error=None if ok else "boom", error_type=None if ok else "StoreError")


def retry(url, tid, kind=A):
    from packyard.workers.records.recorder import record_retry

    record_retry(url, task_id=tid, kind=kind, repo=None, reason="test")


def state(url, tid):
    from packyard.workers.records.recorder import job_state

    s = job_state(url, tid)
    return None if s is None else s.value


def test_the_level_follows_every_write_that_enters_or_leaves_lost(url):
    from packyard.workers.records import Job, session_scope, utcnow
    from packyard.workers.records.recorder import mark_unseen, record_lost
    from packyard.workers.records.retention import prune

    for tid, kind in (("a1", A), ("a2", A), ("a3", A), ("b1", B), ("b2", B)):
        queue(url, tid, kind)
    start(url, "a3")
    for tid in ("a1", "a2", "a3", "b1", "b2"):
        assert mark(url, tid)
    assert check(url) == {A: 3, B: 2} == marks(url)

    # A second mark of a row already LOST: it is not pending, nothing is written or counted.
    jid = job_id(url, "a1")
    with session_scope(url) as s:
        unseen = s.scalar(select(Job.unseen_since).where(Job.id == jid))
    assert not record_lost(url, jid, unseen, "again")
    assert not mark_unseen(url, jid, utcnow())
    assert check(url) == {A: 3, B: 2} == marks(url)

    start(url, "a1")                         # a redelivered LOST job starts
    assert state(url, "a1") == "STARTED" and check(url) == {A: 2, B: 2}
    finish(url, "a2")                        # a LOST job finishes (its first outcome)
    assert state(url, "a2") == "SUCCESS" and check(url) == {A: 1, B: 2}
    finish(url, "a3", ok=False)              # a LOST job that had started fails
    assert state(url, "a3") == "FAILURE" and check(url) == {B: 2}
    queue(url, "b1", B)                      # a LOST job's message published again
    assert state(url, "b1") == "QUEUED" and check(url) == {B: 1}
    retry(url, "b2", B)                      # a LOST job's retry recorded
    assert state(url, "b2") == "RETRY" and check(url) == {}
    assert mark(url, "b2") and mark(url, "a1")   # marked again: two more marks
    assert check(url) == {A: 1, B: 1}
    assert marks(url) == {A: 4, B: 3}

    # Prune deletes old LOST rows (not the newest of its kind): the level goes down in the same batch.
    for n in range(5):
        queue(url, f"c{n}", C)
        assert mark(url, f"c{n}")
        age(url, f"c{n}", 40 + n)
    queue(url, "c-new", C)
    assert mark(url, "c-new")
    assert check(url) == {A: 1, B: 1, C: 6}
    report = prune(settings_for(url), batch=2, max_batches=100)
    assert report.jobs_removed == 5
    assert check(url) == {A: 1, B: 1, C: 1}
    assert marks(url) == {A: 4, B: 3, C: 6}   # events: the days' marks stay


def test_a_finish_whose_row_turns_lost_after_it_read_the_row(url):
    """The fast path: the finish read (SQLite) or expected (PostgreSQL) an open row; the reconciler marks it LOST
    just before the finish's UPDATE: the guard for an open row misses, the one for a LOST row writes it."""

    queue(url, "f1")
    start(url, "f1")
    injected: list[str] = []
    finish_updates: list[str] = []

    def before(_conn, _cursor, statement, *_a):
        if re.match(r"\s*UPDATE jobs SET state=", statement):
            finish_updates.append(statement)
        if not injected and finish_updates:
            injected.append(statement)
            assert mark(url, "f1")   # another connection, committed before the finish's UPDATE runs

    job = _finish_while(url, "f1", before)
    assert injected and job.state.value == "SUCCESS"
    # the open row's guard missed (the row was LOST by then), the LOST row's guard wrote it (+ the mark's own)
    assert len(finish_updates) == 3, finish_updates
    assert state(url, "f1") == "SUCCESS" and check(url) == {} and marks(url) == {A: 1}


def _finish_while(url, task_id, before):
    """``finish(url, task_id)`` with ``before`` seeing every statement the engine sends (to inject a race)."""
    from packyard.workers.records import get_engine

    engine = get_engine(url)
    event.listen(engine, "before_cursor_execute", before)
    try:
        return finish(url, task_id)
    finally:
        event.remove(engine, "before_cursor_execute", before)


def test_a_finish_on_its_general_path_overwrites_a_row_that_turned_lost(url):
    """The general path: the finish finds no row; before it reads the row again, another process records the
    job queued and the reconciler marks it LOST; the general path's write then takes it out of LOST."""

    injected: list[str] = []

    def before(_conn, _cursor, statement, *_a):
        # the general path's read of the whole row (select(Job)); the fast path reads no such row
        if not injected and re.match(r"\s*SELECT jobs\.id, jobs\.task_id, jobs\.kind", statement):
            injected.append(statement)
            queue(url, "g1")
            assert mark(url, "g1")

    job = _finish_while(url, "g1", before)
    assert injected and job.state.value == "SUCCESS"
    assert state(url, "g1") == "SUCCESS" and check(url) == {} and marks(url) == {A: 1}


def test_a_random_walk_of_writes_keeps_the_level_equal_to_the_rows(url):
    from packyard.workers.records.retention import prune

    rng = random.Random(21)
    tids = [f"w{i}" for i in range(8)]
    kind_of = {t: (A, B)[i % 2] for i, t in enumerate(tids)}
    ops = ("queue", "start", "retry", "finish", "mark", "mark", "age", "prune")
    for _ in range(70):
        op, t = rng.choice(ops), rng.choice(tids)
        k = kind_of[t]
        if op == "queue":
            queue(url, t, k)
        elif op == "start":
            start(url, t, k)
        elif op == "retry":
            retry(url, t, k)
        elif op == "finish":
            finish(url, t, k, ok=rng.random() < 0.7)
        elif op == "mark":
            if job_id(url, t) is not None:
                mark(url, t)
        elif op == "age":
            age(url, t, 45)
        else:
            prune(settings_for(url), batch=3, max_batches=10)
        check(url)


def test_the_migration_seeds_the_level_from_the_rows_and_the_downgrade_removes_it(url):
    from packyard.workers.records import Job, JobState, downgrade_database, session_scope, upgrade_database

    for tid, kind in (("m1", A), ("m2", A), ("m3", B)):
        queue(url, tid, kind)
        assert mark(url, tid)
    age(url, "m1", 3)
    queue(url, "m4", B)
    before = check(url)
    downgrade_database(url, "0006")
    with session_scope(url) as s:
        assert s.execute(text("SELECT count(*) FROM record_totals WHERE family = 'level'")).scalar() == 0
        assert s.execute(text("SELECT count(*) FROM record_daily WHERE state = 'LOST'")).scalar() == 0
        # 0006's code marks a job LOST without a level: the upgrade counts it from its row
        s.execute(update(Job).where(Job.task_id == "m4").values(state=JobState.LOST, finished_at=Job.queued_at))
    upgrade_database(url)
    assert check(url) == {A: 2, B: 2} and before == {A: 2, B: 1}
    assert marks(url) == {A: 2, B: 2}
    with session_scope(url) as s:   # the aged mark counts in the day its row says
        days = s.execute(text("SELECT count(DISTINCT day) FROM record_daily WHERE state = 'LOST'")).scalar()
    assert days == 2


# -- the scrape ----------------------------------------------------------------------------------------------

def _jobs_reads_sqlite(dbapi, statement, parameters) -> list[str]:
    """What SQLite's plan reads of ``jobs``: each must be a search of the (state, kind) index by state."""
    rows = dbapi.cursor().execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
    bad = []
    for detail in (r[3] for r in rows):
        if re.search(r"\bjobs\b", detail) and not re.match(r"SEARCH jobs USING (COVERING )?INDEX ix_jobs_state_kind "
                                                           r"\(state=\?", detail):
            bad.append(detail)
    return bad


def _jobs_rows_read_postgres(dbapi, statement, parameters) -> int:
    """The job rows PostgreSQL's executor read for the statement (EXPLAIN ANALYZE: rows returned by each scan of
    ``jobs`` and the rows it removed by a filter), sequential scans off as in test_records_indexes (a test's
    tables are too small for the planner to prefer an index it would take at scale)."""
    cur = dbapi.cursor()
    cur.execute("SET enable_seqscan = off")
    try:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        (plan,) = cur.fetchone()
    finally:
        cur.execute("RESET enable_seqscan")
    read = 0

    def walk(node):
        nonlocal read
        if node.get("Relation Name") == "jobs":
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                     + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return read


def test_the_scrape_serves_the_lost_level_and_reads_no_lost_row(url):
    from prometheus_client import generate_latest

    from packyard.workers.metrics import make_registry
    from packyard.workers.records import get_engine, session_scope

    for n in range(30):
        kind = (A, B, C)[n % 3] if n < 12 else A
        queue(url, f"l{n}", kind)
        assert mark(url, f"l{n}")
    queue(url, "p1", A)                          # pending rows: the scrape counts these from their rows
    queue(url, "p2", B)
    start(url, "p2", B)
    assert check(url) == {A: 22, B: 4, C: 4}
    got = scrape(url)
    for kind, n in lost_rows(url).items():
        assert got[("packyard_jobs", (("kind", kind), ("state", "LOST")))] == n
    assert got[("packyard_jobs", (("kind", A), ("state", "QUEUED")))] == 1
    assert got[("packyard_jobs", (("kind", B), ("state", "STARTED")))] == 1

    engine = get_engine(url)
    sent: list[tuple[str, object]] = []

    def before(_conn, _cursor, statement, parameters, *_a):
        sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", before)
    try:
        generate_latest(make_registry(settings_for(url)))
    finally:
        event.remove(engine, "before_cursor_execute", before)
    on_jobs = [(st, p) for st, p in sent if re.search(r"\bFROM jobs\b", st)]
    assert len(on_jobs) == 2, on_jobs    # the pending rows by kind and state, the maintenance jobs in flight
    for st, p in on_jobs:
        assert "LOST" not in repr(p), (st, p)
    with engine.connect() as conn:
        dbapi = conn.connection.dbapi_connection
        for st, p in on_jobs:
            if url.startswith("postgresql"):
                assert _jobs_rows_read_postgres(dbapi, st, p) <= 2, st   # the two pending rows at most
            else:
                assert not _jobs_reads_sqlite(dbapi, st, p), st
        conn.rollback()

    # The figure is the level's, not the rows': rows deleted behind the recorder's back do not change it.
    with session_scope(url) as s:
        s.execute(text("DELETE FROM jobs WHERE state = 'LOST'"))
    assert scrape(url)[("packyard_jobs", (("kind", A), ("state", "LOST")))] == 22
    assert ("packyard_jobs", (("kind", A), ("state", "QUEUED"))) in scrape(url)
