"""PackyardTask: the base class of every packyard task (see the contract in workers/tasks/__init__.py)."""
from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, NoReturn, TypeVar

import redis
from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.signals import worker_init, worker_process_init
from kombu.exceptions import OperationalError
from sqlalchemy.exc import SQLAlchemyError

from packyard.store import owner
from packyard.store.errors import InvalidInputError, LockContendedError, LockLostError, StoreError
from packyard.workers import logs as plog
from packyard.workers.confine import InputKind
from packyard.workers.records import task_runs as recording
from packyard.workers.records.recorder import DeliveryVerdict
from packyard.workers.settings import get_settings
from packyard.workers.tasks import boundary

T = TypeVar("T")

# Errors that say "try again later", not "this input is bad". LockContendedError: a claim file
# (<ref>.lock, packyard/fence.lock) is held by a live writer -- a moment's contention, unlike a
# compare-and-swap that found the ref moved (RefUpdateError, a failure).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (LockLostError, LockContendedError, redis.ConnectionError,
                                                     redis.TimeoutError, OperationalError)
# What a lost broker connection looks like from a task (redis-py directly, or through kombu/Celery).
BROKER_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OperationalError)

log = plog.get_logger("packyard.jobs")

_in_worker = False


@worker_init.connect
@worker_process_init.connect
def _note_worker_process(**_: Any) -> None:
    """This process runs tasks for a worker (its main process, or a prefork child)."""
    global _in_worker
    _in_worker = True


def in_worker_process() -> bool:
    """Does this process run tasks for a ``celery worker``? (a direct call of a task is refused there)."""
    return _in_worker


class AlreadyFinished(Ignore):
    """A delivery of a job whose row already has its outcome: acknowledged without running (no new result)."""


