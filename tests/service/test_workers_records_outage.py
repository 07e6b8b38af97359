"""The records database goes away around a job: real PostgreSQL refusing and dropping connections.

* at the start: the job is retried later and touches nothing while it cannot be recorded;
* at the end: the finished job's row is written once the database is back (within the retry
  window), the lease is released only after it, and the outcome is in the worker's log either way.

PostgreSQL only (``ALTER DATABASE ... ALLOW_CONNECTIONS false`` plus terminating every
session is an outage the pool cannot hide); skipped without PACKYARD_TEST_POSTGRES_URL.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from gitutil import git, make_worktree_repo, snapshot_tree


class Outage:
    """Make one database unreachable (new connections refused, open ones killed) and bring it back."""

    def __init__(self, url: str) -> None:
        u = make_url(url)
        self.name = u.database
        self.admin = create_engine(u.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def begin(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                      {"n": self.name})

    def end(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))

    def close(self) -> None:
        self.end()
        self.admin.dispose()


@pytest.fixture
def pg_worker(tmp_path, postgres_url, redis_server, settings, pk, monkeypatch):
    from packyard.workers.records import upgrade_database

    upgrade_database(postgres_url)
    monkeypatch.setenv("PACKYARD_DATABASE_URL", postgres_url)
    pg_settings = dataclasses.replace(settings, database_url=postgres_url)
    queue = f"outage-{os.getpid()}"
    worker = pk.WorkerProcess(pg_settings, f"outage-{os.getpid()}@%h", tmp_path / "outage-worker.log",
                              queues=(queue,))
    outage = Outage(postgres_url)
    try:
        worker.wait_ready()
        yield worker, queue, outage, postgres_url
    finally:
        outage.close()
        worker.stop()


def _job(url: str, task_id: str) -> Any:
    from packyard.workers.records import Job, session_scope

    with session_scope(url) as s:
        return s.scalar(select(Job).where(Job.task_id == task_id))


def _events(worker: Any, name: str) -> list[dict[str, Any]]:
    return [line for line in worker.log_lines() if line.get("event") == name]


def test_outage_at_start_retries_the_job_and_touches_nothing(store_root, incoming, pg_worker, celery_app, pk):
    worker, queue, outage, url = pg_worker
    repo = make_worktree_repo(store_root / "r")
    src = incoming / "src"
    src.mkdir()
    (src / "hello.txt").write_text("written once the records are back\n")
    before = snapshot_tree(repo)
    outage.begin()
    res = celery_app.send_task("packyard.import_tree", queue=queue,
                               kwargs={"repo": str(repo), "ref": "refs/heads/imported", "source": str(src)})
    pk.wait_until(lambda: any(e.get("step") == "started" for e in _events(worker, "job.record_failed")), 60,
                  what="the worker to fail recording the start")
    pk.wait_until(lambda: res.state == "RETRY", 30, what="the job to be retried")
    assert snapshot_tree(repo) == before, "nothing may be written while the job cannot be recorded"
    outage.end()
    value = res.get(timeout=120)
    job = _job(url, res.id)
    assert job.state.value == "SUCCESS" and job.counters["files"] == 1, job
    assert value["counters"]["objects_written"] == job.counters["objects_written"]
    assert git("cat-file", "-p", "refs/heads/imported:hello.txt", git_dir=repo) == \
        b"written once the records are back\n"
    git("fsck", "--full", "--no-dangling", git_dir=repo)


def test_outage_at_finish_is_recorded_when_the_database_returns(store_root, pg_worker, celery_app, pk):
    worker, queue, outage, url = pg_worker
    repo = make_worktree_repo(store_root / "r")
    res = celery_app.send_task("packyard.test_slow", queue=queue, kwargs={"repo": str(repo), "steps": 15})
    # Running its steps: past every records access of its start (row, lease, duplicate check), so the
    # outage below hits the finish only (an outage at the start retries the job: the test above).
    pk.wait_until(lambda: celery_app.AsyncResult(res.id).state == "PROGRESS", 60, interval=0.05,
                  what="the job to run its steps")
    outage.begin()
    pk.wait_until(lambda: any(e.get("step") == "finished" for e in _events(worker, "job.record_retry")), 60,
                  what="the worker to retry recording the finish")
    outage.end()
    value = res.get(timeout=60)
    assert value == {"counters": {"steps": 15}}
    job = _job(url, res.id)
    assert job.state.value == "SUCCESS" and job.counters == {"steps": 15}, job
    assert job.finished_at is not None
    assert any(e.get("step") == "finished" for e in _events(worker, "job.recorded_after_retry"))
    # The summary line was logged before the row write, whatever the database did.
    finished = [e for e in _events(worker, "job.finished") if e.get("job_id") == res.id]
    assert len(finished) == 1 and finished[0]["state"] == "SUCCESS"
    # The lease is held until the outcome is on the row (a redelivery waiting on it must find SUCCESS
    # and not run the job again), so its release comes after the outage, is recorded, and frees it.
    from packyard.workers.locks import redis_client, try_acquire
    from packyard.workers.records import LockEvent, LockEventKind, session_scope
    from packyard.workers.settings import get_settings

    with session_scope(url) as s:
        released = s.scalars(select(LockEvent).where(LockEvent.job_id == res.id,
                                                     LockEvent.event == LockEventKind.RELEASED)).all()
        assert len(released) == 1, released
        assert released[0].at >= job.finished_at, (released[0].at, job.finished_at)
    again = try_acquire(redis_client(get_settings()), str(repo), 5.0, None, None)
    assert again is not None, "the lease must have been released despite the outage"
    again.release()
