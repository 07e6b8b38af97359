"""The pool race end to end: ``packyard race --pool`` against the session's real Redis and prefork workers.

* safe: the pool's repacks, member repacks, thin pushes to every member (bases in the pool), fetches of the
  source into the pool and the last fork's disconnect race readers of every member and of the pool and git's
  clones of every member: no lost read, no failed clone, ``git fsck --full`` clean in the pool and every member,
  each member's ``rev-list --objects --all`` exactly its frontend's (before, minus its force pushes' drops,
  plus its pushes);
* the negative control (the pool's repacks ignore the members' refs) loses the objects only the forks still
  reach, and the run says so: exit 1, lost rows on record, git's fsck of a fork fails.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gitutil import fsck, git

SAFE_SECONDS = float(os.environ.get("PACKYARD_TEST_POOL_RACE_SECONDS", "20"))
CONTROL_SECONDS = 12.0


def race(pk, net: Path, *args: str, timeout: float) -> tuple[int, dict]:
    proc = subprocess.run(["packyard", "race", "--pool", "--repo", str(net), "--json", "--forks", "2", *args],
                          env=pk.cli_env(), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1])


def shown(out: dict) -> str:
    return json.dumps({k: v for k, v in out.items() if k != "pushed_ids"})[:4000]


def lost_rows(settings, run_id: str) -> int:
    from packyard.workers.records import RaceEvent, session_scope

    with session_scope(settings) as s:
        return s.execute(select(func.count()).where(RaceEvent.job_id == run_id)
                         .where(RaceEvent.kind == "lost")).scalar_one()


@pytest.mark.slow
def test_pool_race_loses_nothing(celery_worker, store_root, pk, settings):
    net = store_root / "network"
    code, out = race(pk, net, "--duration", str(SAFE_SECONDS), "--seed", "3", timeout=SAFE_SECONDS + 300)
    assert code == 0 and out["ok"], shown(out)
    j = out["jobs"]
    assert j["pool_repack"] >= 2 and j["member_repack"] >= 3 and j["fetch"] >= 2 and j["disconnect"] == 1, j
    assert j["push"] >= 6 and out["thin_bases_in_pool"] >= 4, shown(out)
    members = [Path(m) for m in out["members"]]
    assert len(members) == 3 and all(out["pushes_per_member"].get(str(m), 0) >= 1 for m in members), shown(out)
    assert out["ingests"]["rewrite"] >= 1, "the source never force-pushed: the pool's refs never left a topic"
    assert out["events"]["lost"] == 0 and out["final_missing"] == 0 and not out["fsck_failed"], shown(out)
    assert out["clones"]["clones"] >= 3 and out["clones_failed"] == 0, shown(out)
    assert out["lookups"] > 5_000 and out["readers"] == 4, shown(out)
    # git, again: the pool and every member whole; the disconnected fork borrows nothing, the others do.
    pool = Path(out["pool"])
    for r in (pool, *members):
        fsck(r)
    assert out["disconnected"] == [str(members[-1])]
    assert not (members[-1] / "objects" / "info" / "alternates").exists()
    assert all((m / "objects" / "info" / "alternates").is_file() for m in members[:-1])
    for m in members:   # every object each member's refs reach is there (rev-list --objects walks them all)
        assert out["objects_after"][str(m)] == len(git("rev-list", "--objects", "--all", git_dir=m).splitlines())
    job = pk.job_row(out["run_id"])
    assert job.kind == "packyard.race" and job.state.value == "SUCCESS" and job.params["pool"] is True
    assert job.counters["jobs_disconnect"] == 1 and job.counters["fsck_failed"] == 0


def test_pool_repack_ignoring_the_members_loses_objects(celery_worker, store_root, pk, settings):
    """The harness can fail: the pool's repacks prune what only the members reach, and git finds forks with
    objects missing; the run reports them lost and exits 1."""
    net = store_root / "network-control"
    code, out = race(pk, net, "--duration", str(CONTROL_SECONDS), "--seed", "5", "--unsafe-pool-prune",
                     timeout=CONTROL_SECONDS + 300)
    assert code == 1 and not out["ok"], shown(out)
    assert out["pool_repacks_ignoring_members"] >= 1 and out["ingests"]["rewrite"] >= 1, shown(out)
    assert out["final_missing"] > 0 and out["events"]["lost"] >= out["final_missing"], shown(out)
    forks = [m for m in out["members"] if Path(m).name.startswith("fork-") and m not in out["disconnected"]]
    assert forks and all(out["missing_per_member"][m] > 0 for m in forks), shown(out)
    assert out["fsck_failed"], shown(out)
    assert lost_rows(settings, out["run_id"]) >= out["final_missing"]
    assert pk.job_row(out["run_id"]).state.value == "FAILURE"
