"""Before a command uses the services: start or reuse the embedded Redis, migrate the embedded SQLite; and a
command that runs a job's work in this process, recorded as that job's row (``run_as_job``)."""
from __future__ import annotations

import os
from typing import Any, Callable

from packyard.workers.settings import Settings, get_settings


def is_default_sqlite(s: Settings) -> bool:
    return s.database_url == f"sqlite:///{s.state_dir / 'packyard.db'}"


def prepare_embedded(s: Settings, migrate: bool = True):  # type: ignore[no-untyped-def]
    """Start/reuse the embedded Redis (if configured) and migrate the embedded SQLite database."""
    from packyard.workers.embedded import REAP_ENV, ensure_private_dir, ensure_redis

    ensure_private_dir(s.state_dir)
    server = ensure_redis(s)
    if server is not None and server.process is not None:
        # A command that exec()s Celery next (worker, beat, flower) passes the server, its child,
        # on to be reaped there (workers/embedded.py: adopt_from_env).
        os.environ[REAP_ENV] = str(server.process.pid)
    if migrate and is_default_sqlite(s):
        from packyard.workers.records import upgrade_database  # (SQLAlchemy: only for a command that migrates)

        upgrade_database(s)
    return server


def run_as_job(kind: str, work: Callable[[Settings, str], dict[str, Any]], *, repo: str | None,
               params: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """Run ``work(settings, job_id)`` here (embedded services prepared, the database migrated) and record it as a
    finished ``kind`` job row (worker ``cli@<host>``) with the ``counters`` of the result; returns (job id, result)."""
    import socket
    import uuid
    from datetime import UTC, datetime

    from packyard.workers.records.models import JobState
    from packyard.workers.records.recorder import record_run

    s = get_settings()
    prepare_embedded(s, migrate=True)
    run_id = str(uuid.uuid4())
    started = datetime.now(UTC)
    result = work(s, run_id)
    record_run(s, task_id=run_id, kind=kind, repo=repo, params=params, started=started, state=JobState.SUCCESS,
               counters=result["counters"], hostname=f"cli@{socket.gethostname()}", pid=os.getpid())
    return run_id, result
