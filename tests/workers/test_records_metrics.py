"""The exporter's counters against the rows they count, the migration's seeding against the recorder's counting,
and per-repository families bounded by PACKYARD_METRICS_TOP_REPOS whatever the fleet's size."""
from __future__ import annotations

import random

import pytest
from sqlalchemy import case, func, select

from recordsutil import finished_job, scrape, settings_for


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


def history(url, n=40, seed=7):
    """Jobs of several kinds, states and durations, lease and race events, through the recorder."""
    from packyard.workers.records import JobState
    from packyard.workers.records.models import LockEventKind
    from packyard.workers.records.recorder import record_lock_event, record_race_events

    rng = random.Random(seed)
    kinds = ("packyard.index_pack", "packyard.repack", "packyard.verify_repo")
    for i in range(n):
        state = JobState.FAILURE if rng.random() < 0.2 else JobState.SUCCESS
        finished_job(url, f"h-{i}", rng.choice(kinds), f"/srv/m/{i % 5}.git", state=state,
                     days_ago=rng.choice((0, 0, 3, 12)), duration_s=rng.choice((0.05, 0.3, 2.0, 40.0, 700.0, 20000.0)))
    for i in range(12):
        lease = "packyard:lock:maint:" if i % 3 == 0 else "packyard:lock:"
        record_lock_event(url, repo="/srv/m/0.git", job_id=f"h-{i}", lock_name=f"{lease}/srv/m/0.git",
                          event=rng.choice((LockEventKind.ACQUIRED, LockEventKind.RELEASED, LockEventKind.RENEWED)),
                          token=i)
    record_race_events(url, repo="/srv/m/1.git", job_id=None,
                       events=[{"kind": rng.choice(("relisted", "preserved", "lost"))} for _ in range(9)])


def from_rows(url):
    """What the exporter served before issue 21: GROUP BYs over every row (the oracle here)."""
    from packyard.workers.records import Job, JobState, LockEvent, RaceEvent, session_scope
    from packyard.workers.records.aggregates import lease_of
    from packyard.workers.records.models import DURATION_BUCKETS

    want = {}
    with session_scope(url) as s:
        for kind, state, n in s.execute(select(Job.kind, Job.state, func.count()).group_by(Job.kind, Job.state)):
            want[("packyard_jobs", (("kind", kind), ("state", state.value)))] = n
        cols = [func.sum(case((Job.duration_ms <= b * 1000, 1), else_=0)) for b in DURATION_BUCKETS]
        for kind, count, total, *cum in s.execute(
                select(Job.kind, func.count(), func.sum(Job.duration_ms), *cols)
                .where(Job.state.in_((JobState.SUCCESS, JobState.FAILURE))).group_by(Job.kind)):
            want[("packyard_job_duration_seconds_count", (("kind", kind),))] = count
            want[("packyard_job_duration_seconds_sum", (("kind", kind),))] = pytest.approx(float(total) / 1000)
            for b, c in zip(DURATION_BUCKETS, cum):
                want[("packyard_job_duration_seconds_bucket", (("kind", kind), ("le", repr(float(b)))))] = c
        locks = {}
        for name, event, n in s.execute(select(LockEvent.lock_name, LockEvent.event, func.count())
                                        .group_by(LockEvent.lock_name, LockEvent.event)):
            key = ("packyard_lock_events_total", (("event", event.value), ("lease", lease_of(name))))
            locks[key] = locks.get(key, 0) + n
        want.update(locks)
        for kind, n in s.execute(select(RaceEvent.kind, func.count()).group_by(RaceEvent.kind)):
            want[("packyard_race_events_total", (("kind", kind),))] = n
    return want


def test_counters_agree_with_the_rows_and_the_migration_seeds_the_same(url):
    from packyard.workers.records import downgrade_database, session_scope, upgrade_database
    from packyard.workers.records.aggregates import daily, totals

    history(url)
    got = scrape(url)
    want = from_rows(url)
    assert len(want) > 20
    for key, value in want.items():
        assert got.get(key) == value, key
    with session_scope(url) as s:
        live_totals, live_daily = sorted(map(str, totals(s))), sorted(map(str, daily(s)))
    # The same history counted again by 0005's upgrade from the rows alone.
    downgrade_database(url, "0004")
    upgrade_database(url)
    with session_scope(url) as s:
        assert sorted(map(str, totals(s))) == live_totals
        seeded_daily = sorted(map(str, daily(s)))
    # The recorder counts a job in the day it finished (today, before the test aged it); the migration
    # in the day its row says: same counts, different days for the aged rows.
    assert len(seeded_daily) >= len(live_daily)
    again = scrape(url)
    for key, value in want.items():
        assert again.get(key) == value, key


def plan(url, path, packs, loose, action="nothing"):
    import time

    from packyard.workers.records import registry

    registry.register(url, path)
    registry.record_plan(url, path, {"action": action, "outcome": "nothing", "at": time.time(),
                                     "stats": {"packs": packs, "loose_estimate": loose}}, time.time())


