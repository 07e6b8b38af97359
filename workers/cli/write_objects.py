"""packyard write-objects --repo R FILE: write raw objects given as JSON [{"type", "data": base64}], in-process."""
from __future__ import annotations

import argparse
import json
import sys

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.progress import make_progress


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "write-objects", help="write raw objects (JSON, base64) in one batch",
        description="FILE (or - for stdin) holds {\"objects\": [{\"type\": \"blob\", \"data\": \"<base64>\"}, ...], "
                    "\"ref_updates\": [{\"ref\": ..., \"old\": hex|null, \"new\": hex}]} or just the objects list. "
                    "Objects are validated first, then written with one durable flush; refs move last.")
    add_repo_arg(p)
    p.add_argument("file", nargs="?", default=None, help="the JSON document (default: stdin, unless --objects-file)")
    p.add_argument("--objects-file", metavar="FILE",
                   help="objects in `git cat-file --batch` format (<id> <type> <size> LF content LF), written "
                        "after the JSON ones; for content too big for JSON")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.write_objects import write_objects

    source = args.file if args.file is not None else (None if args.objects_file else "-")
    doc: object = []
    if source is not None:
        raw = sys.stdin.read() if source == "-" else open(source, encoding="utf-8").read()
        try:
            doc = json.loads(raw)
        except ValueError as err:
            print(f"packyard write-objects: not JSON: {err}", file=sys.stderr)
            return 2
    if isinstance(doc, list):
        objects, refs = doc, None
    elif isinstance(doc, dict):
        objects, refs = doc.get("objects", []), doc.get("ref_updates")
    else:
        print("packyard write-objects: the JSON must be a list of objects or {\"objects\": [...], "
              "\"ref_updates\": [...]}", file=sys.stderr)
        return 2
    progress = make_progress(args)
    result = call_store("write-objects", progress, write_objects, args.repo, objects,
                               objects_file=args.objects_file, ref_updates=refs, progress=progress)
    print(json.dumps(result))
    return 0
