"""Child processes of the CLI (Celery worker, beat, Flower): their command lines, environment and process
groups, and waiting for workers to answer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Sequence

from packyard.workers.settings import Settings


def child_env(s: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(s.as_env())
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if extra:
        env.update(extra)
    return env


def celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "packyard.workers.app", *args]


def worker_argv(s: Settings, name: str = "packyard@%h", concurrency: int | None = None,
                loglevel: str | None = None, queues: Sequence[str] = (), include: Sequence[str] = ()) -> list[str]:
    extra = [f"--queues={','.join(queues)}"] if queues else []
    extra += [f"--include={','.join(include)}"] if include else []
    return celery_argv("worker", "--pool=prefork", f"--concurrency={concurrency or s.worker_concurrency}",
                       "--task-events", f"--hostname={name}", f"--loglevel={loglevel or s.log_level}", *extra)


def beat_argv(s: Settings) -> list[str]:
    return celery_argv("beat", f"--schedule={s.state_dir / 'celerybeat-schedule'}",
                       f"--pidfile={s.state_dir / 'celerybeat.pid'}", f"--loglevel={s.log_level}")


def flower_argv(port: int, address: str) -> list[str]:
    """Flower's command line; credentials go through its environment (FLOWER_BASIC_AUTH), not argv. It runs
    Celery's CLI through packyard's wrapper, which puts /metrics behind the same credentials (cli/flower.py)."""
    return [sys.executable, "-m", "packyard.workers.cli.flower", "-A", "packyard.workers.app", "flower",
            f"--port={port}", f"--address={address}"]


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies, so a killed supervisor leaves no orphans."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """A child process in its own process group, stopped with the whole group."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], stdout: IO[bytes] | int | None = None,
                 cwd: str | None = None, die_with_parent: bool = True) -> None:
        self.name = name
        self.proc = subprocess.Popen(list(argv), env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                     preexec_fn=_die_with_parent if die_with_parent else None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM the group (Celery: warm shutdown), then SIGKILL it after ``timeout``."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Whatever is left of the group (prefork children) goes too.
        self._signal_group(signal.SIGKILL)
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return -9


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def ping_workers(timeout: float = 1.0) -> list[str]:
    """Names of the Celery workers answering a broadcast ping."""
    from packyard.workers.app import app

    replies = app.control.ping(timeout=timeout) or []
    return [name for reply in replies for name in reply]
