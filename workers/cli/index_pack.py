"""packyard index-pack --repo R [--fix-thin] [--strict] [--keep MSG] [PACK|-]: ingest a pack in-process."""
from __future__ import annotations

import argparse
import json
import sys
import time

from packyard.workers.cli.args import add_fsck_args, add_ref_update_arg, add_repo_arg, fsck_options
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.cli.progress import make_progress
from packyard.workers.settings import get_settings

LABELS = {"receiving": "Receiving objects", "resolving": "Resolving deltas"}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "index-pack", help="ingest a pack (file or stdin) into a repository",
        description="Like `git index-pack --stdin [--fix-thin] [--strict] [--keep=MSG]`: stream the pack into "
                    "a quarantine inside the repository, verify every entry and the trailer, resolve deltas on "
                    "every core, check collisions against one snapshot, write .idx/.rev byte-identical to "
                    "git's, install durably (idx last), then apply --ref-update (all or nothing). "
                    "Prints 'pack\\t<checksum>' (and 'keep\\t<checksum>' with --keep) like git.")
    add_repo_arg(p)
    p.add_argument("pack", nargs="?", default="-", help="pack file, or - for stdin (default)")
    p.add_argument("--fix-thin", action="store_true", help="append missing delta bases from the repository")
    p.add_argument("--strict", action="store_true",
                   help="git's fsck (index-pack --strict): every object, every link's type, .gitmodules")
    add_fsck_args(p)
    p.add_argument("--keep", metavar="MSG", nargs="?", const="", default=None,
                   help="leave pack-<checksum>.keep (with MSG) until released")
    add_ref_update_arg(p)
    p.add_argument("--max-pack-bytes", type=int, default=None,
                   help="refuse packs larger than this (default: PACKYARD_MAX_PACK_BYTES, 2 GiB)")
    p.add_argument("--processes", type=int, default=None, help="delta resolver processes (default: cores)")
    p.add_argument("--lock", action="store_true",
                   help="hold the repository's Redis lease around install + ref updates")
    p.add_argument("--json", action="store_true", help="print the result with counters as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars even on a terminal")
    p.set_defaults(func=run, logs=False, exit_at_once=True)   # in this process, prints its result; one-shot


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.index_pack import index_pack, redis_repo_lock

    progress = make_progress(args, labels=LABELS)
    lock = None
    if args.lock:
        prepare_embedded(get_settings(), migrate=False)
        lock = redis_repo_lock(args.repo)
    t0 = time.monotonic()
    result = call_store("index-pack", progress, index_pack, args.repo, args.pack, fix_thin=args.fix_thin,
                               strict=args.strict or bool(args.fsck) or args.fsck_skiplist is not None,
                               fsck=fsck_options(args), keep=args.keep, ref_updates=args.ref_update,
                               max_pack_bytes=args.max_pack_bytes if args.max_pack_bytes is not None
                               else get_settings().max_pack_bytes,
                               processes=args.processes, progress=progress, lock=lock)
    if args.json:
        print(json.dumps(result))
        return 0
    c = result["counters"]
    print(f"{'keep' if result['keep'] else 'pack'}\t{result['checksum']}")
    print(f"{result['outcome']}: {c['objects']} objects, {c['deltas']} deltas, {c['bytes']} bytes, "
          f"{c['thin_bases_added']} thin bases added, {c['workers']} resolver processes, "
          f"peak RSS {c['peak_rss'] // (1 << 20)} MiB, {time.monotonic() - t0:.2f}s", file=sys.stderr)
    return 0
