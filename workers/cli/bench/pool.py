"""packyard bench pool: a fork network in an object pool, packyard vs git doing the same work, side by side.

Input: git-v2.0.0 (the corpus pack) as the source, and ``--forks`` forks of it (default 20), each with
``--own`` commits of its own (default 10, written by ``git fast-import``). Three rows:

* ``disk`` -- the network's objects on disk after linking and maintenance: packyard (``pool create`` from the
  source, ``pool link`` of every fork: alternates, then a local-only repack) vs git (``git clone --bare
  --shared`` of every fork from the source, its own commits, ``git repack -a -d -l``), each against one
  repository's objects (the source's). ``objects/pack/preserved/`` is not counted: it expires after the
  preserve time. Checked by ``git fsck`` in every fork and ``git count-objects -v``.
* ``fork-repack`` -- a full repack of one linked fork after a further push of ``--own`` commits:
  ``packyard repack --no-commit-graph --no-pack-refs`` vs ``git repack -a -d -l`` (the same alternates), each on
  its own fresh copy per round, rounds alternating who goes first.
* ``pool-repack`` -- a full repack of the pool holding every fork's refs in its namespace, with delta islands:
  ``packyard repack`` (its pool repack: islands ``refs/virtual/([^/]+)/``, and what every member reaches kept) vs
  ``git -c pack.island='refs/virtual/([^/]+)/' repack -a -d -i``; pack bytes side by side. Checked by ``git fsck``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.repack import (
    TIME,
    alternating,
    base_repo,
    child_env,
    fresh_copies,
    measured,
    pack_sizes,
)


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("pool", help="a fork network in an object pool: packyard vs git",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--forks", type=int, default=20, help="forks of the source (default 20)")
    p.add_argument("--own", type=int, default=10, help="commits of its own per fork (default 10)")
    p.add_argument("--runs", type=int, default=3, help="rounds per timed row, alternating (default 3)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--row", action="append", choices=("disk", "fork-repack", "pool-repack"), default=None,
                   help="run only these rows (repeatable; default: all)")
    p.set_defaults(func=run)


def _own_commits(repo: Path, name: str, count: int, start: int = 0) -> None:
    """``count`` commits on refs/heads/main of the bare ``repo``, each adding a file of its own (git fast-import)."""
    tip = common.git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip()
    lines = []
    for i in range(start, start + count):
        text = "".join(f"{name} change {i} line {k}\n" for k in range(200)).encode()
        msg = f"{name}: change {i}\n".encode()
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"committer {name} <{name}@example.com> {1700000000 + i} +0000\n".encode())
        lines.append(b"data %d\n%s" % (len(msg), msg))
        if i == start:
            lines.append(f"from {tip}\n".encode())
        lines.append(f"M 100644 inline {name}/file-{i}.txt\n".encode())
        lines.append(b"data %d\n%s\n" % (len(text), text))
    common.git("fast-import", "--quiet", git_dir=repo, input=b"".join(lines))


def _objects_bytes(repo: Path) -> int:
    """Bytes of the repository's own objects (packs, their indexes, loose files), preserved/ not counted."""
    total = 0
    for dirpath, dirs, files in os.walk(repo / "objects"):
        dirs[:] = [d for d in dirs if d != "preserved"]
        total += sum(os.lstat(os.path.join(dirpath, f)).st_blocks * 512 for f in files)
    return total


def _network(work: Path, src: Path, forks: int, own: int) -> tuple[Path, list[Path], list[Path]]:
    """(packyard's pool, its linked forks, git's shared forks)."""
    from packyard.store.maintenance.pool.lifecycle import create_pool, fetch_into_pool, link_member
    from packyard.store.repo import Repository

    pool = work / "net" / "pool.git"
    pool.parent.mkdir(parents=True)
    create_pool(pool, Repository.open(src))
    ours, theirs = [], []
    for i in range(forks):
        name = f"fork{i:02d}"
        fork = work / "net" / f"{name}.git"
        common.git("clone", "-q", "--bare", str(src), str(fork))   # (a local clone: hard links, as hosts copy)
        _own_commits(fork, name, own)
        link_member(Repository.open(fork), Repository.open(pool))
        ours.append(fork)
        shared = work / "git-net" / f"{name}.git"
        common.git("clone", "-q", "--bare", "--shared", str(src), str(shared))
        _own_commits(shared, name, own)
        common.git("repack", "-a", "-d", "-l", "-q", git_dir=shared)
        theirs.append(shared)
        print(f"  {name}: linked ({_objects_bytes(fork) / 1e6:.2f} MB own objects; git's "
              f"{_objects_bytes(shared) / 1e6:.2f} MB)", flush=True)
    for fork in ours:   # the pool keeps every fork's refs in its namespace (islands, one per fork)
        fetch_into_pool(Repository.open(pool), Repository.open(fork))
    return pool, ours, theirs


