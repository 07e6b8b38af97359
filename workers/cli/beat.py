"""packyard beat: exec `celery beat` with the nightly schedule."""
from __future__ import annotations

import argparse
import os

from packyard.workers.cli.children import beat_argv, child_env
from packyard.workers.cli.prepare import prepare_embedded
from packyard.workers.settings import get_settings


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser(
        "beat", help="run the scheduler (nightly jobs)",
        description="Exec `celery -A packyard.workers.app beat`. Every PACKYARD_LOST_AFTER/2 seconds: the "
                    "job reconciler (LOST jobs, stranded deliveries). Nightly: the maintenance window opens at "
                    "PACKYARD_MAINTENANCE_CRON (UTC) and plans every enabled registered repository (packyard "
                    "repos) for PACKYARD_MAINTENANCE_WINDOW seconds, at most PACKYARD_MAINTENANCE_CONCURRENCY "
                    "maintenance jobs in flight.")
    p.add_argument("--show-schedule", action="store_true", help="print the schedule and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = get_settings()
    if args.show_schedule:
        from packyard.workers.app import beat_schedule

        for name, entry in beat_schedule(s).items():
            if isinstance(entry["schedule"], (int, float)):
                print(f"{name}: {entry['task']} every {entry['schedule']:g}s")
                continue
            if name == "backup-fleet":
                print(f"{name}: {entry['task']} at cron '{s.backup_cron}' (UTC), into {s.backup_path}, "
                      f"{s.backup_keep_full} full chain(s) kept, a new full one after "
                      f"{s.backup_full_interval:.0f} s")
                continue
            print(f"{name}: {entry['task']} {entry['kwargs']} at cron '{s.maintenance_cron}' (UTC), open for "
                  f"{s.maintenance_window:.0f} s, at most {s.maintenance_concurrency} maintenance job(s) in flight, "
                  f"jitter up to {s.maintenance_jitter:.0f} s; also after every {s.plan_after_ingests} ingests")
        return 0
    prepare_embedded(s)
    argv = beat_argv(s)
    os.execve(argv[0], argv, child_env(s))
    return 0
