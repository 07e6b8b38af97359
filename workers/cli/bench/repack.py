"""packyard bench repack: `packyard repack` vs `git repack` on identical repositories, side by side.

Scenarios (each side gets its own fresh copy per round, all copies made before the first timed
run so no deletion precedes one; rounds alternate who goes first):

* ``full`` -- git-v2.0.0 split into 50 packs (``git pack-objects --revs`` over 50 ranges of the
  history) plus the newest commits' objects loose; ``packyard repack --mode full`` vs
  ``git -c repack.writeBitmaps=false repack -a -d``. Wall time, size of the new pack, peak RSS.
  Each pack's delta bases are whole objects there: the delta search finds them deltas.
* ``maintenance`` -- the same repository, full maintenance against git's defaults: ``packyard repack --mode
  full`` (pack, reachability bitmap, commit-graph chain with Bloom filters, packed refs: its defaults) vs
  ``git repack -a -d`` (a bitmap: git's default in a bare repository) then ``git commit-graph write --reachable
  --changed-paths`` and ``git pack-refs --all``, one shell under /usr/bin/time. Also the ``.bitmap`` and
  commit-graph sizes.
* ``no-reuse`` -- the same repository; ``packyard repack --mode full --no-reuse`` vs
  ``git -c repack.writeBitmaps=false repack -a -d -f``: every delta computed anew.
* ``loose`` -- every object loose: three successive commits of a 10,000-file tree (the loose-writes
  benchmark's files) in which 10% of the files change each time, written by ``git add``/``commit``;
  ``packyard repack --mode loose`` vs ``git repack -d``.
* ``geometric`` -- one large pack plus 30 small push packs (a few commits each);
  ``packyard repack --mode geometric --factor 2`` vs ``git repack --geometric=2 -d``: wall time and
  the number of packs left.
* ``cruft`` -- ``main`` force-pushed back to 65% of its first-parent history (48% of the objects
  unreachable, all young: workers/cli/bench/repack_hosting.py); ``packyard repack --mode full`` vs
  ``git repack --cruft -d``: wall, peak RSS, the new pack's and the cruft pack's sizes.
* ``cruft-expire`` -- the same, with the newer half of the unreachable objects in a pack dated 30 days
  back; ``--expire 2.weeks.ago`` vs ``git repack --cruft -d --cruft-expiration=2.weeks.ago``.
* ``cruft-update`` -- a repository with git's cruft pack, ``main`` moved back again (to 55%): the second
  full repack over an existing cruft pack.
* ``geometric-ordinary`` / ``geometric-thin`` -- one pack of 90% of the first-parent history plus 30 pushes
  of the rest, as ordinary ``pack-objects --revs`` packs or as thin packs completed by
  ``index-pack --fix-thin``; geometric repack on both sides.
* ``large`` (``--large``) -- a synthetic history made with ``git fast-import`` (``--large-objects``,
  default 500,000 objects) in one pack, full repack on both sides: peak RSS and wall time.

Both commands run as fresh processes under ``/usr/bin/time`` (peak RSS: the largest of the process
and its children, so packyard's forked walk counts).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from packyard.workers.cli.bench import common, nfsim_side
from packyard.workers.cli.bench import repack_hosting as hosting

TIME = "/usr/bin/time"
CRUFT = ("cruft", "cruft-expire", "cruft-update")
PUSHES = ("geometric-ordinary", "geometric-thin")
ALL = ("full", "maintenance", "no-reuse", "geometric", "loose") + CRUFT + PUSHES
#: git's full maintenance (``maintenance``): one shell, the repository as $0.
GIT_MAINTENANCE = ['git --git-dir "$0" repack -a -d -q && git --git-dir "$0" commit-graph write --reachable '
                   '--changed-paths && git --git-dir "$0" pack-refs --all']
#: What git runs for each scenario (packyard: ``OURS``).
GIT_ARGS = {
    "full": ["-c", "repack.writeBitmaps=false", "repack", "-a", "-d", "-q"],
    "maintenance": ["sh", "-c", *GIT_MAINTENANCE, "{repo}"],
    "no-reuse": ["-c", "repack.writeBitmaps=false", "repack", "-a", "-d", "-f", "-q"],
    "cruft": ["-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q"],
    "cruft-expire": ["-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q",
                     "--cruft-expiration=2.weeks.ago"],
    "cruft-update": ["-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q"],
    "geometric": ["repack", "--geometric=2", "-d", "-q"],
    "geometric-ordinary": ["repack", "--geometric=2", "-d", "-q"],
    "geometric-thin": ["repack", "--geometric=2", "-d", "-q"],
    "loose": ["repack", "-d", "-q"],
    "large": ["-c", "repack.writeBitmaps=false", "repack", "-a", "-d", "-q"],
}
#: The repack alone, as git's side above does it (no bitmap, commit-graph, packed refs or MIDX): the same work
#: on both sides. Full maintenance against git's defaults (bitmaps, commit-graph, pack-refs) is
#: ``packyard bench serve``.
_REPACK_ONLY = ["--no-bitmap", "--no-commit-graph", "--no-pack-refs", "--no-midx"]
OURS = {name: [*args, *_REPACK_ONLY] for name, args in {
    "full": ["--mode", "full"],
    "no-reuse": ["--mode", "full", "--no-reuse"],
    "cruft": ["--mode", "full"],
    "cruft-expire": ["--mode", "full", "--expire", "2.weeks.ago"],
    "cruft-update": ["--mode", "full"],
    "geometric": ["--mode", "geometric", "--factor", "2"],
    "geometric-ordinary": ["--mode", "geometric", "--factor", "2"],
    "geometric-thin": ["--mode", "geometric", "--factor", "2"],
    "loose": ["--mode", "loose"],
    "large": ["--mode", "full"],
}.items()}
OURS["maintenance"] = ["--mode", "full"]   # packyard's defaults: bitmap, commit-graph, pack-refs


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("repack", help="packyard repack vs git repack (wall, pack size, RSS, packs left)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds per scenario, alternating (default 3)")
    p.add_argument("--scenario", action="append", choices=ALL + ("large",),
                   default=None, help="run only these (repeatable; default: all but large, which needs --large)")
    p.add_argument("--loose-files", type=int, default=10_000, help="files in the loose scenario's tree")
    p.add_argument("--large", action="store_true", help="also the large synthetic repository")
    p.add_argument("--large-objects", type=int, default=500_000, help="objects in the large repository")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--keep-dir", action="store_true", help="keep the work directory (inputs are reused)")
    p.add_argument("--fresh-ext4", action="store_true",
                   help="run on a new journaled ext4 loop-mounted under the work directory (root only): figures "
                        "independent of what else the machine deleted lately (the loose scenario deletes 12,000 "
                        "files per run, on both sides)")
    nfsim_side.add_arg(p)
    p.set_defaults(func=run)


# -- inputs --------------------------------------------------------------------------------------------

def _git(*args: str, git_dir: Path | None = None, input: bytes | None = None) -> bytes:
    return common.git(*args, git_dir=git_dir, input=input)


def base_repo(dest: Path, pack: Path, refs: Path) -> Path:
    """A bare repository of the corpus pack (indexed by git under its real name) with refs/heads/main."""
    if dest.exists():
        return dest
    _git("init", "-q", "--bare", str(dest))
    with open(pack, "rb") as f:
        subprocess.run(["git", "--git-dir", str(dest), "index-pack", "--stdin"], stdin=f, check=True,
                       stdout=subprocess.DEVNULL)
    tip = refs.read_text().split()[0]
    _git("update-ref", "refs/heads/main", tip, git_dir=dest)
    return dest


def _pack_ranges(dest: Path, src: Path, tips: list[str]) -> str:
    """One pack in ``dest`` per range of ``src``'s history: up to tips[0], then each tip since the one
    before it (as successive pushes would bring them); returns the last tip."""
    prev: str | None = None
    for tip in tips:
        spec = f"{tip}\n" + (f"^{prev}\n" if prev else "")
        _git("pack-objects", "-q", "--revs", str(dest / "objects" / "pack" / "pack"), git_dir=src, input=spec.encode())
        prev = tip
    assert prev is not None
    return prev


def _new_repo_for_history(dest: Path, src: Path) -> list[str]:
    """``dest`` made an empty bare repository; the commits of ``src``'s main, oldest first (topological order)."""
    _git("init", "-q", "--bare", str(dest))
    return _git("rev-list", "--reverse", "--topo-order", "main", git_dir=src).decode().split()


