"""packyard bench midx: a geometric repack that leaves a multi-pack-index, packyard vs git, side by side.

Input: git-v2.0.0 cut into one large pack and 30 push packs (``bench repack``'s ``geometric_repo``).
Two rows, each side on its own fresh copy per round (all copies made before the first timed run),
rounds alternating who goes first:

* ``geometric`` -- ``packyard repack --mode geometric --factor 2 --no-bitmap`` (MIDX with RIDX over the
  packs that stay, written before the rolled-up packs go) vs ``git repack --geometric=2 -d --write-midx``;
* ``geometric+bitmap`` -- the same with the MIDX bitmap (packyard's default) vs git's
  ``--write-midx --write-bitmap-index``;
* packyard's side runs with ``--no-commit-graph --no-pack-refs`` (its defaults write both after the repack; git's
  ``repack`` writes neither), so both sides do the same work;
* ``write`` -- the MIDX alone over the 31 input packs: ``store.pack.midx.write_midx`` in a fresh
  process vs ``git multi-pack-index write``.

Every result is checked by ``git multi-pack-index verify`` (and ``git fsck`` for the last repack).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.repack import (
    TIME,
    alternating,
    base_repo,
    child_env,
    fresh_copies,
    geometric_repo,
    measured,
    pack_sizes,
)

WRITE_CHILD = ("import sys; from packyard.store.maintenance.serving.midx import write_midx, installed_stems; "
               "d = sys.argv[1]; write_midx(d, installed_stems(d))")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("midx", help="geometric repack with a multi-pack-index: packyard vs git",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds per row, alternating (default 3)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--small", type=int, default=30, help="push packs beside the large one (default 30)")
    p.add_argument("--row", action="append", choices=("geometric", "geometric+bitmap", "write"), default=None,
                   help="run only these rows (repeatable; default: all)")
    p.set_defaults(func=run)


def _row(name: str, template: Path, commands: dict[str, list[str]], runs: int, work: Path) -> dict[str, list]:
    env = child_env()
    copies = fresh_copies(template, work, name, runs)
    rows: dict[str, list] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        repo = copies[side, rnd]
        cmd = [a.replace("{repo}", str(repo)).replace("{pack_dir}", str(repo / "objects" / "pack"))
               for a in commands[side]]
        wall, rss, _out = measured(cmd, env, work / "rss.txt")
        common.git("multi-pack-index", "verify", "--no-progress", git_dir=repo)
        midx = repo / "objects" / "pack" / "multi-pack-index"
        bitmaps = list((repo / "objects" / "pack").glob("multi-pack-index-*.bitmap"))
        if bitmaps:
            subprocess.run(["git", "--git-dir", str(repo), "rev-list", "--test-bitmap", "main"], check=True,
                           capture_output=True)
        rows[side].append({"wall": wall, "rss": rss, "packs": len(pack_sizes(repo)),
                           "midx": midx.stat().st_size, "bitmap": sum(b.stat().st_size for b in bitmaps)})
        print(f"  {name} round {rnd + 1} {side:8} wall {wall:7.3f}s  peak RSS {rss / 2**20:7.1f} MiB  "
              f"packs {len(pack_sizes(repo)):3}  MIDX {midx.stat().st_size / 1e6:6.2f} MB", flush=True)
    common.git("fsck", "--no-progress", "--no-dangling", git_dir=copies["packyard", runs - 1])
    for repo in copies.values():
        shutil.rmtree(repo)
    return rows


def _report(name: str, rows: dict[str, list]) -> None:
    g, p = rows["git"], rows["packyard"]
    common.print_wall_rss(name, ([r["wall"] for r in p], [r["wall"] for r in g]),
                          ([r["rss"] for r in p], [r["rss"] for r in g]))
    print(f"{name}: {'MIDX bytes':22} {p[-1]['midx']:10} {g[-1]['midx']:10}")
    if g[-1]["bitmap"] or p[-1]["bitmap"]:
        print(f"{name}: {'MIDX bitmap bytes':22} {p[-1]['bitmap']:10} {g[-1]['bitmap']:10}")
    print(f"{name}: {'packs left':22} {p[-1]['packs']:10} {g[-1]['packs']:10}")


def run(args: argparse.Namespace) -> int:
    start = common.corpus_bench_start("midx", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    print(f"{os.cpu_count()} cores, {args.runs} rounds per row alternating git/packyard, in {work} "
          f"({common.describe_filesystem(work)})", flush=True)
    try:
        src = base_repo(work / "inputs" / "v2.git", pack, refs)
        t = geometric_repo(work / "inputs" / f"geometric-{args.small}.git", src, small=args.small)
        print(f"input: {len(pack_sizes(t))} packs, {sum(pack_sizes(t)) / 1e6:.1f} MB", flush=True)
        # (the same work as git's side: no commit-graph, no packed refs -- packyard's defaults write both)
        ours = common.packyard_entry() + ["repack", "--repo", "{repo}", "--json", "--no-progress", "--mode",
                                          "geometric", "--factor", "2", "--no-commit-graph", "--no-pack-refs"]
        theirs = ["git", "--git-dir", "{repo}", "repack", "--geometric=2", "-d", "-q", "--write-midx"]
        commands = {
            "geometric": {"git": theirs, "packyard": ours + ["--no-bitmap"]},
            "geometric+bitmap": {"git": theirs + ["--write-bitmap-index"], "packyard": ours},
            "write": {"git": ["git", "--git-dir", "{repo}", "multi-pack-index", "write", "--no-progress"],
                      "packyard": [sys.executable, "-c", WRITE_CHILD, "{pack_dir}"]},
        }
        results = {name: _row(name, t, cmds, args.runs, work) for name, cmds in commands.items()
                   if args.row is None or name in args.row}
        print()
        for name, rows in results.items():
            _report(name, rows)
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
