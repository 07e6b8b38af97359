"""packyard bench records: the records database at fleet scale -- every query the service runs, timed.

Fills a fresh database (a throwaway PostgreSQL database when ``--postgres URL`` or
PACKYARD_BENCH_POSTGRES_URL names a server, else a SQLite file) with ``--jobs`` job rows over
``--days`` days across ``--repos`` registered repositories, two lock events per job, one race
event per 50 jobs and the counters the recorder would have kept (bulk inserts: COPY on
PostgreSQL, executemany on SQLite; the rows of ``jobs``, ``lock_events`` and ``race_events`` are
loaded before their secondary indexes, which are then built from the migrated database's own
definitions and checked against the migrations'; each phase is printed to stderr with its time),
then times, each the best of ``--runs``:

* ``status`` (the newest 20 jobs and the reconciler's pending rows), ``status --repo`` (the
  repository's row and its newest 20 jobs), ``races`` (1 day, all and one repository), the
  janitor's job lookup, the planner's queries (the window's due list, and per repository its
  row, the in-flight check, the claim and the recorded plan; the pass over every registered
  repository is that per-repository cost times ``--repos`` plus the due list);
* recording one job (queued, started, finished) and one lock event, per job, in milliseconds;
* one metrics scrape (seconds, and the number of series it printed);
* prune (the rows older than the retention), and the database's size before and after; with
  ``--steady-days D``, D more days of the same load, each followed by a prune, to show the size
  stays bounded.

There is no git side to compare with: the figures are absolute, next to the issue's goals. The fill
itself (the rows, the bulk loads, the deferred indexes) is :mod:`.recordsfill`.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from packyard.workers.cli.bench.common import best_of as best
from packyard.workers.cli.bench.recordsfill import Fill, Phases, fill_database, insert_history

GOALS = {"status": 0.3, "status --repo": 0.2, "scrape": 0.5, "record started": 0.005, "record finished": 0.005}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("records", help="the records database at fleet scale (queries, recording, scrape)",
                              description="Fill a fresh records database with realistic rows and time every query "
                                          "the service runs, the recording of a job, a metrics scrape and prune.")
    p.add_argument("--jobs", type=int, default=1_000_000, help="job rows (default 1,000,000)")
    p.add_argument("--repos", type=int, default=10_000, help="registered repositories (default 10,000)")
    p.add_argument("--days", type=float, default=40.0,
                   help="the history's span in days (default 40: prune has 10 days to delete)")
    p.add_argument("--postgres", metavar="URL", default=os.environ.get("PACKYARD_BENCH_POSTGRES_URL"),
                   help="a PostgreSQL server to create a throwaway database in (default: "
                        "PACKYARD_BENCH_POSTGRES_URL; none: SQLite)")
    p.add_argument("--runs", type=int, default=5, help="best of N runs per query (default 5)")
    p.add_argument("--sample", type=int, default=200, help="jobs recorded / repositories planned (default 200)")
    p.add_argument("--steady-days", type=int, default=0, metavar="D",
                   help="then D more days of load, each followed by a prune (the size stays bounded)")
    p.add_argument("--compare-jobs", type=int, default=0, metavar="N",
                   help="also fill a second database with N job rows (the same repositories) and time the scrape "
                        "on both in alternating rounds: the same load for both sizes")
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=run, logs=False)


# -- the rows ---------------------------------------------------------------------------------------------

def db_size(engine: Any, url: str) -> int:
    from sqlalchemy import text

    if engine.dialect.name == "postgresql":
        with engine.connect() as c:
            return int(c.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)
    path = Path(url.split("///", 1)[1])
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# -- timing ---------------------------------------------------------------------------------------------

def per_call(fn: Callable[[int], object], n: int) -> tuple[float, float, float]:
    """(median, p95, median CPU of this process) seconds of ``fn(i)`` over ``n`` calls (the CPU time is the
    client's share, what a worker pays; on a loaded machine the wall time mostly waits for a core)."""
    times, cpu = [], []
    for i in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(i)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))], statistics.median(cpu)


