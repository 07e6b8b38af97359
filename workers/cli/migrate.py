"""packyard migrate: bring the records database to the latest schema."""
from __future__ import annotations

import argparse

from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("migrate", help="apply database migrations (Alembic)",
                              description="Upgrade PACKYARD_DATABASE_URL to a revision (default: head).")
    p.add_argument("--revision", default="head", help="target revision (default head)")
    p.add_argument("--downgrade", metavar="REV", help="downgrade to REV instead (e.g. base)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from packyard.workers.embedded import ensure_private_dir
    from packyard.workers.records import downgrade_database, upgrade_database

    s = get_settings()
    ensure_private_dir(s.state_dir)
    if args.downgrade:
        downgrade_database(s, args.downgrade)
        print(f"downgraded {_safe(s.database_url)} to {args.downgrade}")
    else:
        upgrade_database(s, args.revision)
        print(f"upgraded {_safe(s.database_url)} to {args.revision}")
    return 0


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
