"""packyard bench pool: a fork network in an object pool, packyard vs git doing the same work, side by side.

Input: git-v2.0.0 (the corpus pack) as the source, and ``--forks`` forks of it (default 20), each with
``--own`` commits of its own (default 10, written by ``git fast-import``). Six rows:

* ``disk`` -- the network's objects on disk after linking and maintenance: packyard (``pool create`` from the
  source, ``pool link`` of every fork: alternates, then a local-only repack) vs git (``git clone --bare
  --shared`` of every fork from the source, its own commits, ``git repack -a -d -l``), each against one
  repository's objects (the source's). ``objects/pack/preserved/`` is not counted: it expires after the
  preserve time. Checked by ``git fsck`` in every fork and ``git count-objects -v``.
* ``fork-repack`` -- a full repack of one linked fork after a further push of ``--own`` commits:
  ``packyard repack --no-commit-graph --no-pack-refs`` vs ``git repack -a -d -l`` (the same alternates), each on
  its own fresh copy per round, rounds alternating who goes first.
* ``pool-repack`` -- a full repack of the pool holding every fork's refs in its namespace, with delta islands:
  ``packyard repack`` (its pool repack: islands ``refs/virtual/([^/]+)/``, the source's island the core, and
  what every member reaches kept) vs ``git -c pack.island='refs/virtual/([^/]+)/' -c pack.islandCore=<the
  source's key> repack -a -d -i``; pack bytes side by side. Checked by ``git fsck``.
* ``thin-push`` -- a thin push to a linked fork: ``--push`` commits that each change the source's ``Makefile``
  (so blobs and trees are deltas against bases only the pool holds), packed by ``git pack-objects --thin``, then
  ingested by ``packyard index-pack --fix-thin --strict`` vs ``git index-pack --stdin --fix-thin --strict`` (as
  receive-pack runs it), each into its own fresh copy of the fork with the same alternates. Checked by
  ``git fsck`` of both copies (the completed pack's bases read from the pool).
* ``thin-push-warm`` -- the same ingest as a worker runs it: the library call (``index_pack(fix_thin=True,
  strict=True)``, workers/commands/index_pack.py) in this process, its imports done by one untimed call, vs the
  same ``git index-pack`` process, each into its own fresh copy. The difference from ``thin-push`` is the CLI
  process's start (the interpreter and its imports), which a push handed to a running worker does not pay.
* ``clone`` -- a clone of one fork served from each side's island-repacked pool: the pool repacked once per side
  (untimed, as in ``pool-repack``), a copy of the first fork borrowing from it, then the ``git pack-objects``
  that ``upload-pack`` runs for a clone (``--revs --all --thin --stdout --delta-base-offset``) timed on each.
  Checked: the pack holds exactly what the fork reaches and no object of any other fork's own commits; the
  deltas it reused from the pool and the objects it sent verbatim from a bitmapped pack (git's ``Total ... reused
  ... pack-reused`` line) side by side.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.repack import (
    TIME,
    alternating,
    base_repo,
    child_env,
    fresh_copies,
    measured,
    pack_sizes,
    warm,
)

ROWS = ("disk", "fork-repack", "pool-repack", "thin-push", "thin-push-warm", "clone")
#: git's summary line of a pack it wrote (builtin/pack-objects.c, printed with progress on).
TOTAL_RE = re.compile(rb"Total (\d+) \(delta (\d+)\), reused (\d+) \(delta (\d+)\)"
                      rb"(?:, pack-reused (\d+))?")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("pool", help="a fork network in an object pool: packyard vs git",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--forks", type=int, default=20, help="forks of the source (default 20)")
    p.add_argument("--own", type=int, default=10, help="commits of its own per fork (default 10)")
    p.add_argument("--runs", type=int, default=3, help="rounds per timed row, alternating (default 3)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--push", type=int, default=100, help="commits in the thin-push row's pack (default 100)")
    p.add_argument("--row", action="append", choices=ROWS, default=None,
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


def _thin_pack(fork: Path, work: Path, count: int) -> Path:
    """A thin pack of ``count`` commits onto the linked ``fork``'s main, each appending to the ``Makefile``: its
    deltas' bases (the old Makefile, the old trees) are in the pool, so ingest must complete it from there."""
    client = work / "thin-client.git"
    common.git("clone", "-q", "--bare", "--shared", str(fork), str(client))
    old = common.git("rev-parse", "refs/heads/main", git_dir=client).decode().strip()
    text = common.git("cat-file", "blob", f"{old}:Makefile", git_dir=client)
    lines = []
    for i in range(count):
        text += f"# thin push change {i}\n".encode()
        msg = f"thin push: change {i}\n".encode()
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"committer pusher <p@example.com> {1710000000 + i} +0000\n".encode())
        lines.append(b"data %d\n%s" % (len(msg), msg))
        if i == 0:
            lines.append(f"from {old}\n".encode())
        lines.append(b"M 100644 inline Makefile\ndata %d\n%s\n" % (len(text), text))
    common.git("fast-import", "--quiet", git_dir=client, input=b"".join(lines))
    new = common.git("rev-parse", "refs/heads/main", git_dir=client).decode().strip()
    pack = work / "thin-push.pack"
    pack.write_bytes(common.git("pack-objects", "--thin", "--stdout", "--revs", "-q", git_dir=client,
                                input=f"{new}\n^{old}\n".encode()))
    shutil.rmtree(client)
    return pack


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


