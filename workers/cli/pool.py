"""packyard pool create|fetch|link|disconnect|delete|list: a fork network's object pool, in-process.

The same functions the queued jobs run (workers/commands/pool.py; ``packyard submit pool-link --repo F -p
pool=P`` queues one). ``--lock`` holds the leases the job would, in the same order (the pool's first).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from packyard.workers.cli.failures import call_store
from packyard.workers.cli.lease import EXIT_BUSY
from packyard.workers.cli.progress import make_progress

LABELS = {"counting objects": "Counting objects", "copying objects": "Copying objects",
          "counting commits": "Counting commits", "writing objects": "Writing objects",
          "compressing objects": "Compressing objects", "writing cruft objects": "Writing cruft objects"}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "pool", help="object pools: forks that share one copy of their objects",
        description="A pool holds the objects a fork network shares; each member reads them through "
                    "objects/info/alternates. create: a pool from a source repository (its refs kept under "
                    "refs/virtual/<key>/); fetch: the source's new objects and refs into the pool; link: make a "
                    "fork a member (alternates written durably, then the objects the pool has dropped from the "
                    "fork, as `git repack -a -d -l`); disconnect: copy back what the fork borrows, verify it "
                    "alone, then remove its alternates; delete: refused while any member links to the pool. "
                    "Membership is recorded in PACKYARD_DATABASE_URL (list, status).")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--lock", action="store_true",
                        help="hold the leases the queued job holds (the pool's maintenance lease first)")
        sp.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                        help=f"with --lock: wait this long for each lease; then exit {EXIT_BUSY}")
        sp.add_argument("--json", action="store_true", help="print the result as JSON")
        sp.add_argument("--no-progress", action="store_true", help="no progress bars even on a terminal")

    c = sub.add_parser("create", help="make a pool from a source repository")
    c.add_argument("--pool", required=True, metavar="PATH", help="the pool repository to make (empty or absent)")
    c.add_argument("--source", required=True, metavar="PATH", help="the repository whose objects it starts with")
    c.add_argument("--key", default=None, help="the source's namespace key (default: from its path)")
    common(c)
    f = sub.add_parser("fetch", help="bring a member's (default: the source's) new objects and refs into the pool")
    f.add_argument("--pool", required=True, metavar="PATH")
    f.add_argument("--source", default=None, metavar="PATH", help="default: the source the pool was made from")
    f.add_argument("--key", default=None, help="the namespace key (default: from the source's path)")
    common(f)
    ln = sub.add_parser("link", help="make a repository a member of the pool")
    ln.add_argument("--pool", required=True, metavar="PATH")
    ln.add_argument("--repo", required=True, metavar="PATH", help="the fork")
    common(ln)
    d = sub.add_parser("disconnect", help="make a member whole again and unlink it")
    d.add_argument("--repo", required=True, metavar="PATH", help="the member")
    d.add_argument("--pool", default=None, metavar="PATH", help="default: the pool its alternates name")
    common(d)
    rm = sub.add_parser("delete", help="delete a pool that no repository links to")
    rm.add_argument("--pool", required=True, metavar="PATH")
    common(rm)
    ls = sub.add_parser("list", help="the recorded pools and their members")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.add_argument("--check", action="store_true",
                    help="compare each recorded pool's members with its members file on disk (exit 1 if they differ)")
    p.set_defaults(func=run, logs=False)


def _leases(args: argparse.Namespace, pool: str, member: str | None, *, refs: bool = False,
            ingest: bool = False):  # type: ignore[no-untyped-def]
    from contextlib import ExitStack, contextmanager, nullcontext

    if not args.lock:
        return nullcontext()

    @contextmanager
    def held():  # type: ignore[no-untyped-def]
        from packyard.workers import logs as plog
        from packyard.workers.cli.lease import LeaseBusy
        from packyard.workers.locks import LockTimeout, pool_leases
        from packyard.workers.settings import get_settings

        s = get_settings()
        plog.configure_from_settings(s)
        stack = ExitStack()
        try:
            joint = stack.enter_context(pool_leases(s, pool, member, refs=refs, ingest=ingest, wait=args.wait))
        except LockTimeout as err:
            print(f"packyard pool {args.action}: lease busy: {err}", file=sys.stderr)
            raise LeaseBusy(str(err)) from err
        with stack:
            yield joint

    return held()


def run(args: argparse.Namespace) -> int:
    from packyard.workers.cli.prepare import prepare_embedded
    from packyard.workers.settings import get_settings

    s = get_settings()
    prepare_embedded(s, migrate=True)   # membership is recorded: the embedded database needs its tables
    if args.action == "list":
        return _list(args)
    from packyard.workers.commands import pool as command

    progress = make_progress(args, labels=LABELS)
    name = f"pool {args.action}"
    result: dict[str, Any]
    if args.action == "create":
        call_store(name, None, command.prepare_pool_dir, args.pool)
        with _leases(args, args.pool, None, refs=True) as lease:
            result = call_store(name, progress, command.create, args.pool, args.source, key=args.key, lease=lease,
                                progress=progress)
    elif args.action == "fetch":
        with _leases(args, args.pool, None, refs=True) as lease:
            result = call_store(name, progress, command.fetch, args.pool, args.source, key=args.key, lease=lease,
                                progress=progress)
    elif args.action == "link":
        with _leases(args, args.pool, args.repo) as lease:
            result = call_store(name, progress, command.link, args.repo, args.pool, lease=lease, progress=progress)
    elif args.action == "disconnect":
        pool = args.pool
        if pool is None:
            from packyard.workers.repos import open_repository

            pool = str(call_store(name, None, lambda: command.pool_of(open_repository(args.repo))))
        with _leases(args, pool, args.repo, ingest=True) as lease:
            result = call_store(name, progress, command.disconnect, args.repo, pool, lease=lease, progress=progress)
    else:
        with _leases(args, args.pool, None) as lease:
            result = call_store(name, progress, command.delete, args.pool, lease=lease)
    if args.json:
        print(json.dumps(result, default=str))
    else:
        c = result["counters"]
        parts = [f"{k}={v}" for k, v in c.items()
                 if k in ("objects_copied", "objects_reachable", "refs_updated", "repack_objects_out",
                          "repack_borrowed", "repack_packs_merged", "repack_loose_deleted", "leftovers_removed")]
        print(f"pool {args.action}: {result['outcome']} ({result['pool']}"
              f"{', member ' + result['member'] if 'member' in result else ''}) {' '.join(parts)}".rstrip())
    return 0


def _list(args: argparse.Namespace) -> int:
    from packyard.workers.records.pools import list_pools
    from packyard.workers.settings import get_settings

    rows = list_pools(get_settings())
    differ = 0
    for row, count in rows:
        disk: dict[str, Any] | None = None
        if args.check:
            from packyard.store.errors import StoreError
            from packyard.workers.commands.pool import describe

            try:
                disk = describe(row.path)
            except StoreError as err:
                disk = {"error": f"{type(err).__name__}: {err}", "members": []}
            if sorted(disk["members"]) != sorted(row.members) or "error" in disk:
                differ += 1
        if args.json:
            out: dict[str, Any] = {"pool": row.path, "source": row.source, "created_at": row.created_at,
                   "last_fetched_at": row.last_fetched_at, "fetches": row.fetches, "member_count": count,
                   "members": list(row.members)}
            if disk is not None:
                out["disk"] = disk
            print(json.dumps(out, default=str))
            continue
        fetched = row.last_fetched_at.strftime("%Y-%m-%d %H:%M") if row.last_fetched_at else "-"
        print(f"{row.path}\tsource {row.source or '-'}\t{count} member(s)\tlast fetch {fetched} "
              f"({row.fetches} fetches)")
        for m in row.members:
            print(f"  member\t{m}")
        if count > len(row.members):
            print(f"  ... {count - len(row.members)} more")
        if disk is not None and sorted(disk["members"]) != sorted(row.members):
            print(f"  DIFFERS from the members file on disk: {disk.get('error') or disk['members']}")
    if not rows and not args.json:
        print("no pools recorded")
    return 1 if differ else 0
