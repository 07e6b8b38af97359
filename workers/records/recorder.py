"""Writing job, lock and race rows. Called from one place per event (workers/records/task_runs.py, workers/locks.py).

Every function opens its own short transaction, so a worker never holds a
database transaction open while it works on a repository.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import Double, Integer, Table, bindparam, case, cast, extract, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packyard.workers.records import aggregates, registry
from packyard.workers.records.db import session_scope
from packyard.workers.records.jobrows import REQUESTED_REPO
from packyard.workers.records.models import (
    FINISHED_STATES,
    PENDING_STATES,
    Family,
    Job,
    JobState,
    LeaseOutcome,
    LockEvent,
    LockEventKind,
    RaceEvent,
    Repository,
    normalize_repo_path,
    utcnow,
)
from packyard.workers.settings import Settings


def repository_id(session: Session, path: str | Path | None, *, create: bool = True) -> int | None:
    """The id of the repository row for ``path``, creating it if needed (safe against concurrent creators).

    ``create=False``: only an existing row (None otherwise). Job rows written before a job passed the
    boundary (queued, started, a refusal) use it: a path a message names is not a repository until a
    job on it was confined to the storage roots (:func:`record_admitted` registers it then), so a
    refused ``--repo /etc`` never becomes a registered (planned, scraped) repository.
    """
    if path is None:
        return None
    norm = normalize_repo_path(path)
    found = session.scalar(select(Repository.id).where(Repository.path == norm))
    if found is not None or not create:
        return found
    try:
        with session.begin_nested():
            repo = Repository(path=norm, created_at=utcnow())
            session.add(repo)
            session.flush()
            return repo.id
    except IntegrityError:  # another process created it between our select and insert
        return session.scalar(select(Repository.id).where(Repository.path == norm))


# REQUESTED_REPO (imported above): the params key that keeps the repository a job names while its row is linked
# to none; defined in jobrows, which ``packyard status`` reads without this module's SQLAlchemy imports.


def _requested(params: dict[str, Any] | None, repo: str | None, repo_id: int | None) -> dict[str, Any] | None:
    """``params`` plus the requested repository while the row is linked to no registered repository."""
    if repo is None or repo_id is not None:
        return params
    return {**(params or {}), REQUESTED_REPO: normalize_repo_path(repo)}


def _job(session: Session, task_id: str, kind: str, repo: str | None) -> Job:
    job = session.scalar(select(Job).where(Job.task_id == task_id))
    if job is None:
        job = Job(task_id=task_id, kind=kind, repo_id=repository_id(session, repo, create=False),
                  state=JobState.QUEUED, retries=0)
        session.add(job)
    return job


def record_queued(settings: Settings | str, *, task_id: str, kind: str, repo: str | None,
                  params: dict[str, Any] | None = None) -> None:
    """A message for the job was published. A job that has its outcome is left as it is (a republish)."""
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        if job.state in FINISHED_STATES:
            return
        job.queued_at = job.queued_at or utcnow()
        job.params = _requested(params, repo, job.repo_id)
        job.unseen_since = None
        if job.id is not None and job.state is not JobState.QUEUED and (
                job.started_at is None or job.state is JobState.LOST):
            # Back to QUEUED by a guarded UPDATE, not the ORM's: a LOST row leaving LOST moves the level.
            _write_open(s, _open_pair((_JOB_TABLE.c.id == job.id)
                                      & (_JOB_TABLE.c.started_at.is_(None) | (_JOB_TABLE.c.state == JobState.LOST)),
                                      {"state": JobState.QUEUED}), lost_first=job.state is JobState.LOST)


class DeliveryVerdict(enum.Enum):
    """What a worker does with a delivery of a job's message (a result, not a boolean)."""

    RUN = "run"                            # no outcome yet: the job runs (STARTED)
    ALREADY_FINISHED = "already-finished"  # SUCCESS/FAILURE recorded: acknowledge without running


@dataclass(frozen=True)
class Delivery:
    verdict: DeliveryVerdict
    attempts: int
    state: JobState
    started_at: datetime


