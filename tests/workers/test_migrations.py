"""Alembic migrations: upgrade → downgrade base → upgrade, on SQLite and on PostgreSQL when configured."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

TABLES = {"repositories", "jobs", "lock_events", "race_events", "record_totals", "record_daily", "pools",
          "pool_members"}
HEAD = "0009"



def get_engine_for(url):
    from packyard.workers.records import get_engine

    return get_engine(url)


def _tables(url):
    from packyard.workers.records import get_engine

    with get_engine(url).connect() as c:
        return set(inspect(c).get_table_names())


def _diff(url):
    from packyard.workers.records import Base, get_engine

    with get_engine(url).connect() as c:
        return compare_metadata(MigrationContext.configure(c), Base.metadata)


def _revision(url):
    from packyard.workers.records import get_engine

    with get_engine(url).connect() as c:
        return MigrationContext.configure(c).get_current_revision()


def _roundtrip(url):
    from packyard.workers.records import JobState, downgrade_database, session_scope, upgrade_database
    from packyard.workers.records.models import Job
    from packyard.workers.records.recorder import (
        DeliveryVerdict,
        mark_unseen,
        record_finished,
        record_lost,
        record_queued,
        record_started,
    )

    # 0001 -> 0002 keeps the rows: a job that had started counts one delivery.
    upgrade_database(url, "0001")
    with get_engine_for(url).begin() as c:
        c.execute(text("INSERT INTO jobs (task_id, kind, state, retries, started_at) "
                       "VALUES ('old-1', 'packyard.verify_repo', 'SUCCESS', 0, '2026-01-02 03:04:05')"))
    upgrade_database(url)
    assert TABLES <= _tables(url)
    assert _revision(url) == HEAD
    assert _diff(url) == [], "models and migrations disagree"
    with session_scope(url) as s:
        old = s.scalar(select(Job).where(Job.task_id == "old-1"))
        assert old.attempts == 1 and old.first_started_at is not None and old.last_started_at is not None

    # The schema works for what the recorder does.
    record_queued(url, task_id="t-1", kind="packyard.verify_repo", repo="/srv/r.git", params={"x": 1})
    first = record_started(url, task_id="t-1", kind="packyard.verify_repo", repo="/srv/r.git", params=None,
                           hostname="w@h", pid=42)
    assert first.verdict is DeliveryVerdict.RUN and first.attempts == 1
    record_finished(url, task_id="t-1", kind="packyard.verify_repo", repo="/srv/r.git", state=JobState.SUCCESS,
                    counters={"objects": 3}, error=None, error_type=None)
    again = record_started(url, task_id="t-1", kind="packyard.verify_repo", repo="/srv/r.git", params=None,
                           hostname="w@h", pid=43)
    assert again.verdict is DeliveryVerdict.ALREADY_FINISHED and again.attempts == 2
    with session_scope(url) as s:
        job = s.scalar(select(Job).where(Job.task_id == "t-1"))
        assert job.state is JobState.SUCCESS and job.counters == {"objects": 3} and job.duration_ms >= 0
        assert job.attempts == 2 and job.worker_pid == 42 and job.last_started_at >= job.first_started_at

    # LOST is stored (no DDL for a new state); a downgrade turns it into a FAILURE the old code can read.
    record_queued(url, task_id="t-2", kind="packyard.nope", repo=None)
    with session_scope(url) as s:
        t2 = s.scalar(select(Job).where(Job.task_id == "t-2"))
    from packyard.workers.records import utcnow

    assert mark_unseen(url, t2.id, utcnow())
    with session_scope(url) as s:
        unseen = s.scalar(select(Job.unseen_since).where(Job.id == t2.id))
    assert record_lost(url, t2.id, unseen, "no worker knows task 'packyard.nope'")
    with session_scope(url) as s:
        assert s.scalar(select(Job.state).where(Job.id == t2.id)) is JobState.LOST
    downgrade_database(url, "0001")
    with get_engine_for(url).connect() as c:
        assert c.execute(text("SELECT state, error FROM jobs WHERE task_id = 't-2'")).one() == (
            "FAILURE", "LOST: no worker knows task 'packyard.nope'")

    downgrade_database(url, "base")
    assert not (TABLES & _tables(url))
    assert _revision(url) is None
    upgrade_database(url)
    assert TABLES <= _tables(url) and _diff(url) == []


def test_sqlite_upgrade_downgrade_upgrade(sqlite_url):
    _roundtrip(sqlite_url)


def test_postgres_upgrade_downgrade_upgrade(postgres_url):
    _roundtrip(postgres_url)


def test_migrate_command(tmp_path, pk):
    import subprocess

    url = f"sqlite:///{tmp_path / 'm.db'}"
    env = pk.cli_env(PACKYARD_DATABASE_URL=url)
    out = subprocess.run(["packyard", "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _revision(url) == HEAD
    out = subprocess.run(["packyard", "migrate", "--downgrade", "base"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert _revision(url) is None and not (TABLES & _tables(url))


def test_registry_migration_keeps_rows_and_links(sqlite_url):
    """0003 on a database with history: existing repositories become enabled with no ingests counted, and
    neither the upgrade nor the downgrade touches the jobs' links to them (no table is recreated)."""
    from sqlalchemy import text

    from packyard.workers.records import downgrade_database, get_engine, upgrade_database

    upgrade_database(sqlite_url, "0001")
    with get_engine(sqlite_url).begin() as c:
        c.execute(text("INSERT INTO repositories (id, path, created_at) VALUES (7, '/srv/old.git', '2026-01-01')"))
        c.execute(text("INSERT INTO jobs (task_id, kind, repo_id, state, retries) "
                       "VALUES ('t-old', 'packyard.index_pack', 7, 'SUCCESS', 0)"))
    upgrade_database(sqlite_url)
    with get_engine(sqlite_url).connect() as c:
        row = c.execute(text("SELECT enabled, ingests_since_repack, last_plan FROM repositories")).one()
        assert row == (1, 0, None)
        assert c.execute(text("SELECT repo_id FROM jobs WHERE task_id = 't-old'")).scalar() == 7
    downgrade_database(sqlite_url, "0001")
    with get_engine(sqlite_url).connect() as c:
        assert c.execute(text("SELECT repo_id FROM jobs WHERE task_id = 't-old'")).scalar() == 7
        assert "enabled" not in {col["name"] for col in inspect(c).get_columns("repositories")}


