"""packyard repos list|add|remove|enable|disable: the repositories the nightly maintenance run covers."""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.prepare import is_default_sqlite
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "repos", help="the repository registry (what nightly maintenance covers)",
        description="Every repository a job was admitted to (inside a storage root) is registered (enabled). "
                    "The nightly window plans the "
                    "enabled ones. `remove` forgets a repository (its job rows stay, unlinked); `disable` keeps "
                    "its history but leaves it out of maintenance.")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="registered repositories, their counters and last plan")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.add_argument("--outside", action="store_true",
                    help="only registered paths outside the storage roots (left by versions that registered a "
                         "path before confining it)")
    sub.add_parser("remove-outside", help="forget every registered path outside the storage roots "
                                          "(PACKYARD_STORAGE_ROOTS); their job rows stay, unlinked")
    for name, help_ in (("add", "register a repository (enabled)"), ("remove", "forget a repository"),
                        ("enable", "include it in maintenance"), ("disable", "leave it out of maintenance")):
        sp = sub.add_parser(name, help=help_)
        add_repo_arg(sp)
    p.set_defaults(func=run, logs=False)


def _outside(settings, path: str) -> bool:  # type: ignore[no-untyped-def]
    """Does a registered path lie outside every storage root (the boundary would refuse a job on it)?"""
    from packyard.store.errors import InvalidInputError
    from packyard.workers.confine import Confinement

    try:
        Confinement.from_settings(settings).repository(path)
    except InvalidInputError:
        return True
    return False


def _t(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M") if t else "-"


def run(args: argparse.Namespace) -> int:
    from packyard.workers.records import registry

    s = get_settings()
    if is_default_sqlite(s):  # embedded: the database may not exist yet
        from packyard.workers.records import upgrade_database

        upgrade_database(s)
    if args.action == "remove-outside":
        gone = [r["path"] for r in registry.list_repositories(s) if _outside(s, r["path"])]
        for path in gone:
            unlinked = registry.remove(s, path)
            print(f"removed {path} (outside the storage roots; {unlinked or 0} job row(s) kept, unlinked)")
        if not gone:
            print("no registered path lies outside the storage roots")
        return 0
    if args.action == "list":
        rows = registry.list_repositories(s)
        if args.outside:
            rows = [r for r in rows if _outside(s, r["path"])]
        if args.json:
            for r in rows:
                print(json.dumps(r, default=str))
            return 0
        if not rows:
            print("no repositories registered")
            return 0
        print(f"{'id':>4}  {'enabled':7}  {'ingests':>7}  {'last repack':16}  {'last full':16}  "
              f"{'planned':16}  plan  path")
        for r in rows:
            plan = r["last_plan"] or {}
            what = f"{plan.get('action') or '-'}/{plan.get('outcome') or '-'}" if plan else "-"
            print(f"{r['id']:>4}  {'yes' if r['enabled'] else 'no':7}  {r['ingests_since_repack']:>7}  "
                  f"{_t(r['last_repack_at']):16}  {_t(r['last_full_repack_at']):16}  {_t(r['last_planned_at']):16}  "
                  f"{what}  {r['path']}")
        return 0
    if args.action == "add":
        from packyard.store.errors import StoreError
        from packyard.store.repo import find_git_dir

        try:
            path = find_git_dir(args.repo)
        except StoreError as err:
            print(f"packyard repos add: {type(err).__name__}: {err}", file=sys.stderr)
            return 1
        row, created = registry.register(s, path)
        print(f"{'registered' if created else 'already registered (enabled)'}: {row['path']}")
        return 0
    if args.action == "remove":
        unlinked = registry.remove(s, args.repo)
        if unlinked is None:
            print(f"packyard repos remove: not registered: {registry.normalize(args.repo)}", file=sys.stderr)
            return 1
        print(f"removed {registry.normalize(args.repo)} ({unlinked} job row(s) kept, unlinked)")
        return 0
    enabled = args.action == "enable"
    if not registry.set_enabled(s, args.repo, enabled):
        print(f"packyard repos {args.action}: not registered: {registry.normalize(args.repo)}", file=sys.stderr)
        return 1
    print(f"{args.action}d {registry.normalize(args.repo)}")
    return 0