def record_started(settings: Settings | str, *, task_id: str, kind: str, repo: str | None,
                   params: dict[str, Any] | None, hostname: str | None, pid: int) -> Delivery:
    """A worker received the job's message: count the delivery, and start the job unless it has an outcome.

    Each statement is one atomic UPDATE (attempts = attempts + 1), so two deliveries counted at
    once by two processes are both counted, and only one of "start" / "already finished" applies.
    """
    now = utcnow()
    for _ in range(2):  # a second round only if another process created the row between our statements
        with session_scope(settings) as s:
            J = _JOB_TABLE
            started, _was_lost = _write_open(s, _start_pair(), {"b_task_id": task_id, "b_now": now,
                                                                "b_hostname": hostname, "b_pid": pid})
            if started is None:
                finished = s.execute(
                    update(Job).where(Job.task_id == task_id, Job.state.in_(FINISHED_STATES))
                    .values(attempts=Job.attempts + 1, last_started_at=now)
                    .execution_options(synchronize_session=False)).rowcount  # type: ignore[attr-defined]  # DML: a CursorResult
                if finished:
                    job = s.scalar(select(Job).where(Job.task_id == task_id))
                    assert job is not None
                    return Delivery(DeliveryVerdict.ALREADY_FINISHED, job.attempts, job.state, now)
                try:
                    with s.begin_nested():
                        rid = repository_id(s, repo, create=False)
                        s.add(Job(task_id=task_id, kind=kind, repo_id=rid, state=JobState.STARTED,
                                  params=_requested(params, repo, rid), retries=0, attempts=1, first_started_at=now,
                                  last_started_at=now, started_at=now, worker_hostname=hostname, worker_pid=pid))
                except IntegrityError:
                    continue
                return Delivery(DeliveryVerdict.RUN, 1, JobState.STARTED, now)
            # The row as written came back with the UPDATE (no second read; the row stays locked by it until the
            # commit); params are filled in only on a row that has none, by one more statement then.
            wanted = _requested(params, repo, started.repo_id) if started.params is None else None
            if wanted is not None:
                s.execute(update(J).where(J.c.id == started.id).values(params=wanted))
            return Delivery(DeliveryVerdict.RUN, started.attempts, JobState.STARTED, now)
    raise RuntimeError(f"job row {task_id} could neither be created nor found")  # pragma: no cover


def record_admitted(settings: Settings | str, *, task_id: str, repo: str) -> None:
    """The job passed the boundary (``repo`` confined to a storage root): register the repository (enabled,
    as every repository a job touches is) and link the job row to it."""
    with session_scope(settings) as s:
        rid = repository_id(s, repo)
        job = s.scalar(select(Job).where(Job.task_id == task_id))
        if job is None or job.repo_id is not None:
            return
        job.repo_id = rid
        if job.params and REQUESTED_REPO in job.params:   # linked now: the row's repository says it
            job.params = {k: v for k, v in job.params.items() if k != REQUESTED_REPO}


def job_state(settings: Settings | str, task_id: str) -> JobState | None:
    """The recorded state of a job (None: no row)."""
    with session_scope(settings) as s:
        return s.scalar(select(Job.state).where(Job.task_id == task_id))


def record_retry(settings: Settings | str, *, task_id: str, kind: str, repo: str | None, reason: str) -> None:
    """The job will run again (a retry message is published). A job with an outcome keeps it, but its
    retry is still counted: the retry message is published before this runs, so on a busy worker the
    next attempt may have run and even finished already. The count is one atomic ``retries + 1``
    (two retries recorded at once both count; a read-modify-write here lost one under load)."""
    with session_scope(settings) as s:
        job = _job(s, task_id, kind, repo)
        s.flush()        # a new row gets its id before the update names it
        s.execute(update(Job).where(Job.id == job.id).values(retries=func.coalesce(Job.retries, 0) + 1)
                  .execution_options(synchronize_session=False))
        if job.state in FINISHED_STATES:
            return
        _write_open(s, _open_pair(_JOB_TABLE.c.id == job.id,
                                  {"state": JobState.RETRY, "error": reason, "unseen_since": None}),
                    lost_first=job.state is JobState.LOST)


