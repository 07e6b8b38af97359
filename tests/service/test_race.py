"""The race harness end to end: ``packyard race`` against the session's real Redis and prefork workers.

* safe mode, 60 s, 4 reader processes, a repack every 3 s (full, loose, geometric in turn) and a
  push every second (index_pack, unpack_objects, write_objects, a real git push, force pushes): no lost read, misses
  really happened and were recovered, every miss is a race_events row, git fsck --full passes and
  every pushed object is in the repository;
* each negative control (readers trusting the pack directory's stat data; repacks unlinking
  replaced packs at once) must report lost reads and exit 1: the harness can fail.

Durations are arguments (PACKYARD_TEST_RACE_SECONDS overrides the safe run's 60 s).
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from sqlalchemy import func, select

from gitutil import git

SAFE_SECONDS = float(os.environ.get("PACKYARD_TEST_RACE_SECONDS", "60"))
CONTROL_SECONDS = 12.0


def race(pk, repo, *args: str, timeout: float) -> tuple[int, dict]:
    proc = subprocess.run(["packyard", "race", "--repo", str(repo), "--json", *args], env=pk.cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1])


def recorded(settings, run_id: str) -> dict[str, int]:
    from packyard.workers.records import RaceEvent, session_scope

    with session_scope(settings) as s:
        return dict(s.execute(select(RaceEvent.kind, func.count()).where(RaceEvent.job_id == run_id)
                              .group_by(RaceEvent.kind)).all())


@pytest.mark.slow
def test_safe_race_loses_nothing_and_really_races(celery_worker, store_root, pk, settings):
    repo = store_root / "race.git"
    code, out = race(pk, repo, "--readers", "4", "--duration", str(SAFE_SECONDS), "--repack-every", "3",
                     "--ingest-every", "1", "--seed", "7", timeout=SAFE_SECONDS + 240)
    assert code == 0 and out["ok"], json.dumps({k: v for k, v in out.items() if k != "pushed_ids"})[:3000]
    ev = out["events"]
    assert ev["lost"] == 0 and out["final_missing"] == 0
    assert out["recovered"] > 0, "no miss was recovered: the readers never raced a repack"
    assert ev["preserved"] > 0, "force-pushed objects were read from preserved/ after a full repack deleted them"
    assert out["lookups"] > 50_000 and out["reads"] > 0 and out["quick"] > 0 and out["probes"] > 0
    assert all(n >= 2 for n in out["repacks"].values()), out["repacks"]      # every mode, more than once
    assert all(n >= 2 for n in out["ingests"].values()), out["ingests"]      # every kind of push
    assert {"index_pack", "unpack_objects", "write_objects", "git_push", "rewrite"} <= out["ingests"].keys()
    # Every miss is a race_events row of the run, kind by kind.
    rows = recorded(settings, out["run_id"])
    assert {k: rows.get(k, 0) for k in ev} == ev and out["events_recorded"] == sum(ev.values())
    # git is the oracle: the repository is whole and holds every object a push carried.
    git("fsck", "--full", "--strict", git_dir=repo)
    have = git("cat-file", "--batch-check", git_dir=repo,
               input="".join(f"{o}\n" for o in out["pushed_ids"]).encode()).decode()
    assert len(out["pushed_ids"]) > 20 and "missing" not in have
    # The run is a job row; `packyard races` shows the counts.
    job = pk.job_row(out["run_id"])
    assert job.kind == "packyard.race" and job.state.value == "SUCCESS" and job.counters["lost"] == 0
    shown = subprocess.run(["packyard", "races", "--repo", str(repo)], env=pk.cli_env(), capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and "no lost reads" in shown.stdout, shown.stdout
    line = next(x for x in shown.stdout.splitlines() if x.startswith(str(repo.resolve())))
    assert f"{ev['preserved']:,}" in line.split(), line


@pytest.mark.parametrize("control", ["--unsafe-dir-cache", "--unsafe-delete"])
def test_each_negative_control_is_caught(control, celery_worker, store_root, pk, settings):
    """The harness can fail: flip the readers' one unsafe option, or let repacks unlink replaced packs
    at once, and the same run reports lost reads (exit 1, rows of kind lost)."""
    repo = store_root / "race-control.git"
    code, out = race(pk, repo, "--readers", "4", "--duration", str(CONTROL_SECONDS), "--repack-every", "2",
                     "--ingest-every", "1", "--seed", "11", control, timeout=CONTROL_SECONDS + 180)
    assert code == 1 and not out["ok"]
    assert out["events"]["lost"] > 0 and not out["failures"] and not out["reader_errors"], \
        json.dumps({k: v for k, v in out.items() if k != "pushed_ids"})[:3000]
    assert recorded(settings, out["run_id"]).get("lost") == out["events"]["lost"]
    assert all(e["run_mode"] == control.removeprefix("--") for e in out["lost_examples"] if e.get("reader") is not None)
    shown = subprocess.run(["packyard", "races", "--repo", str(repo)], env=pk.cli_env(), capture_output=True,
                           text=True, timeout=60)
    assert "lost reads:" in shown.stdout and "ObjectMissingError" in shown.stdout, shown.stdout[-2000:]
    # Only readers were fooled (or the preserved copies were unlinked): git still finds a whole repository.
    git("fsck", "--full", git_dir=repo)
