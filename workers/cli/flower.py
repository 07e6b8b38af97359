"""packyard flower: the Flower dashboard against the same broker, never open by accident.

Flower's HTTP API can queue any task (``/api/task/async-apply``), so the dashboard is a way in:

* it listens on 127.0.0.1 unless ``--address`` says otherwise;
* it needs basic-auth credentials, from ``--basic-auth USER:PASSWORD`` or (better: not visible in
  ``ps``) the ``FLOWER_BASIC_AUTH`` environment variable, Flower's own; empty credentials, a
  well-known default password (``change-me``, ``admin``, ``password1234``, ...) or a weak one
  (:func:`password_problem`: shorter than MIN_PASSWORD_LENGTH and not a passphrase of
  MIN_PASSPHRASE_WORDS words) refuse to start;
* Flower serves ``/metrics`` to anyone (its handler has no authentication): the process
  ``packyard flower`` execs (:func:`serve`) puts it behind the same credentials, unless
  ``--metrics-public`` (a scraper that cannot send basic auth, on a private network);
* ``--insecure-local`` lifts that for a dashboard on the loopback interface only (a developer's
  machine); ``--unauthenticated-api`` (serve the API without credentials) requires it.

The credentials reach Flower through its environment (``FLOWER_BASIC_AUTH``), not its argv.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import sys

from packyard.workers.cli.children import child_env, flower_argv
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.settings import get_settings

MIN_PASSWORD_LENGTH = 16
#: ... or a passphrase: this many different words of at least MIN_WORD_LETTERS letters.
MIN_PASSPHRASE_WORDS = 4
MIN_WORD_LETTERS = 3
#: A password of fewer different characters is refused whatever its length ("aaaaaaaaaaaaaaaa").
MIN_DISTINCT_CHARACTERS = 6
#: Set (to 1) by ``packyard flower --metrics-public`` for the Flower process it execs; removed otherwise.
METRICS_PUBLIC_ENV = "PACKYARD_FLOWER_METRICS_PUBLIC"
#: Passwords refused whatever their length: defaults of sample configurations, ours included.
DEFAULT_PASSWORDS = frozenset({"change-me", "changeme", "change_me", "admin", "password", "passw0rd", "secret",
                               "flower", "packyard", "celery", "guest", "root", "test", "12345678", "123456789012"})


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "flower", help="run the Flower dashboard",
        description="Exec `celery -A packyard.workers.app flower` against the configured broker. "
                    "HTTP API: /api/tasks, /api/workers. Requires basic-auth credentials (--basic-auth or "
                    "FLOWER_BASIC_AUTH=user:password, the password at least "
                    f"{MIN_PASSWORD_LENGTH} characters or a passphrase of {MIN_PASSPHRASE_WORDS} words, and not "
                    "a default) unless --insecure-local. /metrics needs them too, unless --metrics-public.")
    p.add_argument("--port", type=int, default=5555, help="HTTP port (default 5555)")
    p.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--basic-auth", metavar="USER:PASSWORD",
                   help="protect the dashboard and API with basic auth (prefer FLOWER_BASIC_AUTH in the "
                        "environment: command lines are visible to every user of the host)")
    p.add_argument("--insecure-local", action="store_true",
                   help="allow missing or weak credentials; only with a loopback --address")
    p.add_argument("--unauthenticated-api", action="store_true",
                   help="serve the HTTP API without authentication (requires --insecure-local)")
    p.add_argument("--metrics-public", action="store_true",
                   help="serve /metrics (Prometheus) without authentication; by default it needs the "
                        "dashboard's credentials")
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
        problem = password_problem(password)
        if problem is not None:
            return f"the password of {user!r} {problem}"
    return None


def password_problem(password: str) -> str | None:
    """Why ``password`` is too weak for a dashboard that can queue jobs (completes "the password ..."), or None.

    Strong enough: not a well-known default (also with digits or punctuation appended), at least
    MIN_DISTINCT_CHARACTERS different characters, and either MIN_PASSWORD_LENGTH long or a passphrase
    of MIN_PASSPHRASE_WORDS different words (letters, separated by spaces or punctuation).
    """
    lowered = password.lower()
    if lowered in DEFAULT_PASSWORDS:
        return "is a well-known default"
    if lowered.rstrip("0123456789!?.,-_ ") in DEFAULT_PASSWORDS:
        return "is a well-known default with digits or punctuation appended"
    words = {w for w in re.findall(r"[^\W\d_]+", lowered) if len(w) >= MIN_WORD_LETTERS}
    if len(password) < MIN_PASSWORD_LENGTH and len(words) < MIN_PASSPHRASE_WORDS:
        return (f"is {len(password)} characters: use at least {MIN_PASSWORD_LENGTH}, or a passphrase of "
                f"{MIN_PASSPHRASE_WORDS} or more words")
    if len(set(password)) < MIN_DISTINCT_CHARACTERS:
        return f"has fewer than {MIN_DISTINCT_CHARACTERS} different characters"
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
    s = get_settings()
    prepare_embedded(s, migrate=False)
    argv = flower_argv(args.port, args.address)
    env = child_env(s)
    # Only what was checked here reaches Flower: no API opened by a stray variable in the environment.
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    env.pop("FLOWER_BASIC_AUTH", None)
    env.pop(METRICS_PUBLIC_ENV, None)
    if args.metrics_public:
        env[METRICS_PUBLIC_ENV] = "1"
    if basic_auth:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    if args.unauthenticated_api:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    os.execve(argv[0], argv, env)
    return 0


def protect_metrics() -> None:
    """Put Flower's ``/metrics`` behind its authentication, as its other pages are (``web.authenticated``:
    basic auth answers 401 without valid credentials; with no credentials configured it stays open)."""
    from flower.views import monitor
    from tornado import web

    if not getattr(monitor.Metrics.get, "_packyard_protected", False):
        monitor.Metrics.get = web.authenticated(monitor.Metrics.get)  # type: ignore[method-assign]
        monitor.Metrics.get._packyard_protected = True  # type: ignore[attr-defined]


def serve() -> None:
    """The Flower process (``python -m packyard.workers.cli.flower -A packyard.workers.app flower ...``):
    /metrics protected unless METRICS_PUBLIC_ENV=1, then Celery's own command line."""
    if os.environ.get(METRICS_PUBLIC_ENV) != "1":
        protect_metrics()
    from celery.bin.celery import main

    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(main())


if __name__ == "__main__":
    serve()
