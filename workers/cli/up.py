"""packyard up: embedded Redis + migrations + a worker + beat, until Ctrl-C."""
from __future__ import annotations

import argparse
import signal
import time

from packyard.workers.cli import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "up", help="run Redis (embedded), migrations, a worker and beat until Ctrl-C",
        description="Everything on one host: start (or reuse) the embedded Redis, migrate the database, "
                    "start a prefork worker and beat; on Ctrl-C/SIGTERM stop them (warm shutdown) and Redis.")
    p.add_argument("-c", "--concurrency", type=int, default=None, help="worker processes")
    p.add_argument("--no-beat", action="store_true", help="do not run the scheduler")
    p.set_defaults(func=run)


class _Stop(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    from packyard.workers.records import upgrade_database

    s = common.settings()
    server = common.prepare_embedded(s, migrate=False)
    upgrade_database(s)
    env = common.child_env(s)
    children: list[common.Child] = []

    def stop(signum, _frame):  # type: ignore[no-untyped-def]
        raise _Stop(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        children.append(common.Child("worker", common.worker_argv(s, concurrency=args.concurrency), env))
        if not args.no_beat:
            children.append(common.Child("beat", common.beat_argv(s), env))
        print(f"packyard up: redis {s.redis_py_url}, database {s.database_url}; "
              f"{', '.join(f'{c.name} pid {c.pid}' for c in children)}. Ctrl-C to stop.", flush=True)
        while True:
            for c in children:
                if c.poll() is not None:
                    print(f"packyard up: {c.name} exited with {c.poll()}; stopping", flush=True)
                    status = 1
                    raise _Stop(c.name)
            time.sleep(0.5)
    except _Stop:
        pass
    finally:
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)
        for c in reversed(children):
            c.stop()
        if server is not None:
            server.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        print("packyard up: stopped", flush=True)
    return status
