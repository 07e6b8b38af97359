"""packyard bench status: what an operator waits for, ``packyard status`` and ``packyard --help``, start to end.

Each figure is a whole process, as an operator runs it (the installed ``packyard`` script; the
interpreter's start, the imports, the query and the output), repeated ``--runs`` times after one
warm-up run, so the page cache is warm; best and median are reported next to the issue's goals
(issue 39) and next to git's own ``git status`` in an empty repository, the ratio being packyard's
median over git's. A fresh SQLite database in a temporary state directory, migrated to head, is
timed empty; then ``packyard bench records``' fill (:mod:`.recordsfill`) loads ``--jobs`` job rows
into it and ``status`` is timed again.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

#: issue 39's goals, seconds per run
GOALS = {"--help": 0.15, "status --no-reconcile, empty": 0.3, "status --no-reconcile, filled": 0.5}


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("status", help="packyard status and --help, whole processes, against goals",
                              description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--jobs", type=int, default=1_000_000, help="job rows for the filled run (default 1,000,000; "
                                                                "0: empty only)")
    p.add_argument("--repos", type=int, default=10_000, help="registered repositories in the fill (default 10,000)")
    p.add_argument("--runs", type=int, default=20, help="timed runs per command (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.set_defaults(func=run, logs=False)


def timed(cmd: list[str], env: dict[str, str], cwd: Path, runs: int) -> dict[str, float]:
    """Best and median seconds of ``runs`` runs of ``cmd`` (after one untimed warm-up); a failing run raises."""
    subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return {"best": round(min(times), 3), "median": round(statistics.median(times), 3)}


def run(args: argparse.Namespace) -> int:
    from packyard.workers.cli.bench.common import git, packyard_entry
    from packyard.workers.cli.bench.recordsfill import Fill, Phases, fill_database
    from packyard.workers.records import get_engine, upgrade_database, utcnow
    from packyard.workers.settings import Settings

    out: dict[str, Any] = {"runs": args.runs, "jobs": args.jobs}
    entry = packyard_entry()
    with tempfile.TemporaryDirectory(prefix="packyard-bench-status-") as tmp:
        work = Path(tmp)
        state = work / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PACKYARD_")}
        env["PACKYARD_STATE_DIR"] = str(state)
        url = f"sqlite:///{state / 'packyard.db'}"
        settings = replace(Settings.from_env(env), database_url=url)
        upgrade_database(settings)
        git("init", "-q", str(work / "gitrepo"))
        res: dict[str, dict[str, float]] = {}
        res["git status (empty repository)"] = timed(["git", "status"], env, work / "gitrepo", args.runs)
        res["--help"] = timed(entry + ["--help"], env, work, args.runs)
        res["status --no-reconcile, empty"] = timed(entry + ["status", "--no-reconcile"], env, work, args.runs)
        if args.jobs:
            fill = Fill(args.jobs, args.repos, 40.0, utcnow(), 21)
            t0 = time.perf_counter()
            fill_database(get_engine(url), fill, args.jobs, Phases("fill"))
            out["fill_s"] = round(time.perf_counter() - t0, 1)
            res["status --no-reconcile, filled"] = timed(entry + ["status", "--no-reconcile"], env, work, args.runs)
        out["size_mb"] = round((state / "packyard.db").stat().st_size / 1e6, 1)
    out["seconds"] = res
    if args.json:
        print(json.dumps(out))
        return 0
    ref = res["git status (empty repository)"]["median"]
    print(f"{'command':56} {'best s':>7} {'median s':>9} {'goal s':>7} {'vs git status':>14}")
    for what, t in res.items():
        goal = GOALS.get(what)
        label = what if what.startswith("git") else f"packyard {what}"
        if what.endswith("filled"):
            label += f" ({args.jobs:,} jobs)"
        print(f"{label:56} {t['best']:7.3f} {t['median']:9.3f} {goal if goal else '':>7} "
              f"{t['median'] / ref if ref else float('inf'):13.1f}x")
    return 0
