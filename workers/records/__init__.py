"""Job records: models, engine/sessions, migrations entry point and the recorders.

``task_runs`` is the task side (Celery signals and the task base class turn runs into job rows),
``recorder`` writes the rows, ``registry`` the repositories, ``aggregates`` the counters, ``retention`` prunes.

    from packyard.workers.records import upgrade_database, session_scope, Job, JobState
"""
from packyard.workers.records.db import downgrade_database, get_engine, session_scope, upgrade_database
from packyard.workers.records.models import Base, Job, JobState, LockEvent, LockEventKind, RaceEvent, Repository, utcnow

__all__ = ["Base", "Job", "JobState", "LockEvent", "LockEventKind", "RaceEvent", "Repository",
           "downgrade_database", "get_engine", "session_scope", "upgrade_database", "utcnow"]
