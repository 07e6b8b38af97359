"""packyard race --repo R --readers N --duration S: readers, repacks and pushes racing on purpose.

Builds a new repository at R with git, starts N reader processes and, through the queue, repacks
(full, loose, geometric in turn) and pushes (index_pack, unpack_objects, write_objects, force
pushes of topic branches) while they read. Every reader miss is a ``race_events`` row
(``packyard races``); the summary counts lookups, repacks, ingests and each kind of miss, and the
exit status is 1 if any read was lost (or a job failed). The logic is in
:mod:`packyard.workers.race`.

With an embedded Redis (no PACKYARD_REDIS_URL) it starts one and a worker (2 prefork processes)
for the run, with R's directory added to the storage roots; otherwise it uses the configured
Redis and workers, and R must lie inside PACKYARD_STORAGE_ROOTS.

``--backup-every T`` queues a ``packyard.backup`` every T seconds too; afterwards every backup written is
restored and must hold the refs, HEAD and checksum it recorded (:mod:`packyard.workers.race.backups`).

The negative controls (``--unsafe-dir-cache``, ``--unsafe-delete``) must FAIL: they prove the
harness can see a lost read.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from packyard.workers.cli.args import add_repo_arg
from packyard.workers.cli.children import Child, child_env, ping_workers, wait_for, worker_argv
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.durations import parse_duration
from packyard.workers.nfsim import IMPLEMENTATIONS
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "race", help="race readers against repacks and pushes; every miss recorded; exit 1 on a lost read",
        description="Build a new repository at --repo with git, start --readers reader processes (each a "
                    "long-lived Repository doing full reads, quick existence checks and absent-id probes of "
                    "objects reachable from the refs) and, through the queue, repack every --repack-every "
                    "seconds (full, loose, geometric in turn) and push every --ingest-every seconds "
                    "(index_pack, unpack_objects, write_objects, and force pushes of topic branches) for "
                    "--duration seconds. Prints lookups, repacks, ingests and each kind of miss (relisted, "
                    "preserved, quick_absent, lost); exit status 1 on any lost read or failed job.")
    add_repo_arg(p)
    p.add_argument("--readers", type=int, default=4, metavar="N", help="reader processes (default 4)")
    p.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds to race (default 60)")
    p.add_argument("--repack-every", type=float, default=3.0, metavar="T",
                   help="seconds between repacks (default 3; modes full, loose, geometric in turn)")
    p.add_argument("--ingest-every", type=float, default=1.0, metavar="T",
                   help="seconds between pushes (default 1)")
    p.add_argument("--seed", type=int, default=None, metavar="K", help="random seed (default: a new one, printed)")
    p.add_argument("--expire", type=float, default=5.0, metavar="SECONDS",
                   help="full repacks delete unreachable objects older than this (default 5: force-pushed "
                        "objects really go while readers still read them)")
    p.add_argument("--reader-rate", type=float, default=1500.0, metavar="N",
                   help="lookups per second per reader, at most (default 1500)")
    p.add_argument("--unsafe-dir-cache", action="store_true",
                   help="NEGATIVE CONTROL: readers trust objects/pack's stat data instead of re-listing on a miss "
                        "(git's rejected stat_validity patch); the run must report lost reads")
    p.add_argument("--unsafe-delete", action="store_true",
                   help="NEGATIVE CONTROL: repacks unlink replaced packs at once instead of preserving them; the "
                        "run must report lost reads")
    p.add_argument("--hosts", type=int, choices=(1, 2), default=1,
                   help="2: two simulated NFS client hosts (nfsim mounts of one directory beside --repo), each with "
                        "its own worker; in phase 1 every repack runs on host A while every push, reader and clone "
                        "is on host B, in phase 2 the reverse (docs/nfs.md)")
    p.add_argument("--phases", type=int, default=2, metavar="N",
                   help="with --hosts 2: phases of --duration/N seconds each, the hosts swapping roles (default 2)")
    p.add_argument("--aim-threads", type=int, default=4, metavar="N",
                   help="with --hosts 2: threads per reader that read, cold, the loose objects a repack on the other "
                        "host is about to delete, so that reads meet ESTALE (default 4; 0: none)")
    p.add_argument("--nfsim-latency", default="1ms", metavar="T",
                   help="with --hosts 2: latency per metadata call on both mounts (default 1ms)")
    p.add_argument("--nfsim-impl", choices=IMPLEMENTATIONS, default="auto",
                   help="with --hosts 2: the nfsim filesystem both mounts run (c: _nfsimd.c, python: fs.py, its "
                        "specification; auto: c when built)")
    p.add_argument("--nfsim-trace", default=None, metavar="DIR",
                   help="with --hosts 2: each mount appends its round trips and ESTALE answers to DIR/host-a.trace and "
                        "DIR/host-b.trace (one line each: kind and path)")
    p.add_argument("--nfsim-trust-listing", action="store_true",
                   help="NEGATIVE CONTROL (with --hosts 2): host B's mount reuses cached directory listings for "
                        "3 s without revalidating them on opendir; the run must report lost reads")
    p.add_argument("--backup-every", type=float, default=0.0, metavar="T",
                   help="queue a packyard.backup of the repository every T seconds among the repacks and pushes "
                        "(every third a full one); afterwards every backup in its manifest is restored, and its "
                        "refs, HEAD and checksum must be those it recorded (git fsck --full on three of them); "
                        "exit 1 on a mismatch or a failed backup (default 0: no backups)")
    p.add_argument("--cloners", type=int, default=1, metavar="N",
                   help="clone readers (git clone --no-local through upload-pack, then git fsck) beside the "
                        "readers (default 1; 0: none)")
    p.add_argument("--pool", action="store_true",
                   help="race a fork network instead (workers/race/pool.py): --repo is a new directory for the "
                        "source, --forks forks and their pool; the pool's repacks, member repacks, thin pushes to "
                        "every member, fetches into the pool and a disconnect race --readers readers per member and "
                        "clones of every member; afterwards git fsck --full of each, and each member's rev-list "
                        "--objects must be its frontend's")
    p.add_argument("--forks", type=int, default=2, metavar="N", help="with --pool: forks of the source (default 2)")
    p.add_argument("--unsafe-pool-prune", action="store_true",
                   help="NEGATIVE CONTROL (with --pool): the pool's repacks ignore the members' refs; the run must "
                        "report lost objects")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")
    p.set_defaults(func=run)


def _confine(repo: Path) -> str | None:
    """Embedded mode: add R's directory to the storage roots for this run (and keep the incoming dir apart)."""
    from packyard.workers.settings import get_settings

    s = get_settings()
    inside = any(repo == root or root in repo.parents for _name, root in s.storage_roots)
    if inside:
        return None
    names = {n for n, _ in s.storage_roots}
    name = next(f"race{i or ''}" for i in range(100) if f"race{i or ''}" not in names)
    roots = ",".join(f"{n}={p}" for n, p in s.storage_roots) + f",{name}={repo.parent}"
    os.environ["PACKYARD_STORAGE_ROOTS"] = roots
    incoming = s.incoming_path
    if incoming == repo.parent or repo.parent in incoming.parents or incoming in repo.parent.parents:
        os.environ["PACKYARD_INCOMING_DIR"] = tempfile.mkdtemp(prefix="packyard-race-incoming-")
    return f"{name}={repo.parent}"


