"""The Celery app, configured from :class:`packyard.workers.settings.Settings`.

``celery -A packyard.workers.app worker`` (what ``packyard worker`` execs) finds ``app`` here.
Broker and result backend are the same Redis; the pool is prefork; task events are
on (Flower shows every task and its PROGRESS state); storage tasks ack late and are
re-queued if their worker process dies (set on PackyardTask).
"""
from __future__ import annotations

from datetime import UTC
from typing import Any

from celery import Celery

from packyard.workers import broker, embedded
from packyard.workers.records import task_runs  # noqa: F401  (connects the queued-job signal and logging set-up)
from packyard.workers.settings import Settings, get_settings

RECONCILE_TASK = "packyard.reconcile_jobs"


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The nightly maintenance window and the job reconciler.

    ``maintenance-window``: the planner over the registered repositories at PACKYARD_MAINTENANCE_CRON.
    A new entry (a fresh schedule file) counts as last run one window length ago, so a beat
    started inside a window (the cron fired less than PACKYARD_MAINTENANCE_WINDOW seconds ago)
    opens it at once instead of waiting a day; a persisted entry keeps its own last run time.
    ``verify_repo`` is not scheduled: it stays available on demand (``packyard verify``,
    ``packyard submit verify_repo``).

    ``reconcile-jobs``: every PACKYARD_LOST_AFTER / 2 seconds, rows whose message no broker holds
    and no worker runs become LOST (workers/reconcile.py).

    ``janitor``: every PACKYARD_JANITOR_INTERVAL seconds (0: never), leftovers of dead jobs in the
    registered repositories are removed by owner (workers/commands/janitor.py).

    ``backup-fleet``: at PACKYARD_BACKUP_CRON (``off``: never), one backup job per enabled registered
    repository (workers/commands/backup.py's ``queue_fleet``).

    ``prune-records``: every PACKYARD_RECORDS_PRUNE_INTERVAL seconds (0: never), job rows, lock events
    and race events past their retention are deleted in short batches (workers/records/retention.py).
    """
    from datetime import datetime, timedelta

    from packyard.workers.commands.plan_maintenance import maintenance_crontab

    schedule: dict[str, dict[str, Any]] = {
        "maintenance-window": {
            "task": "packyard.plan_maintenance",
            "schedule": maintenance_crontab(settings),
            "kwargs": {"trigger": "window"},
            "last_run_at": datetime.now(UTC) - timedelta(seconds=settings.maintenance_window),
        },
        "reconcile-jobs": {"task": RECONCILE_TASK, "schedule": max(1.0, settings.lost_after / 2),
                           "options": {"expires": max(1.0, settings.lost_after / 2)}},
    }
    if settings.janitor_interval > 0:
        schedule["janitor"] = {"task": "packyard.janitor", "schedule": settings.janitor_interval,
                               "options": {"expires": settings.janitor_interval}}
    if settings.records_prune_interval > 0:
        schedule["prune-records"] = {"task": "packyard.prune_records", "schedule": settings.records_prune_interval,
                                     "options": {"expires": settings.records_prune_interval}}
    if settings.backup_cron:
        schedule["backup-fleet"] = {"task": "packyard.backup_fleet", "schedule": backup_crontab(settings),
                                    "options": {"expires": 3600.0}}
    return schedule


def backup_crontab(settings: Settings):  # type: ignore[no-untyped-def]
    """PACKYARD_BACKUP_CRON as a Celery crontab (UTC); after the maintenance window by default."""
    from celery.schedules import crontab

    minute, hour, dom, month, dow = settings.backup_cron.split()
    return crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow)


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        # acks_late: an unacknowledged job is redelivered after this long (its host died mid-job).
        "broker_transport_options": {"visibility_timeout": settings.visibility_timeout},
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Results only: with result_extended the backend kept every job's arguments (a write_objects
        # payload, whole) for result_expires. Dashboards get names and (bounded) argument reprs
        # from task events; the job rows keep a summary of the arguments.
        "result_extended": False,
        "result_expires": 7 * 24 * 3600,
        "timezone": "UTC",
        "enable_utc": True,
        "worker_pool": "prefork",
        "worker_concurrency": settings.worker_concurrency,
        "worker_prefetch_multiplier": 1,    # long storage jobs: do not hoard messages in one process
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": False,        # see PackyardTask.track_started
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # A broker connection lost while jobs run does not kill them (the default, stated): their
        # messages stay unacknowledged in the broker (persisted) and are acknowledged when they
        # finish, or put back by the reconciler (workers/reconcile.py).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "beat_schedule": beat_schedule(settings),
        "beat_schedule_filename": str(settings.state_dir / "celerybeat-schedule"),
        "imports": ("packyard.workers.tasks",),
    }


def create_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery_app = Celery("packyard")
    celery_app.config_from_object(celery_config(settings))
    # Celery's built-in tasks (celery.starmap, ...) would run packyard's task bodies unconfined: refused.
    celery_app.on_after_finalize.connect(_refuse_foreign, weak=False)
    return celery_app


def _refuse_foreign(sender: Celery, **_: Any) -> None:
    from packyard.workers.tasks.foreign import refuse_foreign_tasks

    refuse_foreign_tasks(sender)


broker.install_restore_guard(get_settings().redis_py_url)
app = create_app()
# `packyard worker/beat/flower` started the embedded Redis and exec()ed Celery: reap it here.
embedded.adopt_from_env()