def run(args: argparse.Namespace) -> int:
    if args.postgres:
        return _with_postgres(args)
    with tempfile.TemporaryDirectory(prefix="packyard-bench-records-") as tmp:
        return measure(args, f"sqlite:///{Path(tmp) / 'records.db'}",
                       f"sqlite:///{Path(tmp) / 'compare.db'}" if args.compare_jobs else None, Path(tmp))


def _with_postgres(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(args.postgres)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    names = [f"packyard_bench_{uuid.uuid4().hex[:10]}" for _ in range(2 if args.compare_jobs else 1)]
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        for name in names:
            c.execute(text(f'CREATE DATABASE "{name}"'))
    urls = [url.set(database=name).render_as_string(hide_password=False) for name in names]
    try:
        with tempfile.TemporaryDirectory(prefix="packyard-bench-records-") as tmp:
            return measure(args, urls[0], urls[1] if len(urls) > 1 else None, Path(tmp))
    finally:
        from packyard.workers.records.db import dispose_all

        dispose_all()
        with admin.connect() as c:
            for name in names:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _load() -> str:
    """The machine's load average (1, 5, 15 min), as ``uptime`` prints it."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def planner_pass(settings: Any, state: Path, window_start: float) -> dict[str, Any]:
    """The window's real pass (commands/plan_maintenance.sweep, paged) over every registered repository. The
    bench's repositories are not on disk: each one's statistics fail (UNREADABLE, a stat of a missing path),
    and is claimed and recorded like any other, so the time is the pass's database work and its round trips."""
    from sqlalchemy import event

    from packyard.workers.commands.plan_maintenance import sweep
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.records import get_engine
    from packyard.workers.slots import FleetSlots

    statements = commits = 0

    def on_statement(*_a: Any) -> None:
        nonlocal statements
        statements += 1

    def on_commit(*_a: Any) -> None:
        nonlocal commits
        commits += 1

    engine = get_engine(settings.database_url)
    redis = EmbeddedRedis(state / "redis").start()
    try:
        slots = FleetSlots(redis.client(), settings.maintenance_concurrency, 3600.0, key="packyard:bench:slots")
        event.listen(engine, "before_cursor_execute", on_statement)
        event.listen(engine, "commit", on_commit)
        t0, c0 = time.perf_counter(), time.process_time()
        result = sweep(settings=settings, send=lambda *job: None, slots=slots, window_start=window_start,
                       window_end=time.time() + 86400)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_commit)
        redis.stop()
    c = result["counters"]
    return {"s": round(wall, 2), "cpu_s": round(cpu, 2), "due": c["due"], "planned": c["unreadable"],
            "statements": statements, "transactions": commits, "page": settings.planner_page}


def compare_scrapes(args: argparse.Namespace, settings: Any, url: str, fill: Fill, runs: int) -> dict[str, Any]:
    """A second database of ``--compare-jobs`` rows (the same repositories and span), and the scrape timed on
    both in alternating rounds, so both sizes are measured at the same load."""
    from dataclasses import replace as _replace

    from prometheus_client import generate_latest

    from packyard.workers.metrics import make_registry
    from packyard.workers.records import get_engine, upgrade_database

    upgrade_database(url)
    engine = get_engine(url)
    small = Fill(args.compare_jobs, args.repos, args.days, fill.now, args.seed)
    t0 = time.perf_counter()
    fill_database(engine, small, args.compare_jobs, Phases("fill, comparison database"))
    filled = round(time.perf_counter() - t0, 1)
    regs = {"big": make_registry(settings), "small": make_registry(_replace(settings, database_url=url))}
    times: dict[str, list[float]] = {"big": [], "small": []}
    series = {k: sum(1 for line in generate_latest(r).decode().splitlines() if line and not line.startswith("#"))
              for k, r in regs.items()}
    load_before = _load()
    for _ in range(max(3, runs * 2)):
        for k in ("small", "big"):
            t1 = time.perf_counter()
            generate_latest(regs[k])
            times[k].append(time.perf_counter() - t1)
    return {"jobs": {"big": fill.jobs, "small": args.compare_jobs}, "filled_s": filled,
            "scrape_ms": {k: {"best": round(min(v) * 1000, 1), "median": round(statistics.median(v) * 1000, 1)}
                          for k, v in times.items()},
            "series": series, "rounds": len(times["big"]), "load": f"{load_before} -> {_load()}"}