class SkippedJob(Exception):
    """The job decided not to run (a scheduled maintenance job found the lease taken): it succeeds with
    ``result`` (``counters.skipped == 1``, the holder named) instead of doing the work."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("reason", "skipped"))
        self.result = result


#: ``on_busy`` for maintenance jobs: explicit requests wait for the lease, scheduled runs skip.
ON_BUSY = ("wait", "skip")


class PackyardTask(Task):
    """Records the job row, binds log context, reports progress and maps errors to fail/retry.

    Storage tasks acknowledge late and are re-queued if the worker process dies,
    so a SIGKILLed worker's job runs again elsewhere (the store code is crash-safe).

    Exactly-once outcomes: every delivery is counted on the job row (``attempts``); a delivery
    of a job that already has its outcome (SUCCESS/FAILURE) is acknowledged without running,
    checked when it starts and again once it holds the repository lease (a second delivery can
    start while the first still runs, and wait for the lease behind it).
    """

    abstract = True
    Request = "packyard.workers.tasks.boundary:BoundedRequest"   # a message cannot raise the time limits
    #: Input arguments confined to PACKYARD_INCOMING_DIR (``@app.task(..., inputs={"pack": InputKind.FILE})``).
    inputs: dict[str, InputKind] = {}
    #: Arguments a message may not set to values that endanger readers (``unsafe=boundary.PRESERVATION``).
    unsafe: dict[str, Any] = {}
    acks_late = True
    reject_on_worker_lost = True
    # No STARTED state in the result backend: Celery writes it before the task body runs, so a
    # redelivery of a finished job would overwrite its stored result before the delivery check
    # below can acknowledge it untouched. The job row and the task-started event say STARTED.
    track_started = False
    throws = (StoreError,)      # expected failures: logged by Celery without a traceback
    progress_interval = 0.5     # seconds between PROGRESS updates within one phase
    retry_backoff_base = 2.0    # seconds; doubled per retry
    retry_backoff_cap = 300.0

    _progress_phase: str | None = None
    _progress_at: float = 0.0
    _progress_dropped: int = 0
    #: While a recorded delivery runs, the lease of a block that ended normally is held until the
    #: outcome is on the job row (:meth:`_released_after_outcome`).
    _defer_release: bool = False
    _pending_release: ExitStack | None = None

    @property
    def max_retries(self) -> int:  # type: ignore[override]
        return get_settings().task_max_retries

    @property
    def soft_time_limit(self) -> float:  # type: ignore[override]
        """PACKYARD_TIME_LIMITS for this kind: past it the job fails (LimitExceededError naming the limit)."""
        return get_settings().time_limit_for(self.name)[0]

    @property
    def time_limit(self) -> float:  # type: ignore[override]
        """PACKYARD_TIME_LIMITS for this kind: past it the job's process is killed (see on_failure)."""
        return get_settings().time_limit_for(self.name)[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        req = self.request
        if req.id is None or req.is_eager:
            if in_worker_process():
                # Inside a worker only a delivery of the task's own message runs it: a call from another
                # task's body (Celery's celery.starmap / map / chunks call task(*args)), or a message whose
                # headers claim is_eager, would skip the boundary and the job row.
                err = InvalidInputError(
                    f"{self.name} was called inside a worker process without a delivery of its own message "
                    "(from another task, e.g. a Celery built-in such as celery.starmap, or with an is_eager "
                    "header); packyard tasks run only through their own, recorded and confined, message")
                if req.id is not None:
                    recording.job_refused(req.id, self.name, args, kwargs, req.hostname, err)
                raise err
            return self.run(*args, **kwargs)  # a direct call outside any worker (tests, in-process): no job row
        self._progress_phase, self._progress_at, self._progress_dropped = None, 0.0, 0
        # Every claim file the store creates during the job (ref locks, fence lock, ...) names it.
        with owner.bind_job(req.id):
            self._defer_release, self._pending_release = True, None
            try:
                return self._run_recorded(req, args, kwargs)
            finally:
                # Only now, with the outcome (or the retry) on the job row, is the last lease released.
                self._defer_release = False
                self._release_pending()
                plog.clear_job()

    def _run_recorded(self, req: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            delivery = recording.job_started(req.id, self.name, args, kwargs, req.hostname)
        except SQLAlchemyError as err:  # records unavailable: do not touch the repository unrecorded
            log.error("job.record_failed", step="started", error=str(err))
            self.retry_later(err)
        if delivery.verdict is DeliveryVerdict.ALREADY_FINISHED:
            log.warning("job.duplicate_delivery", state=delivery.state.value, attempts=delivery.attempts,
                        when="delivered")
            raise AlreadyFinished(f"job {req.id} already {delivery.state.value}; delivery {delivery.attempts} "
                                  "acknowledged without running")
        started = time.monotonic()
        try:
            try:
                # Arguments checked, repo confined to the storage roots, inputs to the incoming dir.
                with boundary.prepared(self, args, kwargs) as (run_args, run_kwargs):
                    # Only now, confined, is the repository registered (a refused path never is).
                    recording.job_admitted(req.id, recording.repo_from_call(run_args, run_kwargs))
                    result = self.run(*run_args, **run_kwargs)
            except SkippedJob as skipped:   # decided not to run: a success that did nothing, saying why
                result = skipped.result
            except TRANSIENT_ERRORS as err:  # also outside self.call (a lease check in the task body)
                self.retry_later(err)
        except AlreadyFinished:
            raise  # a duplicate found out under the lease: the first delivery's outcome stands
        except Retry as r:
            recording.job_retrying(req.id, self.name, args, kwargs, str(r.exc or r.message or r))
            raise
        except Reject as r:
            # Only retry_later rejects: the retry could not be published (broker unreachable). The
            # message is requeued, or stays unacknowledged in the broker for the reconciler.
            recording.job_retrying(req.id, self.name, args, kwargs, f"redelivered when the broker is back: {r.reason}")
            raise
        except Exception as exc:
            error = boundary.as_job_error(self, exc)   # e.g. the soft time limit, named
            recording.job_finished(req.id, self.name, args, kwargs, started, exc=error)
            if error is not exc:
                raise error from exc
            raise
        else:
            # The work is done: a records outage must not turn a finished job into a failed one
            # (job_finished retries the row write and never raises a database error).
            recording.job_finished(req.id, self.name, args, kwargs, started, result=result)
            return result

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Past the hard time limit Celery kills the job's process and calls this in the worker's main
        process: record the FAILURE the job could not record, and release the leases it held."""
        from celery.exceptions import TimeLimitExceeded

        if not isinstance(exc, TimeLimitExceeded):
            return
        error = boundary.hard_limit_error(self)
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        started = time.monotonic() - self.time_limit
        recording.job_finished(task_id, self.name, args, kwargs, started, exc=error)
        repo = recording.repo_from_call(args, kwargs)
        if repo is not None:
            from packyard.workers.locks import redis_client, release_held_by

            try:
                release_held_by(redis_client(get_settings()), repo, task_id)
            except redis.RedisError as err:  # the lease then expires after its TTL
                log.warning("job.lease_release_failed", error=str(err))

    # -- what a task body uses -------------------------------------------------------------------

    def progress(self, phase: str, done: int, total: int | None = None) -> None:
        """Report progress as a PROGRESS state {phase, done, total} (Flower/dashboards), at a modest rate.

        Best effort: a report the result backend cannot take (broker restarting) is dropped; the
        job itself decides at its next lease check whether it can go on.
        """
        now = time.monotonic()
        finished = total is not None and done >= total
        if phase == self._progress_phase and not finished and now - self._progress_at < self.progress_interval:
            return
        self._progress_phase, self._progress_at = phase, now
        if self.request.id is not None and not self.request.is_eager:
            try:
                self.update_state(state="PROGRESS", meta={"phase": phase, "done": done, "total": total})
            except BROKER_ERRORS as err:
                self._progress_dropped += 1
                if self._progress_dropped == 1:   # once per job: an outage drops every report
                    log.warning("job.progress_dropped", phase=phase, done=done, error=str(err))

    def bind_log(self, **values: Any) -> None:
        """Add context (beyond job_id/task/repo, which are bound already) to every log line of this job."""
        plog.bind_job(**values)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one command function with ``progress=self.progress``; map its errors.

        StoreError subclasses fail the job (bad input does not get better by retrying); lost
        leases, contended claim files and broker connection errors are retried with exponential
        backoff (:meth:`retry_later`).
        """
        try:
            return fn(*args, progress=self.progress, **kwargs)
        except TRANSIENT_ERRORS as err:
            self.retry_later(err)

    def retry_later(self, exc: BaseException, countdown: float | None = None) -> NoReturn:
        """Retry the job after ``countdown`` (default: exponential backoff); raises, never returns.

        Publishing the retry needs the broker. Celery tries for a few seconds and then rejects
        the message *without* requeueing it, so a job that hit a Redis restart used to end as
        FAILURE ("Error 111 connecting to …redis.sock") and vanish. Here a failed publish waits
        for the broker to answer again (up to ``PACKYARD_BROKER_OUTAGE_WAIT`` seconds) and is
        tried again; if the broker stays away, the message is rejected *with* requeue: put back
        at once if the broker answers by then, else left unacknowledged in the broker, where the
        reconciler finds it. After PACKYARD_TASK_MAX_RETRIES retries, ``exc`` itself is raised.
        """
        settings = get_settings()
        deadline = time.monotonic() + settings.broker_outage_wait
        delay = self.backoff() if countdown is None else countdown
        while True:
            try:
                raise self.retry(exc=exc, countdown=delay)
            except Reject as rejected:   # Celery's "the retry message could not be published"
                if time.monotonic() >= deadline or not wait_for_broker(settings, deadline):
                    log.error("job.retry_unpublished", error=str(rejected.reason), cause=str(exc))
                    raise Reject(rejected.reason, requeue=True) from exc
                log.warning("job.retry_republishing", error=str(rejected.reason))

    def record_race(self, kind: str, repo: str | None = None, **detail: Any) -> None:
        """Record a race this job observed (pack vanished under a lookup, ref moved under a CAS, …)."""
        from packyard.workers.records.recorder import record_race_event

        record_race_event(get_settings(), repo=repo, job_id=self.request.id, kind=kind, detail=detail or None)
        plog.get_logger("packyard.races").warning("race.observed", kind=kind, **detail)

    def backoff(self) -> float:
        return min(self.retry_backoff_cap, self.retry_backoff_base * (2 ** self.request.retries))

    def abort_if_finished(self) -> None:
        """Raise AlreadyFinished if another delivery of this job recorded its outcome meanwhile.

        Called once the repository lease is held: a second delivery that started while the first
        still ran waited for the lease behind it, and must not run the job again.
        """
        from packyard.workers.records.recorder import job_state

        req = self.request
        if req.id is None or req.is_eager:
            return
        try:
            state = job_state(get_settings(), req.id)
        except SQLAlchemyError as err:   # records unreachable: do not run a job that may be finished
            log.error("job.record_failed", step="duplicate-check", error=str(err))
            self.retry_later(err)
        if state is not None and state.finished:
            log.warning("job.duplicate_delivery", state=state.value, when="under the lease")
            raise AlreadyFinished(f"job {req.id} already {state.value} (another delivery finished it)")

    @contextmanager
    def repo_lock(self, repo: str, ttl: float | None = None, wait: float = 30.0,
                  auto_renew: bool = True, kind: Any = None) -> Iterator[Any]:
        """The repository lease for this job (fencing token in ``lease.token``; events recorded).

        Renewed every ttl/3 in the background while the block runs; ``lease.check()`` still
        raises LockLostError if a renewal failed (stall, Redis restart). A repository that
        stays locked for ``wait`` seconds, or a lease service that cannot be reached, retries
        the job later instead of failing it. Once held, a job that another delivery finished
        meanwhile stops here (:meth:`abort_if_finished`).
        ``kind=LeaseKind.MAINTENANCE``: the repository's maintenance lease (repack, gc) instead.
        """
        from packyard.workers.locks import LeaseKind, LockTimeout, acquire, db_event_recorder, hold, redis_client

        self._release_pending()   # a finished earlier block's lease goes before the next is taken
        settings = get_settings()
        try:
            lease = acquire(redis_client(settings), repo, ttl=ttl or settings.lock_ttl, job_id=self.request.id,
                            on_event=db_event_recorder(settings), wait=wait, kind=kind or LeaseKind.REPO)
        except (LockTimeout, redis.ConnectionError, redis.TimeoutError, OperationalError) as err:  # BROKER_ERRORS
            self.retry_later(err)
        stack = ExitStack()
        stack.enter_context(hold(lease, auto_renew=auto_renew))
        with self._released_after_outcome(stack):
            self.bind_log(fencing_token=lease.token)
            self.abort_if_finished()
            yield lease


    @contextmanager
    def maintenance_lock(self, repo: str, ttl: float | None = None, wait: float | None = None,
                         on_busy: str = "wait") -> Iterator[Any]:
        """The repository's maintenance lease (repack, prune, gc; never taken by ingestion), renewed in the
        background: one maintenance job per repository at a time.

        ``on_busy="wait"`` (explicit requests): wait up to ``wait`` seconds (default
        PACKYARD_MAINTENANCE_WAIT) for a holder to finish; the wait is on the acquired event and the
        job row (``lease=waited``); past it the job is retried later (``lease=busy``).
        ``on_busy="skip"`` (scheduled runs): one attempt; if the lease is taken the job succeeds at
        once as skipped (a ``skipped`` event naming the holder, ``lease=skipped``, counters skipped=1).

        Once held, its token is recorded in the store's maintenance fence (:func:`claim_fence`), so a
        previous holder that stalled past its lease is refused before any deletion, and the block runs.
        A LockLostError out of the block (a failed check, a refused fence) is recorded as an
        ``aborted`` event and ``lease=lost`` before the job is retried. The policy itself (acquire, renew,
        fence, abort) is :func:`packyard.workers.locks.maintenance_lease`, the one the CLI's ``--lock`` uses.
        """
        from packyard.workers.locks import (
            LockTimeout,
            MaintenanceBusy,
            db_event_recorder,
            maintenance_lease,
            redis_client,
        )
        from packyard.workers.records.models import LeaseOutcome, LockEventKind

        if on_busy not in ON_BUSY:
            raise InvalidInputError(f"on_busy must be one of {', '.join(ON_BUSY)}, not {on_busy!r}")
        self._release_pending()   # a finished earlier block's lease goes before the next is taken
        settings = get_settings()
        on_event = db_event_recorder(settings)
        client = redis_client(settings)

        def held(lease: Any) -> None:
            if lease.waited_ms:
                self._note_lease(LeaseOutcome.WAITED, lease.waited_ms)
            if lease.took_over is not None:
                self._note_lease(LeaseOutcome.TOOK_OVER)
            self.bind_log(fencing_token=lease.token, lease_waited_ms=lease.waited_ms)
            self.abort_if_finished()

        def lost(cause: LockLostError) -> None:
            self._note_lease(LeaseOutcome.LOST)
            log.warning("lease.aborted", lock_event=LockEventKind.ABORTED.value, reason=str(cause))

        stack = ExitStack()
        try:   # the one policy (workers/locks.py); what is the task's own: retries, notes, skipped runs
            lease = stack.enter_context(maintenance_lease(settings, repo, wait, self.request.id, ttl=ttl,
                                                          skip_if_busy=on_busy == "skip", client=client,
                                                          on_event=on_event, on_held=held, on_lost=lost))
        except MaintenanceBusy:
            self._skip_busy(client, repo, on_event)
        except LockTimeout as err:
            self._note_lease(LeaseOutcome.BUSY)
            self.retry_later(err)
        except BROKER_ERRORS as err:
            self.retry_later(err)
        with self._released_after_outcome(stack):
            yield lease

    @contextmanager
    def pool_lock(self, pool: str, member: str | None = None, *, refs: bool = False, ingest: bool = False,
                  wait: float | None = None) -> Iterator[Any]:
        """The leases of a pool job, in the one order :func:`packyard.workers.locks.pool_lease_order` states (the
        pool's first, then the member's), as one joint lease (``check()`` checks each; ``token`` is the last's).
        Each maintenance lease's token goes into its repository's fence as it is taken. A lease that stays
        taken past ``wait`` (default PACKYARD_MAINTENANCE_WAIT) retries the job later, as do broker errors;
        once all are held, a job another delivery finished meanwhile stops."""
        from packyard.workers.locks import LockTimeout, db_event_recorder, pool_leases, redis_client
        from packyard.workers.records.models import LeaseOutcome

        self._release_pending()   # a finished earlier block's lease goes before the next is taken
        settings = get_settings()

        def held(lease: Any) -> None:
            if lease.waited_ms:
                self._note_lease(LeaseOutcome.WAITED, lease.waited_ms)

        stack = ExitStack()
        try:
            joint = stack.enter_context(pool_leases(settings, pool, member, refs=refs, ingest=ingest, wait=wait,
                                                    job_id=self.request.id, client=redis_client(settings),
                                                    on_event=db_event_recorder(settings), on_held=held))
        except LockTimeout as err:
            self._note_lease(LeaseOutcome.BUSY)
            self.retry_later(err)
        except BROKER_ERRORS as err:
            self.retry_later(err)
        with self._released_after_outcome(stack):
            self.bind_log(fencing_token=joint.token)
            self.abort_if_finished()
            yield joint

    @contextmanager
    def _released_after_outcome(self, stack: ExitStack) -> Iterator[None]:
        """Run a lease block; a block that fails releases its leases at once (their context managers see
        the error), one that ends normally keeps them until the job's outcome is recorded.

        Why: a second delivery of the job waits for the lease and then checks the job row
        (:meth:`abort_if_finished`); released before the row says SUCCESS, the lease would let that
        delivery run the job a second time. A later lease block in the same job releases it first, so a
        task that takes leases one after another never holds two it did not ask for together."""
        try:
            yield
        except BaseException:
            with stack:
                raise
        if self._defer_release:
            self._release_pending()
            self._pending_release = stack
        else:
            stack.close()

    def _release_pending(self) -> None:
        pending, self._pending_release = self._pending_release, None
        if pending is not None:
            pending.close()

    def _skip_busy(self, client: Any, repo: str, on_event: Any) -> NoReturn:
        """Record a scheduled job that found the maintenance lease taken, and end it as skipped."""
        from packyard.workers.locks import LeaseKind, LockEvent, holder_detail, lock_name_for
        from packyard.workers.records.models import LeaseOutcome, LockEventKind

        name = lock_name_for(repo)
        holder = holder_detail(client, repo, LeaseKind.MAINTENANCE)
        on_event(LockEvent(name, LeaseKind.MAINTENANCE.key_prefix + name, self.request.id, LockEventKind.SKIPPED,
                           None, None, holder))
        self._note_lease(LeaseOutcome.SKIPPED)
        by = f"job {holder['holder_job']}" if holder and holder.get("holder_job") else "another job"
        reason = f"the maintenance lease of {name} is held by {by}: a scheduled run does not wait"
        log.info("job.skipped", reason=reason, holder=holder)
        raise SkippedJob({"repo": name, "skipped": True, "reason": reason, "holder": holder,
                          "counters": {"skipped": 1}})

    def _note_lease(self, outcome: Any, wait_ms: int | None = None) -> None:
        """Put the lease outcome on the job row (best effort: an audit field, never a reason to fail)."""
        req = self.request
        if req.id is None or req.is_eager:
            return
        from packyard.workers.records.recorder import record_lease

        try:
            record_lease(get_settings(), req.id, outcome, wait_ms)
        except SQLAlchemyError as err:
            log.warning("job.lease_record_failed", lease=getattr(outcome, "value", outcome), error=str(err))


def wait_for_broker(settings: Any, deadline: float, interval: float = 1.0) -> bool:
    """Ping the broker every ``interval`` seconds until it answers (True) or ``deadline`` passes (False)."""
    from packyard.workers.locks import redis_client

    client = redis_client(settings)
    try:
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return True
            except BROKER_ERRORS:
                pass
            time.sleep(interval)
        return False
    finally:
        client.close()