def _disk(src: Path, pool: Path, ours: list[Path], theirs: list[Path]) -> None:
    one = _objects_bytes(src)
    mine = _objects_bytes(pool) + sum(_objects_bytes(f) for f in ours)
    git_side = one + sum(_objects_bytes(f) for f in theirs)
    for f in (*ours, *theirs):
        common.git("fsck", "--no-progress", "--no-dangling", git_dir=f)
    print(f"disk: one repository's objects {one / 1e6:.1f} MB; {len(ours)} forks: packyard pool + forks "
          f"{mine / 1e6:.1f} MB ({mine / one:.3f}x one), git source + --shared forks {git_side / 1e6:.1f} MB "
          f"({git_side / one:.3f}x one); {len(ours)} full copies would be {len(ours) + 1:.0f}x")


def _timed(name: str, template: Path, commands: dict[str, list[str]], runs: int, work: Path) -> dict[str, list]:
    env = child_env()
    copies = fresh_copies(template, template.parent, name, runs)   # (beside the pool: relative alternates hold)
    rows: dict[str, list] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        repo = copies[side, rnd]
        cmd = [a.replace("{repo}", str(repo)) for a in commands[side]]
        wall, rss, _out = measured(cmd, env, work / "rss.txt")
        size = sum(pack_sizes(repo))
        rows[side].append({"wall": wall, "rss": rss, "bytes": size})
        print(f"  {name} round {rnd + 1} {side:8} wall {wall:7.3f}s  peak RSS {rss / 2**20:7.1f} MiB  "
              f"packs {size / 1e6:7.2f} MB", flush=True)
    common.git("fsck", "--no-progress", "--no-dangling", git_dir=copies["packyard", runs - 1])
    common.git("fsck", "--no-progress", "--no-dangling", git_dir=copies["git", runs - 1])
    for repo in copies.values():
        shutil.rmtree(repo)
    return rows


def _report(name: str, rows: dict[str, list]) -> None:
    g, p = rows["git"], rows["packyard"]
    wg, wp = statistics.median(r["wall"] for r in g), statistics.median(r["wall"] for r in p)
    rg, rp = max(r["rss"] for r in g), max(r["rss"] for r in p)
    print(f"{name}: {'':22} {'packyard':>10} {'git':>10} {'ratio':>7}")
    print(f"{name}: {'wall time (median) s':22} {wp:10.3f} {wg:10.3f} {wp / wg:6.2f}x")
    print(f"{name}: {'peak RSS (max) MiB':22} {rp / 2**20:10.1f} {rg / 2**20:10.1f} {rp / rg:6.2f}x")
    print(f"{name}: {'pack bytes':22} {p[-1]['bytes']:10} {g[-1]['bytes']:10} {p[-1]['bytes'] / g[-1]['bytes']:6.3f}x")


def run(args: argparse.Namespace) -> int:
    from packyard.store.maintenance.pool.layout import ISLAND_REGEX

    start = common.corpus_bench_start("pool", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    rows = args.row or ["disk", "fork-repack", "pool-repack"]
    print(f"{os.cpu_count()} cores, {args.forks} forks x {args.own} own commits, {args.runs} rounds per timed row "
          f"alternating git/packyard, in {work} ({common.describe_filesystem(work)})", flush=True)
    try:
        src = base_repo(work / "inputs" / "v2.git", pack, refs)
        pool, ours, theirs = _network(work, src, args.forks, args.own)
        results = {}
        if "disk" in rows:
            _disk(src, pool, ours, theirs)
        if "fork-repack" in rows:
            template = ours[0].with_name("fork-template.git")
            shutil.copytree(ours[0], template)
            _own_commits(template, "template", args.own, start=args.own)   # a further push to pack
            ours_cmd = common.packyard_entry() + ["repack", "--repo", "{repo}", "--json", "--no-progress",
                                                  "--no-commit-graph", "--no-pack-refs"]
            results["fork-repack"] = _timed("fork-repack", template, {
                "packyard": ours_cmd, "git": ["git", "--git-dir", "{repo}", "repack", "-a", "-d", "-l", "-q"]},
                args.runs, work)
        if "pool-repack" in rows:
            ours_cmd = common.packyard_entry() + ["repack", "--repo", "{repo}", "--json", "--no-progress",
                                                  "--no-commit-graph", "--no-pack-refs"]
            git_cmd = ["git", "-c", f"pack.island={ISLAND_REGEX}", "--git-dir", "{repo}", "repack", "-a", "-d", "-i",
                       "-q"]
            results["pool-repack"] = _timed("pool-repack", pool, {"packyard": ours_cmd, "git": git_cmd}, args.runs,
                                            work)
        print()
        for name, r in results.items():
            _report(name, r)
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
