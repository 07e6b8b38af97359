"""PackyardTask: the base class of every packyard task (see the contract in workers/tasks/__init__.py)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import redis
from celery import Task
from celery.exceptions import Retry
from sqlalchemy.exc import SQLAlchemyError

from packyard.store import owner
from packyard.store.errors import LockLostError, StoreError
from packyard.workers import logging as plog
from packyard.workers import recording
from packyard.workers.settings import get_settings

T = TypeVar("T")

# Errors that say "try again later", not "this input is bad".
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (LockLostError, redis.ConnectionError, redis.TimeoutError)


class PackyardTask(Task):
    """Records the job row, binds log context, reports progress and maps errors to fail/retry.

    Storage tasks acknowledge late and are re-queued if the worker process dies,
    so a SIGKILLed worker's job runs again elsewhere (the store code is crash-safe).
    """

    abstract = True
    acks_late = True
    reject_on_worker_lost = True
    track_started = True
    throws = (StoreError,)      # expected failures: logged by Celery without a traceback
    progress_interval = 0.5     # seconds between PROGRESS updates within one phase
    retry_backoff_base = 2.0    # seconds; doubled per retry
    retry_backoff_cap = 300.0

    _progress_phase: str | None = None
    _progress_at: float = 0.0

    @property
    def max_retries(self) -> int:  # type: ignore[override]
        return get_settings().task_max_retries

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        req = self.request
        if req.id is None or req.is_eager:  # a direct call (tests, in-process): no job row
            return self.run(*args, **kwargs)
        self._progress_phase, self._progress_at = None, 0.0
        try:
            started = recording.job_started(req.id, self.name, args, kwargs, req.hostname)
        except SQLAlchemyError as err:  # records unavailable: do not touch the repository unrecorded
            plog.get_logger("packyard.jobs").error("job.record_failed", step="started", error=str(err))
            plog.clear_job()
            raise self.retry(exc=err, countdown=self.backoff()) from err
        owner.set_job(req.id)   # claim files this job creates (.keep, markers, quarantines) name it
        try:
            result = self.run(*args, **kwargs)
        except Retry as r:
            recording.job_retrying(req.id, self.name, args, kwargs, str(r.exc or r.message or r))
            raise
        except Exception as exc:
            recording.job_finished(req.id, self.name, args, kwargs, started, exc=exc)
            raise
        else:
            # The work is done: a records outage must not turn a finished job into a failed one
            # (job_finished retries the row write and never raises a database error).
            recording.job_finished(req.id, self.name, args, kwargs, started, result=result)
            return result
        finally:
            owner.set_job(None)
            plog.clear_job()

    # -- what a task body uses -------------------------------------------------------------------

    def progress(self, phase: str, done: int, total: int | None = None) -> None:
        """Report progress as a PROGRESS state {phase, done, total} (Flower/dashboards), at a modest rate."""
        now = time.monotonic()
        finished = total is not None and done >= total
        if phase == self._progress_phase and not finished and now - self._progress_at < self.progress_interval:
            return
        self._progress_phase, self._progress_at = phase, now
        if self.request.id is not None and not self.request.is_eager:
            self.update_state(state="PROGRESS", meta={"phase": phase, "done": done, "total": total})

    def bind_log(self, **values: Any) -> None:
        """Add context (beyond job_id/task/repo, which are bound already) to every log line of this job."""
        plog.bind_job(**values)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one command function with ``progress=self.progress``; map its errors.

        StoreError subclasses fail the job (bad input does not get better by retrying);
        LockLostError and Redis connection errors are retried with exponential backoff.
        """
        try:
            return fn(*args, progress=self.progress, **kwargs)
        except TRANSIENT_ERRORS as err:
            raise self.retry(exc=err, countdown=self.backoff()) from err
        except StoreError:
            raise

    def record_race(self, kind: str, repo: str | None = None, **detail: Any) -> None:
        """Record a race this job observed (pack vanished under a lookup, ref moved under a CAS, …)."""
        from packyard.workers.records.recorder import record_race_event

        record_race_event(get_settings(), repo=repo, job_id=self.request.id, kind=kind, detail=detail or None)
        plog.get_logger("packyard.races").warning("race.observed", kind=kind, **detail)

    def backoff(self) -> float:
        return min(self.retry_backoff_cap, self.retry_backoff_base * (2 ** self.request.retries))

    @contextmanager
    def repo_lock(self, repo: str, ttl: float | None = None, wait: float = 30.0,
                  auto_renew: bool = True) -> Iterator[Any]:
        """The repository lease for this job (fencing token in ``lease.token``; events recorded).

        Renewed every ttl/3 in the background while the block runs; ``lease.check()`` still
        raises LockLostError if a renewal failed (stall, Redis restart). A repository that
        stays locked for ``wait`` seconds retries the job later instead of failing it.
        """
        from packyard.workers.locks import LockTimeout, acquire, db_event_recorder, hold, redis_client

        settings = get_settings()
        try:
            lease = acquire(redis_client(settings), repo, ttl=ttl or settings.lock_ttl, job_id=self.request.id,
                            on_event=db_event_recorder(settings), wait=wait)
        except LockTimeout as err:
            raise self.retry(exc=err, countdown=self.backoff()) from err
        with hold(lease, auto_renew=auto_renew):
            self.bind_log(fencing_token=lease.token)
            yield lease

    @contextmanager
    def maintenance_lock(self, repo: str, ttl: float | None = None, wait: float = 30.0) -> Iterator[Any]:
        """The repository's maintenance lease (repack, prune, gc; never taken by ingestion), renewed in the
        background. ``lease.token`` is what the store's maintenance fence checks before deletions;
        ``lease.check()`` raises LockLostError if a renewal failed. Held by another job for ``wait``
        seconds: the job is retried later."""
        from packyard.workers.locks import LeaseKind, LockTimeout, acquire, db_event_recorder, hold, redis_client

        settings = get_settings()
        try:
            lease = acquire(redis_client(settings), repo, ttl=ttl or settings.lock_ttl, job_id=self.request.id,
                            on_event=db_event_recorder(settings), wait=wait, kind=LeaseKind.MAINTENANCE)
        except LockTimeout as err:
            raise self.retry(exc=err, countdown=self.backoff()) from err
        with hold(lease, auto_renew=True):
            self.bind_log(maintenance_token=lease.token)
            yield lease
