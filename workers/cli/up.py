"""packyard up: embedded Redis + migrations + a worker + beat, until Ctrl-C."""
from __future__ import annotations

import argparse
import signal
import time

from packyard.workers.cli.children import Child, beat_argv, child_env, worker_argv
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "up", help="run Redis (embedded), migrations, a worker and beat until Ctrl-C",
        description="Everything on one host: create the storage roots and the incoming dir, start (or reuse) the "
                    "embedded Redis, migrate the database, start a prefork worker and beat; an embedded Redis that "
                    "dies is started again on the same socket and data (AOF); on Ctrl-C/SIGTERM stop them (warm "
                    "shutdown) and Redis.")
    p.add_argument("-c", "--concurrency", type=int, default=None, help="worker processes")
    p.add_argument("--no-beat", action="store_true", help="do not run the scheduler")
    p.set_defaults(func=run)


class _Stop(Exception):
    pass


#: Rounds of the supervision loop (0.5 s each) between two checks that the embedded Redis is alive.
REDIS_CHECK_ROUNDS = 4


def create_dirs(s) -> list[str]:  # type: ignore[no-untyped-def]
    """The storage roots and the incoming dir (PACKYARD_STORAGE_ROOTS, PACKYARD_INCOMING_DIR), created when
    missing, so the first job finds them; the ones created."""
    created = []
    for path in (*(root for _name, root in s.storage_roots), s.incoming_path):
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            created.append(str(path))
    return created


def run(args: argparse.Namespace) -> int:
    from packyard.workers.records import upgrade_database

    s = get_settings()
    created = create_dirs(s)
    server = prepare_embedded(s, migrate=False)
    upgrade_database(s)
    env = child_env(s)
    children: list[Child] = []

    def stop(signum, _frame):  # type: ignore[no-untyped-def]
        raise _Stop(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        children.append(Child("worker", worker_argv(s, concurrency=args.concurrency), env))
        if not args.no_beat:
            children.append(Child("beat", beat_argv(s), env))
        print(f"packyard up: redis {s.redis_py_url}, database {s.database_url}; "
              f"{', '.join(f'{c.name} pid {c.pid}' for c in children)}. Ctrl-C to stop.", flush=True)
        if created:
            print(f"packyard up: created {', '.join(created)}", flush=True)
        rounds = 0
        while True:
            rounds += 1
            if server is not None and rounds % REDIS_CHECK_ROUNDS == 0:
                restarted = server.restart_if_dead()
                if restarted is not None:
                    print(f"packyard up: the embedded Redis had died; started it again (pid {restarted}) on "
                          f"{server.socket} with its data in {server.dir}", flush=True)
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
