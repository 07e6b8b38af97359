"""packyard bench loose: 10,000 small files imported as one commit + a ref, packyard vs git batch fsync.

Both sides write the same files from the same directory into a fresh repository on the
same filesystem, durably by their own rules, and end with a ref pointing at a commit:

* git:      ``git -c core.fsync=loose-object -c core.fsyncMethod=batch update-index --add --stdin``
            (the setting measured in issue 4), then ``write-tree``, ``commit-tree``, ``update-ref``;
* packyard: ``packyard import --repo R --ref refs/heads/main DIR`` (the installed command, a fresh process).
            At or above PACKYARD_PACK_THRESHOLD objects (1,000 by default, so here) it writes one pack
            with computed deltas (store/batch/pack.py): one flush, renames with the idx last, a directory
            fsync, the ref by CAS. ``--loose-path`` sets the threshold to 0: loose files, one syncfs
            barrier, all renames, one syncfs for the directory entries, the ref by CAS.

After the timed rounds the pack packyard wrote is compared with the one ``git repack -d`` makes of
git's loose objects (same objects: the trees are checked to be identical).

The two trees must be identical (checked). Wall times alternate git/packyard per round
(the machine is shared: the spread is printed). Then each side runs once under
``strace -f -c`` for the durable-flush (fsync, fdatasync, syncfs, msync), write-out
(sync_file_range), rename, link and unlink counts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packyard.workers.cli.bench import neighbour, nfsim_side
from packyard.workers.cli.bench.common import compile_bytecode, describe_filesystem, fresh_ext4, packyard_entry

FLUSH_CALLS = ("fsync", "fdatasync", "syncfs", "msync")
COUNTED = FLUSH_CALLS + ("sync_file_range", "rename", "renameat", "renameat2", "link", "linkat", "unlink",
                         "unlinkat", "openat", "mkdir")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("loose", help="bulk loose writes: packyard import vs git update-index (batch fsync)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=10_000, help="number of small files (default 10000)")
    p.add_argument("--runs", type=int, default=3, help="timed rounds, alternating git/packyard (default 3)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--no-strace", action="store_true", help="skip the strace -f -c counting runs")
    p.add_argument("--loose-path", action="store_true",
                   help="packyard writes loose files (PACKYARD_PACK_THRESHOLD=0) instead of one pack")
    p.add_argument("--fresh-ext4", action="store_true",
                   help="run on a new journaled ext4 loop-mounted under the work directory (root only): "
                        "figures independent of what else the machine deleted lately")
    p.add_argument("--noisy-neighbour", action="store_true",
                   help="another process streams writes to the same filesystem during the import; then 10-object "
                        "pushes quiet and under it, per flush method (workers/cli/bench/neighbour.py)")
    p.add_argument("--pushes", type=int, default=100, help="10-object pushes per method and condition (default 100)")
    p.add_argument("--no-import", action="store_true", help="with --noisy-neighbour: only the pushes")
    p.add_argument("--neighbour-mib", type=int, default=1024,
                   help="the neighbour's file wraps at this size (default 1024 MiB)")
    nfsim_side.add_arg(p)
    p.set_defaults(func=run)


def make_files(src: Path, n: int) -> list[str]:
    names = []
    per_dir = 100
    for i in range(n):
        d = f"d{i // per_dir:03d}"
        (src / d).mkdir(parents=True, exist_ok=True)
        name = f"{d}/f{i % per_dir:03d}.txt"
        (src / name).write_bytes(f"file {i}\n".encode() + b"x" * ((i * 37) % 200) + b"\n")
        names.append(name)
    return names


def git_env() -> dict[str, str]:
    return {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x",
            "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x", "GIT_AUTHOR_DATE": "1700000000 +0000",
            "GIT_COMMITTER_DATE": "1700000000 +0000"}


GIT_SCRIPT = (
    'set -e; git -c core.fsync=loose-object -c core.fsyncMethod=batch update-index --add --stdin < "$1"; '
    't=$(git write-tree); c=$(echo bench | git commit-tree "$t"); git update-ref refs/heads/main "$c"; echo "$t"')


def git_cmd(list_file: Path) -> list[str]:
    return ["sh", "-c", GIT_SCRIPT, "sh", str(list_file)]


def packyard_cmd(repo: Path, src: Path) -> list[str]:
    # The installed `packyard` command, as a user runs it (start-up included).
    return packyard_entry() + ["import", "--repo", str(repo), "--ref", "refs/heads/main", "--json", "--no-progress",
                               str(src)]


def phase_summary(counters: dict, wall: float) -> str:
    """packyard's own phase times (ms) from its job counters; 'other' is start-up, imports, exit."""
    ms = {k.removeprefix("elapsed_us_"): v / 1000 for k, v in counters.items() if k.startswith("elapsed_us_")}
    if counters.get("write_path") == "pack":
        shown = [("scan", "scan"), ("collect", "read+hash"), ("search", "delta search"), ("write", "write pack"),
                 ("install", "install"), ("update_refs", "ref")]
    else:
        shown = [("scan", "scan"), ("collect", "write"), ("barrier_flush", "barrier"),
                 ("publish_renames", "renames"), ("fsync_dirs", "dir sync"), ("update_refs", "ref")]
    parts = [f"{label} {ms.get(key, 0):.0f}" for key, label in shown]
    other = wall * 1000 - sum(ms.values())
    return "ms: " + ", ".join(parts) + f", other {other:.0f}"


