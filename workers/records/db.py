"""Engine and sessions for the job records, one engine per (URL, process).

A prefork worker forks its children after the app is imported; a SQLAlchemy pool
must never cross a fork, so the engine is keyed by pid and created lazily.
SQLite gets WAL mode and a busy timeout so that several worker processes can
write job rows at once.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from packyard.workers.settings import Settings

_lock = threading.Lock()
_engines: dict[tuple[str, int], Engine] = {}
#: One session factory per engine: ``sessionmaker`` builds a Session subclass (and copies its event listeners)
#: each time it is called, a third of a job row's recording CPU when it was called per transaction.
_factories: dict[Engine, sessionmaker[Session]] = {}

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent.parent / "migrations"


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            create_private_sqlite_file(Path(path))
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    engine = create_engine(url)
    event.listen(engine, "checkin", _checked_in)
    event.listen(engine, "checkout", _ping_if_idle)
    return engine


#: A pooled server connection idle longer than this is pinged before use (one round trip); one used more
#: recently is not: a busy worker records a job in one round trip fewer than with ``pool_pre_ping``, which
#: pinged before every transaction (a finish's round trips went from 9 to 5).
PING_AFTER_IDLE_S = 1.0


def _checked_in(_dbapi_conn, record) -> None:  # type: ignore[no-untyped-def]
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(dbapi_conn, record, _proxy) -> None:  # type: ignore[no-untyped-def]
    """SQLAlchemy's pessimistic disconnect handling, for idle connections only: a connection the server
    closed (a restart, a failover, an idle timeout) raises DisconnectionError, and the pool replaces it."""
    from sqlalchemy import exc

    idle_since = record.info.get("checked_in")
    if idle_since is None or time.monotonic() - idle_since <= PING_AFTER_IDLE_S:
        return
    try:
        cur = dbapi_conn.cursor()
        try:
            cur.execute("SELECT 1")
        finally:
            cur.close()
        dbapi_conn.rollback()
    except Exception as err:   # the driver's own error type: whatever it is, the connection is gone
        raise exc.DisconnectionError(str(err)) from err


def create_private_sqlite_file(path: Path) -> None:
    """Create a missing SQLite database file 0600 (its directory 0700) before SQLite opens it.

    SQLite would create it with the umask's mode (usually 0644: job parameters readable by every
    user of the host); its -wal and -shm files take the database file's mode.
    """
    from packyard.workers.embedded import ensure_private_dir

    ensure_private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass


def get_engine(url: str) -> Engine:
    key = (url, os.getpid())
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(url)
        return engine


def dispose_all() -> None:
    """Forget every engine (after a fork the parent's pools must not be used)."""
    with _lock:
        for (_, pid), engine in list(_engines.items()):
            if pid == os.getpid():
                engine.dispose()
            else:
                engine.dispose(close=False)
        _engines.clear()
        _factories.clear()


@contextmanager
def session_scope(settings: Settings | str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    url = settings if isinstance(settings, str) else settings.database_url
    engine = get_engine(url)
    factory = _factories.get(engine)
    if factory is None:
        factory = _factories[engine] = sessionmaker(engine, expire_on_commit=False)
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def alembic_config(settings: Settings | str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    url = settings if isinstance(settings, str) else settings.database_url
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    # env.py reads this attribute first, so tests and the CLI can target any database.
    cfg.attributes["database_url"] = url
    return cfg


#: The newest migration under migrations/versions (tests/workers/test_records_head.py checks it equals
#: alembic's head). An embedded SQLite file already there is not handed to alembic at all.
HEAD_REVISION = "0009"


def _sqlite_revision(path: Path) -> str | None:
    """The revision an embedded SQLite file is at (its ``alembic_version`` row), read with the standard
    library, read-only; None when the file is missing, not a database or not migrated."""
    import sqlite3

    if not path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return rows[0][0] if len(rows) == 1 else None


def upgrade_database(settings: Settings | str, revision: str = "head") -> None:
    """Bring the records database to ``revision`` (used by ``packyard up``/``demo``/``migrate`` and tests).

    An embedded SQLite file already at the head returns at once, without importing alembic: every
    ``packyard receive-pack`` and ``status`` process calls this, and alembic's import and script scan
    cost ~0.17 s of a 10-commit push (docs/receive.md). A file behind (or foreign) goes to alembic."""
    url = settings if isinstance(settings, str) else settings.database_url
    sqlite_file = _sqlite_file(url)
    if sqlite_file is not None and revision in ("head", HEAD_REVISION) \
            and _sqlite_revision(sqlite_file) == HEAD_REVISION:
        return
    from alembic import command

    if sqlite_file is None:  # server databases: run `packyard migrate` once per deployment (compose does)
        command.upgrade(alembic_config(url), revision)
        return
    # Embedded mode: several `packyard` processes may start at once and each migrates; serialize them.
    from packyard.workers.embedded import ensure_private_dir, file_lock

    ensure_private_dir(sqlite_file.parent)
    with file_lock(sqlite_file.with_name(sqlite_file.name + ".migrate-lock")):
        command.upgrade(alembic_config(url), revision)


def _sqlite_file(url: str) -> Path | None:
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[1] if "///" in url else ""
    return Path(path) if path and path != ":memory:" else None


def downgrade_database(settings: Settings | str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(settings), revision)
