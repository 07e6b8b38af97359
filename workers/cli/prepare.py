"""Before a command uses the services: start or reuse the embedded Redis, migrate the embedded SQLite."""
from __future__ import annotations

import os

from packyard.workers.settings import Settings

def is_default_sqlite(s: Settings) -> bool:
    return s.database_url == f"sqlite:///{s.state_dir / 'packyard.db'}"


def prepare_embedded(s: Settings, migrate: bool = True):  # type: ignore[no-untyped-def]
    """Start/reuse the embedded Redis (if configured) and migrate the embedded SQLite database."""
    from packyard.workers.embedded import REAP_ENV, ensure_private_dir, ensure_redis
    from packyard.workers.records import upgrade_database

    ensure_private_dir(s.state_dir)
    server = ensure_redis(s)
    if server is not None and server.process is not None:
        # A command that exec()s Celery next (worker, beat, flower) passes the server, its child,
        # on to be reaped there (workers/embedded.py: adopt_from_env).
        os.environ[REAP_ENV] = str(server.process.pid)
    if migrate and is_default_sqlite(s):
        upgrade_database(s)
    return server
