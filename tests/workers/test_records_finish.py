"""Recording a job's finish in few statements (issue 21): the same rows and counters as before, fewer round trips.

Real SQLite and PostgreSQL (PACKYARD_TEST_POSTGRES_URL; skipped without it).
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select, text, update

from packyard.workers.records import Job, JobState, Repository, get_engine, registry, session_scope, upgrade_database
from packyard.workers.records import db as records_db
from packyard.workers.records.recorder import record_finished, record_queued, record_started

REPO = "/srv/finish/r.git"


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    registry.register(records_url, REPO)
    return records_url


def _start(url: str, tid: str, kind: str = "packyard.index_pack") -> None:
    record_queued(url, task_id=tid, kind=kind, repo=REPO)
    record_started(url, task_id=tid, kind=kind, repo=REPO, params=None, hostname="h", pid=1)


def _finish(url: str, tid: str, kind: str = "packyard.index_pack", state: JobState = JobState.SUCCESS,
            seen: list[int] | None = None) -> Job:
    return record_finished(url, task_id=tid, kind=kind, repo=REPO, state=state, counters={"objects": 1},
                           error=None if state is JobState.SUCCESS else "boom",
                           error_type=None if state is JobState.SUCCESS else "StoreError",
                           on_ingest_counted=None if seen is None else seen.append)


def _statements(url: str) -> tuple[list[str], list[int]]:
    """The SQL statements sent through the engine and the commits, recorded from now on."""
    sent: list[str] = []
    commits: list[int] = []
    engine = get_engine(url)
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, *_a: sent.append(sql.split()[0].upper()))
    event.listen(engine, "commit", lambda _c: commits.append(1))
    return sent, commits


def test_a_finish_is_one_transaction_of_few_statements(url):
    _start(url, "t-warm")
    _finish(url, "t-warm")
    _start(url, "t-1")
    sent, commits = _statements(url)
    _finish(url, "t-1")
    if url.startswith("postgresql"):
        # the job row's UPDATE ... RETURNING, the repository's UPDATE, the counters' one upsert (WITH ... INSERT)
        assert sent == ["UPDATE", "UPDATE", "WITH"], sent
    else:
        # the start time read (SQLite's day arithmetic is not Python's), then the same with two upserts
        assert sent == ["SELECT", "UPDATE", "UPDATE", "INSERT", "INSERT"], sent
    assert len(commits) == 1


def test_a_start_is_one_statement_and_fills_in_only_missing_params(url):
    """The start's UPDATE returns what the delivery needs (no second read). Params: a queued row's are kept;
    a row without any gets the start's; a row linked to no repository keeps the repository it named."""
    _start(url, "t-warm")
    record_queued(url, task_id="t-kept", kind="packyard.repack", repo=REPO, params={"mode": "full"})
    record_queued(url, task_id="t-none", kind="packyard.repack", repo=REPO)
    sent, commits = _statements(url)
    d = record_started(url, task_id="t-kept", kind="packyard.repack", repo=REPO, params={"mode": "loose"},
                       hostname="h", pid=1)
    assert sent == ["UPDATE"] and len(commits) == 1, sent
    assert (d.verdict.value, d.attempts, d.state) == ("run", 1, JobState.STARTED)
    d = record_started(url, task_id="t-kept", kind="packyard.repack", repo=REPO, params=None, hostname="h", pid=2)
    assert d.attempts == 2
    record_started(url, task_id="t-none", kind="packyard.repack", repo=REPO, params={"mode": "geometric"},
                   hostname="h", pid=1)
    record_started(url, task_id="t-unlinked", kind="packyard.repack", repo="/srv/elsewhere/x.git",
                   params={"mode": "full"}, hostname="h", pid=1)   # no queued row: created by the start
    record_queued(url, task_id="t-q-unlinked", kind="packyard.repack", repo="/srv/elsewhere/y.git")
    record_started(url, task_id="t-q-unlinked", kind="packyard.repack", repo="/srv/elsewhere/y.git",
                   params={"mode": "loose"}, hostname="h", pid=1)
    with session_scope(url) as s:
        got = dict(s.execute(select(Job.task_id, Job.params)).all())
    assert got["t-kept"] == {"mode": "full"}
    assert got["t-none"] == {"mode": "geometric"}
    assert got["t-unlinked"] == {"mode": "full", "repo": "/srv/elsewhere/x.git"}
    assert got["t-q-unlinked"] == {"repo": "/srv/elsewhere/y.git"}   # queued with the repository it named


def test_durations_are_python_s_arithmetic_on_the_recorded_times(url):
    """The server computes the duration on PostgreSQL: it must equal int((finished - started) seconds * 1000),
    the Python the recorder used (float rounding included), for awkward fractions of a millisecond."""
    offsets_us = [0, 1, 999, 1000, 1001, 4_350_000, 290_000, 123_456_789, 86_400_000_001, 3_599_999_999]
    for i, us in enumerate(offsets_us):
        tid = f"t-d{i}"
        _start(url, tid)
        with session_scope(url) as s:   # set in Python: SQLite's arithmetic on its timestamp text is not a time
            started = s.scalar(select(Job.started_at).where(Job.task_id == tid))
            s.execute(update(Job).where(Job.task_id == tid).values(started_at=started - timedelta(microseconds=us)))
        job = _finish(url, tid)
        with session_scope(url) as s:
            started, finished, duration = s.execute(
                select(Job.started_at, Job.finished_at, Job.duration_ms).where(Job.task_id == tid)).one()
        assert duration == int((finished - started).total_seconds() * 1000), (us, duration)
        assert job.duration_ms == duration and job.state is JobState.SUCCESS
        assert duration >= us // 1000