def run(args: argparse.Namespace) -> int:
    from packyard.workers.race.harness import RaceOptions

    repo = Path(args.repo).expanduser().absolute()
    if repo.exists() and (not repo.is_dir() or any(repo.iterdir())):
        print(f"packyard race: {repo} exists: the harness builds its own repository there (name a new path)",
              file=sys.stderr)
        return 2
    if args.readers < 1 or args.duration <= 0 or args.phases < 1 or args.aim_threads < 0 or args.cloners < 0:
        print("packyard race: --readers and --phases must be at least 1, --duration positive, --aim-threads and "
              "--cloners not negative", file=sys.stderr)
        return 2
    if args.nfsim_trust_listing and args.hosts != 2:
        print("packyard race: --nfsim-trust-listing needs --hosts 2", file=sys.stderr)
        return 2
    if args.backup_every < 0 or (args.backup_every and args.pool):
        print("packyard race: --backup-every must not be negative, and is not for --pool", file=sys.stderr)
        return 2
    if args.unsafe_pool_prune and not args.pool:
        print("packyard race: --unsafe-pool-prune needs --pool", file=sys.stderr)
        return 2
    if args.pool:
        return _pool(args, repo)
    if args.hosts == 2:
        return _two_hosts(args, repo)
    options = RaceOptions(repo=repo, readers=args.readers, duration=args.duration, repack_every=args.repack_every,
                          ingest_every=args.ingest_every, seed=args.seed, unsafe_dir_cache=args.unsafe_dir_cache,
                          unsafe_delete=args.unsafe_delete, expire=args.expire, reader_rate=args.reader_rate,
                          cloners=args.cloners, backup_every=args.backup_every)
    return _run(args, options, repo)


