"""The one place where task runs become job rows.

* queued:   ``before_task_publish`` signal, in whatever process publishes
            (``packyard submit``, beat, a frontend using ``app.send_task``);
* started / success / failure / retry: :meth:`packyard.workers.tasks.base.PackyardTask.__call__`,
            which calls :func:`job_started` / :func:`job_finished` / :func:`job_retrying`
            around the task body — before Celery stores the result, so a client that sees
            the result in the backend also finds the finished job row.

A database outage at the start retries the job later (nothing is done unrecorded); at the
end, once the work is done, writing the outcome is retried for ~15 s (RECORD_RETRY_DELAYS)
and the summary log line is written first, so the logs keep the outcome even if the row
cannot get it.

No task repeats any of this: a task is ``@app.task(base=PackyardTask)`` and returns
``{"counters": {...}}``.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable

from celery.signals import before_task_publish, setup_logging, worker_process_init
from sqlalchemy.exc import SQLAlchemyError

from packyard.workers import logs as plog
from packyard.workers.records import JobState, recorder, registry
from packyard.workers.settings import Settings, get_settings

log = plog.get_logger("packyard.jobs")

TASK_PREFIX = "packyard."
#: Bookkeeping tasks that are not jobs: no job row (beat would fill the table with them).
UNRECORDED_TASKS = frozenset({"packyard.reconcile_jobs"})

#: Seconds between attempts to write a finished (or retrying) job's row while the database
#: is unreachable: a restart or failover should not leave a finished job's row at STARTED.
RECORD_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)


def record_with_retries(step: str, write: Callable[[], object]) -> bool:
    """Run one job-row write; on a database error retry after each of RECORD_RETRY_DELAYS.

    Returns False (after logging ``job.record_failed``) if every attempt failed; never raises
    a database error: the repository work it describes has already happened.
    """
    for attempt, delay in enumerate((*RECORD_RETRY_DELAYS, None), start=1):
        try:
            write()
        except SQLAlchemyError as err:
            if delay is None:
                log.error("job.record_failed", step=step, attempts=attempt, error=str(err))
                return False
            log.warning("job.record_retry", step=step, attempt=attempt, retry_in=delay, error=str(err))
            time.sleep(delay)
        else:
            if attempt > 1:
                log.info("job.recorded_after_retry", step=step, attempts=attempt)
            return True
    return False  # pragma: no cover - the loop always returns


def repo_from_call(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> str | None:
    """The repository a task acts on: ``repo=`` keyword, else the first positional argument, spelled as
    the job uses it (``<storage>:<path>`` expanded and resolved: see :mod:`packyard.workers.confine`)."""
    from packyard.workers.confine import canonical_repo

    if "repo" in kwargs:
        return canonical_repo(kwargs["repo"], get_settings())
    if args and isinstance(args[0], str):
        return canonical_repo(args[0], get_settings())
    return None


#: An argument whose JSON is longer than this is recorded as its size and hash, not its content.
MAX_PARAM_JSON = 1024


def params_from_call(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The job row's ``params``: the call's arguments (without ``repo``) as a summary.

    Small values are kept as they are (ref names, ids, flags, paths). Object content never is:
    ``objects`` (write_objects) becomes its count, the total object bytes and the sha256 of its
    JSON; any other value longer than MAX_PARAM_JSON becomes its size and sha256. One 40 MiB blob
    used to be stored whole in ``jobs.params`` (and a second time in the result backend).
    """
    params = {k: summarize_param(k, v) for k, v in kwargs.items() if k != "repo"}
    if args:
        params["args"] = summarize_param("args", list(args))
    return params