def fresh_git(base: Path, tag: str) -> dict[str, str]:
    gdir = base / f"git-{tag}.git"
    shutil.rmtree(gdir, ignore_errors=True)
    subprocess.run(["git", "init", "-q", "--bare", str(gdir)], check=True, env=git_env())
    return {"GIT_DIR": str(gdir)}


def fresh_packyard(base: Path, tag: str) -> Path:
    repo = base / f"packyard-{tag}.git"
    shutil.rmtree(repo, ignore_errors=True)
    subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
    return repo


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"packyard bench loose: {cmd[:3]} failed: {proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def strace_counts(cmd: list[str], env: dict[str, str], cwd: Path, out: Path) -> dict[str, int]:
    subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", "trace=" + ",".join(COUNTED), *cmd], env=env,
                   cwd=cwd, check=True, capture_output=True)
    counts = dict.fromkeys(COUNTED, 0)
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in counts and re.match(r"^[\d.]+$", parts[0]):
            counts[parts[-1]] = int(parts[3])
    return counts


def run(args: argparse.Namespace) -> int:
    if args.nfsim_latency:
        return run_nfsim(args)
    if args.noisy_neighbour:
        return run_noisy(args)
    if not args.fresh_ext4:
        return run_in(args, Path(args.dir) if args.dir else None)
    parent = Path(tempfile.mkdtemp(prefix="packyard-bench-loose-fs-", dir=args.dir))
    try:
        with fresh_ext4(parent) as mnt:
            return run_in(args, mnt / "bench", keep=False)
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def run_noisy(args: argparse.Namespace) -> int:
    """The import under a streaming neighbour on the same filesystem, then the pushes quiet and noisy."""
    base = Path(tempfile.mkdtemp(prefix="packyard-bench-loose-noisy-", dir=args.dir))
    try:
        args.no_strace = True
        if not args.no_import:
            print(f"-- the import with a neighbour streaming writes into {base} --", flush=True)
            with neighbour.neighbour_for(base, args.neighbour_mib):
                rc = run_in(args, base / "import", keep=False)
            if rc:
                return rc
        neighbour.pushes_both_ways(base, args.pushes, args.neighbour_mib)
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_nfsim(args: argparse.Namespace) -> int:
    """The import locally, then with both repositories on an nfsim mount (the source files stay local)."""
    base = Path(tempfile.mkdtemp(prefix="packyard-bench-loose-nfsim-", dir=args.dir))
    try:
        local: dict[str, list[float]] = {}
        if run_in(args, base / "local", keep=False, src_base=base, times_out=local):
            return 1
        args.no_strace = True
        by_latency: dict[str, dict[str, list[float]]] = {}
        for lat in args.nfsim_latency:
            mounted: dict[str, list[float]] = {}
            calls: dict[str, list[dict[str, int]]] = {"git": [], "packyard": []}
            with nfsim_side.mounted(base, lat) as m:
                print(f"\n-- the same on nfsim, {lat} per metadata call ({m.mountpoint}) --", flush=True)
                if run_in(args, m.mountpoint / "bench", keep=False, src_base=base, times_out=mounted,
                          probe=lambda: nfsim_side.probe(m), calls_out=calls):
                    return 1
            nfsim_side.report(lat, local, mounted, calls)
            by_latency[lat] = mounted
        nfsim_side.report_over_floor(by_latency)
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_in(args: argparse.Namespace, where: Path | None, keep: bool | None = None, *, src_base: Path | None = None,
           times_out: dict | None = None, probe=None, calls_out: dict | None = None) -> int:  # type: ignore[no-untyped-def]
    """One comparison in ``where``; ``src_base``: make the source files there instead; ``times_out``
    gets each side's wall times; ``probe`` (an nfsim mount's counters) is read around each timed run
    and the metadata calls of each go to ``calls_out``."""
    root = where or Path(tempfile.mkdtemp(prefix="packyard-bench-loose-"))
    keep = (where is not None) if keep is None else keep
    root.mkdir(parents=True, exist_ok=True)
    src = (src_base or root) / "src"
    try:
        shutil.rmtree(src, ignore_errors=True)
        names = make_files(src, args.files)
        # Read every file once before timing: the first reader of a fresh file would otherwise
        # also pay its relatime atime update (and round 1's git, which runs first, would pay it).
        for name in names:
            (src / name).read_bytes()
        list_file = root / "files.txt"
        list_file.write_text("\n".join(names) + "\n")
        print(f"{args.files} files in {src} ({sum(f.stat().st_size for f in src.rglob('*.txt')) // 1024} KiB), "
              f"{args.runs} rounds alternating git / packyard", flush=True)
        fs = describe_filesystem(root)
        print(f"filesystem: {fs}", flush=True)
        if "without a journal" in fs:
            print("  (every file creation here also scans inodes deleted nearby in the last minutes, for git and "
                  "packyard alike: figures vary with what ran before; --fresh-ext4 avoids that)", flush=True)
        env_py = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
        if args.loose_path:
            env_py["PACKYARD_PACK_THRESHOLD"] = "0"
        compile_bytecode()
        git_times, py_times = [], []
        for i in range(args.runs):
            order = ("git", "packyard") if i % 2 == 0 else ("packyard", "git")
            for side in order:
                # A new repository per run (old ones deleted at the end) and sync(2) first, so no run
                # pays for flushing the previous run's files or deletions.
                if side == "git":
                    env = {**git_env(), **fresh_git(root, f"t{i}"), "GIT_WORK_TREE": str(src)}
                    os.sync()
                    before = probe() if probe else None
                    t, out = timed(git_cmd(list_file), env, src)
                    git_tree = out.strip().splitlines()[-1]
                    git_dir = Path(env["GIT_DIR"])
                    git_times.append(t)
                else:
                    repo = fresh_packyard(root, f"t{i}")
                    os.sync()
                    before = probe() if probe else None
                    t, out = timed(packyard_cmd(repo, src), env_py, root)
                    result = json.loads(out)
                    py_tree = result["tree"]
                    py_repo = repo
                    py_times.append(t)
                    phases = phase_summary(result["counters"], t)
                if probe and calls_out is not None:
                    calls_out[side].append(nfsim_side.calls_between(probe(), before or {}))
            print(f"  round {i + 1}: git {git_times[-1]:.3f}s  packyard {py_times[-1]:.3f}s  ({phases})", flush=True)
        if times_out is not None:
            times_out.update(git=git_times, packyard=py_times)
        if git_tree != py_tree:
            print(f"packyard bench loose: trees differ! git {git_tree} packyard {py_tree}", file=sys.stderr)
            return 1
        g_best, p_best = min(git_times), min(py_times)
        g_med, p_med = statistics.median(git_times), statistics.median(py_times)
        print(f"\nsame tree {py_tree}")
        print(f"{'':28} {'git batch':>10} {'packyard':>10} {'git/packyard':>13}")
        print(f"{'wall best (s)':28} {g_best:10.3f} {p_best:10.3f} {g_best / p_best:12.2f}x")
        print(f"{'wall median (s)':28} {g_med:10.3f} {p_med:10.3f} {g_med / p_med:12.2f}x")
        print(f"packyard wrote {result['counters']['write_path']}"
              + (f" ({result['counters']['deltas_computed']} deltas computed)"
                 if result["counters"]["write_path"] == "pack" else ""))
        # The pack each side ends with: packyard's import vs git repack -d over git's loose objects.
        subprocess.run(["git", "repack", "-d", "-q"], env={**git_env(), "GIT_DIR": str(git_dir)}, check=True)
        g_pack = sum(p.stat().st_size for p in (git_dir / "objects" / "pack").glob("*.pack"))
        p_pack = sum(p.stat().st_size for p in (py_repo / "objects" / "pack").glob("*.pack"))
        if p_pack:
            print(f"{'pack bytes':28} {g_pack:10d} {p_pack:10d}   packyard/git {p_pack / g_pack:.3f}x "
                  "(git: repack -d of its loose objects)")
        if not args.no_strace:
            if shutil.which("strace") is None:
                print("(strace not installed: no syscall counts)")
                return 0
            env = {**git_env(), **fresh_git(root, "s"), "GIT_WORK_TREE": str(src)}
            os.sync()
            gc = strace_counts(git_cmd(list_file), env, src, root / "git.strace")
            pc = strace_counts(packyard_cmd(fresh_packyard(root, "s"), src), env_py, root, root / "py.strace")
            print(f"\nstrace -f -c (one run each){'':2} {'git batch':>10} {'packyard':>10}")
            print(f"{'durable flushes':28} {sum(gc[c] for c in FLUSH_CALLS):10d} "
                  f"{sum(pc[c] for c in FLUSH_CALLS):10d}   (fsync+fdatasync+syncfs+msync)")
            for name in COUNTED:
                if gc[name] or pc[name]:
                    print(f"  {name:26} {gc[name]:10d} {pc[name]:10d}")
            renames = ("rename", "renameat", "renameat2")
            print(f"{'renames':28} {sum(gc[c] for c in renames):10d} {sum(pc[c] for c in renames):10d}")
            print(f"{'link / unlink':28} {gc['link'] + gc['linkat']:>4} / {gc['unlink'] + gc['unlinkat']:<4}"
                  f" {pc['link'] + pc['linkat']:>4} / {pc['unlink'] + pc['unlinkat']:<4}")
        return 0
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
