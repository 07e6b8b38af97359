"""packyard janitor [--repo R ...]: remove what dead jobs left behind, judged by the job that owned it.

``.keep`` files, ingest quarantines, pack writers' temp files, batch writes' tmp objects and claim
files carry an owner record (pid, host, job id); each is removed when its owner process is
provably dead or its job is finished, failed or lost in the records (or finished in Redis), kept
while the job is pending, and removed when the job is unknown only once older than
``--safety-age``. What has no owner record falls back to ``packyard gc``'s age rules, under the
repository's maintenance lease. Without ``--repo``: every registered repository inside the storage
roots. The run is a ``packyard.janitor`` job row listing every removal with what and why; beat
runs the same as the ``packyard.janitor`` task every PACKYARD_JANITOR_INTERVAL seconds.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from packyard.workers.cli.prepare import run_as_job
from packyard.workers.settings import Settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "janitor", help="remove leftovers of dead jobs (by owner: the job records and Redis decide)",
        description="Judge every .keep, quarantine, pack temp file, batch tmp object and lock file packyard wrote "
                    "by the job that owns it: removed when its process is dead or its job finished, failed or "
                    "was lost; kept while the job is pending; unknown jobs' leftovers only after --safety-age. "
                    "Leftovers without an owner record follow `packyard gc`'s age rules (under the maintenance "
                    "lease). Records a packyard.janitor job row with every removal and why.")
    p.add_argument("--repo", metavar="PATH", action="append", default=None,
                   help="a repository (repeatable; default: every registered repository in the storage roots)")
    p.add_argument("--safety-age", type=float, default=None, metavar="SECONDS",
                   help="remove leftovers of jobs nobody knows only when older than this "
                        "(default: PACKYARD_JANITOR_SAFETY_AGE, 86400)")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(func=run, logs=False)


def run(args: argparse.Namespace) -> int:
    from packyard.workers.commands.janitor import run_janitor
    from packyard.workers.locks import redis_client

    def work(s: Settings, run_id: str) -> dict[str, Any]:
        client = redis_client(s)
        try:
            return run_janitor(s, repos=args.repo, redis_client=client, safety_age=args.safety_age, job_id=run_id)
        finally:
            client.close()

    run_id, result = run_as_job("packyard.janitor", work,
                                repo=args.repo[0] if args.repo and len(args.repo) == 1 else None,
                                params={"repos": args.repo, "safety_age": args.safety_age})
    result["job"] = run_id
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    c = result["counters"]
    print(f"janitor {run_id[:8]}: {c['repositories']} repositories, {c['removed']} leftovers removed, "
          f"{c['kept_live']} kept (their jobs are alive), {c['age_rule_removed']} removed by gc's age rules"
          + (f", {c['busy']} repositories busy (maintenance running)" if c["busy"] else ""))
    for r in result["removed"]:
        print(f"  removed {r['what']:<10} {r['repo']}/{r['path']}: {r['why']}")
    for k in result["kept"]:
        print(f"  kept    {k['what']:<10} {k['repo']}/{k['path']}: {k['why']}")
    for e in result["errors"]:
        print(f"  error   {e}")
    return 0