def split_repo(dest: Path, src: Path, packs: int = 50, loose_commits: int = 20) -> Path:
    """``src``'s history in ``packs`` packs of consecutive ranges, the newest ``loose_commits`` commits loose."""
    if dest.exists():
        return dest
    commits = _new_repo_for_history(dest, src)
    body = len(commits) - loose_commits
    prev = _pack_ranges(dest, src, [commits[body * k // packs - 1] for k in range(1, packs + 1)])
    tail = _git("pack-objects", "-q", "--revs", "--stdout", git_dir=src, input=f"{commits[-1]}\n^{prev}\n".encode())
    subprocess.run(["git", "--git-dir", str(dest), "unpack-objects", "-q"], input=tail, check=True)
    _git("update-ref", "refs/heads/main", commits[-1], git_dir=dest)
    return dest


def geometric_repo(dest: Path, src: Path, small: int = 30, per_push: int = 3) -> Path:
    """One large pack (all but the newest ``small * per_push`` commits) plus ``small`` push packs."""
    if dest.exists():
        return dest
    commits = _new_repo_for_history(dest, src)
    cut = len(commits) - small * per_push
    _pack_ranges(dest, src, [commits[cut - 1]] + [commits[cut + (k + 1) * per_push - 1] for k in range(small)])
    _git("update-ref", "refs/heads/main", commits[-1], git_dir=dest)
    return dest


def loose_repo(dest: Path, files: int, versions: int = 3, changed: float = 0.1) -> Path:
    """Every object loose: ``versions`` commits of the loose-writes benchmark's ``files``-file tree, written by
    git (``add -A``, ``commit``); each version rewrites a different ``changed`` share of the files."""
    if dest.exists():
        return dest
    from packyard.workers.cli.bench.loose import git_env, make_files

    _git("init", "-q", "--bare", str(dest))
    work = dest.parent / (dest.name + ".src")
    shutil.rmtree(work, ignore_errors=True)
    names = make_files(work, files)
    env = {**git_env(), "GIT_DIR": str(dest), "GIT_WORK_TREE": str(work), "GIT_INDEX_FILE": str(dest / "index")}
    every = max(1, round(1 / changed))
    for v in range(versions):
        if v:
            for i, name in enumerate(names):
                if i % every == v % every:
                    with open(work / name, "a") as f:
                        f.write(f"changed in version {v}\n")
        # (gc.auto=0: git's commit would otherwise pack the loose objects once there are 6,700 of them)
        subprocess.run(["git", "-c", "gc.auto=0", "add", "-A"], env=env, check=True)
        subprocess.run(["git", "-c", "gc.auto=0", "-c", "maintenance.auto=false", "commit", "-q", "-m",
                        f"version {v}"], env=env, check=True)
    (dest / "index").unlink()
    shutil.rmtree(work)
    return dest


def large_repo(dest: Path, objects: int) -> Path:
    """A synthetic history from ``git fast-import``: 64 directories of 48 files; each commit rewrites two
    files (small edits of earlier content), so every commit adds ~6 objects (a commit, 2 blobs, the root
    and up to 2 directory trees). One pack, as fast-import writes it."""
    if dest.exists():
        return dest
    _git("init", "-q", "--bare", str(dest))
    dirs, files = 64, 48
    commits = max(1, objects // 6)
    proc = subprocess.Popen(["git", "--git-dir", str(dest), "fast-import", "--quiet", "--depth=50"],
                            stdin=subprocess.PIPE)
    w = proc.stdin
    assert w is not None   # (stdin=PIPE)
    when = 1_600_000_000
    body = [f"line {i}: some text that a source file of a project might carry\n".encode() for i in range(60)]
    state = [[0] * files for _ in range(dirs)]

    def blob(d: int, f: int, rev: int) -> bytes:
        lines = list(body)
        lines[rev % 60] = f"dir {d} file {f} revision {rev}\n".encode()
        return b"".join(lines)

    # First commit: every file.
    w.write(b"commit refs/heads/main\n")
    w.write(f"committer Bench <bench@example.com> {when} +0000\ndata 7\ninitial\n".encode())
    for d in range(dirs):
        for f in range(files):
            data = blob(d, f, 0)
            w.write(f"M 100644 inline d{d:02}/f{f:02}.txt\ndata {len(data)}\n".encode() + data + b"\n")
    for c in range(1, commits):
        when += 60
        msg = f"commit {c}".encode()
        w.write(b"commit refs/heads/main\n")
        w.write(f"committer Bench <bench@example.com> {when} +0000\ndata {len(msg)}\n".encode() + msg + b"\n")
        for k in range(2):
            d = (c * 7 + k * 13) % dirs
            f = (c * 11 + k * 5) % files
            state[d][f] += 1
            data = blob(d, f, state[d][f])
            w.write(f"M 100644 inline d{d:02}/f{f:02}.txt\ndata {len(data)}\n".encode() + data + b"\n")
    w.close()
    if proc.wait() != 0:
        raise SystemExit("git fast-import failed")
    return dest


# -- timing --------------------------------------------------------------------------------------------

def measured(cmd: list[str], env: dict[str, str], rss_file: Path) -> tuple[float, int, str]:
    """(wall s, peak RSS bytes, stdout) of ``cmd`` under /usr/bin/time."""
    t0 = time.perf_counter()
    proc = subprocess.run([TIME, "-f", "%M", "-o", str(rss_file)] + cmd, capture_output=True,
                          env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return wall, int(rss_file.read_text().split()[-1]) * 1024, proc.stdout.decode()


def _loose_count(bare: Path) -> int:
    return sum(1 for d in (bare / "objects").iterdir() if len(d.name) == 2 for _ in d.iterdir())


def pack_sizes(bare: Path) -> list[int]:
    return sorted((p.stat().st_size for p in (bare / "objects" / "pack").glob("pack-*.pack")), reverse=True)


def cruft_size(bare: Path) -> int:
    """Bytes of the cruft packs (a pack with a .mtimes file)."""
    return sum(p.stat().st_size for p in (bare / "objects" / "pack").glob("pack-*.pack")
               if p.with_suffix(".mtimes").exists())


def bitmap_size(bare: Path) -> int:
    return sum(p.stat().st_size for p in (bare / "objects" / "pack").glob("pack-*.bitmap"))


def graph_size(bare: Path) -> int:
    """Bytes of the commit-graph: the monolithic file and/or the chain's layers."""
    info = bare / "objects" / "info"
    return sum(p.stat().st_size for p in [info / "commit-graph", *(info / "commit-graphs").glob("*.graph")]
               if p.exists())


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(common.ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


def fresh_copies(template: Path, dest_dir: Path, name: str, runs: int) -> dict[tuple[str, int], Path]:
    """A copy of ``template`` for each side (git, packyard) and round, all made (and synced) before any timed run:
    every run starts from its own fresh directory. Keyed (side, round)."""
    copies = {}
    for rnd in range(runs):
        for side in ("git", "packyard"):
            dest = dest_dir / f"{name}-{side}-{rnd}.git"
            shutil.copytree(template, dest, copy_function=shutil.copy2)
            copies[side, rnd] = dest
    subprocess.run(["sync"], check=False)
    return copies


def warm(repo: Path) -> int:
    """Read every file of ``repo`` once, untimed, right before its timed run; returns the bytes read. The copies
    of all rounds are made before the first run (:func:`fresh_copies`), so a later round's input has waited in
    the page cache for a minute or more, and a VM that reclaims idle page cache (this one's DAMON pageout takes
    pages idle for 60 s) evicts some inputs and not others: that round would time the disk as well. Both sides,
    local and on nfsim (its backing directory: the mount's own cache stays cold, as a client's is for files
    another host wrote), start with their input in the page cache."""
    total = 0
    for p in sorted(repo.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb", buffering=0) as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
    return total


def alternating(runs: int) -> Iterator[tuple[int, str]]:
    """(round, side) in the order the timed runs go: git first in even rounds, packyard first in odd ones."""
    for rnd in range(runs):
        for side in (("git", "packyard") if rnd % 2 == 0 else ("packyard", "git")):
            yield rnd, side


def run_scenario(name: str, template: Path, ours: list[str], theirs: list[str], runs: int, work: Path,
                 mount: Any = None, latency: str | None = None) -> dict:
    """Copies first (every round, both sides), then the timed runs alternating; returns per-side figures.
    With ``mount`` (an nfsim Mount) the copies go to its backing directory and both sides run through the
    mount (its ``latency`` named in the progress lines); each row then has the run's metadata calls by kind
    (``calls``)."""
    env = child_env()
    copies = fresh_copies(template, mount.backing if mount is not None else work, name, runs)
    rows: dict[str, list[dict]] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        repo = copies[side, rnd]
        path = mount.mountpoint / repo.name if mount is not None else repo
        cmd = ([a.replace("{repo}", str(path)) for a in theirs] if theirs[:1] == ["sh"] else
               ["git", "--git-dir", str(path)] + theirs) if side == "git" else \
            (common.packyard_entry() + ["repack", "--repo", str(path), "--json", "--no-progress"] + ours)
        warm(repo)
        # sync(2) first, as the other benchmarks do, so that no run pays for flushing the previous run's pack (a
        # mount's backing filesystem too). (Measured: no change beyond this machine's noise between runs.)
        os.sync()
        before = nfsim_side.probe(mount) if mount is not None else None
        wall, rss, out = measured(cmd, env, work / "rss.txt")
        sizes = pack_sizes(repo)
        row: dict[str, Any] = {"wall": wall, "rss": rss, "packs": len(sizes),
                               "largest": sizes[0] if sizes else 0, "total": sum(sizes),
                               "cruft": cruft_size(repo), "bitmap": bitmap_size(repo),
                               "graph": graph_size(repo)}
        if mount is not None and before is not None:
            row["calls"] = nfsim_side.calls_between(nfsim_side.probe(mount), before)
        if side == "packyard":
            res = json.loads(out)
            row["phases"] = {k.removeprefix("elapsed_us_"): v / 1e6 for k, v in res["counters"].items()
                             if k.startswith("elapsed_us_")}
            row["counters"] = res["counters"]
        rows[side].append(row)
        where = "" if mount is None else f" (nfsim {latency})" if latency else " (nfsim)"
        print(f"  {name}{where} round {rnd + 1} {side:8} wall {wall:7.2f}s  peak RSS {rss / 2**20:7.1f} MiB  "
              f"packs {len(sizes):3}  largest {row['largest'] / 1e6:7.2f} MB  cruft {row['cruft'] / 1e6:6.2f} MB",
              flush=True)
    common.git("fsck", "--full", "--no-dangling", git_dir=copies["packyard", runs - 1])
    for repo in copies.values():
        shutil.rmtree(repo)
    return rows


def report(name: str, rows: dict) -> None:
    g, p = rows["git"], rows["packyard"]
    med = lambda side, key: statistics.median(r[key] for r in side)  # noqa: E731
    print(f"{name}: {'':22} {'packyard':>10} {'git':>10} {'ratio':>7}")
    print(f"{name}: {'wall time (median) s':22} {med(p, 'wall'):10.2f} {med(g, 'wall'):10.2f} "
          f"{med(p, 'wall') / med(g, 'wall'):6.2f}x")
    gr, pr = max(r["rss"] for r in g), max(r["rss"] for r in p)
    print(f"{name}: {'peak RSS (max) MiB':22} {pr / 2**20:10.1f} {gr / 2**20:10.1f} {pr / gr:6.2f}x")
    print(f"{name}: {'largest pack MB':22} {p[-1]['largest'] / 1e6:10.3f} {g[-1]['largest'] / 1e6:10.3f} "
          f"{p[-1]['largest'] / g[-1]['largest']:6.3f}x")
    if g[-1]["cruft"] or p[-1]["cruft"]:
        print(f"{name}: {'cruft pack MB':22} {p[-1]['cruft'] / 1e6:10.3f} {g[-1]['cruft'] / 1e6:10.3f} "
              f"{p[-1]['cruft'] / g[-1]['cruft'] if g[-1]['cruft'] else float('inf'):6.3f}x")
    for key, what in (("bitmap", ".bitmap bytes"), ("graph", "commit-graph bytes")):
        if g[-1].get(key) or p[-1].get(key):
            print(f"{name}: {what:22} {p[-1][key]:10} {g[-1][key]:10} {p[-1][key] / max(1, g[-1][key]):6.3f}x")
    print(f"{name}: {'packs left':22} {p[-1]['packs']:10} {g[-1]['packs']:10}")
    phases = p[len(p) // 2]["phases"]
    print(f"{name}: packyard phases (middle round): " + ", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))
    c = p[-1]["counters"]
    print(f"{name}: packyard counters: objects_out {c['objects_out']}, deltas_reused {c['deltas_reused']}, "
          f"deltas_computed {c['deltas_computed']} ({c['deltas_tried']} tried, {c['search_processes']} processes), "
          f"entries_copied {c['entries_copied']}, rewritten_whole {c['rewritten_whole']}, "
          f"packs_merged {c['packs_merged']}, loose_deleted {c['loose_deleted']}, cruft_kept {c['cruft_kept']}, "
          f"cruft_expired {c['cruft_expired']}")


def run(args: argparse.Namespace) -> int:
    if not Path(TIME).exists():
        print(f"packyard bench repack: needs {TIME} (GNU time) to measure peak RSS", file=sys.stderr)
        return 2
    scenarios = args.scenario or (list(ALL) + (["large"] if args.large else []))
    pack = Path(args.pack) if args.pack else common.corpus_dir() / "git-v2.0.0.pack"
    refs = pack.with_suffix(".refs")
    corpus_scenarios = (set(ALL) - {"loose"}) & set(scenarios)
    if corpus_scenarios and not (pack.exists() and refs.exists()):
        print(f"packyard bench repack: no pack {pack} (with {refs.name})", file=sys.stderr)
        return 2
    common.compile_bytecode()
    if args.fresh_ext4:
        parent = Path(tempfile.mkdtemp(prefix="packyard-bench-repack-fs-", dir=args.dir))
        try:
            with common.fresh_ext4(parent) as mnt:
                return _run_in(args, scenarios, pack, refs, mnt / "bench", keep=True)
        finally:
            shutil.rmtree(parent, ignore_errors=True)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="packyard-bench-repack-"))
    return _run_in(args, scenarios, pack, refs, work, keep=bool(args.keep_dir or args.dir))


def _run_in(args: argparse.Namespace, scenarios: list[str], pack: Path, refs: Path, work: Path, *,
            keep: bool) -> int:
    corpus_scenarios = (set(ALL) - {"loose"}) & set(scenarios)
    work.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, {args.runs} rounds per scenario alternating git/packyard, in {work} "
          f"({common.describe_filesystem(work)})", flush=True)
    print(f"reachability walk: {_walk_implementation()}; {_load()} at start", flush=True)
    stack = contextlib.ExitStack()
    try:
        results: dict[str, dict] = {}
        on_nfsim: dict[tuple[str, str], dict] = {}   # (latency, scenario) -> its rows on that mount
        mounts = {lat: stack.enter_context(nfsim_side.mounted(work, lat)) for lat in args.nfsim_latency or []}

        def scenario(name: str, template: Path, ours: list[str], theirs: list[str], runs: int, work: Path) -> dict:
            rows = run_scenario(name, template, ours, theirs, runs, work)
            for lat, mount in mounts.items():
                on_nfsim[lat, name] = run_scenario(name, template, ours, theirs, runs, work, mount, lat)
            return rows

        if corpus_scenarios:
            src = base_repo(work / "inputs" / "v2.git", pack, refs)
        if {"full", "maintenance", "no-reuse"} & set(scenarios):
            t = split_repo(work / "inputs" / "split50.git", src)
            print(f"full: input {len(pack_sizes(t))} packs ({sum(pack_sizes(t)) / 1e6:.1f} MB) + "
                  f"{_loose_count(t)} loose objects", flush=True)
            for name in ("full", "maintenance", "no-reuse"):
                if name in scenarios:
                    results[name] = scenario(name, t, OURS[name], GIT_ARGS[name], args.runs, work)
        builders = {"geometric": lambda d: geometric_repo(d, src),
                    "cruft": lambda d: hosting.cruft_repo(d, src),
                    "cruft-expire": lambda d: hosting.cruft_expire_repo(d, src),
                    "cruft-update": lambda d: hosting.cruft_update_repo(d, src),
                    "geometric-ordinary": lambda d: hosting.pushes_repo(d, src, thin=False),
                    "geometric-thin": lambda d: hosting.pushes_repo(d, src, thin=True)}
        for name, build in builders.items():
            if name not in scenarios:
                continue
            t = build(work / "inputs" / f"{name}.git")
            extra = ""
            if name in CRUFT:
                n, r = hosting.objects_in(t), hosting.reachable_in(t)
                extra = f", {n} objects, {n - r} unreachable ({(n - r) / n:.0%})"
            print(f"{name}: input {len(pack_sizes(t))} packs ({sum(pack_sizes(t)) / 1e6:.1f} MB){extra}", flush=True)
            results[name] = scenario(name, t, OURS[name], GIT_ARGS[name], args.runs, work)
        if "loose" in scenarios:
            t = loose_repo(work / "inputs" / f"loose-{args.loose_files}.git", args.loose_files)
            print(f"loose: input {_loose_count(t)} loose objects, no pack", flush=True)
            results["loose"] = scenario("loose", t, OURS["loose"], GIT_ARGS["loose"], args.runs, work)
        if "large" in scenarios:
            t0 = time.monotonic()
            t = large_repo(work / "inputs" / f"large-{args.large_objects}.git", args.large_objects)
            n = len(_git("cat-file", "--batch-check", "--batch-all-objects", git_dir=t).splitlines())
            print(f"large: {n} objects in {len(pack_sizes(t))} pack(s), {sum(pack_sizes(t)) / 1e6:.1f} MB "
                  f"(made in {time.monotonic() - t0:.0f}s)", flush=True)
            results["large"] = scenario("large", t, OURS["large"], GIT_ARGS["large"], args.runs, work)
        print(f"\n{_load()} at the end (other work on the machine skews both sides' times)")
        for name, rows in results.items():
            report(name, rows)
        for (lat, name), rows in on_nfsim.items():
            print(f"\n{name}:", end="")
            nfsim_side.report(lat, {s: [r["wall"] for r in results[name][s]] for s in rows},
                              {s: [r["wall"] for r in rows[s]] for s in rows}, {s: [r["calls"] for r in rows[s]]
                                                                                for s in rows})
        for name in results:
            nfsim_side.report_over_floor({lat: {s: [r["wall"] for r in rows[s]] for s in rows}
                                          for (lat, n), rows in on_nfsim.items() if n == name}, f"{name}: ")
        return 0
    finally:
        stack.close()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _walk_implementation() -> str:
    from packyard.store.maintenance.walk import reach as walk

    return walk.IMPLEMENTATION   # "c" or "python" (PACKYARD_PURE_PYTHON=1, or the extension is not built)


def _load() -> str:
    one, five, _fifteen = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"
