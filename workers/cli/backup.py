"""packyard backup: a repository's bundle chain in PACKYARD_BACKUP_ROOT, in-process.

The same functions the queued jobs run (workers/commands/backup.py; ``packyard submit backup --repo R`` queues
one, beat queues the fleet at PACKYARD_BACKUP_CRON). ``backup --lock`` holds the maintenance lease the job
holds; ``backup --all`` backs up every enabled registered repository one after the other (a failure is
reported and the rest go on; exit 1 if any failed). ``backup --list`` prints the manifest's chains.
``packyard restore`` (workers/cli/restore.py) brings them back.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from packyard.workers.cli.failures import CommandFailed, call_store
from packyard.workers.cli.lease import add_lease_args, maintenance_lock_if
from packyard.workers.cli.progress import make_progress

LABELS = {"counting objects": "Counting objects", "writing objects": "Writing objects",
          "compressing objects": "Compressing objects", "receiving objects": "Unpacking bundle",
          "resolving deltas": "Resolving deltas"}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "backup", help="back a repository up into PACKYARD_BACKUP_ROOT (git bundles, full then incremental)",
        description="Write a git bundle of the repository's refs (a full one first, then incrementals holding "
                    "only new objects) and its manifest entry, verify it, and expire chains beyond "
                    "PACKYARD_BACKUP_KEEP_FULL. Refs unchanged since the newest backup: nothing is written.")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--repo", metavar="PATH", help="the repository to back up")
    target.add_argument("--all", action="store_true", help="every enabled registered repository (packyard repos)")
    p.add_argument("--full", action="store_true", help="start a new full chain even if an incremental would do")
    p.add_argument("--list", action="store_true", help="print the repository's backups (its manifest) and exit")
    add_lease_args(p, "hold the repository's maintenance lease (Redis), as the queued job does")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars even on a terminal")
    p.set_defaults(func=run, logs=False)


def _line(result: dict[str, Any], seconds: float) -> str:
    if result["outcome"] == "skipped":
        return f"skipped {result['repo']}: {result['reason']}"
    if result["outcome"] == "unchanged":
        return f"unchanged {result['repo']}: {result['reason']} (newest {result['entry']})"
    c = result["counters"]
    expired = f", {c['expired']} older backup(s) expired" if c.get("expired") else ""
    return (f"{result['kind']} {result['entry']}: {c['objects']} objects, {c['bytes']} bytes, {c['refs']} refs, "
            f"checksum {c['checksum']}, verified{expired}, {seconds:.2f}s -> {result['backup_dir']}")


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.backup import backup, list_backups

    if args.list:
        if args.all:
            print("packyard backup: --list needs --repo", file=sys.stderr)
            return 2
        listed = call_store("backup", None, list_backups, args.repo)
        if args.json:
            print(json.dumps(listed))
            return 0
        for chain in listed["chains"]:
            for e in chain:
                mark = "verified" if e["verified"] else "unverified"
                print(f"{e['id']}  {e['kind']:11}  {e['objects']:>9} objects  {e['size']:>12} bytes  "
                      f"{e['refs']:>6} refs  {e['checksum']}  {mark}")
        return 0
    if args.all:
        return _run_all(args)
    progress = make_progress(args, labels=LABELS)
    t0 = time.monotonic()
    with maintenance_lock_if(args, "backup") as lease:
        result = call_store("backup", progress, backup, args.repo, full=args.full, lease=lease)
    print(json.dumps(result) if args.json else _line(result, time.monotonic() - t0))
    return 0


def _run_all(args: argparse.Namespace) -> int:
    from packyard.workers.cli.prepare import prepare_embedded
    from packyard.workers.commands.backup import backup
    from packyard.workers.records import registry
    from packyard.workers.settings import get_settings

    s = get_settings()
    prepare_embedded(s, migrate=True)
    failed = 0
    after: str | None = None
    total = registry.count_enabled(s)
    for _ in range(total // max(1, s.planner_page) + 2):
        page = registry.enabled_paths_page(s, after, s.planner_page)
        if not page:
            break
        for path in page:
            args.repo = path
            t0 = time.monotonic()
            try:
                with maintenance_lock_if(args, "backup") as lease:
                    result = call_store("backup", None, backup, path, full=args.full, lease=lease)
            except CommandFailed:
                failed += 1
                continue
            print(json.dumps(result) if args.json else _line(result, time.monotonic() - t0))
        after = page[-1]
    if failed:
        print(f"packyard backup: {failed} of {total} repositories failed", file=sys.stderr)
    return 1 if failed else 0
