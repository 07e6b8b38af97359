"""packyard bench receive: ``packyard receive-pack`` vs ``git receive-pack`` (receive.fsckObjects=true), driven by a
real ``git push --receive-pack=...`` from a client repository, side by side.

Two rows, each with a fresh target repository per side and per round, rounds alternating who goes first:

* ``full`` -- a push of all of git-v2.0.0 (the corpus pack, as a client repository) into an empty repository;
* ``ten`` -- a push of 10 new commits onto a repository that holds git-v2.0.0 (copies of one target);
* ``queued`` -- the same 10-commit push over smart HTTP to a running ``packyard http`` whose pushes go through
  the queue to an idle ``packyard worker`` (PACKYARD_RECEIVE_MODE=queue, the default), and, beside it, the same
  server in process mode: the end-to-end time a frontend sees from a long-running receiving process (no
  Python start per push), against git's ``receive-pack`` over stdio (git has no long-running server); the
  push over stdio handed to each of those servers (PACKYARD_RECEIVE_SOCKET) by ``packyard receive-pack`` and by
  its C client ``packyard-receive-pack`` (when it was built), and over stdio in queue mode with no server.

The time is the whole ``git push`` (the client's pack-objects included, the same on both sides); the peak RSS
is the server's alone (``/usr/bin/time`` wraps the receive-pack command). packyard runs the push in process
(its lease in the embedded Redis, its job row in the embedded SQLite of a state directory in the work dir).
A real push rather than a replayed byte stream: the client's negotiation (what it leaves out of the 10-commit
pack after reading each server's advertisement) is part of what is compared.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from packyard.workers.cli.bench import common
from packyard.workers.cli.bench.pool import _own_commits
from packyard.workers.cli.bench.repack import TIME, alternating, base_repo, child_env


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("receive", help="packyard receive-pack vs git receive-pack, by real pushes",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds per row, alternating (default 3)")
    p.add_argument("--pack", default=None, help="source pack (default: the corpus git-v2.0.0.pack)")
    p.add_argument("--dir", default=None, help="work directory (default: a temp dir under /tmp)")
    p.add_argument("--commits", type=int, default=10, help="commits in the small push (default 10)")
    p.add_argument("--row", action="append", choices=("full", "ten", "queued"), default=None,
                   help="run only these rows (repeatable; default: both)")
    p.set_defaults(func=run)


def _push(client: Path, target: Path, side: str, env: dict[str, str], rss_file: Path) -> tuple[float, int]:
    server = (common.packyard_entry() + ["receive-pack"]) if side == "packyard" else ["git", "receive-pack"]
    receive = shlex.join([TIME, "-f", "%M", "-o", str(rss_file), *server])
    t0 = time.perf_counter()
    proc = subprocess.run(["git", "--git-dir", str(client), "push", "-q", f"--receive-pack={receive}", str(target),
                           "refs/heads/main:refs/heads/main"], env=env, capture_output=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"push to {target} ({side}) failed: {proc.stderr.decode(errors='replace')}")
    return wall, int(rss_file.read_text().split()[-1]) * 1024


def _target(path: Path, template: Path | None) -> Path:
    if template is None:
        common.git("init", "-q", "--bare", str(path))
    else:
        shutil.copytree(template, path, copy_function=shutil.copy2)
    common.git("config", "receive.fsckObjects", "true", git_dir=path)   # git's side; packyard's fsck is always on
    return path


def _row(name: str, client: Path, root: Path, template: Path | None, runs: int, env: dict[str, str],
         work: Path) -> dict[str, list[tuple[float, int]]]:
    targets = {(side, rnd): _target(root / f"{name}-{side}-{rnd}.git", template)
               for rnd in range(runs) for side in ("git", "packyard")}
    rows: dict[str, list[tuple[float, int]]] = {"git": [], "packyard": []}
    for rnd, side in alternating(runs):
        wall, rss = _push(client, targets[side, rnd], side, env, work / "rss.txt")
        rows[side].append((wall, rss))
        print(f"  {name} round {rnd + 1} {side:8} wall {wall:7.3f}s  server peak RSS {rss / 2**20:7.1f} MiB",
              flush=True)
    for side in ("git", "packyard"):
        target = targets[side, runs - 1]
        common.git("fsck", "--no-progress", "--no-dangling", git_dir=target)
        tip = common.git("rev-parse", "refs/heads/main", git_dir=target)
        assert tip == common.git("rev-parse", "refs/heads/main", git_dir=client), (side, target)
    for target in targets.values():
        shutil.rmtree(target)
    return rows


def _http_servers(work: Path, env: dict[str, str]) -> tuple[list[subprocess.Popen[bytes]], dict[str, str]]:
    """A worker, and a ``packyard http`` per mode (queue, process); their URLs by mode."""
    from packyard.workers.cli.children import ping_workers

    procs: list[subprocess.Popen[bytes]] = []
    log = open(work / "servers.log", "ab")
    procs.append(subprocess.Popen([*common.packyard_entry(), "worker"], env=env, stdout=log, stderr=log))
    deadline = time.monotonic() + 120
    for name in ("PACKYARD_STATE_DIR", "PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL"):   # this process pings
        if name in env:
            os.environ[name] = env[name]
        else:
            os.environ.pop(name, None)
    while not ping_workers(timeout=0.5):
        if time.monotonic() > deadline or procs[0].poll() is not None:
            raise SystemExit(f"the bench's worker did not start (see {work / 'servers.log'})")
    urls = {}
    for mode in ("queue", "process"):
        proc = subprocess.Popen([*common.packyard_entry(), "http", "--listen", "127.0.0.1:0"],
                                env={**env, "PACKYARD_RECEIVE_MODE": mode,
                                     "PACKYARD_RECEIVE_SOCKET": str(work / f"{mode}.sock")},
                                stdout=subprocess.PIPE, stderr=log)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        urls[mode] = "http://" + line.split("http://", 1)[1].split()[0].rstrip("/") if "http://" in line else ""
        if not urls[mode]:
            raise SystemExit(f"packyard http did not say where it listens: {line!r}")
    return procs, urls


def _http_row(client: Path, root: Path, template: Path, runs: int, env: dict[str, str], work: Path,
              urls: dict[str, str]) -> dict[str, list[float]]:
    """The 10-commit push over HTTP (queue, process), over stdio handed to those servers (``handed-queue``,
    ``handed-process``: ``packyard receive-pack`` passing its streams to the server's PACKYARD_RECEIVE_SOCKET; and
    ``native-queue``, ``native-process``: the same by its C client), over stdio in queue mode with no server
    (``stdio-queue``), and git's over stdio; fresh targets, alternating."""
    from packyard.workers.receive.handoff import native_client

    native = native_client()
    order = ("git", "queue", "process", "handed-queue", "handed-process",
             *(("native-queue", "native-process") if native else ()), "stdio-queue")
    rows: dict[str, list[float]] = {side: [] for side in order}
    stdio = shlex.join([*common.packyard_entry(), "receive-pack"])
    for rnd in range(runs):
        for side in order if rnd % 2 == 0 else reversed(order):
            target = _target(root / f"http-{side}-{rnd}.git", template)
            handed = side.startswith(("handed-", "native-"))     # (to the server of the mode after the dash)
            over_stdio = handed or side in ("git", "stdio-queue")
            url = str(target) if over_stdio else f"{urls[side]}/bench/{target.name}"
            extra = [f"--receive-pack={native if side.startswith('native-') else stdio}"] \
                if over_stdio and side != "git" else []
            sock = str(work / f"{side.split('-', 1)[1]}.sock") if handed else "off"
            t0 = time.perf_counter()
            proc = subprocess.run(["git", "--git-dir", str(client), "push", "-q", *extra, url,
                                   "refs/heads/main:refs/heads/main"],
                                  env={**env, "PACKYARD_RECEIVE_MODE": "queue", "PACKYARD_RECEIVE_SOCKET": sock},
                                  capture_output=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"push to {url} ({side}) failed: {proc.stderr.decode(errors='replace')}")
            rows[side].append(wall)
            print(f"  queued round {rnd + 1} {side:14} wall {wall:7.3f}s", flush=True)
            tip = common.git("rev-parse", "refs/heads/main", git_dir=target)
            assert tip == common.git("rev-parse", "refs/heads/main", git_dir=client), (side, target)
    return rows


