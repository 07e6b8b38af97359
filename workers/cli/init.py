"""packyard init --repo PATH: create a bare repository (like git init --bare)."""
from __future__ import annotations

import argparse

from packyard.workers.cli.args import add_repo_arg


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("init", help="create a bare repository",
                              description="Create a bare repository laid out as `git init --bare` does.")
    add_repo_arg(p)
    p.add_argument("--initial-branch", default="main", help="branch HEAD points at (default: main)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from packyard.store.repo import Repository

    repo = Repository.init(args.repo, initial_branch=args.initial_branch)
    print(f"initialized bare repository {repo.path}")
    return 0