def test_per_repository_families_are_the_top_n_and_distributions_cover_the_rest(url):
    from packyard.workers.metrics import LOOSE_BUCKETS, PACK_BUCKETS, make_registry
    from packyard.workers.records import registry

    rng = random.Random(3)
    fleet = {f"/srv/fleet/{i:03d}.git": (rng.randint(1, 120), rng.randint(0, 20000)) for i in range(60)}
    for path, (packs, loose) in fleet.items():
        plan(url, path, packs, loose, action="geometric" if packs > 60 else "nothing")
    registry.set_enabled(url, "/srv/fleet/000.git", False)
    enabled = {p: v for p, v in fleet.items() if p != "/srv/fleet/000.git"}

    def series(top):
        from prometheus_client import generate_latest

        return generate_latest(make_registry(settings_for(url), top=top)).decode()

    got = scrape(url)
    top_packs = {dict(k[1])["repo"]: v for k, v in got.items() if k[0] == "packyard_repository_packs"}
    assert len(top_packs) == 10
    assert sorted(top_packs.values(), reverse=True) == sorted((v[0] for v in enabled.values()), reverse=True)[:10]
    assert all(enabled[p][0] == v for p, v in top_packs.items())
    top_loose = {dict(k[1])["repo"]: v for k, v in got.items() if k[0] == "packyard_repository_loose_objects_estimate"}
    assert sorted(top_loose.values(), reverse=True) == sorted((v[1] for v in enabled.values()), reverse=True)[:10]
    for b in PACK_BUCKETS:
        assert got[("packyard_repositories_packs_bucket", (("le", str(b)),))] == \
            sum(1 for v in enabled.values() if v[0] <= b)
    for b in LOOSE_BUCKETS:
        assert got[("packyard_repositories_loose_objects_bucket", (("le", str(b)),))] == \
            sum(1 for v in enabled.values() if v[1] <= b)
    assert got[("packyard_repositories_packs_count", ())] == len(enabled)
    assert got[("packyard_repositories_packs_sum", ())] == sum(v[0] for v in enabled.values())
    assert got[("packyard_repositories_maintenance_due", (("action", "geometric"),))] == \
        sum(1 for v in enabled.values() if v[0] > 60)
    # More repositories, same number of series.
    n_before = series(10).count("\npackyard_")
    for i in range(60, 140):
        plan(url, f"/srv/fleet/{i:03d}.git", rng.randint(1, 120), rng.randint(0, 20000))
    assert series(10).count("\npackyard_") == n_before
    assert series(3).count('packyard_repository_packs{') == 3


def test_a_landed_repack_moves_the_recorded_statistics_and_clears_due(url):
    from packyard.workers.records import JobState, registry
    from packyard.workers.records.recorder import record_finished, record_queued, record_started

    path = "/srv/landed/r.git"
    plan(url, path, packs=30, loose=5000, action="full")
    assert registry.get(url, path)["due_action"] == "full"
    record_queued(url, task_id="rp", kind="packyard.repack", repo=path, params={"mode": "full"})
    record_started(url, task_id="rp", kind="packyard.repack", repo=path, params=None, hostname="w", pid=1)
    record_finished(url, task_id="rp", kind="packyard.repack", repo=path, state=JobState.SUCCESS,
                    counters={"packs_merged": 30, "packs_written": 1, "loose_deleted": 4990}, error=None,
                    error_type=None)
    row = registry.get(url, path)
    assert (row["stat_packs"], row["stat_loose_objects"], row["due_action"]) == (1, 10, None)
    assert row["last_full_repack_at"] is not None
    got = scrape(url)
    assert got[("packyard_repository_packs", (("repo", path),))] == 1
    assert got[("packyard_repository_last_full_repack_age_seconds", (("repo", path),))] < 300
    assert got[("packyard_repositories_days_since_full_repack_bucket", (("le", "1"),))] == 1


def test_the_exporter_reads_no_repository_from_disk(url, tmp_path):
    """A registered repository that does not exist on disk costs the scrape nothing and breaks nothing."""
    plan(url, str(tmp_path / "gone.git"), packs=4, loose=10)
    got = scrape(url)
    assert got[("packyard_records_up", ())] == 1
    assert got[("packyard_repository_packs", (("repo", str(tmp_path / "gone.git")),))] == 4


def test_every_dashboard_panel_has_series_from_counters_and_recorded_statistics(sqlite_url):
    """With a history and planned repositories, each packyard_* metric a panel queries has samples."""
    from sqlalchemy import update

    from packyard.workers.records import JobState, Repository, session_scope, upgrade_database, utcnow
    from packyard.workers.records.recorder import record_queued, record_started
    from promql import dashboard_metrics

    upgrade_database(sqlite_url)
    history(sqlite_url, n=12)
    plan(sqlite_url, "/srv/m/0.git", packs=60, loose=3000, action="full")
    finished_job(sqlite_url, "full-repack", "packyard.repack", "/srv/m/1.git")
    with session_scope(sqlite_url) as s:   # a full repack on record (the registry sets it when one lands)
        s.execute(update(Repository).values(last_full_repack_at=utcnow()))
    finished_job(sqlite_url, "backup", "packyard.backup", "/srv/m/1.git")   # a good backup on record
    record_queued(sqlite_url, task_id="in-flight", kind="packyard.repack", repo="/srv/m/2.git")
    record_started(sqlite_url, task_id="in-flight", kind="packyard.repack", repo="/srv/m/2.git", params=None,
                   hostname="w", pid=1)
    got = scrape(sqlite_url)
    names = {name for name, _labels in got}
    empty = sorted(m for m in dashboard_metrics("packyard_") if m not in names)
    assert not empty, f"panels without series: {empty}"
    assert got[("packyard_jobs", (("kind", "packyard.repack"), ("state", JobState.STARTED.value)))] == 1
