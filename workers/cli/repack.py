"""packyard repack --repo R --mode full|geometric|loose: repack in-process, with a progress bar."""
from __future__ import annotations

import argparse
import json
import sys
import time

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.failures import call_store
from packyard.workers.cli.lease import add_lease_args, maintenance_lock_if
from packyard.workers.cli.progress import make_progress

LABELS = {"counting commits": "Counting commits", "counting objects": "Counting objects",
          "compressing objects": "Compressing objects", "writing objects": "Writing objects",
          "writing cruft objects": "Writing cruft objects"}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "repack", help="repack a repository (full, geometric or loose) in-process",
        description="Like `git repack`: --mode full packs everything reachable from the refs, HEAD and reflogs "
                    "into one pack with a reachability bitmap (--no-bitmap: without; unreachable objects younger "
                    "than --expire into a cruft pack with .mtimes, older ones deleted), reusing deltas verbatim and "
                    "searching new ones for the rest "
                    "(--window, --depth; --no-reuse recomputes every delta, like git repack -f); "
                    "--mode geometric merges the smallest packs "
                    "until pack sizes form a progression (--factor); --mode loose packs every loose object. "
                    "Replaced packs move to objects/pack/preserved/ for --preserve-for seconds. Only what "
                    "existed when the repack started is ever deleted.")
    add_repo_arg(p)
    p.add_argument("--mode", choices=("full", "geometric", "loose"), default="full", help="default: full")
    p.add_argument("--factor", type=int, default=2, help="geometric progression factor (default 2)")
    p.add_argument("--expire", default=None, metavar="WHEN",
                   help="delete unreachable objects older than this: 2.weeks.ago (default), 1.day.ago, now, "
                        "never, or seconds")
    p.add_argument("--preserve-for", type=float, default=None, metavar="SECONDS",
                   help="keep replaced packs readable in objects/pack/preserved/ this long "
                        "(default: PACKYARD_MAINTENANCE_PRESERVE_FOR, 3600)")
    p.add_argument("--no-reuse", action="store_true",
                   help="recompute every delta instead of copying existing ones (git repack -f)")
    p.add_argument("--window", type=int, default=None, metavar="N",
                   help="delta search window: objects each object is tried against, plus one (default 10)")
    p.add_argument("--depth", type=int, default=None, metavar="N", help="longest delta chain (default 50)")
    p.add_argument("--window-memory", type=int, default=None, metavar="BYTES",
                   help="bytes of objects one search process keeps in its window (default 256 MiB; 0: no bound)")
    p.add_argument("--no-midx", action="store_true",
                   help="geometric/loose: write no multi-pack-index over the packs that stay (written by default)")
    p.add_argument("--no-bitmap", action="store_true",
                   help="--mode full: write no reachability bitmap (.bitmap) with the pack (git repack -a without -b)")
    p.add_argument("--island", action="append", default=[], metavar="REGEX",
                   help="--mode full: make deltas within delta islands (git's pack.island, repack -i; repeatable, the "
                        "last that matches a ref wins; a pool's repack uses refs/virtual/([^/]+)/ without it)")
    p.add_argument("--island-core", default=None, metavar="NAME",
                   help="--mode full with islands: write this island's objects first and give its refs' commits "
                        "bitmaps (git's pack.islandCore; in a pool, a member's namespace key)")
    p.add_argument("--no-commit-graph", action="store_true",
                   help="do not write the commit-graph afterwards (default: extend its split chain, or rewrite it "
                        "whole when unreachable objects were deleted)")
    p.add_argument("--no-pack-refs", action="store_true",
                   help="do not fold the loose refs into packed-refs afterwards (git pack-refs --all)")
    add_lease_args(p, "hold the repository's maintenance lease (Redis) and fence the deletions with its token")
    p.add_argument("--json", action="store_true", help="print the result with counters as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars even on a terminal")
    p.set_defaults(func=run, logs=False)   # runs in this process and prints its result; no log lines


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.repack import repack

    progress = make_progress(args, labels=LABELS)
    t0 = time.monotonic()
    with maintenance_lock_if(args, "repack") as lease:
        result = call_store("repack", progress, repack, args.repo, mode=args.mode, factor=args.factor,
                                   expire=args.expire, preserve_for=args.preserve_for, no_reuse=args.no_reuse,
                                   window=args.window, depth=args.depth, window_memory=args.window_memory,
                                   no_bitmap=args.no_bitmap, progress=progress, lease=lease, no_midx=args.no_midx,
                                   commit_graph=not args.no_commit_graph, pack_refs=not args.no_pack_refs,
                                   islands=args.island or None, island_core=args.island_core)
    if args.json:
        print(json.dumps(result))
        return 0
    c = result["counters"]
    serving = _serving_line(c)
    if result["nothing_to_do"]:
        print("Nothing new to pack.")
        if serving:
            print(serving, file=sys.stderr)
        return 0
    for name in result["packs_written"]:
        print(f"pack\t{name}")
    if result["cruft_pack"]:
        print(f"cruft\t{result['cruft_pack']}")
    print(f"{result['mode']}: {c['objects_out']} objects written ({c['deltas_reused']} deltas reused, "
          f"{c['deltas_computed']} computed of {c['deltas_tried']} tried, "
          f"{c['rewritten_whole']} written whole), {c['packs_merged']} packs replaced, {c['loose_deleted']} loose "
          f"objects deleted, cruft {c['cruft_kept']} kept / {c['cruft_expired']} expired, "
          f"bitmap of {c['bitmap_commits']} commits, {time.monotonic() - t0:.2f}s", file=sys.stderr)
    if serving:
        print(serving, file=sys.stderr)
    return 0


def _serving_line(c: dict) -> str:
    """What the commit-graph and pack-refs steps did, in one line ("" when both were skipped)."""
    parts = []
    if "commit_graph_commits" in c:
        if c["commit_graph_written"]:
            parts.append(f"commit-graph: layer of {c['commit_graph_commits']} commits"
                         f"{' (rewritten whole)' if c['commit_graph_replaced'] else ''}, "
                         f"{c['commit_graph_layers_after']} layer(s)")
        else:
            parts.append("commit-graph: up to date")
    if "pack_refs_packed" in c:
        parts.append(f"pack-refs: {c['pack_refs_packed']} loose refs packed, {c['pack_refs_total']} in packed-refs")
    return "; ".join(parts)
