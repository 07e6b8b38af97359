"""packyard bench backup: ``packyard backup`` / ``restore`` vs ``git bundle create`` / ``git clone --mirror``, side by
side on git-v2.0.0 (the corpus pack), rounds alternating who goes first.

Three rows, each side timed as a fresh process (what an operator or a cron job runs) with GNU time's peak RSS:

* ``full`` -- a full backup into an empty backup root (packyard: bundle, manifest, read-back verification) vs
  ``git bundle create F --all``; the bundles' sizes compared too;
* ``incremental`` -- after ``--commits`` (default 100) new commits, an incremental on that full backup vs ``git
  bundle create I --all --not <the full bundle's tips>``; packyard's in-process time is shown beside it (a worker
  is a long-running process: that is what a queued backup costs);
* ``restore`` -- the full chain into a new repository vs ``git clone --mirror`` of git's full bundle.

Every copy and backup root is made before the timed runs; each round has its own. git verifies what each side
wrote (``git bundle verify``; ``git fsck`` of the restored repositories, whose refs must equal the source's).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.pool import _own_commits
from packyard.workers.cli.bench.repack import TIME, alternating, base_repo, child_env


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("backup", help="packyard backup/restore vs git bundle create / git clone --mirror",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds per row, alternating (default 3)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--commits", type=int, default=100, help="new commits before the incremental (default 100)")
    p.set_defaults(func=run)


def _timed(cmd: list[str], env: dict[str, str], rss_file: Path) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "%M", "-o", str(rss_file), *cmd], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    return wall, int(rss_file.read_text().split()[-1]) * 1024, proc.stdout


def _tips(bundle: Path) -> list[str]:
    out = common.git("bundle", "list-heads", str(bundle)).decode().split("\n")
    return sorted({line.split()[0] for line in out if line.strip()})


def run(args: argparse.Namespace) -> int:
    start = common.corpus_bench_start("backup", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    env = child_env()
    env.update({"PACKYARD_STATE_DIR": str(work / "state"), "PACKYARD_STORAGE_ROOTS": f"bench={work / 'root'}"})
    for name in ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL", "PACKYARD_BACKUP_ROOT"):
        env.pop(name, None)
    packyard = common.packyard_entry()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {args.runs} rounds per row alternating "
          f"git/packyard, in {work} ({common.describe_filesystem(work)})", flush=True)
    try:
        source = base_repo(work / "root" / "source.git", pack, refs)
        common.git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=source)
        common.git("tag", "-a", "-m", "bench tag", "bench-tag", "refs/heads/main", git_dir=source)
        runs = range(args.runs)
        roots = {(side, r): work / f"backups-{side}-{r}" for side in ("git", "packyard") for r in runs}
        for d in roots.values():
            d.mkdir(parents=True)
        rows: dict[str, dict[str, list[tuple[float, int]]]] = {n: {"git": [], "packyard": []}
                                                               for n in ("full", "incremental", "restore")}
        sizes: dict[str, list[int]] = {"git": [], "packyard": []}
        inproc: list[float] = []
        rss = work / "rss.txt"

        def our_bundles(r: int) -> list[Path]:
            d = roots["packyard", r]
            manifest = json.loads(next(d.rglob("manifest.json")).read_text())
            return [next(d.rglob("manifest.json")).parent / e["file"] for e in manifest["entries"]]

        # -- full ------------------------------------------------------------------------------------------
        for r, side in alternating(args.runs):
            if side == "git":
                cmd = ["git", "--git-dir", str(source), "bundle", "create", "-q", str(roots["git", r] / "full.bundle"),
                       "--all"]
                wall, peak, _ = _timed(cmd, env, rss)
                sizes["git"].append((roots["git", r] / "full.bundle").stat().st_size)
            else:
                wall, peak, _ = _timed([*packyard, "backup", "--repo", str(source), "--full", "--no-progress"],
                                       {**env, "PACKYARD_BACKUP_ROOT": str(roots["packyard", r])}, rss)
                sizes["packyard"].append(our_bundles(r)[0].stat().st_size)
            rows["full"][side].append((wall, peak))
            print(f"  full round {r + 1} {side:8} wall {wall:7.3f}s  peak RSS {peak / 2**20:7.1f} MiB", flush=True)
        for r in runs:
            common.git("bundle", "verify", "-q", str(our_bundles(r)[0]), git_dir=source)

        # -- incremental -----------------------------------------------------------------------------------
        _own_commits(source, "backup", args.commits)
        for r, side in alternating(args.runs):
            if side == "git":
                prereq = [f"^{tip}" for tip in _tips(roots["git", r] / "full.bundle")]
                cmd = ["git", "--git-dir", str(source), "bundle", "create", "-q", str(roots["git", r] / "inc.bundle"),
                       "--all", *prereq]
                wall, peak, _ = _timed(cmd, env, rss)
            else:
                wall, peak, out = _timed([*packyard, "backup", "--repo", str(source), "--json", "--no-progress"],
                                         {**env, "PACKYARD_BACKUP_ROOT": str(roots["packyard", r])}, rss)
                c = json.loads(out)["counters"]
                inproc.append((c["elapsed_us_snapshot"] + c["elapsed_us_write"] + c["elapsed_us_verify"]) / 1e6)
            rows["incremental"][side].append((wall, peak))
            print(f"  incremental round {r + 1} {side:8} wall {wall:7.3f}s  peak RSS {peak / 2**20:7.1f} MiB",
                  flush=True)
        for r in runs:
            common.git("bundle", "verify", "-q", str(our_bundles(r)[-1]), git_dir=source)

        # -- restore ---------------------------------------------------------------------------------------
        want = common.git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=source)
        for r, side in alternating(args.runs):
            target = work / "root" / f"restored-{side}-{r}.git"
            if side == "git":
                # git's own chain is its full bundle, then its incremental fetched on top
                cmd = ["sh", "-c", 'git clone -q --mirror "$0" "$1" && git --git-dir "$1" fetch -q "$2" '
                       '"+refs/*:refs/*"', str(roots["git", r] / "full.bundle"), str(target),
                       str(roots["git", r] / "inc.bundle")]
            else:
                cmd = [*packyard, "restore", "--from", str(source), "--to", str(target), "--no-progress",
                       "--backup-dir", str(our_bundles(r)[0].parent)]
            wall, peak, _ = _timed(cmd, {**env, "PACKYARD_BACKUP_ROOT": str(roots["packyard", r])}, rss)
            rows["restore"][side].append((wall, peak))
            print(f"  restore round {r + 1} {side:8} wall {wall:7.3f}s  peak RSS {peak / 2**20:7.1f} MiB", flush=True)
            got = common.git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=target)
            if got != want:
                raise SystemExit(f"restored {target} ({side}) has other refs than the source")
            common.git("fsck", "--no-progress", "--no-dangling", git_dir=target)

        print()
        for name, by_side in rows.items():
            p, g = by_side["packyard"], by_side["git"]
            common.print_wall_rss(name, ([w for w, _ in p], [w for w, _ in g]), ([m for _, m in p], [m for _, m in g]),
                                  width=24)
            if name == "full":
                sp, sg = max(sizes["packyard"]), max(sizes["git"])
                print(f"{name}: {'bundle bytes':24} {sp:10d} {sg:10d} {sp / sg:6.2f}x")
            if name == "incremental":
                import statistics

                print(f"{name}: {'packyard in-process s':24} {statistics.median(inproc):10.3f}")
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
