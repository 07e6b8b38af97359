"""The ``packyard`` command line. One module per command, each with ``register(subparsers)``.

A command module::

    def register(subparsers) -> None:
        p = subparsers.add_parser("name", help="one line", description="more")
        add_repo_arg(p)                   # cli/args.py; every command acting on a repository: --repo PATH
        p.set_defaults(func=run)          # logs=False: runs in-process, prints only; logging not configured
                                          # exit_at_once=True: a one-shot command; the program ends without
                                          # the interpreter's teardown (entry(), exit_at_once())

    def run(args) -> int: ...            # exit status

Add one line to COMMANDS below: ``"name": ("module", "the help= line"),``. Benchmarks go under
``workers/cli/bench/`` the same way.

What the commands share, one module each: ``args`` (``--repo``, ``--ref-update``, ``--fsck``), ``failures``
(a store error is one line on stderr and exit 1), ``lease`` (``--lock``: the maintenance lease, exit 75 when
busy), ``prepare`` (the embedded Redis and SQLite), ``children`` (Celery worker/beat/Flower processes),
``progress`` (tqdm bars), ``tasknames`` (``verify-repo`` → ``packyard.verify_repo``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

#: command name -> (module, the one line ``packyard --help`` shows). ``packyard --help`` lists them from here
#: without importing a command module; a command's run imports its module alone (a module's name need not be its
#: command's name; the line must equal the help= of the module's add_parser: tests/workers/test_cli_imports.py).
#: A bare module name (``"name": "module"``) also works: --help then imports that module for its line.
COMMANDS: dict[str, tuple[str, str] | str] = {
    "init": ("init", "create a bare repository"),
    "worker": ("worker", "run a Celery worker (prefork, events on)"),
    "beat": ("beat", "run the scheduler (nightly jobs)"),
    "flower": ("flower", "run the Flower dashboard"),
    "migrate": ("migrate", "apply database migrations (Alembic)"),
    "up": ("up", "run Redis (embedded), migrations, a worker and beat until Ctrl-C"),
    "submit": ("submit", "queue a job (by task name)"),
    "status": ("status", "recent jobs as a table"),
    "verify": ("verify", "verify a repository in-process"),
    "demo": ("demo", "run the whole service once: Redis, 2 workers, pushes, bulk writes, verify, status"),
    "bench": ("bench", "benchmarks against git (ratios)"),
    "down": ("down", "stop the embedded Redis left running under the state dir"),
    "import": ("import_tree", "commit a directory or tar archive onto a ref"),
    "unpack-objects": ("unpack_objects", "explode a small pack into loose objects"),
    "write-objects": ("write_objects", "write raw objects (JSON, base64) in one batch"),
    "gc": ("gc", "remove stale temp files of crashed writers"),
    "index-pack": ("index_pack", "ingest a pack (file or stdin) into a repository"),
    "repos": ("repos", "the repository registry (what nightly maintenance covers)"),
    "metrics": ("metrics", "serve Prometheus metrics from the job records"),
    "repack": ("repack", "repack a repository (full, geometric or loose) in-process"),
    "race": ("race", "race readers against repacks and pushes; every miss recorded; exit 1 on a lost read"),
    "races": ("races", "race events on record: counts per repository and kind, lost reads"),
    "janitor": ("janitor", "remove leftovers of dead jobs (by owner: the job records and Redis decide)"),
    "records": ("records", "the records database: prune old rows, daily counts"),
    "nfsim": ("nfsim", "simulated NFS client mounts (FUSE) for tests and benchmarks"),
    "pool": ("pool", "object pools: forks that share one copy of their objects"),
    "receive-pack": ("receive_pack", "receive a push from a git client on stdin/stdout (git receive-pack)"),
    "upload-pack": ("upload_pack", "serve a clone or fetch on stdin/stdout (git upload-pack, serving configuration)"),
    "backup": ("backup", "back a repository up into PACKYARD_BACKUP_ROOT (git bundles, full then incremental)"),
    "restore": ("restore", "restore a repository from its backups into a new repository"),
    "http": ("serve_http", "serve git's smart HTTP (push and fetch) for a frontend proxy, on loopback"),
}


def _module(entry: tuple[str, str] | str) -> str:
    return entry if isinstance(entry, str) else entry[0]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with ``only`` (a command name), just that command.

    Without ``only`` (``--help``, no command or an unknown word) each command is a one-line stub from
    COMMANDS, its module not imported: importing every command module cost ~0.1 s, which ``--help``
    paid; the command that runs is built by its own module's ``register`` (``only``).
    """
    parser = argparse.ArgumentParser(
        prog="packyard",
        description="Git object-storage maintenance service: Celery workers over bare repositories. "
                    "Configuration comes from PACKYARD_* environment variables (see workers/settings.py); "
                    "with none set, an embedded Redis and a SQLite file under ./.state are used.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, entry in COMMANDS.items():
        if only is not None and name != only:
            continue
        if only is None and not isinstance(entry, str):
            subparsers.add_parser(name, help=entry[1])
        else:
            importlib.import_module(f"packyard.workers.cli.{_module(entry)}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Configuration errors and OS errors (a missing file, a full disk) are one line on
    stderr naming the variable or the file, and a non-zero exit status; never a traceback."""
    return _run(argv)[0]


def entry() -> int:
    """The ``packyard`` program (pyproject's script): :func:`main`, then, for a command that sets
    ``exit_at_once`` (the one-shot ingest commands git's receive-pack would run per push), :func:`exit_at_once`."""
    status, args = _run(None)
    if getattr(args, "exit_at_once", False):
        exit_at_once(status)
    return status


def exit_at_once(status: int) -> None:
    """End the process now, as the interpreter's exit would but without tearing down every module and object
    (~13 ms of a 0.2 s thin push to a fork, measured: the command has closed its files, and the pages go
    with the process). What a normal exit does that matters still happens: the atexit handlers run (logging's
    among them) and stdout and stderr are flushed. Returns without exiting -- the interpreter's exit then
    runs -- when a thread other than this one is alive (exit joins it) or a flush fails (exit reports it)."""
    import atexit
    import os

    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:
        return
    run_handlers()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(status & 0xFF)


def _run(argv: list[str] | None) -> tuple[int, argparse.Namespace]:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(only=argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    try:
        if getattr(args, "logs", True):
            # Commands that run in this process and only print a result (set_defaults(logs=False))
            # skip it: importing structlog (and the asyncio it pulls in) is ~40 ms per start.
            from packyard.workers import logs as plog
            from packyard.workers.settings import get_settings

            plog.configure_from_settings(get_settings())
        return int(args.func(args) or 0), args
    except KeyboardInterrupt:
        return 130, args
    except Exception as err:
        return _failed(args, err), args


def _failed(args: argparse.Namespace, err: Exception) -> int:
    """The exit status for a command's error (its classes imported only now: ``packyard receive-pack`` handing
    its push to a server must not pay for the settings' import), or the error raised again."""
    from packyard.workers.cli.failures import CommandFailed
    from packyard.workers.cli.lease import EXIT_BUSY, LeaseBusy
    from packyard.workers.settings import SettingsError

    if isinstance(err, LeaseBusy):
        return EXIT_BUSY  # already reported on stderr
    if isinstance(err, CommandFailed):
        return 1  # already reported on stderr by failures.call_store
    if isinstance(err, SettingsError):
        print(f"packyard {args.command}: configuration error: {err}", file=sys.stderr)
        return 2
    if isinstance(err, OSError):
        print(f"packyard {args.command}: {describe_os_error(err)}", file=sys.stderr)
        return 1
    raise err


def describe_os_error(err: OSError) -> str:
    """``<file>: <errno text>`` (both files for a rename), or the error's own text when it names none."""
    text = err.strerror or str(err)
    if err.filename is not None and err.filename2 is not None:
        return f"{err.filename} -> {err.filename2}: {text}"
    if err.filename is not None:
        return f"{err.filename}: {text}"
    return text


if __name__ == "__main__":
    sys.exit(entry())