def measure(args: argparse.Namespace, url: str, compare_url: str | None = None, state: Path | None = None) -> int:
    from prometheus_client import generate_latest
    from sqlalchemy import select, text

    from packyard.workers.cli import races, status
    from packyard.workers.metrics import make_registry
    from packyard.workers.records import Job, JobState, get_engine, registry, session_scope, upgrade_database, utcnow
    from packyard.workers.records.models import LockEventKind
    from packyard.workers.records.recorder import (
        PENDING_STATES,
        job_state,
        record_finished,
        record_lock_event,
        record_queued,
        record_started,
    )
    from packyard.workers.records.retention import prune
    from packyard.workers.settings import Settings

    out: dict[str, Any] = {"database": "postgresql" if url.startswith("postgresql") else "sqlite",
                           "jobs": args.jobs, "repos": args.repos, "days": args.days, "load at start": _load()}
    settings = replace(Settings.from_env(), database_url=url)
    upgrade_database(url)
    engine = get_engine(url)
    now = utcnow()
    fill = Fill(args.jobs, args.repos, args.days, now, args.seed)
    t0 = time.perf_counter()
    phases = Phases()
    fill_database(engine, fill, args.jobs, phases)
    out["fill_s"] = round(time.perf_counter() - t0, 1)
    out["fill phases"] = phases.done
    out["size_mb"] = round(db_size(engine, url) / 1e6, 1)
    with session_scope(url) as s:
        some = list(s.execute(select(Job.task_id, Job.repo_id).where(Job.id.in_(
            [1 + (i * 7919) % args.jobs for i in range(20)]))))
    repo = fill.repo_path(int(some[0][1] or 1))
    task = some[0][0]
    runs = args.runs
    t: dict[str, float] = {}

    def pending_rows() -> object:
        with session_scope(url) as s:
            return s.execute(select(Job.id, Job.task_id, Job.kind, Job.unseen_since)
                             .where(Job.state.in_(PENDING_STATES))).all()

    t["status"] = best(lambda: (status.fetch(settings, None, 20), pending_rows()), runs)
    t["status --repo"] = best(lambda: (registry.get(settings, repo), status.fetch(settings, repo, 20)), runs)
    since = now - timedelta(days=1)
    t["races"] = best(lambda: races.fetch(settings, None, since, 20), runs)
    t["races --repo"] = best(lambda: races.fetch(settings, repo, since, 20), runs)
    t["reconciler pending rows"] = best(pending_rows, runs)
    t["janitor job lookup"] = best(lambda: job_state(settings, task), runs)
    window = now.timestamp() - 3600
    t["planner due list (window open 1h)"] = best(lambda: registry.due_for_planning(settings, window), runs)
    t["planner due list (every repository)"] = best(lambda: registry.due_for_planning(settings, now.timestamp()),
                                                    max(1, runs // 2))
    paths = [fill.repo_path(1 + (i * 104729) % args.repos) for i in range(args.sample)]

    def plan_one(i: int) -> None:
        path = paths[i]
        row = registry.get(settings, path)
        registry.maintenance_in_flight(settings, path)
        if row is not None:
            registry.claim_for_planning(settings, row["id"], now.timestamp() + 1, now.timestamp() + 2)
        registry.record_plan(settings, path, {"action": "nothing", "outcome": "nothing", "stats": {"packs": 3}},
                             now.timestamp() + 2)

    med, p95, cpu = per_call(plan_one, len(paths))
    out["planner per repository ms"] = {"median": round(med * 1000, 2), "p95": round(p95 * 1000, 2),
                                        "cpu": round(cpu * 1000, 2)}
    out["planner pass over every repository s (DB)"] = round(
        t["planner due list (every repository)"] + med * args.repos, 2)
    for key in ("queued", "started", "finished", "lock event"):
        out[f"record {key} ms"] = {}
    ids = [f"bench-{uuid.uuid4().hex}" for _ in range(args.sample)]
    for step, fn in (
            ("queued", lambda i: record_queued(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i])),
            ("started", lambda i: record_started(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i],
                                                 params=None, hostname="bench", pid=1)),
            ("finished", lambda i: record_finished(url, task_id=ids[i], kind="packyard.index_pack", repo=paths[i],
                                                   state=JobState.SUCCESS, counters={"objects": 1}, error=None,
                                                   error_type=None)),
            ("lock event", lambda i: record_lock_event(url, repo=paths[i], job_id=ids[i],
                                                       lock_name=f"packyard:lock:{paths[i]}",
                                                       event=LockEventKind.ACQUIRED, token=i))):
        med, p95, cpu = per_call(fn, args.sample)
        out[f"record {step} ms"] = {"median": round(med * 1000, 2), "p95": round(p95 * 1000, 2),
                                    "cpu": round(cpu * 1000, 2)}
        if step in ("started", "finished"):
            t[f"record {step}"] = med
    reg = make_registry(settings)
    text_out = generate_latest(reg).decode()
    t["scrape"] = best(lambda: generate_latest(reg), runs)
    out["scrape series"] = sum(1 for line in text_out.splitlines() if line and not line.startswith("#"))
    with session_scope(url) as s:   # the counters add up to the rows (the fill's own check), the LOST level too
        rows = s.execute(text("SELECT count(*) FROM jobs WHERE state IN ('SUCCESS', 'FAILURE')")).scalar()
        counted = s.execute(text("SELECT sum(events) FROM record_totals WHERE family = 'job'")).scalar()
        lost_rows = {k: int(n) for k, n in s.execute(text(
            "SELECT kind, count(*) FROM jobs WHERE state = 'LOST' GROUP BY kind"))}
        lost_level = {k: int(n) for k, n in s.execute(text(
            "SELECT kind, events FROM record_totals WHERE family = 'level' AND state = 'LOST' AND events <> 0"))}
    out["counters equal rows"] = int(rows or 0) == int(counted or 0) and lost_rows == lost_level
    out["timings s"] = {k: round(v, 4) for k, v in t.items()}
    out["goals met"] = {k: t[k] <= v for k, v in GOALS.items() if k in t}
    out["goals met"]["series <= 2000"] = out["scrape series"] <= 2000
    out["load after the queries"] = _load()
    if compare_url is not None:
        out["same-load scrape"] = compare_scrapes(args, settings, compare_url, fill, runs)
    if state is not None:   # after the scrapes: it claims and records a plan on every repository
        out["planner pass (paged sweep)"] = planner_pass(settings, state, now.timestamp() + 3)

    before = db_size(engine, url)
    t0 = time.perf_counter()
    report = prune(settings, now=now)
    out["prune"] = {"s": round(time.perf_counter() - t0, 2), **report.counters(),
                    "size_mb_before": round(before / 1e6, 1)}
    _vacuum(engine)
    out["prune"]["size_mb_after"] = round(db_size(engine, url) / 1e6, 1)
    out["after prune: status s"] = round(best(lambda: (status.fetch(settings, None, 20), pending_rows()), runs), 4)
    out["after prune: scrape s"] = round(best(lambda: generate_latest(reg), runs), 4)
    per_day = int(args.jobs / args.days)
    steady = []
    with session_scope(url) as s:   # the rows recorded above took ids after the fill's
        fill.next_job_id = int(s.execute(text("SELECT max(id) FROM jobs")).scalar() or 0) + 1
        fill.next_lock_id = int(s.execute(text("SELECT max(id) FROM lock_events")).scalar() or 0) + 1
        fill.next_race_id = int(s.execute(text("SELECT max(id) FROM race_events")).scalar() or 0) + 1
    for d in range(1, args.steady_days + 1):
        day0 = now + timedelta(days=d - 1)
        insert_history(engine, fill, per_day, day0, timedelta(days=1), pending_tail=False)
        t0 = time.perf_counter()
        r = prune(settings, now=day0 + timedelta(days=1))
        _vacuum(engine)
        steady.append({"day": d, "prune_s": round(time.perf_counter() - t0, 2), "jobs_removed": r.jobs_removed,
                       "size_mb": round(db_size(engine, url) / 1e6, 1)})
    if steady:
        out["steady"] = steady
    print(json.dumps(out, default=str) if args.json else render(out))
    return 0