def record_finished(settings: Settings | str, *, task_id: str, kind: str, repo: str | None, state: JobState,
                    counters: dict[str, Any] | None, error: str | None, error_type: str | None,
                    on_ingest_counted: Callable[[int], None] | None = None) -> Job:
    """The job's outcome, and the repository registry's counters moved (registry.landed).

    The first outcome recorded stands: a later one (a duplicate run that slipped past the checks)
    is not written, the recorded row is returned, and nothing is counted twice.
    ``on_ingest_counted(n)`` is called after the commit when the job was a successful ingest
    and the repository has now seen ``n`` ingests since its last repack.

    One transaction of three statements on PostgreSQL (the job row's ``UPDATE ... RETURNING`` with
    its duration computed by the server, the repository's one ``UPDATE``, the counters' one upsert
    statement); on SQLite the started time is read first (its duration would be SQLite's float
    day arithmetic otherwise) and the counters are two upserts, in the same one transaction.
    A job the reconciler had marked LOST takes one more statement or two: its row leaves LOST, and the
    LOST level moves by -1 in the same transaction (:func:`_write_open`, on both paths here).
    """
    now = utcnow()
    ingests: int | None = None
    with session_scope(settings) as s:
        row = _finish_row(s, task_id, state, now, counters, error, error_type)
        if row is None:
            recorded = s.scalar(select(Job).where(Job.task_id == task_id))
            if recorded is not None and recorded.state in FINISHED_STATES:
                s.expunge(recorded)
                return recorded
            if recorded is None:   # finished before any start was recorded: the row is created here
                s.add(Job(task_id=task_id, kind=kind, repo_id=repository_id(s, repo, create=False),
                          state=JobState.QUEUED, retries=0))
                s.flush()
            s.expunge_all()
            row = _finish_row(s, task_id, state, now, counters, error, error_type)
            assert row is not None, "the job row exists and has no outcome in this transaction"
        job = Job(**row._mapping)
        if job.repo_id is not None:
            seen: dict[str, Any] = {"last_job_at": now}
            if state is JobState.SUCCESS and kind == "packyard.verify_repo":
                seen["last_verified_at"] = now
            counting = False
            if not (counters or {}).get("skipped"):   # a skipped repack did not repack anything
                moved, counting = registry.landed(kind=kind, state=state, params=job.params, now=now,
                                                  counters=counters)
                seen.update(moved)
            repos = registry.REPOSITORIES
            stmt = update(repos).where(repos.c.id == job.repo_id).values(**seen)   # Core: no ORM bookkeeping
            if counting:
                ingests = s.execute(stmt.returning(repos.c.ingests_since_repack)).scalar_one_or_none()
            else:
                s.execute(stmt)
        # Last, so the shared counter rows stay locked (PostgreSQL) only until the commit that follows.
        aggregates.add(s, Family.JOB, job.kind, state.value, now, duration_ms=job.duration_ms)
    if ingests is not None and on_ingest_counted is not None:
        on_ingest_counted(ingests)
    return job


_JOB_TABLE: Table = Job.__table__  # type: ignore[assignment]  # a declarative class's Table


def _pg_duration_ms(now: Any) -> Any:
    """``int((now - started_at).total_seconds() * 1000)`` computed by PostgreSQL the way Python computes it:
    EXTRACT gives the exact seconds, the cast rounds them to the same double, trunc drops the fraction.
    ``now``: a timestamp-with-time-zone expression (the finish's bound time)."""
    seconds = extract("epoch", now - _JOB_TABLE.c.started_at)
    return cast(func.trunc(cast(seconds, Double()) * 1000), Integer)