def _core(pool: Path) -> str:
    """The island core packyard's pool repack takes when none is named: the source's namespace key (git is
    given the same ``pack.islandCore``, so both sides do the same work)."""
    from packyard.store.maintenance.pool.layout import read_marker, source_key

    key = source_key(read_marker(pool))
    if key is None:
        raise SystemExit(f"the pool {pool} names no source")
    return key


def _disk(src: Path, pool: Path, ours: list[Path], theirs: list[Path]) -> None:
    one = _objects_bytes(src)
    mine = _objects_bytes(pool) + sum(_objects_bytes(f) for f in ours)
    git_side = one + sum(_objects_bytes(f) for f in theirs)
    for f in (*ours, *theirs):
        common.git("fsck", "--no-progress", "--no-dangling", git_dir=f)
    print(f"disk: one repository's objects {one / 1e6:.1f} MB; {len(ours)} forks: packyard pool + forks "
          f"{mine / 1e6:.1f} MB ({mine / one:.3f}x one), git source + --shared forks {git_side / 1e6:.1f} MB "
          f"({git_side / one:.3f}x one); {len(ours)} full copies would be {len(ours) + 1:.0f}x")


def _warm_inputs(repo: Path) -> None:
    """:func:`~.repack.warm` of ``repo`` and of the objects it borrows (its alternates), right before its timed
    run: every round of both sides starts with its input in the page cache."""
    warm(repo)
    alternates = repo / "objects" / "info" / "alternates"
    if alternates.exists():
        for line in alternates.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                warm((repo / "objects" / line.strip()).resolve())


def _rounds(name: str, template: Path, runs: int, run_side: Callable[[str, Path], dict]) -> dict[str, list]:
    """The timed rows' rounds: a fresh copy of ``template`` per side and round, its input read in first, then
    ``run_side(side, copy)`` (its ``wall``, and ``rss`` when it ran as a process of its own); the last
    copies checked by ``git fsck``."""
    copies = fresh_copies(template, template.parent, name, runs)   # (beside the pool: relative alternates hold)
    rows: dict[str, list] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        repo = copies[side, rnd]
        _warm_inputs(repo)
        row = run_side(side, repo)
        row["bytes"] = sum(pack_sizes(repo))
        rows[side].append(row)
        rss = f"  peak RSS {row['rss'] / 2**20:7.1f} MiB" if "rss" in row else ""
        print(f"  {name} round {rnd + 1} {side:8} wall {row['wall']:7.3f}s{rss}  packs {row['bytes'] / 1e6:7.2f} MB",
              flush=True)
    common.git("fsck", "--no-progress", "--no-dangling", git_dir=copies["packyard", runs - 1])
    common.git("fsck", "--no-progress", "--no-dangling", git_dir=copies["git", runs - 1])
    for repo in copies.values():
        shutil.rmtree(repo)
    return rows


