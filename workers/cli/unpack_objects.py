"""packyard unpack-objects --repo R [PACK]: explode a small pack (file or stdin) into loose objects, in-process."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile

from packyard.workers.cli.args import add_fsck_args, add_ref_update_arg, add_repo_arg, fsck_options
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.progress import make_progress


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "unpack-objects", help="explode a small pack into loose objects",
        description="Like `git unpack-objects`: parse and check the pack (trailer checksum, entries), resolve "
                    "deltas (thin-pack bases from the repository), write every object in one batch "
                    "(one durable flush, renames last). Reads stdin when PACK is '-' or absent.")
    add_repo_arg(p)
    p.add_argument("pack", nargs="?", default="-", help="pack file, or - for stdin")
    add_ref_update_arg(p)
    p.add_argument("--strict", action="store_true",
                   help="git's fsck first (unpack-objects --strict); nothing is written on a refusal")
    add_fsck_args(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, logs=False, exit_at_once=True)   # in this process, prints its result; one-shot


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.unpack_objects import unpack_objects

    progress = make_progress(args)
    with tempfile.NamedTemporaryFile(prefix="packyard-unpack-", suffix=".pack") as tmp:
        path = args.pack
        if path == "-":
            tmp.write(sys.stdin.buffer.read())
            tmp.flush()
            path = tmp.name
        result = call_store("unpack-objects", progress, unpack_objects, args.repo, path,
                                   ref_updates=args.ref_update, progress=progress,
                                   strict=args.strict or bool(args.fsck) or args.fsck_skiplist is not None,
                                   fsck=fsck_options(args))
    c = result["counters"]
    print(json.dumps(result) if args.json else
          f"unpacked {c['objects']} objects ({c['deltas']} deltas): {c['objects_written']} written, "
          f"{c['objects_skipped']} skipped, {c['flushes']} flushes, {c['renames']} renames")
    return 0