def test_lease_migration_keeps_old_events_and_drops_the_new_kinds_on_downgrade(sqlite_url):
    """0004 adds the lease columns; a downgrade deletes only the lock events of kinds the older code
    cannot read (taken_over, skipped, aborted, wait_timeout) and keeps the rest."""
    from packyard.workers.records import downgrade_database, get_engine, upgrade_database
    from packyard.workers.records.models import LeaseOutcome, LockEventKind
    from packyard.workers.records.recorder import record_lock_event

    upgrade_database(sqlite_url)
    for kind in (LockEventKind.ACQUIRED, LockEventKind.TAKEN_OVER, LockEventKind.SKIPPED, LockEventKind.RELEASED):
        record_lock_event(sqlite_url, repo="/srv/r.git", job_id="j", lock_name="packyard:lock:maint:/srv/r.git",
                          event=kind, token=3, waited_ms=12, detail={"holder_job": "other"})
    with get_engine(sqlite_url).begin() as c:
        c.execute(text("INSERT INTO jobs (task_id, kind, state, retries, attempts, lease, lease_wait_ms) "
                       f"VALUES ('w', 'packyard.repack', 'SUCCESS', 0, 1, '{LeaseOutcome.WAITED.value}', 250)"))
    with get_engine(sqlite_url).connect() as c:
        assert c.execute(text("SELECT waited_ms FROM lock_events WHERE event = 'acquired'")).scalar() == 12
    downgrade_database(sqlite_url, "0003")
    with get_engine(sqlite_url).connect() as c:
        assert [r[0] for r in c.execute(text("SELECT event FROM lock_events ORDER BY id"))] == ["acquired", "released"]
        assert "lease" not in {col["name"] for col in inspect(c).get_columns("jobs")}
        assert c.execute(text("SELECT state FROM jobs WHERE task_id = 'w'")).scalar() == "SUCCESS"
    upgrade_database(sqlite_url)
    assert _diff(sqlite_url) == []
