"""The ``packyard`` command line. One module per command, each with ``register(subparsers)``.

A command module::

    def register(subparsers) -> None:
        p = subparsers.add_parser("name", help="one line", description="more")
        add_repo_arg(p)                   # cli/args.py; every command acting on a repository: --repo PATH
        p.set_defaults(func=run)          # logs=False: runs in-process, prints only; logging not configured

    def run(args) -> int: ...            # exit status

Add the module to COMMANDS below. Benchmarks go under ``workers/cli/bench/`` the same way.

What the commands share, one module each: ``args`` (``--repo``, ``--ref-update``, ``--fsck``), ``failures``
(a store error is one line on stderr and exit 1), ``lease`` (``--lock``: the maintenance lease, exit 75 when
busy), ``prepare`` (the embedded Redis and SQLite), ``children`` (Celery worker/beat/Flower processes),
``progress`` (tqdm bars), ``tasknames`` (``verify-repo`` → ``packyard.verify_repo``).
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command name -> module (a module's name need not be its command's name)
COMMANDS = {
    "init": "init", "worker": "worker", "beat": "beat", "flower": "flower", "migrate": "migrate", "up": "up",
    "submit": "submit", "status": "status", "verify": "verify", "demo": "demo", "bench": "bench", "down": "down",
    "import": "import_tree", "unpack-objects": "unpack_objects", "write-objects": "write_objects", "gc": "gc",
    "index-pack": "index_pack", "repos": "repos", "metrics": "metrics", "repack": "repack",
    "race": "race", "races": "races", "janitor": "janitor", "records": "records",
    "nfsim": "nfsim", "pool": "pool",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with ``only`` (a command name), just that command.

    Building every subparser costs ~35 ms, a third of a small import's run time; ``main``
    builds only the command it was asked for (the full set for ``--help`` or an unknown word).
    """
    parser = argparse.ArgumentParser(
        prog="packyard",
        description="Git object-storage maintenance service: Celery workers over bare repositories. "
                    "Configuration comes from PACKYARD_* environment variables (see workers/settings.py); "
                    "with none set, an embedded Redis and a SQLite file under ./.state are used.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"packyard.workers.cli.{module}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. Configuration errors and OS errors (a missing file, a full disk) are one line on
    stderr naming the variable or the file, and a non-zero exit status; never a traceback."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(only=argv[0] if argv and argv[0] in COMMANDS else None).parse_args(argv)
    from packyard.workers.cli.failures import CommandFailed
    from packyard.workers.cli.lease import EXIT_BUSY, LeaseBusy
    from packyard.workers.settings import SettingsError

    try:
        if getattr(args, "logs", True):
            # Commands that run in this process and only print a result (set_defaults(logs=False))
            # skip it: importing structlog (and the asyncio it pulls in) is ~40 ms per start.
            from packyard.workers import logs as plog
            from packyard.workers.settings import get_settings

            plog.configure_from_settings(get_settings())
        return int(args.func(args) or 0)
    except LeaseBusy:
        return EXIT_BUSY  # already reported on stderr
    except CommandFailed:
        return 1  # already reported on stderr by failures.call_store
    except SettingsError as err:
        print(f"packyard {args.command}: configuration error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"packyard {args.command}: {describe_os_error(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def describe_os_error(err: OSError) -> str:
    """``<file>: <errno text>`` (both files for a rename), or the error's own text when it names none."""
    text = err.strerror or str(err)
    if err.filename is not None and err.filename2 is not None:
        return f"{err.filename} -> {err.filename2}: {text}"
    if err.filename is not None:
        return f"{err.filename}: {text}"
    return text


if __name__ == "__main__":
    sys.exit(main())