def _report(name: str, rows: dict[str, list[tuple[float, int]]]) -> None:
    p, g = rows["packyard"], rows["git"]
    common.print_wall_rss(name, ([w for w, _ in p], [w for w, _ in g]), ([r for _, r in p], [r for _, r in g]),
                          wall_label="push wall (median) s", rss_label="server peak RSS MiB", width=24)


def run(args: argparse.Namespace) -> int:
    start = common.corpus_bench_start("receive", args.pack, TIME, args.dir)
    if start is None:
        return 2
    pack, refs, work = start
    rows = args.row or ["full", "ten"]
    root = work / "root"
    root.mkdir()
    env = child_env()
    env.update({"PACKYARD_STORAGE_ROOTS": f"bench={root}", "PACKYARD_STATE_DIR": str(work / "state"),
                "GIT_TERMINAL_PROMPT": "0", "PACKYARD_RECEIVE_MODE": "process",   # (the stdio rows: in process,
                "PACKYARD_RECEIVE_SOCKET": "off"})                                 # in receive-pack's own process)
    env.pop("PACKYARD_REDIS_URL", None)
    env.pop("PACKYARD_DATABASE_URL", None)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {args.runs} rounds per row alternating "
          f"git/packyard, in {work} ({common.describe_filesystem(work)})", flush=True)
    try:
        client = base_repo(work / "client.git", pack, refs)
        results = {}
        if "full" in rows:
            results["full"] = _row("full", client, root, None, args.runs, env, work)
        http: dict[str, list[float]] = {}
        if "ten" in rows or "queued" in rows:
            template = _target(root / "template.git", None)
            common.git("--git-dir", str(client), "push", "-q", str(template), "refs/heads/main:refs/heads/main")
            _own_commits(client, "pusher", args.commits)
            if "ten" in rows:
                results["ten"] = _row(f"{args.commits}-commits", client, root, template, args.runs, env, work)
            if "queued" in rows:
                procs, urls = _http_servers(work, {**env, "PACKYARD_RECEIVE_MODE": "queue"})
                try:
                    http = _http_row(client, root, template, args.runs, env, work, urls)
                finally:
                    for proc in reversed(procs):
                        proc.terminate()
                    for proc in procs:
                        proc.wait(timeout=60)
        print()
        for name, r in results.items():
            _report(name, r)
        if http:
            import statistics

            from packyard.workers.receive.handoff import NATIVE_CLIENT

            g = statistics.median(http["git"])
            for side, label in (("queue", "HTTP, queue mode"), ("process", "HTTP, process mode"),
                                ("handed-queue", "stdio to the server, queue mode"),
                                ("handed-process", "stdio to the server, process mode"),
                                ("native-queue", "C client to the server, queue mode"),
                                ("native-process", "C client to the server, process mode"),
                                ("stdio-queue", "stdio, queue mode, no server")):
                if side not in http:
                    print(f"queued: {label}: {NATIVE_CLIENT} was not built (no C compiler at install)")
                    continue
                m = statistics.median(http[side])
                print(f"queued: {label + ', wall (median) s':53} {m:8.3f}  git stdio {g:8.3f}  {m / g:6.2f}x")
        return 0
    finally:   # the embedded Redis the pushes started under the bench's state dir goes with it (was left running)
        subprocess.run([*common.packyard_entry(), "down", "--force"], env=env, capture_output=True, timeout=60)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
