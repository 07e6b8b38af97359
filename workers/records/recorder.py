"""Writing job, lock and race rows. Called from one place per event (workers/recording.py, workers/locks.py).

Every function opens its own short transaction, so a worker never holds a
database transaction open while it works on a repository.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packyard.workers.records import registry
from packyard.workers.records.db import session_scope
from packyard.workers.records.models import Job, JobState, LockEvent, LockEventKind, RaceEvent, Repository, utcnow
from packyard.workers.settings import Settings


def normalize_repo_path(path: str | Path) -> str:
    return str(Path(path).expanduser().resolve())


def repository_id(session: Session, path: str | Path | None) -> int | None:
    """The id of the repository row for ``path``, creating it if needed (safe against concurrent creators)."""
    if path is None:
        return None
    norm = normalize_repo_path(path)
    found = session.scalar(select(Repository.id).where(Repository.path == norm))
    if found is not None:
        return found
    try:
        with session.begin_nested():
            repo = Repository(path=norm, created_at=utcnow())
            session.add(repo)
            session.flush()
            return repo.id
    except IntegrityError:  # another process created it between our select and insert
        return session.scalar(select(Repository.id).where(Repository.path == norm))


def _job(session: Session, task_id: str, kind: str, repo: str | None) -> Job:
    job = session.scalar(select(Job).where(Job.task_id == task_id))
    if job is None:
        job = Job(task_id=task_id, kind=kind, repo_id=repository_id(session, repo), state=JobState.QUEUED,
                  retries=0)
        session.add(job)
    return job


def record_queued(settings: Settings | str, *, task_id: str, kind: str, repo: str | None,
                  params: dict[str, Any] | None = None) -> None:
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        job.queued_at = job.queued_at or utcnow()
        job.params = params
        if job.started_at is None:
            job.state = JobState.QUEUED


def record_started(settings: Settings | str, *, task_id: str, kind: str, repo: str | None,
                   params: dict[str, Any] | None, hostname: str | None, pid: int) -> datetime:
    now = utcnow()
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        if job.params is None:
            job.params = params
        job.state = JobState.STARTED
        job.started_at = now
        job.finished_at = None
        job.worker_hostname = hostname
        job.worker_pid = pid
    return now


def record_retry(settings: Settings | str, *, task_id: str, kind: str, repo: str | None, reason: str) -> None:
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        job.state = JobState.RETRY
        job.retries = (job.retries or 0) + 1
        job.error = reason


def record_finished(settings: Settings | str, *, task_id: str, kind: str, repo: str | None, state: JobState,
                    counters: dict[str, Any] | None, error: str | None, error_type: str | None,
                    on_ingest_counted: Callable[[int], None] | None = None) -> Job:
    """Finish the job row and move the repository registry's counters (registry.count_landed).

    ``on_ingest_counted(n)`` is called after the commit when the job was a successful ingest
    and the repository has now seen ``n`` ingests since its last repack.
    """
    now = utcnow()
    ingests: int | None = None
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        counted_before = job.state is JobState.SUCCESS  # a redelivered job's second finish counts once
        job.state = state
        job.finished_at = now
        started = job.started_at
        if started is not None:
            if started.tzinfo is None:  # SQLite hands back naive datetimes
                started = started.replace(tzinfo=now.tzinfo)
            job.duration_ms = int((now - started).total_seconds() * 1000)
        job.counters = counters
        job.error = error
        job.error_type = error_type
        if job.repo_id is not None:
            repo_row = s.get(Repository, job.repo_id)
            if repo_row is not None:
                repo_row.last_job_at = now
                if state is JobState.SUCCESS and kind == "packyard.verify_repo":
                    repo_row.last_verified_at = now
                s.flush()
                if not counted_before:
                    ingests = registry.count_landed(s, repo_row.id, kind=kind, state=state, params=job.params,
                                                    now=now)
        s.flush()
        s.expunge(job)
    if ingests is not None and on_ingest_counted is not None:
        on_ingest_counted(ingests)
    return job


def record_lock_event(settings: Settings | str, *, repo: str | None, job_id: str | None, lock_name: str,
                      event: LockEventKind, token: int | None) -> None:
    with session_scope(settings) as s:
        s.add(LockEvent(repo_id=repository_id(s, repo), job_id=job_id, lock_name=lock_name, event=event,
                        fencing_token=token, at=utcnow()))


def record_race_event(settings: Settings | str, *, repo: str | None, job_id: str | None, kind: str,
                      detail: dict[str, Any] | None = None) -> None:
    """A race a worker observed (later issues: pack vanished under a lookup, ref moved under a CAS, …)."""
    with session_scope(settings) as s:
        s.add(RaceEvent(repo_id=repository_id(s, repo), job_id=job_id, kind=kind, detail=detail,
                        observed_at=utcnow()))