def _vacuum(engine: Any) -> None:
    """PostgreSQL: what autovacuum does after a prune (the freed tuples become reusable); SQLite reuses the
    freed pages by itself (the file does not shrink, it stops growing)."""
    if engine.dialect.name != "postgresql":
        return
    from sqlalchemy import text

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE"))


def render(out: dict[str, Any]) -> str:
    buf = io.StringIO()
    buf.write(f"records bench: {out['database']}, {out['jobs']:,} jobs over {out['days']:g} days, "
              f"{out['repos']:,} repositories; filled in {out['fill_s']} s, {out['size_mb']} MB; load "
              f"{out['load at start']} at start, {out['load after the queries']} after the queries\n")
    for ph in out.get("fill phases", []):
        extra = ", ".join(f"{k} {v:,}" for k, v in ph.items() if k not in ("phase", "s"))
        buf.write(f"  fill: {ph['phase']:50} {ph['s']:8.1f} s" + (f"   ({extra})" if extra else "") + "\n")
    for k, v in out["timings s"].items():
        goal = GOALS.get(k)
        buf.write(f"  {k:40} {v * 1000:10.2f} ms" + (f"   (goal {goal * 1000:g} ms)" if goal else "") + "\n")
    for k in ("planner per repository ms", "record queued ms", "record started ms", "record finished ms",
              "record lock event ms"):
        buf.write(f"  {k:40} median {out[k]['median']} p95 {out[k]['p95']} (CPU of this process "
                  f"{out[k]['cpu']})\n")
    buf.write(f"  {'planner pass over every repository':40} {out['planner pass over every repository s (DB)']} s "
              "(database part)\n")
    pp = out.get("planner pass (paged sweep)")
    if pp:
        buf.write(f"  {'planner pass, paged sweep (all unreadable)':40} {pp['s']} s wall, {pp['cpu_s']} s CPU, "
                  f"{pp['planned']:,} of {pp['due']:,} planned in {pp['transactions']:,} transactions / "
                  f"{pp['statements']:,} statements (page {pp['page']})\n")
    buf.write(f"  scrape: {out['scrape series']} series; counters equal rows: {out['counters equal rows']}\n")
    cmp_ = out.get("same-load scrape")
    if cmp_:
        ms = cmp_["scrape_ms"]
        buf.write(f"  same-load scrape, {cmp_['rounds']} alternating rounds (load {cmp_['load']}): "
                  f"{cmp_['jobs']['small']:,} jobs best {ms['small']['best']} / median {ms['small']['median']} ms, "
                  f"{cmp_['jobs']['big']:,} jobs best {ms['big']['best']} / median {ms['big']['median']} ms; "
                  f"series {cmp_['series']['small']} / {cmp_['series']['big']}\n")
    p = out["prune"]
    buf.write(f"  prune: {p['jobs_removed']:,} jobs, {p['lock_events_removed']:,} lock events, "
              f"{p['race_events_removed']:,} race events in {p['s']} s ({p['batches']} batches); size "
              f"{p['size_mb_before']} -> {p['size_mb_after']} MB\n")
    buf.write(f"  after prune: status {out['after prune: status s'] * 1000:.2f} ms, scrape "
              f"{out['after prune: scrape s'] * 1000:.2f} ms\n")
    for d in out.get("steady", []):
        buf.write(f"  steady day {d['day']}: prune {d['prune_s']} s, {d['jobs_removed']:,} jobs removed, "
                  f"{d['size_mb']} MB\n")
    buf.write(f"  goals met: {out['goals met']}\n")
    return buf.getvalue()