def _open_pair(where: Any, values: dict[str, Any], returning: Any = ()) -> tuple[Any, Any]:
    """The two guarded UPDATEs of the job row ``where`` selects (:func:`_write_open`): the row open and not
    LOST, the row LOST. Both return ``returning``'s columns and ``kind``."""
    J = _JOB_TABLE
    cols = list(returning)
    if not any(c is J.c.kind for c in cols):
        cols.append(J.c.kind)
    return (update(J).where(where, J.c.state.not_in((*FINISHED_STATES, JobState.LOST))).values(**values)
            .returning(*cols),
            update(J).where(where, J.c.state == JobState.LOST).values(**values).returning(*cols))


def _b(name: str, column: str) -> Any:
    """A bind parameter named ``b_<name>`` typed as the job column ``column``."""
    return bindparam(f"b_{name}", type_=_JOB_TABLE.c[column].type)


@functools.cache
def _start_pair() -> tuple[Any, Any]:
    """A delivery's start, built once (a job's start and finish are every job's statements: building them per
    call was a third of the recording's CPU): params ``b_task_id``, ``b_now``, ``b_hostname``, ``b_pid``."""
    J, now = _JOB_TABLE, _b("now", "started_at")
    return _open_pair(J.c.task_id == _b("task_id", "task_id"),
                      {"attempts": J.c.attempts + 1, "first_started_at": func.coalesce(J.c.first_started_at, now),
                       "last_started_at": now, "state": JobState.STARTED, "started_at": now, "finished_at": None,
                       "worker_hostname": _b("hostname", "worker_hostname"), "worker_pid": _b("pid", "worker_pid"),
                       "unseen_since": None},
                      (J.c.id, J.c.attempts, J.c.repo_id, J.c.params))


@functools.cache
def _finish_pair(postgresql: bool) -> tuple[Any, Any]:
    """A job's outcome, built once: params ``b_state``, ``b_now``, ``b_counters``, ``b_error``, ``b_error_type``
    and ``b_task_id`` (PostgreSQL: the duration computed by the server from the row's started_at) or ``b_id``
    and ``b_duration`` (SQLite: computed in Python; None keeps the row's)."""
    J = _JOB_TABLE
    values: dict[str, Any] = {"state": _b("state", "state"), "finished_at": _b("now", "finished_at"),
                              "counters": _b("counters", "counters"), "error": _b("error", "error"),
                              "error_type": _b("error_type", "error_type"), "unseen_since": None}
    if postgresql:
        values["duration_ms"] = case((J.c.started_at.is_(None), J.c.duration_ms),
                                     else_=_pg_duration_ms(_b("now", "finished_at")))
        return _open_pair(J.c.task_id == _b("task_id", "task_id"), values, J.c)
    values["duration_ms"] = func.coalesce(_b("duration", "duration_ms"), J.c.duration_ms)
    return _open_pair(J.c.id == _b("id", "id"), values, J.c)


def _write_open(s: Session, pair: tuple[Any, Any], params: dict[str, Any] | None = None, *,
                lost_first: bool = False) -> tuple[Any, bool]:
    """Run ``pair`` (:func:`_open_pair`: the UPDATE of a job row if it has no outcome, SUCCESS or FAILURE) with
    ``params``: (the row as written, with the pair's returned columns, or None: no such row; whether it was LOST).

    Every write that can take a row out of LOST goes through here, so the LOST level (record_totals, moved by
    aggregates.move_level) stays equal to the LOST rows: two guarded UPDATEs are tried in turn -- the row open
    and not LOST, then the row LOST (``lost_first``: the other way round, when the caller read it LOST). Each
    is atomic with its guard (PostgreSQL re-checks it on the row it locked; SQLite writes one transaction at a
    time), so the one that matched says what the row was when it was overwritten, and a LOST row overwritten
    moves the level by -1 in this transaction. The common case is one statement; a second only when the
    first guard misses.
    """
    tries = ((pair[0], False), (pair[1], True))
    for stmt, was_lost in (tries[::-1] if lost_first else tries):
        row = s.execute(stmt, params).first()
        if row is not None:
            if was_lost:
                aggregates.move_level(s, row.kind, aggregates.LOST, -1)
            return row, was_lost
    return None, False


