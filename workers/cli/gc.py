"""packyard gc --repo R: remove what crashed writers left behind (never a live writer's files).

* temp files of crashed batch writes (``objects/xx/tmp_obj_*``) and their batch markers;
* index-pack quarantines (``objects/incoming-*``) of ingests that died, once nothing in them
  was touched for ``--quarantine-after`` seconds (a live ingest keeps writing into its own);
* pack writers' temp files (``objects/pack/tmp_*``) of writers that died, packs left half-moved,
  and packs a repack replaced that stayed in ``objects/pack/preserved/`` longer than ``--preserve-for``;
* ref and fence claim files (``refs/**.lock``, ``packyard/*.lock``) whose owner is provably
  dead, or that nobody can judge and are older than 10 minutes, and orphaned ref temp files
  (``dead_locks_removed``: path, verdict, owner).

The same cleanup runs as the ``packyard.gc`` job a maintenance plan queues (workers/commands/gc.py). Every
name and age rule is a row of the leftovers table (store/leftovers/, listed in docs/operating.md).
"""
from __future__ import annotations

import argparse
import json

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.lease import add_lease_args, maintenance_lock_if
from packyard.workers.commands.gc import QUARANTINE_AFTER
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "gc", help="remove stale temp files of crashed writers",
        description="Scan every loose fan-out directory for tmp_obj_* files. Ours (tmp_obj_<pid>_<host>-<batch>_<n>) "
                    "are removed when their process is dead on this host and they are older than --stale-after; "
                    "others (another host, git's own) only after --foreign-after (git's prune expiry). Also "
                    "remove index-pack quarantines (objects/incoming-*) untouched for --quarantine-after, "
                    "pack writers' temp files of dead writers, preserved packs older than --preserve-for, and "
                    "ref/fence lock files whose owner is dead (or unknown and older than 10 minutes). "
                    "Prints one JSON line: what was removed. Every name and age: docs/operating.md (leftovers).")
    add_repo_arg(p)
    p.add_argument("--stale-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of a dead process's temp files (default 600)")
    p.add_argument("--foreign-after", type=float, default=None, metavar="SECONDS",
                   help="minimum age of temp files we cannot attribute (default 14 days)")
    p.add_argument("--quarantine-after", type=float, default=QUARANTINE_AFTER, metavar="SECONDS",
                   help=f"minimum age of an abandoned index-pack quarantine (default {QUARANTINE_AFTER:.0f})")
    p.add_argument("--preserve-for", type=float, default=None, metavar="SECONDS",
                   help="remove preserved packs (objects/pack/preserved/) older than this "
                        "(default: PACKYARD_MAINTENANCE_PRESERVE_FOR, 3600)")
    add_lease_args(p, "hold the repository's maintenance lease (never beside a repack); each deletion checks it")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.store.errors import StoreError
    from packyard.workers.commands.gc import run_gc

    try:
        with maintenance_lock_if(args, "gc") as lease:
            result = run_gc(args.repo, stale_after=args.stale_after, foreign_after=args.foreign_after,
                            quarantine_after=args.quarantine_after,
                            preserve_for=get_settings().maintenance_preserve_for
                            if args.preserve_for is None else args.preserve_for,
                            lease=lease)
    except StoreError as err:
        print(f"packyard gc: {type(err).__name__}: {err}")
        return 1
    c, removed = result["counters"], result["removed"]
    print(json.dumps({"repo": result["repo"], "stale_tmp_removed": c["stale_tmp_removed"],
                      "stale_markers_removed": c["stale_markers_removed"],
                      "stale_quarantines_removed": removed["quarantines"],
                      "stale_pack_temps_removed": removed["pack_temps"],
                      "preserved_packs_expired": removed["preserved_packs"],
                      "preserved_mapped_expired": removed["preserved_mapped"],
                      "preserved_loose_expired": removed["preserved_loose"],
                      "dead_locks_removed": removed["dead_locks"]}))
    return 0
