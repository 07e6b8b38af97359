"""packyard flower: the Flower dashboard against the same broker, never open by accident.

Flower's HTTP API can queue any task (``/api/task/async-apply``), so the dashboard is a way in:

* it listens on 127.0.0.1 unless ``--address`` says otherwise;
* it needs basic-auth credentials, from ``--basic-auth USER:PASSWORD`` or (better: not visible in
  ``ps``) the ``FLOWER_BASIC_AUTH`` environment variable, Flower's own; empty credentials, a
  well-known default password (``change-me``, ``admin``, ...) or one shorter than
  MIN_PASSWORD_LENGTH refuse to start;
* ``--insecure-local`` lifts that for a dashboard on the loopback interface only (a developer's
  machine); ``--unauthenticated-api`` (serve the API without credentials) requires it.

The credentials reach Flower through its environment (``FLOWER_BASIC_AUTH``), not its argv.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from packyard.workers.cli import common

MIN_PASSWORD_LENGTH = 12
#: Passwords refused whatever their length: defaults of sample configurations, ours included.
DEFAULT_PASSWORDS = frozenset({"change-me", "changeme", "change_me", "admin", "password", "passw0rd", "secret",
                               "flower", "packyard", "celery", "guest", "root", "test", "12345678", "123456789012"})


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "flower", help="run the Flower dashboard",
        description="Exec `celery -A packyard.workers.app flower` against the configured broker. "
                    "HTTP API: /api/tasks, /api/workers. Requires basic-auth credentials (--basic-auth or "
                    "FLOWER_BASIC_AUTH=user:password, the password at least "
                    f"{MIN_PASSWORD_LENGTH} characters and not a default) unless --insecure-local.")
    p.add_argument("--port", type=int, default=5555, help="HTTP port (default 5555)")
    p.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--basic-auth", metavar="USER:PASSWORD",
                   help="protect the dashboard and API with basic auth (prefer FLOWER_BASIC_AUTH in the "
                        "environment: command lines are visible to every user of the host)")
    p.add_argument("--insecure-local", action="store_true",
                   help="allow missing or weak credentials; only with a loopback --address")
    p.add_argument("--unauthenticated-api", action="store_true",
                   help="serve the HTTP API without authentication (requires --insecure-local)")
    p.set_defaults(func=run)


class Refused(Exception):
    """The dashboard would be open to others: the message says why and what to set."""


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def credential_problem(basic_auth: str) -> str | None:
    """Why ``user:password[,user:password...]`` is not acceptable, or None."""
    for pair in basic_auth.split(","):
        user, sep, password = pair.partition(":")
        if not sep or not user.strip() or not password:
            return "credentials must be user:password with both parts non-empty"
        if password.lower() in DEFAULT_PASSWORDS:
            return f"the password of {user!r} is a well-known default"
        if len(password) < MIN_PASSWORD_LENGTH:
            return f"the password of {user!r} is shorter than {MIN_PASSWORD_LENGTH} characters"
    return None


def check_exposure(address: str, basic_auth: str | None, insecure_local: bool, unauthenticated_api: bool) -> None:
    """Raise Refused unless this dashboard is protected (or explicitly local and insecure)."""
    if insecure_local:
        if not _is_loopback(address):
            raise Refused(f"--insecure-local only listens on the loopback interface, not {address!r}")
        return
    if unauthenticated_api:
        raise Refused("--unauthenticated-api serves the API to anyone: it needs --insecure-local")
    if not basic_auth:
        raise Refused("no credentials: set FLOWER_BASIC_AUTH=user:password (or --basic-auth), or pass "
                      "--insecure-local for a loopback-only dashboard")
    problem = credential_problem(basic_auth)
    if problem is not None:
        raise Refused(f"{problem}; choose a real password (FLOWER_BASIC_AUTH), or pass --insecure-local for a "
                      "loopback-only dashboard")


def run(args: argparse.Namespace) -> int:
    basic_auth = args.basic_auth or os.environ.get("FLOWER_BASIC_AUTH") or None
    try:
        check_exposure(args.address, basic_auth, args.insecure_local, args.unauthenticated_api)
    except Refused as err:
        print(f"packyard flower: refusing to start: {err}", file=sys.stderr)
        return 2
    s = common.settings()
    common.prepare_embedded(s, migrate=False)
    argv = common.flower_argv(args.port, args.address)
    env = common.child_env(s)
    # Only what was checked here reaches Flower: no API opened by a stray variable in the environment.
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    env.pop("FLOWER_BASIC_AUTH", None)
    if basic_auth:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    if args.unauthenticated_api:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    os.execve(argv[0], argv, env)
    return 0