def _finish_row(s: Session, task_id: str, state: JobState, now: datetime, counters: dict[str, Any] | None,
                error: str | None, error_type: str | None) -> Any:
    """Write the outcome on the job's row if it has none yet; the row as written (None: no row, or an outcome
    was already recorded). One ``UPDATE ... RETURNING`` on PostgreSQL; a read of the start time first on SQLite.
    A LOST row overwritten moves the LOST level (:func:`_write_open`)."""
    params: dict[str, Any] = {"b_state": state, "b_now": now, "b_counters": counters, "b_error": error,
                              "b_error_type": error_type}
    if s.get_bind().dialect.name == "postgresql":
        return _write_open(s, _finish_pair(True), {**params, "b_task_id": task_id})[0]
    open_row = (_JOB_TABLE.c.task_id == task_id) & _JOB_TABLE.c.state.not_in(FINISHED_STATES)
    found = s.execute(select(_JOB_TABLE.c.id, _JOB_TABLE.c.started_at, _JOB_TABLE.c.state).where(open_row)).first()
    if found is None:
        return None
    duration = None
    if found.started_at is not None:
        started = found.started_at
        if started.tzinfo is None:  # SQLite hands back naive datetimes
            started = started.replace(tzinfo=now.tzinfo)
        duration = int((now - started).total_seconds() * 1000)
    return _write_open(s, _finish_pair(False), {**params, "b_id": found.id, "b_duration": duration},
                       lost_first=found.state is JobState.LOST)[0]


def mark_unseen(settings: Settings | str, job_id: int, now: datetime) -> bool:
    """The reconciler did not find a pending job's message: start its grace period (if nothing wrote it since)."""
    with session_scope(settings) as s:
        return bool(s.execute(
            update(Job).where(Job.id == job_id, Job.state.in_(PENDING_STATES), Job.unseen_since.is_(None))
            .values(unseen_since=now).execution_options(synchronize_session=False)).rowcount)  # type: ignore[attr-defined]  # DML: a CursorResult


def mark_seen(settings: Settings | str, job_id: int) -> None:
    """The reconciler found the job's message again: forget its grace period."""
    with session_scope(settings) as s:
        s.execute(update(Job).where(Job.id == job_id, Job.unseen_since.is_not(None)).values(unseen_since=None)
                  .execution_options(synchronize_session=False))


def record_lost(settings: Settings | str, job_id: int, unseen_since: datetime, reason: str) -> bool:
    """Mark a pending job LOST, only if nothing wrote its row since it went unseen at ``unseen_since``
    (every write clears ``unseen_since``): a job that started meanwhile is never marked. The LOST level
    (record_totals) moves by +1 and the day's count of marks by one, in the same transaction; a row already
    LOST is not pending, so a second mark neither writes nor counts."""
    now = utcnow()
    with session_scope(settings) as s:
        J = _JOB_TABLE
        marked = s.execute(
            update(J).where(J.c.id == job_id, J.c.state.in_(PENDING_STATES), J.c.unseen_since == unseen_since)
            .values(state=JobState.LOST, error=reason, error_type="JobLost", finished_at=now)
            .returning(J.c.kind)).first()
        if marked is None:   # started, finished, written or already LOST since: nothing marked, nothing counted
            return False
        aggregates.count_marked_lost(s, marked.kind, now)   # the LOST level +1, and the day's count of marks
        return True


def record_lock_event(settings: Settings | str, *, repo: str | None, job_id: str | None, lock_name: str,
                      event: LockEventKind, token: int | None, waited_ms: int | None = None,
                      detail: dict[str, Any] | None = None) -> None:
    now = utcnow()
    with session_scope(settings) as s:
        s.add(LockEvent(repo_id=repository_id(s, repo), job_id=job_id, lock_name=lock_name, event=event,
                        fencing_token=token, at=now, waited_ms=waited_ms, detail=detail))
        aggregates.add(s, Family.LOCK, aggregates.lease_of(lock_name), event.value, now)


