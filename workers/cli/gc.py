"""packyard gc --repo R: remove what crashed writers left behind (never a live writer's files).

* temp files of crashed batch writes (``objects/xx/tmp_obj_*``) and their batch markers;
* index-pack quarantines (``objects/incoming-*``) of ingests that died, once nothing in them
  was touched for ``--quarantine-after`` seconds (a live ingest keeps writing into its own);
* temp files of repacks that died (``objects/pack/tmp_*``), and packs a repack replaced that have
  stayed in ``objects/pack/preserved/`` longer than ``--preserve-for`` seconds.
"""
from __future__ import annotations

import argparse
import json

from packyard.workers.cli import common

QUARANTINE_AFTER = 3600.0  # seconds untouched before an incoming-* directory counts as abandoned


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "gc", help="remove stale temp files of crashed writers",
        description="Scan every loose fan-out directory for tmp_obj_* files. Ours (tmp_obj_<pid>_<host>-<batch>_<n>) "
                    "are removed when their process is dead on this host and they are older than --stale-after; "
                    "others (another host, git's own) only after --foreign-after (git's prune expiry). Also "
                    "remove index-pack quarantines (objects/incoming-*) untouched for --quarantine-after. "
                    "Prints one JSON line: what was removed.")
    common.add_repo_arg(p)
    p.add_argument("--stale-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of a dead process's temp files (default 600)")
    p.add_argument("--foreign-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of temp files we cannot attribute (default 14 days)")
    p.add_argument("--quarantine-after", type=float, default=QUARANTINE_AFTER, metavar="SECONDS",
                   help=f"minimum age of an abandoned index-pack quarantine (default {QUARANTINE_AFTER:.0f})")
    p.add_argument("--preserve-for", type=float, default=None, metavar="SECONDS",
                   help="remove preserved packs (objects/pack/preserved/) older than this "
                        "(default: PACKYARD_PRESERVE_SECONDS, 3600)")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.store import bulk
    from packyard.store.errors import StoreError
    from packyard.store.maintenance.preserved import expire_preserved
    from packyard.store.maintenance.leftovers import remove_stale_temp_files
    from packyard.store.pack.indexpack import remove_stale_quarantines
    from packyard.store.repo import Repository

    try:
        repo = Repository.open(args.repo)
        result = bulk.gc_stale_tmp(
            repo, stale_after=bulk.STALE_AFTER if args.stale_after is None else args.stale_after,
            foreign_after=bulk.FOREIGN_STALE_AFTER if args.foreign_after is None else args.foreign_after)
        quarantines = remove_stale_quarantines(repo, older_than=args.quarantine_after)
        pack_dir = repo.objects.path / "pack"
        result["stale_pack_tmp_removed"] = remove_stale_temp_files(pack_dir)
        result["preserved_packs_expired"] = expire_preserved(
            pack_dir, common.settings().preserve_seconds if args.preserve_for is None else args.preserve_for)
    except StoreError as err:
        print(f"packyard gc: {type(err).__name__}: {err}")
        return 1
    result["stale_quarantines_removed"] = [f"objects/{p.name}" for p in quarantines]
    print(json.dumps({"repo": str(repo.path), **result}))
    return 0
