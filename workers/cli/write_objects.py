"""packyard write-objects --repo R FILE: write raw objects given as JSON [{"type", "data": base64}], in-process."""
from __future__ import annotations

import argparse
import json
import sys

from packyard.workers.cli import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "write-objects", help="write raw objects (JSON, base64) in one batch",
        description="FILE (or - for stdin) holds {\"objects\": [{\"type\": \"blob\", \"data\": \"<base64>\"}, ...], "
                    "\"ref_updates\": [{\"ref\": ..., \"old\": hex|null, \"new\": hex}]} or just the objects list. "
                    "Objects are validated first, then written with one durable flush; refs move last.")
    common.add_repo_arg(p)
    p.add_argument("file", nargs="?", default="-")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.write_objects import write_objects

    raw = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
    try:
        doc = json.loads(raw)
    except ValueError as err:
        print(f"packyard write-objects: not JSON: {err}", file=sys.stderr)
        return 2
    objects, refs = (doc, None) if isinstance(doc, list) else (doc.get("objects", []), doc.get("ref_updates"))
    progress = common.make_progress(args)
    result = common.call_store("write-objects", progress, write_objects, args.repo, objects,
                               ref_updates=refs, progress=progress)
    print(json.dumps(result))
    return 0