def test_the_first_outcome_stands_and_is_counted_once(url):
    seen: list[int] = []
    for i in range(3):
        _start(url, f"t-i{i}")
        _finish(url, f"t-i{i}", seen=seen)
    assert seen == [1, 2, 3]                       # each ingest sees its own count
    again = _finish(url, "t-i0", state=JobState.FAILURE, seen=seen)   # a duplicate run's later outcome
    assert again.state is JobState.SUCCESS and again.error is None
    assert seen == [1, 2, 3]
    with session_scope(url) as s:
        row = s.execute(select(Repository.ingests_since_repack, Repository.last_job_at)
                        .where(Repository.path == REPO)).one()
        events = s.execute(text("SELECT sum(events) FROM record_totals WHERE family = 'job'")).scalar()
        daily = s.execute(text("SELECT sum(events) FROM record_daily WHERE family = 'job'")).scalar()
        finished = s.scalar(select(Job.state).where(Job.task_id == "t-i0"))
    assert row.ingests_since_repack == 3 and row.last_job_at is not None
    assert events == daily == 3
    assert finished is JobState.SUCCESS


def test_a_finish_without_a_recorded_start_creates_the_row(url):
    job = _finish(url, "t-unseen", state=JobState.FAILURE)
    assert job.state is JobState.FAILURE and job.duration_ms is None and job.error_type == "StoreError"
    with session_scope(url) as s:
        row = s.execute(select(Job.state, Job.repo_id, Job.finished_at).where(Job.task_id == "t-unseen")).one()
        events = s.execute(text("SELECT sum(events) FROM record_totals WHERE family = 'job' AND state = 'FAILURE'")
                           ).scalar()
    assert row.state is JobState.FAILURE and row.repo_id is not None and row.finished_at is not None
    assert events == 1


def test_a_repack_and_a_skipped_repack_move_the_registry_as_before(url):
    _start(url, "t-ingest")
    _finish(url, "t-ingest")
    _start(url, "t-skip", "packyard.repack")
    record_finished(url, task_id="t-skip", kind="packyard.repack", repo=REPO, state=JobState.SUCCESS,
                    counters={"skipped": 1}, error=None, error_type=None)
    assert registry.get(url, REPO)["ingests_since_repack"] == 1   # a skipped repack repacked nothing
    record_queued(url, task_id="t-full", kind="packyard.repack", repo=REPO, params={"mode": "full"})
    record_started(url, task_id="t-full", kind="packyard.repack", repo=REPO, params=None, hostname="h", pid=1)
    record_finished(url, task_id="t-full", kind="packyard.repack", repo=REPO, state=JobState.SUCCESS,
                    counters={"packs_written": 1}, error=None, error_type=None)
    row = registry.get(url, REPO)
    assert row["ingests_since_repack"] == 0
    assert row["last_repack_at"] is not None and row["last_full_repack_at"] is not None


def test_an_idle_connection_the_server_closed_is_replaced(postgres_url, monkeypatch):
    """Without pool_pre_ping, a pooled connection idle past PING_AFTER_IDLE_S is pinged at checkout: one the
    server terminated (a restart, an idle timeout) is replaced, and the recording goes through."""
    upgrade_database(postgres_url)
    record_queued(postgres_url, task_id="t-a", kind="packyard.index_pack", repo=None)
    with session_scope(postgres_url) as s:
        pid = s.execute(text("SELECT pg_backend_pid()")).scalar()
    from sqlalchemy import create_engine

    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    admin.dispose()
    monkeypatch.setattr(records_db, "PING_AFTER_IDLE_S", 0.0)
    record_queued(postgres_url, task_id="t-b", kind="packyard.index_pack", repo=None)
    with session_scope(postgres_url) as s:
        assert s.execute(text("SELECT pg_backend_pid()")).scalar() != pid
        assert s.scalar(select(Job.state).where(Job.task_id == "t-b")) is JobState.QUEUED


def test_a_retry_recorded_after_the_next_attempt_finished_still_counts(url):
    """The retry message is published before the retry is recorded: on a busy worker the next attempt
    can run, retry again and finish first (seen in a loaded full-suite run: retries 1 for 2 retries)."""
    from packyard.workers.records.recorder import record_retry

    tid = "retry-late"
    _start(url, tid)
    record_retry(url, task_id=tid, kind="packyard.index_pack", repo=REPO, reason="lease lost on attempt 2")
    _finish(url, tid)
    record_retry(url, task_id=tid, kind="packyard.index_pack", repo=REPO, reason="lease lost on attempt 1")
    with session_scope(url) as s:
        job = s.scalar(select(Job).where(Job.task_id == tid))
        assert job.state is JobState.SUCCESS and job.retries == 2 and job.error is None