def _pool(args: argparse.Namespace, repo: Path) -> int:
    """--pool: a fork network's race (workers/race/pool.py); the repack and ingest periods scale its timers."""
    from packyard.workers.race.poolsummary import PoolRaceOptions

    if args.hosts != 1 or args.unsafe_dir_cache or args.unsafe_delete or not 1 <= args.forks <= 16:
        print("packyard race --pool: one host, 1 to 16 --forks, and no other negative control", file=sys.stderr)
        return 2
    options = PoolRaceOptions(repo=repo, forks=args.forks, duration=args.duration, readers=max(1, args.readers // 4),
                              pool_repack_every=args.repack_every, member_repack_every=args.repack_every * 2 / 3,
                              push_every=args.ingest_every * 0.7, fetch_every=args.repack_every,
                              seed=args.seed, expire=min(args.expire, 3.0), reader_rate=min(args.reader_rate, 600.0),
                              cloners=args.cloners, unsafe_pool_prune=args.unsafe_pool_prune)
    return _run(args, options, repo)


def _start(s, options, app, say, nfsim=None):  # type: ignore[no-untyped-def]
    """The run: the pool race for PoolRaceOptions, else the repository race."""
    from packyard.workers.race.poolsummary import PoolRaceOptions

    if isinstance(options, PoolRaceOptions):
        from packyard.workers.race.pool import run_pool_race

        return run_pool_race(s, options, app, say=say)
    from packyard.workers.race.harness import run_race

    return run_race(s, options, app, say=say, nfsim=nfsim)


def _unsafe(options) -> bool:  # type: ignore[no-untyped-def]
    """The workers must accept an unsafe argument (PACKYARD_ALLOW_UNSAFE_MAINTENANCE) for a negative control."""
    return bool(getattr(options, "unsafe_delete", False) or getattr(options, "unsafe_pool_prune", False))


def _two_hosts(args: argparse.Namespace, repo: Path) -> int:
    """--hosts 2: R's directory becomes nfsim's backing dir ``<R>.nfs/server``, mounted twice (host A,
    host B); the repository is built through A; each phase one host repacks, the other reads and pushes."""
    from packyard.workers import nfsim

    reason = nfsim.unavailable(args.nfsim_impl)
    if reason:
        print(f"packyard race --hosts 2: {reason}", file=sys.stderr)
        return 2
    base = repo.parent / f"{repo.name}.nfs"
    server = base / "server"
    server.mkdir(parents=True, exist_ok=True)
    latency = parse_duration(args.nfsim_latency)
    trace = Path(args.nfsim_trace) if args.nfsim_trace else None
    if trace is not None:
        trace.mkdir(parents=True, exist_ok=True)
    if nfsim.implementation(args.nfsim_impl) == "python":
        print("[race] nfsim runs fs.py here, which keys the kernel's inodes by name: a clone that maps a MIDX or "
              "commit-graph the other host replaces can read the new file's bytes, which no NFS client does "
              "(docs/nfs.md); a failed clone may be that", file=sys.stderr, flush=True)
    with nfsim.Mount(server, base / "host-a", latency=latency, name="race-host-a", impl=args.nfsim_impl,
                     trace=trace / "host-a.trace" if trace else None) as a, \
            nfsim.Mount(server, base / "host-b", latency=latency, name="race-host-b", impl=args.nfsim_impl,
                        trace=trace / "host-b.trace" if trace else None,
                        dir_revalidate="trust" if args.nfsim_trust_listing else "open") as b:
        from packyard.workers.race.harness import RaceOptions

        options = RaceOptions(repo=a.mountpoint / repo.name, readers=args.readers, duration=args.duration,
                              repack_every=args.repack_every, ingest_every=args.ingest_every, seed=args.seed,
                              unsafe_dir_cache=args.unsafe_dir_cache, unsafe_delete=args.unsafe_delete,
                              expire=args.expire, reader_rate=args.reader_rate, hosts=2,
                              reader_repo=b.mountpoint / repo.name, nfsim_trust_listing=args.nfsim_trust_listing,
                              cloners=args.cloners, host_b_queue=f"race-{os.getpid()}-host-b",
                              phases=args.phases, aim_threads=args.aim_threads, backup_every=args.backup_every)
        rc = _run(args, options, a.mountpoint / repo.name, nfsim=lambda: {"A": a.counters(), "B": b.counters()})
        counts = {"host A": a.counters(), "host B": b.counters()}
    for host, c in counts.items():
        print(f"[race] nfsim {host}: {c['metadata_calls']} metadata calls, {c['readdir']} listings read, "
              f"{c['readdir_hits']} from cache, {c['estale']} ESTALE answers", file=sys.stderr, flush=True)
    return rc


def _run(args: argparse.Namespace, options, repo: Path, nfsim=None) -> int:  # type: ignore[no-untyped-def]
    import logging

    # This process is the frontend: its job.queued log lines would only repeat what the harness prints.
    logging.getLogger("packyard.jobs").setLevel(logging.WARNING)
    s = get_settings()
    say = (lambda m: print(f"[race] {m}", file=sys.stderr, flush=True)) if args.json else \
        (lambda m: print(f"[race] {m}", flush=True))
    if s.embedded_redis:
        added = _confine(repo.parent.resolve() / repo.name)
        summary = with_embedded_workers(options, say, added, nfsim)
    else:
        summary = with_configured_workers(options, say, nfsim)
    if summary is None:
        return 2
    if args.json:
        print(json.dumps(summary.as_dict(), default=str))
    else:
        print(summary.render())
    return 0 if summary.ok else 1


def with_configured_workers(options, say, nfsim=None):  # type: ignore[no-untyped-def]
    s = get_settings()
    parent = options.repo.parent.resolve()
    inside = any(parent == root or root in parent.parents for _n, root in s.storage_roots)
    if not inside:
        say(f"{options.repo} is not inside PACKYARD_STORAGE_ROOTS: queued jobs could not touch it")
        return None
    parent.mkdir(parents=True, exist_ok=True)
    workers = ping_workers(timeout=2.0)
    if not workers:
        say("no Celery worker answers on the configured broker: start `packyard worker`")
        return None
    from packyard.workers.app import app

    say(f"using the configured broker and workers: {', '.join(sorted(workers))}")
    if _unsafe(options) and not s.allow_unsafe_maintenance:
        say("a negative control (--unsafe-delete, --unsafe-pool-prune) needs workers started with "
            "PACKYARD_ALLOW_UNSAFE_MAINTENANCE=1 (they refuse "
            "preserve=false otherwise); this shell does not set it, so the workers likely do not either")
    if getattr(options, "hosts", 1) != 2:
        return _start(s, options, app, say)
    # --hosts 2: the configured workers are host A; host B's worker joins them for the run.
    logs = s.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "race-worker-host-b.log", "ab") as log_b:
        worker_b = host_b_worker(s, options, log_b)
        try:
            say(f"host B's worker: pid {worker_b.pid} here, in its own PID and UTS namespaces (host name {HOST_B})")
            if not wait_for(lambda: any(n.startswith(f"race-{os.getpid()}-b@") for n in ping_workers()),
                                   timeout=90, interval=0.5):
                say("host B's worker did not answer a ping within 90 s; see its log")
                return None
            return _start(s, options, app, say, nfsim)
        finally:
            worker_b.stop()


