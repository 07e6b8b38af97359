"""packyard flower: the Flower dashboard against the same broker."""
from __future__ import annotations

import argparse
import os

from packyard.workers.cli import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "flower", help="run the Flower dashboard",
        description="Exec `celery -A packyard.workers.app flower` against the configured broker. "
                    "HTTP API: /api/tasks, /api/workers.")
    p.add_argument("--port", type=int, default=5555, help="HTTP port (default 5555)")
    p.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--basic-auth", metavar="USER:PASSWORD", help="protect the dashboard and API with basic auth")
    p.add_argument("--unauthenticated-api", action="store_true",
                   help="serve the HTTP API without authentication (trusted networks only; "
                        "same as FLOWER_UNAUTHENTICATED_API=true)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = common.settings()
    common.prepare_embedded(s, migrate=False)
    argv = common.flower_argv(args.port, args.address, args.basic_auth)
    env = common.child_env(s, {"FLOWER_UNAUTHENTICATED_API": "true"} if args.unauthenticated_api else None)
    os.execve(argv[0], argv, env)
    return 0
