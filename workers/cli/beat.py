"""packyard beat: exec `celery beat` with the nightly schedule."""
from __future__ import annotations

import argparse
import os

from packyard.workers.cli import common


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "beat", help="run the scheduler (nightly jobs)",
        description="Exec `celery -A packyard.workers.app beat`. Every PACKYARD_LOST_AFTER/2 seconds: the "
                    "job reconciler (LOST jobs, stranded deliveries). Nightly: verify_repo for every repository in "
                    "PACKYARD_NIGHTLY_REPOS at PACKYARD_NIGHTLY_HOUR (UTC).")
    p.add_argument("--show-schedule", action="store_true", help="print the schedule and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = common.settings()
    if args.show_schedule:
        from packyard.workers.app import beat_schedule

        entries = beat_schedule(s)
        if not any("kwargs" in e for e in entries.values()):
            print("no nightly jobs (set PACKYARD_NIGHTLY_REPOS)")
        for name, entry in entries.items():
            if isinstance(entry["schedule"], (int, float)):
                print(f"{name}: {entry['task']} every {entry['schedule']:g}s")
                continue
            print(f"{name}: {entry['task']} {entry['kwargs']} daily at {s.nightly_hour:02d}:00 UTC "
                  f"({entry['schedule']!r})")
        return 0
    common.prepare_embedded(s)
    argv = common.beat_argv(s)
    os.execve(argv[0], argv, common.child_env(s))
    return 0
