"""``--lock``: the repository's maintenance lease held by an in-process command, and its busy exit status."""
from __future__ import annotations

import argparse
import sys

from packyard.workers.cli.failures import CommandFailed
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.settings import get_settings as settings

#: Exit status of a command that gave up waiting for a lease (EX_TEMPFAIL: try again later).
EXIT_BUSY = 75


class LeaseBusy(CommandFailed):
    """The maintenance lease stayed taken for the whole ``--wait``; the command exits with EXIT_BUSY."""


def add_lease_args(parser: argparse.ArgumentParser, lock_help: str) -> None:
    """``--lock`` (its help says what the lease fences in this command) and ``--wait SECONDS``, read by
    ``maintenance_lock_if``."""
    parser.add_argument("--lock", action="store_true", help=lock_help)
    parser.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                        help="with --lock: wait this long for another maintenance job of the repository to finish "
                             f"(default: PACKYARD_MAINTENANCE_WAIT, 600); then give up with exit status {EXIT_BUSY}")


def maintenance_lock_if(args: argparse.Namespace, command: str):  # type: ignore[no-untyped-def]
    """``--lock``: the repository's maintenance lease for this in-process command (waits ``--wait``);
    otherwise a context yielding None. A lease that stays taken is one line on stderr and LeaseBusy."""
    from contextlib import contextmanager, nullcontext

    if not getattr(args, "lock", False):
        return nullcontext()

    @contextmanager
    def held():  # type: ignore[no-untyped-def]
        from contextlib import ExitStack

        from packyard.workers import logs as plog
        from packyard.workers.locks import LockTimeout, maintenance_lease

        s = settings()
        # The lease records its events (workers/locks.py): the embedded database must have its tables (a fresh
        # state dir has none), and what the lease logs goes to stderr, not into a --json result on stdout (the
        # in-process commands skip the log setup).
        prepare_embedded(s, migrate=True)
        plog.configure_from_settings(s)
        stack = ExitStack()
        try:
            lease = stack.enter_context(maintenance_lease(s, args.repo, wait=getattr(args, "wait", None)))
        except LockTimeout as err:
            print(f"packyard {command}: maintenance lease busy: {err}", file=sys.stderr)
            raise LeaseBusy(str(err)) from err
        with stack:
            yield lease

    return held()
