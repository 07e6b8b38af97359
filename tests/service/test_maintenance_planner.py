"""The planner's parts against real Redis and a real SQLite database: fleet slots, the registry's counters
as job rows finish, plan_repository's outcomes, the gc job through a real worker, `packyard repos`."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from gitutil import commit_blobs, git
from packyard.workers.records import JobState, registry
from packyard.workers.records.recorder import record_admitted, record_finished, record_queued, record_started

# -- slots ----------------------------------------------------------------------------------------------

def test_slots_never_hand_out_more_than_the_limit(redis_client):
    from packyard.workers.slots import FleetSlots

    slots = FleetSlots(redis_client, limit=3, ttl=60, key=f"test:slots:{uuid.uuid4().hex}")
    got: list[tuple[str, int | None]] = []
    start = threading.Barrier(16)

    def grab(i: int) -> None:
        start.wait()
        got.append((f"job-{i}", slots.try_acquire(f"job-{i}")))
    threads = [threading.Thread(target=grab, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = sorted(tid for tid, n in got if n is not None)
    assert len(winners) == 3 and sorted(n for _, n in got if n is not None) == [1, 2, 3]
    assert sorted(slots.holders()) == winners
    assert slots.try_acquire(winners[0]) == 3            # a holder asking again keeps its slot
    assert slots.release(winners[0]) and not slots.release(winners[0])
    assert slots.try_acquire("late") == 3 and slots.try_acquire("later") is None


def test_a_lost_release_expires(redis_client):
    from packyard.workers.slots import FleetSlots

    slots = FleetSlots(redis_client, limit=1, ttl=1.0, key=f"test:slots:{uuid.uuid4().hex}")
    assert slots.try_acquire("crashed-job") == 1
    assert slots.try_acquire("next") is None
    from procutil import wait_until
    wait_until(lambda: slots.try_acquire("next") == 1, 10, interval=0.2, what="the claim to expire")
    assert slots.holders() == ["next"]


# -- the registry's counters, moved by record_finished ----------------------------------------------------

def finish(url: str, repo: str, kind: str, state: JobState = JobState.SUCCESS, params=None, seen=None) -> str:
    tid = uuid.uuid4().hex
    record_queued(url, task_id=tid, kind=kind, repo=repo, params=params)
    record_started(url, task_id=tid, kind=kind, repo=repo, params=params, hostname="h", pid=1)
    record_admitted(url, task_id=tid, repo=repo)          # the job passed the boundary: registered from now on
    record_finished(url, task_id=tid, kind=kind, repo=repo, state=state, counters=None, error=None, error_type=None,
                    on_ingest_counted=None if seen is None else seen.append)
    return tid


def test_ingests_are_counted_and_a_repack_resets_them(sqlite_url):
    from packyard.workers.records import upgrade_database

    upgrade_database(sqlite_url)
    repo, seen = "/srv/counted.git", []
    for kind in ("packyard.index_pack", "packyard.unpack_objects", "packyard.import_tree", "packyard.write_objects"):
        finish(sqlite_url, repo, kind, seen=seen)
    finish(sqlite_url, repo, "packyard.index_pack", JobState.FAILURE, seen=seen)   # a failed ingest: not counted
    finish(sqlite_url, repo, "packyard.verify_repo", seen=seen)                    # not an ingest
    assert seen == [1, 2, 3, 4] and registry.get(sqlite_url, repo)["ingests_since_repack"] == 4
    # A redelivered job finishing twice counts once.
    tid = finish(sqlite_url, repo, "packyard.write_objects", seen=seen)
    record_finished(sqlite_url, task_id=tid, kind="packyard.write_objects", repo=repo, state=JobState.SUCCESS,
                    counters=None, error=None, error_type=None, on_ingest_counted=seen.append)
    assert seen == [1, 2, 3, 4, 5]
    finish(sqlite_url, repo, "packyard.repack", params={"mode": "geometric"})
    row = registry.get(sqlite_url, repo)
    assert row["ingests_since_repack"] == 0 and row["last_repack_at"] and row["last_full_repack_at"] is None
    finish(sqlite_url, repo, "packyard.repack", JobState.FAILURE, params={"mode": "full"})
    assert registry.get(sqlite_url, repo)["last_full_repack_at"] is None           # a failed repack changes nothing
    finish(sqlite_url, repo, "packyard.repack", params={"mode": "full"})
    h = registry.history(registry.get(sqlite_url, repo))
    assert h.last_full_repack_at == h.last_repack_at and h.ingests_since_repack == 0


def test_concurrent_ingests_each_see_their_own_count(sqlite_url):
    """The UPDATE ... RETURNING: eight ingests landing at once report 1..8, so 'every M-th' fires exactly once."""
    from packyard.workers.records import upgrade_database

    upgrade_database(sqlite_url)
    seen: list[int] = []
    start = threading.Barrier(8)

    def land() -> None:
        start.wait()
        finish(sqlite_url, "/srv/busy.git", "packyard.index_pack", seen=seen)
    threads = [threading.Thread(target=land) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 9))


# -- plan_repository's outcomes ------------------------------------------------------------------------------

@pytest.fixture
def planner_env(sqlite_url, redis_client, settings):
    from packyard.workers.records import upgrade_database
    from packyard.workers.slots import FleetSlots

    upgrade_database(sqlite_url)
    s = dataclasses.replace(settings, database_url=sqlite_url, maintenance_concurrency=1, maintenance_jitter=0.0)
    slots = FleetSlots(redis_client, limit=1, ttl=60, key=f"test:slots:{uuid.uuid4().hex}")
    return s, slots


def loose_repo(base: Path, name: str, files: int = 1600) -> Path:
    bare = base / f"{name}.git"
    git("init", "-q", "--bare", str(bare))
    commit_blobs(bare, base / "scratch", "main", files)
    return bare


def test_plan_outcomes_queued_no_slot_busy_nothing(planner_env, tmp_path):
    from packyard.workers.commands.plan_maintenance import Outcome, plan_repository

    s, slots = planner_env
    sent: list[tuple[str, dict, str, float]] = []
    send = lambda *job: sent.append(job)  # noqa: E731 (what app.send_task would publish)
    a, b = loose_repo(tmp_path, "a"), loose_repo(tmp_path, "b")
    empty = tmp_path / "empty.git"
    git("init", "-q", "--bare", str(empty))

    first = plan_repository(a, settings=s, send=send, slots=slots, trigger="manual")
    assert first.outcome is Outcome.QUEUED and first.in_flight == 1
    (name, kwargs, task_id, countdown), = sent
    # A scheduled job never waits for the maintenance lease: it skips if another maintenance job holds it.
    assert (name, kwargs) == ("packyard.repack", {"repo": str(a.resolve()), "mode": "loose", "on_busy": "skip"})
    assert countdown == 0
    assert slots.holders() == [task_id] == [first.job_id]

    second = plan_repository(b, settings=s, send=send, slots=slots, trigger="ingests")
    assert second.outcome is Outcome.NO_SLOT and len(sent) == 1
    row = registry.get(s, b)
    assert row["last_plan"]["outcome"] == "no_slot" and row["last_planned_at"] is None   # the window takes it up

    # The queued job's row (written at publish in production) carries the plan; here we publish nothing,
    # so write the queued row the way before_task_publish would, then plan again: the repository is busy.
    record_queued(s, task_id=task_id, kind="packyard.repack", repo=str(a), params={"mode": "loose"})
    slots.release(task_id)
    again = plan_repository(a, settings=s, send=send, slots=slots, trigger="manual")
    assert again.outcome is Outcome.BUSY and len(sent) == 1 and slots.holders() == []

    nothing = plan_repository(empty, settings=s, send=send, slots=slots, trigger="manual")
    assert nothing.outcome is Outcome.NOTHING and registry.get(s, empty)["last_plan"]["action"] == "nothing"

    registry.set_enabled(s, b, False)
    assert plan_repository(b, settings=s, send=send, slots=slots, trigger="ingests").outcome is Outcome.DISABLED


def test_a_window_claims_each_repository_once(planner_env, tmp_path):
    from packyard.workers.commands.plan_maintenance import Outcome, plan_repository, sweep

    s, slots = planner_env
    # (no commit-graph or pack-refs reasons either: these repositories have nothing due at all)
    s = dataclasses.replace(s, maintenance_concurrency=4, maintenance_skip_commit_graph=True)
    slots.limit = 4
    repos = [loose_repo(tmp_path, f"r{i}", files=10) for i in range(3)]
    for r in repos:
        registry.register(s, r)
    start = time.time()
    result = sweep(settings=s, send=lambda *job: None, slots=slots, window_start=start, window_end=start + 60)
    assert result["counters"]["nothing"] == 3 and result["counters"]["waiting"] == 0
    again = sweep(settings=s, send=lambda *job: None, slots=slots, window_start=start, window_end=start + 60)
    assert again["counters"]["due"] == 0                           # planned in this window already
    row = registry.get(s, repos[0])
    taken = plan_repository(repos[0], settings=s, send=lambda *job: None, slots=slots, trigger="window",
                            window_start=start)
    assert taken.outcome is Outcome.TAKEN and registry.get(s, repos[0]) == row   # nothing rewritten
    later = time.time()  # a later window, already closed when its round runs
    closed = sweep(settings=s, send=lambda *job: None, slots=slots, window_start=later, window_end=later)
    assert closed["counters"]["not_reached"] == 3, closed  # the window is over: they wait for the next


def test_an_unreadable_repository_fails_its_own_plan_with_the_reason(planner_env, tmp_path):
    from packyard.store.errors import NotARepositoryError
    from packyard.workers.commands.plan_maintenance import plan_repository

    s, slots = planner_env
    with pytest.raises(NotARepositoryError):
        plan_repository(tmp_path / "gone.git", settings=s, send=lambda *job: None, slots=slots, trigger="manual")
    plan = registry.get(s, tmp_path / "gone.git")["last_plan"]
    assert plan["outcome"] == "unreadable" and "does not exist" in plan["error"]


# -- the gc job through a real worker ---------------------------------------------------------------------------

def test_gc_job_removes_leftovers_under_the_maintenance_lease(celery_worker, celery_app, pk, tmp_path, store_root):
    from packyard.workers.records import LockEvent, session_scope

    repo = store_root / "gc.git"
    git("init", "-q", "--bare", str(repo))
    commit_blobs(repo, tmp_path / "scratch", "main", 5)
    git("repack", "-q", "-a", "-d", git_dir=repo)
    old = time.time() - 15 * 86400
    q = repo / "objects" / "incoming-abandoned"
    q.mkdir()
    (q / "tmp_pack_1").write_bytes(b"x")
    tmp = repo / "objects" / "pack" / "tmp_pack_dead"
    tmp.write_bytes(b"x")
    preserved = repo / "objects" / "pack" / "preserved"
    preserved.mkdir()
    (preserved / f"pack-{'3' * 40}.pack").write_bytes(b"old")
    for p in (q / "tmp_pack_1", q, tmp):
        os.utime(p, (old, old))
    res = celery_app.send_task("packyard.gc", kwargs={"repo": str(repo), "preserve_for": 0})
    value = res.get(timeout=60)
    assert value["counters"]["stale_quarantines_removed"] == 1
    assert value["counters"]["stale_pack_temps_removed"] == 1 and value["counters"]["preserved_packs_expired"] == 1
    assert not q.exists() and not tmp.exists() and not any(preserved.iterdir())
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.counters == value["counters"]
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        locks = s.scalars(select(LockEvent).where(LockEvent.job_id == res.id)).all()
    assert locks and all(e.lock_name.startswith("packyard:lock:maint:") for e in locks)
    git("fsck", "--full", git_dir=repo)


# -- packyard repos, packyard status --repo ----------------------------------------------------------------------

@pytest.mark.slow
def test_repos_cli_and_status_plan(pk, tmp_path, migrated_db):
    def run(*args):
        return subprocess.run(["packyard", *args], env=pk.cli_env(), capture_output=True, text=True, timeout=60)

    repo = loose_repo(tmp_path, "cli", files=1600)
    assert run("repos", "add", "--repo", str(repo)).stdout.startswith("registered: ")
    assert "already registered" in run("repos", "add", "--repo", str(repo)).stdout
    assert run("repos", "disable", "--repo", str(repo)).returncode == 0
    rows = [json.loads(line) for line in run("repos", "list", "--json").stdout.splitlines()]
    (mine,) = [r for r in rows if r["path"] == str(repo.resolve())]
    assert mine["enabled"] is False and mine["ingests_since_repack"] == 0
    assert run("repos", "enable", "--repo", str(repo)).returncode == 0
    table = run("repos", "list").stdout
    assert any(str(repo.resolve()) in line and " yes " in line for line in table.splitlines())

    out = run("status", "--repo", str(repo))
    assert out.returncode == 0, out.stderr
    assert f"repository {repo.resolve()} (enabled for maintenance; 0 ingest(s) since the last repack)" in out.stdout
    assert "\nplan if planned now: loose (mode=loose)\n  - ~" in out.stdout
    assert "loose objects (estimated from" in out.stdout and "no jobs recorded" in out.stdout
    # the commit-graph and refs statistics and their reason (issue 19)
    assert "\n  commit-graph: 0 layer(s), 0 commits, generation data no, Bloom filters no" in out.stdout
    assert "\n  - also: commit-graph missing\n" in out.stdout

    out = run("repos", "remove", "--repo", str(repo))
    assert out.returncode == 0 and "0 job row(s) kept" in out.stdout
    assert run("repos", "remove", "--repo", str(repo)).returncode == 1
    out = run("repos", "add", "--repo", str(tmp_path / "nope.git"))
    assert out.returncode == 1 and "NotARepositoryError" in out.stderr