HOST_B = "race-host-b"   # = workers/race/harness.py HOST_B_NAME (how its routing check knows host B's job rows)
#: host B's worker: its own PID namespace (pids collide with host A's), its own host name, and in its own
#: mount namespace host B's nfsim mount bound over host A's mount point, so job paths name the same files.
HOST_B_SCRIPT = 'hostname "$1" && mount --bind "$2" "$3" && shift 3 && exec "$@"'


def host_b_worker(s, options, log):  # type: ignore[no-untyped-def]
    # Only host B's own queue (the harness sends it the jobs of host B's phases: workers/race/harness.py:_Hosts);
    # the default queue is host A's workers'.
    queues = [options.host_b_queue] if options.host_b_queue else []
    argv = ["unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc", "--kill-child",
            "sh", "-c", HOST_B_SCRIPT, "sh", HOST_B, str(options.reader_repo.parent), str(options.repo.parent),
            *worker_argv(s, name=f"race-{os.getpid()}-b@%h", concurrency=2, queues=queues)]
    env = child_env(s, {"PACKYARD_LOG_FORMAT": "json",
                               "PACKYARD_ALLOW_UNSAFE_MAINTENANCE": "1" if options.unsafe_delete else "0"})
    return Child("race-worker-b", argv, env, stdout=log)


