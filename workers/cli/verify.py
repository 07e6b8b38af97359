"""packyard verify --repo PATH: verify a repository in-process (no queue), with a progress bar on a TTY.

``--against OTHER``: compare the two copies' repository checksums (Gitaly's rule, store/backup/checksum.py)
instead; exit 1 when they differ, listing the counted refs that do."""
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
    p.add_argument("--against", metavar="OTHER", default=None,
                   help="compare the refs checksum with another copy of the repository (exit 1 if they differ)")
    p.add_argument("--json", action="store_true", help="print counters as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.verify import verify_repo

    if args.against:
        return _against(args)
    progress = make_progress(args)
    result = call_store("verify", progress, verify_repo, args.repo, progress=progress)
    counters = result["counters"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"ok {result['repo']}: " + " ".join(f"{k}={v}" for k, v in counters.items()))
    return 0


def _against(args: argparse.Namespace) -> int:
    from packyard.workers.commands.checksum import compare_repos

    result = call_store("verify", None, compare_repos, args.repo, args.against)
    if args.json:
        print(json.dumps(result))
        return 0 if result["match"] else 1
    if result["match"]:
        print(f"ok checksum {result['checksum']}: {result['repo']} and {result['other']} hold the same refs")
        return 0
    print(f"MISMATCH: {result['repo']} checksum {result['checksum']}, {result['other']} checksum "
          f"{result['other_checksum']}; {result['differing_total']} counted ref(s) differ:")
    for d in result["differing"]:
        print(f"  {d['ref']}: {d['ours']} vs {d['theirs']}")
    if result["differing_total"] > len(result["differing"]):
        print(f"  ... ({result['differing_total'] - len(result['differing'])} more)")
    return 1
