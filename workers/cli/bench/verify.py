"""packyard bench verify: verify_repository vs `git fsck --full` on a corpus repository."""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from packyard.workers.cli.bench import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("verify", help="verify_repository vs git fsck --full",
                              description="Time packyard's verify against `git fsck --full` on one repository "
                                          "(default: built from the corpus pack).")
    p.add_argument("--repo", metavar="PATH", help="repository to verify (default: a copy of the corpus pack)")
    p.add_argument("--corpus", default="git-v1.0.0", help="corpus pack name (default git-v1.0.0)")
    p.add_argument("--runs", type=int, default=3, help="best of N runs (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from packyard.store.verify import verify_repository

    with tempfile.TemporaryDirectory(prefix="packyard-bench-") as tmp:
        repo = common.bench_repo("verify", args.repo, args.corpus, Path(tmp) / "r.git")
        if repo is None:
            return 2
        ours = common.best_of(lambda: verify_repository(repo), args.runs)
        theirs = common.best_of(lambda: subprocess.run(["git", "--git-dir", str(repo), "fsck", "--full",
                                                        "--no-dangling"], check=True, capture_output=True),
                                args.runs)
        common.print_ratios([(f"verify {repo.name}", ours, theirs)])
    return 0
