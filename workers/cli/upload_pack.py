"""packyard upload-pack REPO: git's upload-pack with packyard's serving configuration (clones and fetches)."""
from __future__ import annotations

import argparse
import os
import sys


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "upload-pack", help="serve a clone or fetch on stdin/stdout (git upload-pack, serving configuration)",
        description="Run git's own `upload-pack` on REPO (exec, stdin/stdout passed through) with the "
                    "configuration packyard's maintenance expects: bitmaps and the multi-pack-index used, "
                    "uploadpack.allowFilter, only reachable objects, the hidden refs of pushes "
                    "(PACKYARD_RECEIVE_HIDE_REFS as transfer.hideRefs). `git clone "
                    "--upload-pack='packyard upload-pack' host:REPO`. REPO must lie in a storage root. "
                    "See docs/receive.md.")
    p.add_argument("repo", help="repository: an absolute path or STORAGE:RELATIVE/PATH")
    p.add_argument("--advertise-refs", "--http-backend-info-refs", action="store_true", dest="advertise_refs",
                   help="print the advertisement and exit (smart HTTP's info/refs)")
    p.add_argument("--stateless-rpc", action="store_true", help="one request, one response (smart HTTP)")
    p.add_argument("--strict", action="store_true", help="(accepted, as git's: always strict here)")
    p.add_argument("--timeout", type=int, help="(accepted, as git's: PACKYARD_RECEIVE_IDLE_TIMEOUT applies)")
    p.set_defaults(func=run, logs=False)   # stdout is the protocol


def run(args: argparse.Namespace) -> int:
    from packyard.store.errors import StoreError
    from packyard.workers.commands.upload_pack import confined_git_dir, upload_pack_argv, upload_pack_env
    from packyard.workers.settings import get_settings

    s = get_settings()
    try:
        git_dir = confined_git_dir(args.repo, s)
    except StoreError as err:   # git's words for a path that is not a repository, and the reason
        sys.stderr.write(f"fatal: '{args.repo}' does not appear to be a git repository ({err})\n")
        return 128
    argv = upload_pack_argv(git_dir, s, stateless=args.stateless_rpc, advertise_refs=args.advertise_refs)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("git", argv, upload_pack_env(os.environ))
    return 127   # pragma: no cover - execvpe does not return
