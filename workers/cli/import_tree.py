"""packyard import --repo R --ref REF PATH: commit a directory or tar archive on top of REF, in-process."""
from __future__ import annotations

import argparse
import json

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.progress import make_progress


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "import", help="commit a directory or tar archive onto a ref",
        description="Write PATH (a directory or a tar archive) as blobs, trees and one commit whose parent is "
                    "REF's current value, with one durable flush for the whole batch, then move REF by "
                    "compare-and-swap. Runs in this process (use `packyard submit import_tree` to queue it).")
    add_repo_arg(p)
    p.add_argument("--ref", required=True, help="ref to move, e.g. refs/heads/main")
    p.add_argument("-m", "--message", default="Import", help="commit message")
    p.add_argument("--author-name", default="packyard")
    p.add_argument("--author-email", default="packyard@localhost")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("path", help="directory or tar archive (.tar, .tar.gz, .tar.bz2, .tar.xz)")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.import_tree import import_tree

    progress = make_progress(args)
    result = call_store("import", progress, import_tree, args.repo, args.ref, args.path,
                               message=args.message, author_name=args.author_name,
                               author_email=args.author_email, progress=progress)
    if args.json:
        print(json.dumps(result))
    else:
        c = result["counters"]
        print(f"{result['ref']} -> {result['commit']} (tree {result['tree']}): {c['files']} files, "
              f"{c['objects_written']} objects written, {c['objects_skipped']} skipped, "
              f"{c['flushes']} flushes, {c['renames']} renames, {c['dir_fsyncs']} dir fsyncs")
    return 0
