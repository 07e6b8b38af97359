"""The embedded Redis killed and restarted under real workers: persistence, reaping, retries, fences, LOST.

Each test brings its own Redis server (and workers): the session's must not be killed.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from gitutil import ROOT, git


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
    if not os.environ.get("PKR_KEEP"):
        shutil.rmtree(d, ignore_errors=True)


def own_app(settings: Any) -> Any:
    from packyard.workers.app import create_app

    return create_app(settings)


def ping(app: Any, name: str) -> bool:
    try:
        return any(name in reply for reply in (app.control.ping(timeout=0.5) or []))
    except Exception:  # the broker is down or restarting: not answering
        return False


@pytest.mark.slow
def test_killed_embedded_redis_is_reaped_by_the_worker_that_started_it(state_dir, pk):
    """`packyard worker` starts the embedded Redis and exec()s Celery, so the server is the Celery
    worker's child; billiard waits only for its pool processes, so a killed server stayed a zombie
    for the worker's whole life. Now the worker reaps it, and reconnects once it is restarted."""
    from packyard.workers.cli.children import Child
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.settings import Settings

    env = pk.cli_env(PACKYARD_STATE_DIR=str(state_dir))
    for key in ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL"):
        env.pop(key)
    name = f"reap-{uuid.uuid4().hex[:6]}@%h"
    log = open(state_dir / "worker.log", "ab")
    worker = Child("worker", ["packyard", "worker", "-c", "1", "-n", name], env, stdout=log)
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


def start_worker(settings: Any, name: str, log_path: Path, concurrency: int = 1) -> Any:
    """A real prefork worker (test tasks included) against ``settings``' broker."""
    from packyard.workers.cli.children import Child, child_env, worker_argv

    root = ROOT
    argv = worker_argv(settings, name=name, concurrency=concurrency, loglevel="INFO",
                              include=("workers_testtasks",))
    env = child_env(settings)
    env["PYTHONPATH"] = f"{root / 'tests'}{os.pathsep}{env['PYTHONPATH']}"
    return Child(name, argv, env, stdout=open(log_path, "ab"), cwd=str(root))


@pytest.mark.slow
def test_redis_killed_and_restarted_with_jobs_queued_running_and_finished(state_dir, settings, migrated_db, pk,
                                                                          tmp_path):
    """SIGKILL the broker while one job runs, two wait in the queue and one has finished; restart it.
    The queued jobs run (the append-only file kept them), the running one is retried and succeeds,
    every ref moves under a token above the repository's fence (no 'stale fencing token'), the
    finished job is left alone, the killed server is reaped (no zombie), the worker survives, and
    nothing stays stranded in the broker."""
    from packyard.store import fence
    from packyard.workers.broker import snapshot
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.reconcile import reconcile

    root = settings.storage_roots[0][1]          # queued jobs address repositories inside a storage root
    root.mkdir(parents=True, exist_ok=True)
    repo = root / "r.git"
    git("init", "-q", "--bare", str(repo))
    from gitutil import commit_objects

    objects, commit = commit_objects(tmp_path, "restart\n")
    scratch = tmp_path / "scratch.git"
    pack = git("pack-objects", "--stdout", "--revs", git_dir=scratch, input=f"{commit}\n".encode())
    git("index-pack", "--stdin", git_dir=repo, input=pack)
    (repo / "packyard").mkdir()
    (repo / "packyard" / "fence").write_text("11\n")          # refs here already moved under token 11

    server = EmbeddedRedis(state_dir).start()
    own = replace(settings, state_dir=state_dir, redis_url=f"unix://{state_dir / 'redis.sock'}",
                  embedded_redis=False, lock_ttl=2.0, broker_outage_wait=120.0)
    app = own_app(own)
    name = f"restart-{os.getpid()}@%h"
    worker = start_worker(own, name, state_dir / "worker.log")
    restarted = None
    try:
        pk.wait_until(lambda: ping(app, name.replace("%h", os.uname().nodename)), 60, interval=0.2,
                      what="the worker to answer")

        def send(ref: str, steps: int) -> str:
            return app.send_task("packyard.test_slow_ref",
                                 kwargs={"repo": str(repo), "ref": ref, "new": commit, "steps": steps}).id

        def state(task_id: str) -> str | None:
            job = pk.job_row(task_id)
            return job.state.value if job is not None else None

        finished = send("refs/heads/finished", 1)
        pk.wait_until(lambda: state(finished) == "SUCCESS", 60, what="the finished job")
        finished_row = pk.job_row(finished)
        running = send("refs/heads/running", 50)
        pk.wait_until(lambda: state(running) == "STARTED", 60, what="the running job to start")
        queued = [send(f"refs/heads/queued{i}", 1) for i in range(2)]
        with server.client() as c:
            pk.wait_until(lambda: set(queued) <= snapshot(c).queued, 30, what="two jobs waiting in the queue")

        killed = server.process.pid
        os.kill(killed, signal.SIGKILL)
        pk.wait_until(lambda: proc_state(killed) is None, 30, interval=0.1,
                      what="the killed redis-server to be reaped, not left a zombie")
        time.sleep(5)   # the outage: longer than the 2 s lease TTL, so the running job's lease is gone
        restarted = EmbeddedRedis(state_dir).start()

        jobs = [running, *queued]
        pk.wait_until(lambda: all(state(t) == "SUCCESS" for t in jobs), 180, interval=0.5,
                      what=f"the running and queued jobs to succeed (states: {[state(t) for t in jobs]})")
        run_row = pk.job_row(running)
        assert run_row.retries >= 1 and run_row.attempts >= 2, "the running job was retried, not failed"
        tokens = [pk.job_row(t).counters["token"] for t in (finished, *jobs)]
        assert min(tokens) > 11 and len(set(tokens)) == len(tokens)
        assert fence.recorded_token(repo) == max(tokens)
        for ref in ("finished", "running", "queued0", "queued1"):
            assert git("rev-parse", f"refs/heads/{ref}", git_dir=repo).decode().strip() == commit
        git("fsck", "--full", "--strict", git_dir=repo)
        assert worker.poll() is None, "the worker survived the restart"
        log = (state_dir / "worker.log").read_text(errors="replace")
        assert "Unrecoverable error" not in log and "stale fencing token" not in log

        # Nothing stays stranded: the reconciler puts back any delivery nobody holds, and the
        # redelivery of a finished job is acknowledged without running.
        with restarted.client() as c:
            def drained() -> bool:
                reconcile(replace(own, lost_after=1.0), app, c, inspect_timeout=1.0)
                return not snapshot(c).deliveries and not snapshot(c).queued
            pk.wait_until(drained, 60, interval=0.5, what="no delivery left in the broker")
        assert all(state(t) == "SUCCESS" for t in (finished, *jobs))
        again = pk.job_row(finished)
        assert (again.attempts, again.finished_at, again.counters) == (1, finished_row.finished_at,
                                                                        finished_row.counters)
    finally:
        worker.stop()
        if restarted is not None:
            restarted.stop()
        server.stop()