def with_embedded_workers(options, say, added_root, nfsim=None):  # type: ignore[no-untyped-def]
    s = get_settings()
    server = prepare_embedded(s, migrate=True)
    logs = s.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = open(logs / "race-worker.log", "ab")
    worker = Child("race-worker", worker_argv(s, name=f"race-{os.getpid()}@%h", concurrency=2),
                          child_env(s, {"PACKYARD_LOG_FORMAT": "json",
                                               # the worker must accept preserve=false for --unsafe-delete
                                               "PACKYARD_ALLOW_UNSAFE_MAINTENANCE":
                                                   "1" if _unsafe(options) else "0"}), stdout=log)
    worker_b = None
    log_b = None
    try:
        say(f"embedded redis {'reused' if server and server.reused else 'started'}; worker pid {worker.pid} "
            f"(2 prefork processes, log {logs / 'race-worker.log'})" +
            (f"; storage root {added_root} added for this run" if added_root else ""))
        names = [f"race-{os.getpid()}@"]
        if getattr(options, "hosts", 1) == 2:
            log_b = open(logs / "race-worker-host-b.log", "ab")
            worker_b = host_b_worker(s, options, log_b)
            names.append(f"race-{os.getpid()}-b@{HOST_B}")
            say(f"host B's worker: pid {worker_b.pid} here, in its own PID and UTS namespaces (host name {HOST_B}) "
                f"with host B's mount over host A's path (log {logs / 'race-worker-host-b.log'})")
        if not wait_for(lambda: all(any(n.startswith(p) for n in ping_workers()) for p in names),
                               timeout=90, interval=0.5):
            say("a worker did not answer a ping within 90 s; see its log")
            return None
        from packyard.workers.app import app

        return _start(s, options, app, say, nfsim)
    finally:
        if worker_b is not None:
            worker_b.stop()
        if log_b is not None:
            log_b.close()
        worker.stop()
        log.close()
        if server is not None and not server.reused:
            server.stop()
