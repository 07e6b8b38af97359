"""packyard restore --from R --to T: bring R's backups (PACKYARD_BACKUP_ROOT) back into the new repository T.

``--force``: replace a non-empty T, only once the new copy is complete; ``--backup-dir``: read a copy of the
backups brought from elsewhere; ``--entry``: stop at that manifest entry. The function the queued
``packyard.restore`` job runs (workers/commands/backup.py), in this process.
"""
from __future__ import annotations

import argparse
import json
import time

from packyard.workers.cli.backup import LABELS
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.progress import make_progress


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    r = subparsers.add_parser(
        "restore", help="restore a repository from its backups into a new repository",
        description="Restore the backups of --from (a repository's path or <storage>:<path>; it may be gone) "
                    "into the new repository --to: the full bundle and the incrementals in order, each through "
                    "index-pack's checks, refs last; the repository appears only once it is complete.")
    r.add_argument("--from", dest="source", required=True, metavar="PATH", help="the repository the backups are of")
    r.add_argument("--to", dest="target", required=True, metavar="PATH", help="the repository to create")
    r.add_argument("--entry", default=None, metavar="ID", help="restore up to this manifest entry (default: newest)")
    r.add_argument("--backup-dir", default=None, metavar="DIR",
                   help="read the backups from DIR instead of the one PACKYARD_BACKUP_ROOT names for --from")
    r.add_argument("--force", action="store_true", help="replace a non-empty --to once the new copy is complete")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.add_argument("--no-progress", action="store_true", help="no progress bars even on a terminal")
    r.set_defaults(func=run_restore, logs=False)


def run_restore(args: argparse.Namespace) -> int:
    from packyard.workers.commands.backup import restore

    progress = make_progress(args, labels=LABELS)
    t0 = time.monotonic()
    result = call_store("restore", progress, restore, args.target, args.source, entry=args.entry,
                        force=args.force, backup_dir=args.backup_dir, progress=progress)
    if args.json:
        print(json.dumps(result))
    else:
        c = result["counters"]
        print(f"restored {result['repo']} from {result['backup_dir']} up to {result['entry']}: {c['objects']} "
              f"objects, {c['refs']} refs, checksum {result['checksum']}, {time.monotonic() - t0:.2f}s")
    return 0