def summarize_param(name: str, value: Any) -> Any:
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    if name == "objects" and isinstance(value, list):
        return {"count": len(value), "bytes": sum(_object_bytes(o) for o in value),
                "sha256": hashlib.sha256(encoded).hexdigest()}
    if len(encoded) <= MAX_PARAM_JSON:
        return value
    summary: dict[str, Any] = {"json_bytes": len(encoded), "sha256": hashlib.sha256(encoded).hexdigest()}
    if isinstance(value, (list, dict)):
        summary["count"] = len(value)
    return summary


def _object_bytes(item: Any) -> int:
    """Decoded size of one ``{"type": ..., "data": <base64>}`` entry, from the base64 length alone."""
    data = item.get("data") if isinstance(item, dict) else None
    if not isinstance(data, str):
        return 0
    return len(data) * 3 // 4 - len(data) + len(data.rstrip("="))


def _summarized_repr(args: Any, kwargs: dict[str, Any]) -> tuple[str, str] | None:
    """argsrepr/kwargsrepr for the message headers when an argument had to be summarized (events and
    Flower show these; Celery's own repr would carry the first KiB of the content), else None."""
    summary_args = [summarize_param("args", a) for a in args] if args else []
    summary_kwargs = {k: (v if k == "repo" else summarize_param(k, v)) for k, v in kwargs.items()}
    if summary_args == list(args) and summary_kwargs == kwargs:
        return None
    return repr(tuple(summary_args)), repr(summary_kwargs)


def reported_counters(value: Any) -> dict[str, Any] | None:
    """Counters from a task's returned dict, or from an exception's partial report/counters."""
    if isinstance(value, dict):
        c = value.get("counters")
        return dict(c) if isinstance(c, dict) else None
    report = getattr(value, "report", None)
    if report is not None and hasattr(report, "as_counters"):
        return dict(report.as_counters())
    c = getattr(value, "counters", None)
    return dict(c) if isinstance(c, dict) else None


@before_task_publish.connect
def _on_publish(sender: str | None = None, headers: dict[str, Any] | None = None, body: Any = None,
                **_: Any) -> None:
    headers = headers if headers is not None else {}
    name = sender or headers.get("task")
    if not name or not name.startswith(TASK_PREFIX) or name in UNRECORDED_TASKS:
        return
    args: Any = ()
    kwargs: dict[str, Any] = {}
    if isinstance(body, (tuple, list)) and len(body) >= 2:
        args, kwargs = body[0] or (), body[1] or {}
    reprs = _summarized_repr(args, kwargs)
    if reprs is not None:
        headers["argsrepr"], headers["kwargsrepr"] = reprs
    if headers.get("retries"):
        return
    repo = repo_from_call(args, kwargs)
    try:
        recorder.record_queued(get_settings(), task_id=headers["id"], kind=name, repo=repo,
                               params=params_from_call(args, kwargs))
    except Exception as err:  # the job is still queued; the worker creates the row when it starts
        log.warning("job.queued_record_failed", task_id=headers.get("id"), task=name, error=str(err))
        return
    log.info("job.queued", job_id=headers["id"], task=name, repo=repo)


def job_started(task_id: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                hostname: str | None) -> recorder.Delivery:
    """Count this delivery on the job row; its verdict says whether the job runs (see PackyardTask)."""
    repo = repo_from_call(args, kwargs)
    plog.bind_job(job_id=task_id, task=name, repo=repo)
    delivery = recorder.record_started(get_settings(), task_id=task_id, kind=name, repo=repo,
                                       params=params_from_call(args, kwargs), hostname=hostname, pid=os.getpid())
    log.info("job.started", worker=hostname, pid=os.getpid(), attempt=delivery.attempts)
    return delivery


def job_admitted(task_id: str, repo: str | None) -> None:
    """The job passed the boundary: its (confined, resolved) repository is registered and linked only now
    (``recorder.record_admitted``), so a refused path never becomes a registered repository."""
    if repo is None:
        return
    recorder.record_admitted(get_settings(), task_id=task_id, repo=repo)


