"""Helpers shared by the CLI commands: the --repo convention, settings, child processes."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from packyard.workers.settings import Settings, get_settings


def add_repo_arg(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--repo", metavar="PATH", required=required,
                        help="repository path (bare repository, or a work tree with .git)")


def add_ref_update_arg(parser: argparse.ArgumentParser) -> None:
    """``--ref-update REF:OLD:NEW`` (repeatable; empty OLD = the ref must not exist yet)."""
    parser.add_argument("--ref-update", action="append", default=[], metavar="REF:OLD:NEW",
                        type=_ref_update, help="after the objects are durable, move REF from OLD to NEW "
                        "(compare-and-swap, all or nothing; empty OLD: the ref must not exist)")


def add_fsck_args(parser: argparse.ArgumentParser) -> None:
    """``--fsck MSG=SEV`` (repeatable; git's receive.fsck.<msg-id>) and ``--fsck-skiplist FILE`` (fsck.skipList),
    on top of PACKYARD_FSCK / PACKYARD_FSCK_SKIPLIST; either implies --strict."""
    parser.add_argument("--fsck", action="append", default=[], metavar="MSG=SEV",
                        help="severity of one fsck message id (error, warn or ignore), e.g. "
                        "zeroPaddedFilemode=ignore; implies --strict")
    parser.add_argument("--fsck-skiplist", metavar="FILE", default=None,
                        help="object ids (one a line, git's fsck.skipList) whose findings are ignored")


def fsck_options(args: argparse.Namespace) -> Any:
    """The FsckOptions of ``add_fsck_args`` over the settings' (a bad value ends the command)."""
    from packyard.store.errors import StoreError
    from packyard.workers.commands._bulk import fsck_options_of

    try:
        return fsck_options_of(args.fsck, args.fsck_skiplist)
    except StoreError as err:
        print(f"packyard: {err}", file=sys.stderr)
        raise CommandFailed(str(err)) from err


def _ref_update(item: str) -> dict[str, str | None]:
    parts = item.split(":")
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise argparse.ArgumentTypeError(f"bad --ref-update {item!r}: want REF:OLD:NEW")
    return {"ref": parts[0], "old": parts[1] or None, "new": parts[2]}


class CommandFailed(Exception):
    """A store error already reported on stderr; the command exits with status 1."""


def call_store(command: str, bar: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Run one store-backed command function; close its progress bar however it ends.

    A StoreError (bad input, corrupt data, a ref that moved) becomes one line on stderr,
    ``packyard <command>: <ErrorType>: <message naming file/object/offset>``, and
    CommandFailed, which ``main`` turns into exit status 1.
    """
    from packyard.store.errors import StoreError

    try:
        return fn(*args, **kwargs)
    except StoreError as err:
        print(f"packyard {command}: {type(err).__name__}: {err}", file=sys.stderr)
        raise CommandFailed(str(err)) from err
    finally:
        if bar:
            bar.close()


def settings() -> Settings:
    return get_settings()


#: Exit status of a command that gave up waiting for a lease (EX_TEMPFAIL: try again later).
EXIT_BUSY = 75


class LeaseBusy(CommandFailed):
    """The maintenance lease stayed taken for the whole ``--wait``; the command exits with EXIT_BUSY."""


def maintenance_lock_if(args: argparse.Namespace, command: str):  # type: ignore[no-untyped-def]
    """``--lock``: the repository's maintenance lease for this in-process command (waits ``--wait``);
    otherwise a context yielding None. A lease that stays taken is one line on stderr and LeaseBusy."""
    from contextlib import contextmanager, nullcontext

    if not getattr(args, "lock", False):
        return nullcontext()

    @contextmanager
    def held():  # type: ignore[no-untyped-def]
        from contextlib import ExitStack

        from packyard.workers.locks import LockTimeout, maintenance_lease

        s = settings()
        prepare_embedded(s, migrate=False)
        stack = ExitStack()
        try:
            lease = stack.enter_context(maintenance_lease(s, args.repo, wait=getattr(args, "wait", None)))
        except LockTimeout as err:
            print(f"packyard {command}: maintenance lease busy: {err}", file=sys.stderr)
            raise LeaseBusy(str(err)) from err
        with stack:
            yield lease

    return held()


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


def normalize_task_name(name: str) -> str:
    """``verify-repo`` / ``verify_repo`` / ``packyard.verify_repo`` → ``packyard.verify_repo``."""
    base = name.removeprefix("packyard.").replace("-", "_")
    return f"packyard.{base}"


def known_tasks() -> list[str]:
    import packyard.workers.tasks  # noqa: F401  (registers every task module)
    from packyard.workers.app import app

    return sorted(n for n in app.tasks if n.startswith("packyard."))


# -- progress bars -----------------------------------------------------------------------------------

def terminal_size(stream: Any, fallback: tuple[int, int] = (100, 24)) -> tuple[int, int]:
    """(columns, rows) of the terminal behind ``stream``; a terminal reporting 0 (a fresh pty) gets the fallback.

    tqdm hides every bar when it is told (or finds out by itself) that the screen has 0 rows,
    so both numbers are always passed to it, never left for tqdm to discover.
    """
    try:
        size = os.get_terminal_size(stream.fileno())
        columns, rows = size.columns, size.lines
    except (AttributeError, ValueError, OSError):
        columns, rows = 0, 0
    return columns or fallback[0], rows or fallback[1]


class TqdmProgress:
    """The CLI's one progress adapter: a ``progress(phase, done, total)`` callable driving one tqdm bar per phase.

    ``labels`` maps phase names to what the bar says (index-pack uses git's "Receiving objects" wording).
    """

    BAR_FORMAT = "{desc}: {percentage:3.0f}% ({n_fmt}/{total_fmt}) {bar} [{elapsed}, {rate_fmt}]"
    #: Phases that count bytes rather than objects (import_tree streaming a large file).
    BYTE_PHASES = frozenset({"hash", "compress"})
    BAR_FORMAT_NO_TOTAL = "{desc}: {n_fmt} [{elapsed}, {rate_fmt}]"

    def __init__(self, stream: Any = None, labels: Mapping[str, str] | None = None, unit: str = " obj") -> None:
        self.stream = stream or sys.stderr
        self.labels = dict(labels or {})
        self.unit = unit
        self.bar: Any = None
        self.phase: str | None = None

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            columns, rows = terminal_size(self.stream)
            in_bytes = phase in self.BYTE_PHASES
            self.bar = tqdm(total=total, desc=self.labels.get(phase, phase), file=self.stream,
                            unit="B" if in_bytes else self.unit, unit_scale=in_bytes, unit_divisor=1024,
                            leave=True, ncols=columns, nrows=rows, mininterval=0.2,
                            bar_format=self.BAR_FORMAT if total is not None else self.BAR_FORMAT_NO_TOTAL)
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def make_progress(args: argparse.Namespace, labels: Mapping[str, str] | None = None) -> TqdmProgress | None:
    """A progress adapter when stderr is a terminal and ``--no-progress`` was not given, else None."""
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        return None
    return TqdmProgress(labels=labels)
