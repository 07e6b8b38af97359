"""packyard bench serve: maintenance that leaves a repository ready to serve, vs git's, and serving from each.

* ``maintenance`` -- git-v2.0.0 split into 50 packs plus the newest commits loose (the repack benchmark's
  ``full`` input); ``packyard repack --mode full`` (a pack with a reachability bitmap) vs ``git repack -a -d
  -b`` (git's default in a bare repository: ``repack.writeBitmaps``). Fresh copies for each side and round,
  all made before the first timed run; rounds alternate who goes first. Wall time, peak RSS (the process and
  its children, /usr/bin/time), size of the .bitmap.
* ``serving`` -- from the last round's two results, what ``git upload-pack`` runs for a client, alternating:
  a full clone's ``git pack-objects --revs --stdout --all --thin --delta-base-offset --include-tag``, and a
  fetch of the newest 10 commits (``main`` and ``^main~10`` on stdin). Wall time and "pack-reused" (objects
  git sent verbatim because the bitmap found them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.repack import (
    TIME,
    alternating,
    base_repo,
    child_env,
    fresh_copies,
    measured,
    pack_sizes,
    split_repo,
)


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("serve", help="packyard repack (with bitmap) vs git repack -adb, then serving from each",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="maintenance rounds, alternating (default 3)")
    p.add_argument("--serve-runs", type=int, default=5, help="runs of each serving request per side (default 5)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.set_defaults(func=run)


def _bitmap_bytes(repo: Path) -> int:
    return sum(p.stat().st_size for p in (repo / "objects" / "pack").glob("pack-*.bitmap"))


def _maintenance(template: Path, runs: int, work: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Path]]:
    env = child_env()
    copies = fresh_copies(template, work, "serve", runs)
    rows: dict[str, list[dict[str, Any]]] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        repo = copies[side, rnd]
        cmd = (["git", "--git-dir", str(repo), "repack", "-a", "-d", "-b", "-q"] if side == "git" else
               common.packyard_entry() + ["repack", "--repo", str(repo), "--json", "--no-progress"])
        wall, rss, out = measured(cmd, env, work / "rss.txt")
        row: dict[str, Any] = {"wall": wall, "rss": rss, "bitmap": _bitmap_bytes(repo),
                               "pack": sum(pack_sizes(repo))}
        if side == "packyard":
            c = json.loads(out)["counters"]
            row["bitmap_s"] = c.get("elapsed_us_bitmap", 0) / 1e6
            row["bitmap_commits"] = c.get("bitmap_commits", 0)
        rows[side].append(row)
        print(f"  maintenance round {rnd + 1} {side:8} wall {wall:7.2f}s  peak RSS {rss / 2**20:7.1f} MiB  "
              f".bitmap {row['bitmap'] / 1e6:6.3f} MB", flush=True)
    last = {side: copies[side, runs - 1] for side in ("git", "packyard")}
    for (_side, rnd), repo in copies.items():
        if rnd != runs - 1:
            shutil.rmtree(repo)
    return rows, last


_REQUESTS = {
    "full clone": (["pack-objects", "--revs", "--stdout", "--all", "--thin", "--delta-base-offset", "--include-tag",
                    "--progress"], b""),
    "fetch of the last 10 commits": (["pack-objects", "--revs", "--stdout", "--thin", "--delta-base-offset",
                                      "--include-tag", "--progress"], b"main\n^main~10\n"),
}


def _serve_once(repo: Path, args: list[str], stdin: bytes) -> tuple[float, int, int]:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(["git", "--git-dir", str(repo), *args], input=stdin, capture_output=True,
                          env=env, check=True)
    wall = time.perf_counter() - t0
    reused = 0
    tail = proc.stderr.rsplit(b"pack-reused ", 1)
    if len(tail) == 2:
        reused = int(tail[1].split()[0])
    return wall, len(proc.stdout), reused


def _serving(last: dict[str, Path], runs: int) -> dict[str, dict[str, list[tuple[float, int, int]]]]:
    out: dict[str, dict[str, list[tuple[float, int, int]]]] = {}
    for name, (args, stdin) in _REQUESTS.items():
        got: dict[str, list[tuple[float, int, int]]] = {"git": [], "packyard": []}
        for k in range(runs):
            for side in (("git", "packyard") if k % 2 == 0 else ("packyard", "git")):
                got[side].append(_serve_once(last[side], args, stdin))
        out[name] = got
        p = statistics.median(w for w, _n, _r in got["packyard"])
        g = statistics.median(w for w, _n, _r in got["git"])
        print(f"  serving {name}: packyard {p:.3f}s git {g:.3f}s", flush=True)
    return out


def run(args: argparse.Namespace) -> int:
    start = common.corpus_bench_start("serve", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    from packyard.store.maintenance.serving import bitmap

    one, five, _ = os.getloadavg()
    print(f"{os.cpu_count()} cores, {args.runs} maintenance rounds alternating, in {work} "
          f"({common.describe_filesystem(work)}); bitmap loop: {bitmap.IMPLEMENTATION}; load {one:.2f}/{five:.2f}",
          flush=True)
    try:
        src = base_repo(work / "inputs" / "v2.git", pack, refs)
        t = split_repo(work / "inputs" / "split50.git", src)
        print(f"input: {len(pack_sizes(t))} packs ({sum(pack_sizes(t)) / 1e6:.1f} MB) + the newest commits loose",
              flush=True)
        rows, last = _maintenance(t, args.runs, work)
        for repo in last.values():
            common.git("fsck", "--full", "--no-dangling", git_dir=repo)
        served = _serving(last, args.serve_runs)
        g, p = rows["git"], rows["packyard"]
        med = lambda side, key: statistics.median(r[key] for r in side)  # noqa: E731
        one, five, _ = os.getloadavg()
        print(f"\nload {one:.2f}/{five:.2f} at the end (other work on the machine skews both sides' times)")
        print(f"{'':34} {'packyard':>10} {'git':>10} {'ratio':>7}")
        print(f"{'maintenance wall (median) s':34} {med(p, 'wall'):10.2f} {med(g, 'wall'):10.2f} "
              f"{med(p, 'wall') / med(g, 'wall'):6.2f}x")
        pr, gr = max(r["rss"] for r in p), max(r["rss"] for r in g)
        print(f"{'maintenance peak RSS (max) MiB':34} {pr / 2**20:10.1f} {gr / 2**20:10.1f} {pr / gr:6.2f}x")
        print(f"{'.bitmap bytes':34} {p[-1]['bitmap']:10} {g[-1]['bitmap']:10} "
              f"{p[-1]['bitmap'] / max(1, g[-1]['bitmap']):6.3f}x")
        print(f"{'pack bytes':34} {p[-1]['pack']:10} {g[-1]['pack']:10} {p[-1]['pack'] / g[-1]['pack']:6.3f}x")
        for name, got in served.items():
            pw = statistics.median(w for w, _n, _r in got["packyard"])
            gw = statistics.median(w for w, _n, _r in got["git"])
            print(f"{name + ' (median) s':34} {pw:10.3f} {gw:10.3f} {pw / gw:6.2f}x")
            print(f"{'  bytes sent / pack-reused':34} {got['packyard'][-1][1]:>10}/{got['packyard'][-1][2]} "
                  f"{got['git'][-1][1]:>10}/{got['git'][-1][2]}")
        print(f"packyard bitmap phase (median) {statistics.median(r['bitmap_s'] for r in p):.2f}s, "
              f"{p[-1]['bitmap_commits']} commits bitmapped")
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