#: A notable lease outcome is not overwritten by a lesser one (a job that lost its lease and then, retried,
#: waited for it keeps "lost": what an operator must see first).
_LEASE_RANK = {LeaseOutcome.WAITED: 1, LeaseOutcome.TOOK_OVER: 2, LeaseOutcome.BUSY: 3, LeaseOutcome.SKIPPED: 4,
               LeaseOutcome.LOST: 5}


def record_lease(settings: Settings | str, task_id: str, outcome: LeaseOutcome, wait_ms: int | None = None) -> None:
    """Mark the job row with what its lease did (waited, skipped, took over, lost, busy) and how long it waited."""
    with session_scope(settings) as s:
        job = s.scalar(select(Job).where(Job.task_id == task_id))
        if job is None:
            return
        if job.lease is None or _LEASE_RANK[outcome] >= _LEASE_RANK[job.lease]:
            job.lease = outcome
        if wait_ms is not None:
            job.lease_wait_ms = (job.lease_wait_ms or 0) + int(wait_ms)


def record_race_event(settings: Settings | str, *, repo: str | None, job_id: str | None, kind: str,
                      detail: dict[str, Any] | None = None) -> None:
    """A race a worker observed (later issues: pack vanished under a lookup, ref moved under a CAS, …)."""
    now = utcnow()
    with session_scope(settings) as s:
        s.add(RaceEvent(repo_id=repository_id(s, repo), job_id=job_id, kind=kind, detail=detail, observed_at=now))
        aggregates.add(s, Family.RACE, kind, "", now)


def record_race_events(settings: Settings | str, *, repo: str | None, job_id: str | None,
                       events: list[dict[str, Any]]) -> int:
    """Many race events in one transaction (the race harness's readers report misses in batches):
    each ``{"kind": str, "at": epoch seconds, "detail": dict}``. Returns how many were written."""

    if not events:
        return 0
    rows = [RaceEvent(repo_id=None, job_id=job_id, kind=e["kind"], detail=e.get("detail"),
                      observed_at=datetime.fromtimestamp(e["at"], UTC) if e.get("at") else utcnow()) for e in events]
    per_day: dict[tuple[str, Any], int] = {}
    for r in rows:
        key = (r.kind, r.observed_at.date())
        per_day[key] = per_day.get(key, 0) + 1
    with session_scope(settings) as s:
        rid = repository_id(s, repo)
        for r in rows:
            r.repo_id = rid
        s.add_all(rows)
        for (kind, day), n in sorted(per_day.items()):
            aggregates.add(s, Family.RACE, kind, "", day, events=n)
    return len(events)


def record_run(settings: Settings | str, *, task_id: str, kind: str, repo: str | None, params: dict[str, Any] | None,
               started: datetime, state: JobState, counters: dict[str, Any] | None, error: str | None = None,
               hostname: str | None = None, pid: int | None = None) -> None:
    """A job that ran outside Celery (``packyard race``, ``packyard janitor`` in-process): its whole row at once,
    written when it ends (a pending row of a process no broker knows would be marked LOST meanwhile)."""
    now = utcnow()
    duration_ms = int((now - started).total_seconds() * 1000)
    with session_scope(settings) as s:
        s.add(Job(task_id=task_id, kind=kind, repo_id=repository_id(s, repo), state=state, params=params,
                  queued_at=started, started_at=started, first_started_at=started, last_started_at=started,
                  finished_at=now, duration_ms=duration_ms, counters=counters,
                  error=error, error_type=None if error is None else "RunFailed", retries=0, attempts=1,
                  worker_hostname=hostname, worker_pid=pid))
        if state in FINISHED_STATES:
            aggregates.add(s, Family.JOB, kind, state.value, now, duration_ms=duration_ms)
        elif state is JobState.LOST:
            aggregates.count_marked_lost(s, kind, now)