def _timed(name: str, template: Path, commands: dict[str, list[str]], runs: int, work: Path) -> dict[str, list]:
    env = child_env()

    def run_side(side: str, repo: Path) -> dict:
        wall, rss, _out = measured([a.replace("{repo}", str(repo)) for a in commands[side]], env, work / "rss.txt")
        return {"wall": wall, "rss": rss}

    return _rounds(name, template, runs, run_side)


def _timed_warm(name: str, template: Path, pack: Path, git_cmd: list[str], runs: int, work: Path
                ) -> dict[str, list]:
    """The ``thin-push-warm`` row (module docstring): the library call in this process vs git's process."""
    from packyard.workers.commands.index_pack import index_pack

    env = child_env()
    scratch = template.with_name(f"{name}-imports.git")
    shutil.copytree(template, scratch, copy_function=shutil.copy2)
    index_pack(scratch, pack, fix_thin=True, strict=True)   # untimed: the imports, once
    shutil.rmtree(scratch)

    def run_side(side: str, repo: Path) -> dict:
        if side == "git":
            wall, rss, _out = measured([a.replace("{repo}", str(repo)) for a in git_cmd], env, work / "rss.txt")
            return {"wall": wall, "rss": rss}
        t0 = time.perf_counter()
        index_pack(repo, pack, fix_thin=True, strict=True)
        return {"wall": time.perf_counter() - t0}

    return _rounds(name, template, runs, run_side)


def _other_forks_objects(src: Path, forks: list[Path]) -> set[bytes]:
    """The objects of every fork's own commits (what it reaches and the source does not)."""
    base = common.git("rev-parse", "refs/heads/main", git_dir=src).decode().strip()
    own: set[bytes] = set()
    for fork in forks:
        out = common.git("rev-list", "--objects", "refs/heads/main", f"^{base}", git_dir=fork)
        own.update(line[:40] for line in out.splitlines())
    return own


