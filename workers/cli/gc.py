"""packyard gc --repo R: remove temp files left by crashed batch writes (never a live batch's)."""
from __future__ import annotations

import argparse
import json

from workers.cli import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "gc", help="remove stale temp files of crashed writers",
        description="Scan every loose fan-out directory for tmp_obj_* files. Ours (tmp_obj_<pid>_<host>-<batch>_<n>) "
                    "are removed when their process is dead on this host and they are older than --stale-after; "
                    "others (another host, git's own) only after --foreign-after (git's prune expiry).")
    common.add_repo_arg(p)
    p.add_argument("--stale-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of a dead process's temp files (default 600)")
    p.add_argument("--foreign-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of temp files we cannot attribute (default 14 days)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from store import bulk
    from store.errors import StoreError
    from store.repo import Repository

    try:
        repo = Repository.open(args.repo)
        result = bulk.gc_stale_tmp(
            repo, stale_after=bulk.STALE_AFTER if args.stale_after is None else args.stale_after,
            foreign_after=bulk.FOREIGN_STALE_AFTER if args.foreign_after is None else args.foreign_after)
    except StoreError as err:
        print(f"packyard gc: {type(err).__name__}: {err}")
        return 1
    print(json.dumps({"repo": str(repo.path), **result}))
    return 0
