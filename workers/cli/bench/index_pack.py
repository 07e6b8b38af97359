"""packyard bench index-pack PACK: `git index-pack` vs `packyard index-pack` on the same pack, side by side.

Both read the pack from stdin into a fresh bare repository on the same filesystem
(git: ``git index-pack --stdin --rev-index``; packyard: the real CLI in a fresh
process, ``packyard index-pack --repo R -``). Rounds alternate git/packyard; wall
time and peak RSS come from ``wait4`` on each child (peak RSS = the largest of the
process and its reaped children, so packyard's resolver processes count); both
run under ``/usr/bin/time`` so that neither inherits this process's high-water
mark (Linux keeps a process's peak RSS across fork+exec). The idx, rev and pack
files of both sides must be byte-identical (checked).

``--strict`` runs both sides with git's fsck (``git index-pack --strict``, ``packyard index-pack
--strict``) and then measures a 50-object push exploded with ``--strict``: packyard's library call
``unpack_objects(strict=True)`` in this (warm) process, as a worker runs it, against
``git unpack-objects --strict``, alternating, fresh repositories each round.

Then each side runs once under ``strace -f`` on a repository with 20 packs and 5,000
loose objects, counting the calls (open/openat/stat/lstat/newfstatat/statx/access/
getdents64) that name a path under ``objects/``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packyard.workers.cli.bench import common, nfsim_side

TRACED = "trace=open,openat,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,getdents64"


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("index-pack", help="packyard index-pack vs git index-pack (wall, RSS, fs calls)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("pack", nargs="?", default=None,
                   help="pack file (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--runs", type=int, default=2, help="rounds, alternating git/packyard (default 2)")
    p.add_argument("--processes", type=int, default=None, help="packyard resolver processes (default: cores)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--no-strace", action="store_true", help="skip the strace filesystem-call counts")
    p.add_argument("--strict", action="store_true",
                   help="both sides with fsck (index-pack --strict), then a 50-object unpack-objects --strict")
    p.add_argument("--unpack-only", action="store_true",
                   help="only the 50-object unpack-objects --strict rows (git's fsync settings, each flush method)")
    nfsim_side.add_arg(p)
    p.set_defaults(func=run)


TIME = "/usr/bin/time"


def measured(cmd: list[str], stdin_path: Path, env: dict[str, str],
             rss_file: Path) -> tuple[float, int, int, bytes, float]:
    """Run ``cmd`` under /usr/bin/time: (wall s, peak RSS bytes incl. reaped children, status, stdout, CPU s)."""
    with open(stdin_path, "rb") as fin:
        t0 = time.perf_counter()
        proc = subprocess.run([TIME, "-f", "%M %U %S", "-o", str(rss_file)] + cmd, stdin=fin, capture_output=True,
                              env=env)
        wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        return wall, 0, proc.returncode, proc.stdout, 0.0
    rss_kb, user, system = rss_file.read_text().split()[-3:]
    return wall, int(rss_kb) * 1024, 0, proc.stdout, float(user) + float(system)


def same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def packyard_cmd(repo: Path, processes: int | None, strict: bool = False) -> list[str]:
    cmd = common.packyard_entry() + ["index-pack", "--repo", str(repo), "--no-progress", "--json"]
    if strict:
        cmd.append("--strict")
    if processes:
        cmd += ["--processes", str(processes)]
    return cmd + ["-"]


def git_cmd(repo: Path, strict: bool = False) -> list[str]:
    return ["git", "--git-dir", str(repo), "index-pack", "--stdin", "--rev-index"] + (["--strict"] if strict else [])


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(common.ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


def only_file(d: Path, suffix: str) -> Path:
    found = sorted(d.glob(f"pack-*{suffix}"))
    if len(found) != 1:
        raise SystemExit(f"expected one {suffix} in {d}, found {found}")
    return found[0]


def busy_repo(dest: Path) -> Path:
    """A bare repository with 20 packs and 5,000 loose objects (the issue's strace setup)."""
    common.git("init", "-q", "--bare", str(dest))
    blobs = dest.parent / "busy-blobs"
    blobs.mkdir(exist_ok=True)
    paths = []
    for i in range(5000):
        p = blobs / str(i)
        p.write_bytes(b"loose object %d\n" % i)
        paths.append(str(p))
    ids = common.git("hash-object", "-w", "--stdin-paths", git_dir=dest, input="\n".join(paths).encode()).split()
    for k in range(20):
        common.git("pack-objects", "-q", str(dest / "objects" / "pack" / "pack"), git_dir=dest,
                   input=b"\n".join(ids[k * 50:(k + 1) * 50]) + b"\n")
    shutil.rmtree(blobs)
    return dest


def strace_count(cmd: list[str], pack: Path, objects_dir: Path, log: Path, env: dict[str, str]) -> int:
    with open(pack, "rb") as fin:
        subprocess.run(["strace", "-f", "-qq", "-y", "-o", str(log), "-e", TRACED] + cmd, stdin=fin,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    needle = str(objects_dir)
    return sum(1 for line in log.read_text(errors="replace").splitlines() if needle in line)


def small_push(base: Path, env: dict[str, str]) -> Path:
    """A self-contained 50-object push made by git: 47 files (40 at the top, 7 in sub/), 2 trees, 1 commit."""
    work = base / "push-work"
    (work / "sub").mkdir(parents=True)
    common.git("init", "-q", str(work))
    for i in range(47):
        d = work if i < 40 else work / "sub"
        (d / f"file{i:02}.c").write_text("".join(f"int f{i}_{k}(void) {{ return {k}; }}\n" for k in range(40 + i)))
    common.git("-C", str(work), "add", "-A")
    common.git("-C", str(work), "-c", "user.name=Bench", "-c", "user.email=bench@example.com", "commit", "-q",
               "-m", "fifty objects")
    out = base / "push50.pack"
    out.write_bytes(common.git("-C", str(work), "pack-objects", "-q", "--revs", "--stdout", input=b"HEAD\n"))
    shutil.rmtree(work)
    return out


def unpack_50(base: Path, rounds: int, env: dict[str, str]) -> None:
    """Library call in this warm process vs git unpack-objects --strict, alternating, fresh repos each round."""
    from packyard.store.flush import FlushPolicy, parse_method
    from packyard.store.pack.unpack import unpack_objects
    from packyard.store.repo import Repository

    push = small_push(base, env)
    data = push.read_bytes()
    # git's default (no fsync of loose objects in 2.39: core.fsync's default leaves loose-object out), git made
    # durable per file and in its batch mode; packyard's own choice (store/flush.py) and each method forced.
    git_sides = {"git": [], "git fsync": ["-c", "core.fsync=loose-object"],
                 "git batch": ["-c", "core.fsync=loose-object", "-c", "core.fsyncMethod=batch"]}
    py_sides = {"packyard": None, "packyard fsync_each": "fsync_each", "packyard syncfs": "syncfs"}
    times: dict[str, list[float]] = {side: [] for side in (*git_sides, *py_sides)}
    warm = base / "warm.git"
    common.git("init", "-q", "--bare", str(warm))
    res = unpack_objects(Repository.open(warm), data, strict=True)     # warm the process (imports, caches)
    for rnd in range(rounds):
        sides = list(times) if rnd % 2 == 0 else list(reversed(times))
        for side in sides:
            repo = base / f"u-{side.replace(' ', '-')}-{rnd}.git"
            common.git("init", "-q", "--bare", str(repo))
            os.sync()
            t0 = time.perf_counter()
            if side in git_sides:
                subprocess.run(["git", *git_sides[side], "--git-dir", str(repo), "unpack-objects", "-q", "--strict"],
                               input=data, check=True, env=env)
            else:
                method = py_sides[side]
                unpack_objects(Repository.open(repo), data, strict=True,
                               flush_policy=FlushPolicy(parse_method(method) if method else None))
            times[side].append(time.perf_counter() - t0)
            shutil.rmtree(repo)
    g, p = statistics.median(times["git"]), statistics.median(times["packyard"])
    print(f"unpack-objects --strict of a {res.objects}-object push ({len(data)} bytes), {rounds} alternating rounds: "
          f"packyard (library call, warm process) {p * 1000:.1f} ms, git {g * 1000:.1f} ms, ratio {p / g:.2f}x")
    for side, ts in times.items():
        m = statistics.median(ts)
        print(f"  {side:22} median {m * 1000:7.1f} ms  (min {min(ts) * 1000:6.1f}, max {max(ts) * 1000:6.1f})  "
              f"vs git default {m / g:5.2f}x  vs git fsync {m / statistics.median(times['git fsync']):5.2f}x")
    # where packyard's time goes: the checks alone (parse, resolve, fsck; nothing written) vs the durable write
    from packyard.store.fsck import STRICT
    from packyard.store.pack.unpack import parse_pack, strict_check
    fresh = Repository.open(warm)
    snap = fresh.objects.snapshot()
    checks = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        strict_check(fresh, snap, data, parse_pack(data), snap.read, STRICT, "<push>")
        checks.append(time.perf_counter() - t0)
    print(f"  of which parse + resolve + fsck (nothing written): {statistics.median(checks) * 1000:.2f} ms; the rest "
          f"is the durable loose write (one syncfs barrier; git unpack-objects does not fsync loose objects by "
          f"default)")
def run_on_nfsim(args: argparse.Namespace, base: Path, pack: Path, env: dict[str, str], rows: dict) -> None:
    """The same rounds on an nfsim mount per latency (fresh repositories there), each with its table; with a
    latency of 0 among them, each side's time over its time there."""
    by_latency = {lat: run_on_mount(args, base, pack, env, rows, lat) for lat in args.nfsim_latency}
    nfsim_side.report_over_floor(by_latency)


def run_on_mount(args: argparse.Namespace, base: Path, pack: Path, env: dict[str, str], rows: dict,
                 latency: str) -> dict[str, list[float]]:
    """The rounds on one mount; prints its table, returns each side's wall times there."""
    local = {side: [w for w, _ in rows[side]] for side in ("packyard", "git")}
    walls: dict[str, list[float]] = {"packyard": [], "git": []}
    calls: dict[str, list[dict[str, int]]] = {"packyard": [], "git": []}
    with nfsim_side.mounted(base, latency) as m:
        for rnd in range(args.runs):
            for side in (("git", "packyard") if rnd % 2 == 0 else ("packyard", "git")):
                repo = m.mountpoint / f"{side}-{rnd}.git"
                common.git("init", "-q", "--bare", str(repo))
                before = nfsim_side.probe(m)
                cmd = git_cmd(repo, args.strict) if side == "git" else packyard_cmd(repo, args.processes, args.strict)
                wall, _, rc, _, _ = measured(cmd, pack, env, base / "rss.txt")
                if rc != 0:
                    raise SystemExit(f"{side} failed on nfsim with status {rc}")
                calls[side].append(nfsim_side.calls_between(nfsim_side.probe(m), before))
                walls[side].append(wall)
                print(f"  nfsim {latency} round {rnd + 1} {side:8} wall {wall:7.2f}s", flush=True)
                shutil.rmtree(repo)
    nfsim_side.report(latency, local, walls, calls)
    return walls


def run(args: argparse.Namespace) -> int:
    pack = Path(args.pack) if args.pack else common.corpus_dir() / "git-v2.0.0.pack"
    if not Path(TIME).exists():
        print(f"packyard bench index-pack: needs {TIME} (GNU time) to measure peak RSS", file=sys.stderr)
        return 2
    if not pack.exists():
        print(f"packyard bench index-pack: no pack {pack}", file=sys.stderr)
        return 2
    env = child_env()
    common.compile_bytecode()
    base = Path(tempfile.mkdtemp(prefix="packyard-bench-ip-", dir=args.dir))
    try:
        if args.unpack_only:
            unpack_50(base, max(args.runs, 5), env)
            return 0
        rows: dict[str, list] = {"git": [], "packyard": []}
        cpus: dict[str, list[float]] = {"git": [], "packyard": []}
        phases: list[dict] = []
        print(f"pack {pack} ({pack.stat().st_size / 1e6:.1f} MB), {os.cpu_count()} cores, "
              f"{args.runs} rounds alternating git/packyard{' (--strict)' if args.strict else ''}", flush=True)
        for rnd in range(args.runs):
            order = ("git", "packyard") if rnd % 2 == 0 else ("packyard", "git")
            for side in order:
                repo = base / f"{side}-{rnd}.git"
                common.git("init", "-q", "--bare", str(repo))
                cmd = git_cmd(repo, args.strict) if side == "git" else packyard_cmd(repo, args.processes, args.strict)
                wall, rss, rc, out, cpu = measured(cmd, pack, env, base / "rss.txt")
                if rc != 0:
                    print(f"{side} failed with status {rc}", file=sys.stderr)
                    return 1
                rows[side].append((wall, rss))
                cpus[side].append(cpu)
                if side == "packyard":
                    res = json.loads(out)
                    phases.append({k.removeprefix("elapsed_us_"): v / 1e6 for k, v in res["counters"].items()
                                   if k.startswith("elapsed_us_")})
                print(f"  round {rnd + 1} {side:8} wall {wall:7.2f}s  cpu {cpu:6.2f}s  peak RSS {rss / 2**20:7.1f} MiB",
                      flush=True)
            g_pack = base / f"git-{rnd}.git" / "objects" / "pack"
            p_pack = base / f"packyard-{rnd}.git" / "objects" / "pack"
            for suffix in (".idx", ".rev", ".pack"):
                if not same_file(only_file(g_pack, suffix), only_file(p_pack, suffix)):
                    print(f"MISMATCH: {suffix} files differ between git and packyard", file=sys.stderr)
                    return 1
            for side in ("git", "packyard"):
                shutil.rmtree(base / f"{side}-{rnd}.git")
        g_wall = statistics.median(w for w, _ in rows["git"])
        p_wall = statistics.median(w for w, _ in rows["packyard"])
        g_rss = max(r for _, r in rows["git"])
        p_rss = max(r for _, r in rows["packyard"])
        print("idx, rev and pack byte-identical to git's: yes")
        print("packyard phases (median-round values): " + ", ".join(
            f"{k} {statistics.median(p[k] for p in phases):.2f}s" for k in phases[0]))
        print(f"{'':24} {'packyard':>10} {'git':>10} {'ratio':>7}")
        print(f"{'wall time (median) s':24} {p_wall:10.2f} {g_wall:10.2f} {p_wall / g_wall:6.2f}x")
        print(f"{'peak RSS (max) MiB':24} {p_rss / 2**20:10.1f} {g_rss / 2**20:10.1f} {p_rss / g_rss:6.2f}x")
        g_cpu, p_cpu = statistics.median(cpus["git"]), statistics.median(cpus["packyard"])
        print(f"{'cpu user+sys (median) s':24} {p_cpu:10.2f} {g_cpu:10.2f} {p_cpu / g_cpu:6.2f}x")
        print(f"wall spread: git {min(w for w, _ in rows['git']):.2f}-{max(w for w, _ in rows['git']):.2f}s, "
              f"packyard {min(w for w, _ in rows['packyard']):.2f}-{max(w for w, _ in rows['packyard']):.2f}s")
        if args.strict:
            unpack_50(base, max(args.runs, 5), env)
        if args.nfsim_latency:
            run_on_nfsim(args, base, pack, env, rows)
        if not args.no_strace:
            if shutil.which("strace") is None:
                print("strace not installed: filesystem-call counts skipped")
                return 0
            busy = busy_repo(base / "busy.git")
            counts = {}
            for side in ("git", "packyard"):
                repo = base / f"busy-{side}.git"
                shutil.copytree(busy, repo)
                cmd = git_cmd(repo) if side == "git" else packyard_cmd(repo, args.processes)
                counts[side] = strace_count(cmd, pack, repo / "objects", base / f"{side}.strace", env)
            print(f"filesystem calls naming objects/ (repo with 20 packs + 5,000 loose objects; "
                  f"open/stat/access/getdents): packyard {counts['packyard']}, git {counts['git']}")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
