"""The embedded Redis killed and restarted under real workers: persistence, reaping, retries, fences, LOST.

Each test brings its own Redis server (and workers): the session's must not be killed.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from gitutil import git


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (``Z``: a zombie), None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A short private state dir (unix socket paths must fit in 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="pkr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def own_app(settings: Any) -> Any:
    from packyard.workers.app import create_app

    return create_app(settings)


def ping(app: Any, name: str) -> bool:
    try:
        return any(name in reply for reply in (app.control.ping(timeout=0.5) or []))
    except Exception:  # noqa: BLE001 - the broker is down or restarting: not answering
        return False


def test_killed_embedded_redis_is_reaped_by_the_worker_that_started_it(state_dir, pk):
    """`packyard worker` starts the embedded Redis and exec()s Celery, so the server is the Celery
    worker's child; billiard waits only for its pool processes, so a killed server stayed a zombie
    for the worker's whole life. Now the worker reaps it, and reconnects once it is restarted."""
    from packyard.workers.cli import common
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.settings import Settings

    env = pk.cli_env(PACKYARD_STATE_DIR=str(state_dir))
    for key in ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL"):
        env.pop(key)
    name = f"reap-{uuid.uuid4().hex[:6]}@%h"
    log = open(state_dir / "worker.log", "ab")
    worker = common.Child("worker", ["packyard", "worker", "-c", "1", "-n", name], env, stdout=log)
    restarted = None
    try:
        settings = Settings.from_env({"PACKYARD_STATE_DIR": str(state_dir)})
        app = own_app(settings)
        full = name.replace("%h", os.uname().nodename)
        pk.wait_until(lambda: ping(app, full), 60, interval=0.2, what="the worker to answer")
        server_pid = int((state_dir / "redis" / "redis.pid").read_text())
        assert parent_of(server_pid) == worker.pid, "the worker (exec'd packyard worker) started the server"

        os.kill(server_pid, signal.SIGKILL)
        pk.wait_until(lambda: proc_state(server_pid) is None, 30, interval=0.1,
                      what=f"the killed redis-server {server_pid} to be reaped, not left a zombie")

        restarted = EmbeddedRedis(state_dir).start()
        pk.wait_until(lambda: ping(app, full), 90, interval=0.5, what="the worker to reconnect")
        assert worker.poll() is None, "the worker survived its broker's restart"
    finally:
        worker.stop()
        log.close()
        if restarted is not None:
            restarted.stop()
        EmbeddedRedis(state_dir).stop(force=True)
