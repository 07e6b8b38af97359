"""packyard records prune|daily: the records' retention, and the daily counts that outlive the rows.

``prune`` deletes job rows, lock events and race events older than PACKYARD_RECORDS_KEEP_*_DAYS
(30 / 7 / 30 by default; never a pending job, never the newest job of a repository and kind) in
short batches, in this process, and records the run as a ``packyard.prune_records`` job row whose
counters say what it removed (beat runs the same as a task every PACKYARD_RECORDS_PRUNE_INTERVAL
seconds). ``daily`` prints the per-day counts and mean durations kept in ``record_daily``.
"""
from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta

from packyard.workers.cli.prepare import is_default_sqlite, run_as_job
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("records", help="the records database: prune old rows, daily counts",
                              description="Retention of the job records (workers/records/retention.py) and the "
                                          "daily aggregates that keep their counts (docs/records.md).")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    pr = sub.add_parser("prune", help="delete job rows, lock events and race events past their retention",
                        description="Delete rows older than PACKYARD_RECORDS_KEEP_JOBS_DAYS / _LOCK_EVENTS_DAYS / "
                                    "_RACE_EVENTS_DAYS in batches of PACKYARD_RECORDS_PRUNE_BATCH (one short "
                                    "transaction each). Never a pending job, never the newest job of a repository "
                                    "and kind; the counters (dashboards, `records daily`) stay. Recorded as a "
                                    "packyard.prune_records job row.")
    for flag, what in (("--jobs-days", "job rows"), ("--lock-events-days", "lock events"),
                       ("--race-events-days", "race events")):
        pr.add_argument(flag, type=float, default=None, metavar="DAYS",
                        help=f"keep {what} this many days (default: the setting)")
    pr.add_argument("--batch", type=int, default=None, metavar="ROWS",
                    help="rows per transaction (default: PACKYARD_RECORDS_PRUNE_BATCH)")
    pr.add_argument("--json", action="store_true", help="print the counters as JSON")
    pr.set_defaults(func=run_prune, logs=False)
    dl = sub.add_parser("daily", help="per-day counts kept in record_daily (they outlive pruned rows)")
    dl.add_argument("--days", type=int, default=14, help="how many days back (default 14)")
    dl.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    dl.set_defaults(func=run_daily, logs=False)


def run_prune(args: argparse.Namespace) -> int:
    from packyard.workers.commands.prune_records import prune_records

    run_id, result = run_as_job(
        "packyard.prune_records",
        lambda s, _run_id: prune_records(s, jobs_days=args.jobs_days, lock_events_days=args.lock_events_days,
                                         race_events_days=args.race_events_days, batch=args.batch),
        repo=None,
        params={k: v for k, v in (("jobs_days", args.jobs_days), ("lock_events_days", args.lock_events_days),
                                  ("race_events_days", args.race_events_days), ("batch", args.batch))
                if v is not None})
    c = result["counters"]
    if args.json:
        print(json.dumps({"job": run_id, **c}))
        return 0
    print(f"prune {run_id[:8]}: {c['jobs_removed']:,} job rows (finished before {c['jobs_before']}), "
          f"{c['lock_events_removed']:,} lock events (before {c['lock_events_before']}), "
          f"{c['race_events_removed']:,} race events (before {c['race_events_before']}) removed in "
          f"{c['batches']} batches, {c['elapsed_ms']} ms"
          + (f"; more left in {c['more']} (the next run goes on)" if c["more"] else ""))
    return 0


def run_daily(args: argparse.Namespace) -> int:
    from packyard.workers.records import session_scope
    from packyard.workers.records.aggregates import daily

    s = get_settings()
    if is_default_sqlite(s) and not (s.state_dir / "packyard.db").exists():
        print(f"no records yet ({s.state_dir / 'packyard.db'} does not exist)")
        return 0
    since = (datetime.now(UTC) - timedelta(days=args.days)).date()
    with session_scope(s) as session:
        rows = daily(session, since)
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
        return 0
    if not rows:
        print(f"no counts since {since}")
        return 0
    print(f"{'day':10}  {'family':6}  {'kind':32}  {'state':14}  {'events':>9}  {'mean s':>8}")
    for r in rows:
        mean = f"{r['duration_ms_sum'] / r['timed'] / 1000:.2f}" if r["timed"] else ""
        print(f"{r['day']!s:10}  {r['family']:6}  {r['kind'].removeprefix('packyard.'):32}  {r['state'] or '-':14}  "
              f"{r['events']:>9,}  {mean:>8}")
    return 0
