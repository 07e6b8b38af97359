"""packyard verify --repo PATH: verify a repository in-process (no queue), with a progress bar on a TTY."""
from __future__ import annotations

import argparse
import json

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.progress import make_progress


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("verify", help="verify a repository in-process",
                              description="Check every object (hash, parse) and reachability from the refs, "
                                          "in this process (no Redis, no worker). Exit 1 on the first bad object.")
    add_repo_arg(p)
    p.add_argument("--json", action="store_true", help="print counters as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.verify import verify_repo

    progress = make_progress(args)
    result = call_store("verify", progress, verify_repo, args.repo, progress=progress)
    counters = result["counters"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"ok {result['repo']}: " + " ".join(f"{k}={v}" for k, v in counters.items()))
    return 0
