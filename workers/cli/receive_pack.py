"""packyard receive-pack REPO: git's receive side of a push over stdin/stdout (where git-receive-pack runs)."""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "receive-pack", help="receive a push from a git client on stdin/stdout (git receive-pack)",
        description="Speak git's push protocol (v0/v1) on stdin/stdout, as `git receive-pack REPO` does: "
                    "`git push --receive-pack='packyard receive-pack' host:REPO`. The pack goes through "
                    "packyard's index-pack with the server's fsck into a quarantine, then one ref transaction "
                    "under the repository lease, recorded as a job (packyard.receive_pack). REPO must lie in a "
                    "storage root. See docs/receive.md.")
    p.add_argument("repo", help="repository: an absolute path or STORAGE:RELATIVE/PATH")
    p.add_argument("--advertise-refs", "--http-backend-info-refs", action="store_true", dest="advertise_refs",
                   help="print the advertisement and exit (smart HTTP's info/refs)")
    p.add_argument("--stateless-rpc", action="store_true", help="read the request without advertising first")
    p.add_argument("-q", "--quiet", action="store_true", help="(accepted, as git's)")
    p.set_defaults(func=run, logs=False)   # stdout is the protocol: logs are configured onto stderr below


def run(args: argparse.Namespace) -> int:
    import os

    from packyard.workers import envpaths
    from packyard.workers.receive.handoff import hand_over

    try:
        sock = envpaths.receive_socket(os.environ)
    except ValueError:
        sock = None           # (the settings below say what is wrong with it)
    handed = hand_over(sock, args.repo, advertise_refs=args.advertise_refs,
                       stateless=args.stateless_rpc)   # a running `packyard http` takes it: nothing more imported
    if handed is not None:
        return handed
    from packyard.workers.cli.prepare import prepare_embedded
    from packyard.workers.receive.session import serve
    from packyard.workers.settings import get_settings

    s = get_settings()
    if s.receive_mode == "process":   # (its job row's log lines; in queue mode the worker logs: ~0.15 s saved)
        from packyard.workers import logs as plog

        plog.configure_from_settings(s)
    if not args.advertise_refs:   # queue mode writes no job row here (the worker does): no records to migrate
        prepare_embedded(s, migrate=s.receive_mode == "process")
    return serve(args.repo, sys.stdin.fileno(), sys.stdout.buffer, sys.stderr.buffer,
                 advertise_only=args.advertise_refs, stateless=args.stateless_rpc)