def _clone(src: Path, pool: Path, ours: list[Path], repack: dict[str, list[str]], runs: int, work: Path
           ) -> dict[str, list]:
    """The clone row (module docstring): serve the first fork from each side's island-repacked pool.
    ``src``: the repository the forks were made from (their shared history)."""
    env = child_env()
    forks = {}
    for side in ("packyard", "git"):
        side_pool = pool.with_name(f"clone-pool-{side}.git")
        shutil.copytree(pool, side_pool, copy_function=shutil.copy2)
        subprocess.run([a.replace("{repo}", str(side_pool)) for a in repack[side]], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        fork = ours[0].with_name(f"clone-fork-{side}.git")
        shutil.copytree(ours[0], fork, copy_function=shutil.copy2)
        (fork / "objects" / "info" / "alternates").write_text(f"{side_pool / 'objects'}\n")
        forks[side] = fork
    reaches = {line[:40] for line in common.git("rev-list", "--objects", "--all", git_dir=ours[0]).splitlines()}
    others = _other_forks_objects(src, ours[1:]) - reaches
    subprocess.run(["sync"], check=False)
    rows: dict[str, list] = {"git": [], "packyard": []}
    out = work / "clone.pack"
    for rnd, side in alternating(runs):
        _warm_inputs(forks[side])
        cmd = ["git", "--git-dir", str(forks[side]), "pack-objects", "--revs", "--all", "--thin", "--stdout",
               "--delta-base-offset", "--progress"]
        with open(out, "wb") as fout:
            t0 = time.perf_counter()
            proc = subprocess.run([TIME, "-f", "%M", "-o", str(work / "rss.txt")] + cmd, stdin=subprocess.DEVNULL,
                                  stdout=fout, stderr=subprocess.PIPE, env=env, check=True)
            wall = time.perf_counter() - t0
        rss = int((work / "rss.txt").read_text().split()[-1]) * 1024
        total = TOTAL_RE.search(proc.stderr)
        if total is None:
            raise SystemExit(f"clone: no Total line from git pack-objects on {side}'s pool")
        objects, deltas, reused, reused_deltas, verbatim = (int(x or 0) for x in total.groups())
        common.git("index-pack", "-o", str(out.with_suffix(".idx")), str(out))
        with open(out.with_suffix(".idx"), "rb") as fidx:
            sent = {line.split()[1].encode() for line in
                    subprocess.run(["git", "show-index"], stdin=fidx, capture_output=True, check=True,
                                   text=True).stdout.splitlines()}
        if sent != reaches:
            raise SystemExit(f"clone from {side}'s pool: {len(sent)} objects sent, the fork reaches {len(reaches)}")
        if sent & others:
            raise SystemExit(f"clone from {side}'s pool sent {len(sent & others)} objects of other forks")
        rows[side].append({"wall": wall, "rss": rss, "bytes": out.stat().st_size})
        print(f"  clone round {rnd + 1} {side:8} wall {wall:7.3f}s  peak RSS {rss / 2**20:7.1f} MiB  "
              f"pack {out.stat().st_size / 1e6:7.2f} MB  {objects} objects, {deltas} deltas, reused {reused} "
              f"({reused_deltas} deltas), {verbatim} sent verbatim from a bitmapped pack; none of the other "
              f"forks' {len(others)}", flush=True)
    for side in ("packyard", "git"):
        shutil.rmtree(forks[side])
        shutil.rmtree(pool.with_name(f"clone-pool-{side}.git"))
    return rows


def _report(name: str, rows: dict[str, list]) -> None:
    g, p = rows["git"], rows["packyard"]
    if "rss" not in p[0]:   # (a library call: this process's RSS is the bench's own)
        wp, wg = statistics.median(r["wall"] for r in p), statistics.median(r["wall"] for r in g)
        print(f"{name}: {'':22} {'packyard':>10} {'git':>10} {'ratio':>7}")
        print(f"{name}: {'wall time (median) s':22} {wp:10.3f} {wg:10.3f} {wp / wg:6.2f}x")
    else:
        common.print_wall_rss(name, ([r["wall"] for r in p], [r["wall"] for r in g]),
                              ([r["rss"] for r in p], [r["rss"] for r in g]))
    print(f"{name}: {'pack bytes':22} {p[-1]['bytes']:10} {g[-1]['bytes']:10} {p[-1]['bytes'] / g[-1]['bytes']:6.3f}x")


def run(args: argparse.Namespace) -> int:
    from packyard.store.maintenance.pool.layout import ISLAND_REGEX

    start = common.corpus_bench_start("pool", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    rows = args.row or list(ROWS)
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
        pool_repack = {
            "packyard": common.packyard_entry() + ["repack", "--repo", "{repo}", "--json", "--no-progress",
                                                   "--no-commit-graph", "--no-pack-refs"],
            "git": ["git", "-c", f"pack.island={ISLAND_REGEX}", "-c", f"pack.islandCore={_core(pool)}",
                    "--git-dir", "{repo}", "repack", "-a", "-d", "-i", "-q"]}
        if "pool-repack" in rows:
            results["pool-repack"] = _timed("pool-repack", pool, pool_repack, args.runs,
                                            work)
        if "thin-push" in rows or "thin-push-warm" in rows:
            pack = _thin_pack(ours[0], work, args.push)
            print(f"  thin-push: {args.push} commits, a {pack.stat().st_size / 1e3:.1f} kB thin pack", flush=True)
            ours_cmd = common.packyard_entry() + ["index-pack", "--repo", "{repo}", "--fix-thin", "--strict",
                                                  "--json", "--no-progress", str(pack)]
            git_cmd = ["sh", "-c", 'exec git --git-dir "$0" index-pack --stdin --fix-thin --strict < "$1"', "{repo}",
                       str(pack)]
            if "thin-push" in rows:
                results["thin-push"] = _timed("thin-push", ours[0], {"packyard": ours_cmd, "git": git_cmd},
                                              args.runs, work)
            if "thin-push-warm" in rows:
                results["thin-push-warm"] = _timed_warm("thin-push-warm", ours[0], pack, git_cmd, args.runs,
                                                        work)
        if "clone" in rows:
            results["clone"] = _clone(src, pool, ours, pool_repack, args.runs, work)
        print()
        for name, r in results.items():
            _report(name, r)
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