def job_refused(task_id: str, name: str, args: Any, kwargs: Any, hostname: str | None, exc: BaseException) -> None:
    """Record a delivery that is refused before anything runs (a Celery built-in such as ``celery.starmap``, a
    packyard task reached from inside another task): a FAILURE row naming why, linked to no repository."""
    plog.bind_job(job_id=task_id, task=name)
    try:
        params = params_from_call(tuple(args or ()), dict(kwargs or {}) if isinstance(kwargs, dict) else {})
    except (TypeError, ValueError):
        params = None
    settings = get_settings()
    log.error("job.refused", error=str(exc), error_type=type(exc).__name__)

    def write() -> None:
        recorder.record_started(settings, task_id=task_id, kind=name, repo=None, params=params, hostname=hostname,
                                pid=os.getpid())
        recorder.record_finished(settings, task_id=task_id, kind=name, repo=None, state=JobState.FAILURE,
                                 counters=None, error=str(exc), error_type=type(exc).__name__)

    record_with_retries("refused", write)


def job_finished(task_id: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], started: float,
                 result: Any = None, exc: BaseException | None = None) -> None:
    """Log the one summary event, then record SUCCESS (counters from the result) or FAILURE (str(exc))."""
    repo = repo_from_call(args, kwargs)
    state = JobState.FAILURE if exc is not None else JobState.SUCCESS
    counters = reported_counters(exc if exc is not None else result)
    event = {"state": state.value, "duration_ms": int((time.monotonic() - started) * 1000), "counters": counters}
    if exc is not None:
        log.error("job.finished", error=str(exc), error_type=type(exc).__name__, **event)
    else:
        log.info("job.finished", **event)
    settings = get_settings()
    record_with_retries("finished", lambda: recorder.record_finished(
        settings, task_id=task_id, kind=name, repo=repo, state=state, counters=counters,
        error=str(exc) if exc is not None else None, error_type=type(exc).__name__ if exc is not None else None,
        on_ingest_counted=lambda n: plan_after_ingests(settings, repo, n)))
    if name in registry.MAINTENANCE_KINDS:
        release_slot(settings, task_id)


def plan_after_ingests(settings: Settings, repo: str | None, ingests: int) -> None:
    """Every PACKYARD_PLAN_AFTER_INGESTS-th ingest since the last repack queues the planner for the repository."""
    every = settings.plan_after_ingests
    if repo is None or every <= 0 or ingests % every:
        return
    try:
        from packyard.workers.app import app

        res = app.send_task(registry.PLAN_KIND, kwargs={"repo": repo, "trigger": "ingests"})
    except Exception as err:  # the ingest is done; the next multiple (or the window) plans it
        log.warning("maintenance.plan_not_queued", ingests=ingests, error=str(err))
        return
    log.info("maintenance.plan_queued", ingests=ingests, plan_job=res.id)


def release_slot(settings: Settings, task_id: str) -> None:
    """A finished maintenance job gives its fleet slot back (a job queued by hand never had one)."""
    from packyard.workers.slots import fleet_slots

    try:
        released = fleet_slots(settings).release(task_id)
    except Exception as err:  # the claim expires on its own; the planner also prunes finished holders
        log.warning("maintenance.slot_release_failed", error=str(err))
        return
    if released:
        log.info("maintenance.slot_released")


def job_retrying(task_id: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str) -> None:
    log.warning("job.retry", reason=reason)
    record_with_retries("retrying", lambda: recorder.record_retry(
        get_settings(), task_id=task_id, kind=name, repo=repo_from_call(args, kwargs), reason=reason))


@setup_logging.connect
def _setup_logging(**_: Any) -> None:
    # Having a receiver here stops Celery from installing its own handlers: every line goes through structlog.
    plog.configure_from_settings(get_settings())


@worker_process_init.connect
def _child_init(**_: Any) -> None:
    # Pools created before the fork belong to the parent.
    from packyard.workers.records.db import dispose_all

    dispose_all()
