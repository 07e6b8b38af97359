"""packyard worker: exec a real `celery worker` (prefork pool, task events on)."""
from __future__ import annotations

import argparse
import os

from packyard.workers.cli.children import child_env, worker_argv
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "worker", help="run a Celery worker (prefork, events on)",
        description="Exec `celery -A packyard.workers.app worker --pool=prefork --task-events`. With embedded defaults "
                    "the Redis server is started (or reused) and the SQLite database migrated first.")
    p.add_argument("-c", "--concurrency", type=int, default=None,
                   help="prefork processes (default PACKYARD_WORKER_CONCURRENCY)")
    p.add_argument("-n", "--name", default="packyard@%h", help="worker node name (default packyard@%%h)")
    p.add_argument("-l", "--loglevel", default=None, help="log level (default PACKYARD_LOG_LEVEL)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = get_settings()
    prepare_embedded(s)
    argv = worker_argv(s, args.name, args.concurrency, args.loglevel)
    os.execve(argv[0], argv, child_env(s))
    return 0  # not reached
