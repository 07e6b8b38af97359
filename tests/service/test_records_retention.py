"""Retention (packyard records prune, the prune_records task) and the counters that outlive the rows it deletes.

Rows are written through the recorder (so the counters move as in production), then aged by
rewriting their timestamps; the database is real SQLite (and PostgreSQL when configured).
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update

from recordsutil import age, finished_job, scrape, settings_for, task_ids


@pytest.fixture
def url(records_url):  # type: ignore[no-untyped-def]
    return records_url


def test_prune_deletes_only_what_retention_allows_and_the_counters_stay(url):
    from packyard.workers.records import Job, JobState, LockEvent, RaceEvent, session_scope, utcnow
    from packyard.workers.records.models import LockEventKind
    from packyard.workers.records.recorder import (
        mark_unseen,
        record_lock_event,
        record_lost,
        record_queued,
        record_race_event,
        record_run,
    )
    from packyard.workers.records.retention import prune

    a, b = "/srv/prune/a.git", "/srv/prune/b.git"
    # A LOST row (older than a-ingest-new, of the same kind) is not pending: pruned. (Its repository is
    # registered already: a queued row links only to a repository some admitted job registered.)
    from packyard.workers.records import registry

    registry.register(url, a)
    record_queued(url, task_id="a-lost-old", kind="packyard.index_pack", repo=a)
    with session_scope(url) as s:
        lost_id = s.scalar(select(Job.id).where(Job.task_id == "a-lost-old"))
    assert mark_unseen(url, lost_id, utcnow())
    with session_scope(url) as s:
        unseen = s.scalar(select(Job.unseen_since).where(Job.id == lost_id))
    assert record_lost(url, lost_id, unseen, "test")
    age(url, "a-lost-old", 35)
    for n in range(3):
        finished_job(url, f"a-ingest-old-{n}", "packyard.index_pack", a, days_ago=40 + n)
    finished_job(url, "a-ingest-new", "packyard.index_pack", a, days_ago=1)
    finished_job(url, "a-plan-old", "packyard.plan_maintenance", a, days_ago=45)       # its last plan: kept
    finished_job(url, "a-repack-failed-old", "packyard.repack", a, state=JobState.FAILURE, days_ago=50)
    finished_job(url, "a-repack-new", "packyard.repack", a, days_ago=2)
    finished_job(url, "b-verify-older", "packyard.verify_repo", b, days_ago=60)
    finished_job(url, "b-verify-old", "packyard.verify_repo", b, days_ago=31)          # b's newest verify: kept
    # Pending rows are never pruned, however old; a LOST row is not pending.
    record_queued(url, task_id="a-queued-ancient", kind="packyard.index_pack", repo=a)
    age(url, "a-queued-ancient", 90)
    with session_scope(url) as s:
        s.execute(text("UPDATE jobs SET finished_at = NULL WHERE task_id = 'a-queued-ancient'"))
    # Runs without a repository: the newest of the kind stays.
    for n, days in enumerate((40, 35)):
        record_run(url, task_id=f"janitor-{n}", kind="packyard.janitor", repo=None, params=None, started=utcnow(),
                   state=JobState.SUCCESS, counters={})
        age(url, f"janitor-{n}", days)
    now = utcnow()
    for days, kind in ((10, LockEventKind.ACQUIRED), (8, LockEventKind.RELEASED), (1, LockEventKind.ACQUIRED)):
        record_lock_event(url, repo=a, job_id="x", lock_name=f"packyard:lock:{a}", event=kind, token=1)
        with session_scope(url) as s:
            last = s.scalar(select(LockEvent.id).order_by(LockEvent.id.desc()).limit(1))
            s.execute(update(LockEvent).where(LockEvent.id == last).values(at=now - timedelta(days=days)))
    for days in (40, 31, 2):
        record_race_event(url, repo=a, job_id="x", kind="relisted")
        with session_scope(url) as s:
            last = s.scalar(select(RaceEvent.id).order_by(RaceEvent.id.desc()).limit(1))
            s.execute(update(RaceEvent).where(RaceEvent.id == last).values(observed_at=now - timedelta(days=days)))

    before = scrape(url)
    report = prune(settings_for(url), batch=2, max_batches=100)
    assert task_ids(url) == {"a-ingest-new", "a-plan-old", "a-repack-new", "b-verify-old", "a-queued-ancient",
                             "janitor-1"}
    assert report.jobs_removed == 7 and report.lock_events_removed == 2 and report.race_events_removed == 2
    assert report.more == [] and report.batches >= 7   # two rows per transaction
    with session_scope(url) as s:
        assert s.scalar(select(text("count(*)")).select_from(LockEvent)) == 1
        assert s.scalar(select(text("count(*)")).select_from(RaceEvent)) == 1
    after = scrape(url)
    # What the dashboards read did not move: finished jobs, durations, lease and race events.
    for key, value in before.items():
        if key[0] in ("packyard_jobs", "packyard_job_duration_seconds_bucket", "packyard_job_duration_seconds_count",
                      "packyard_lock_events_total", "packyard_race_events_total") and \
                dict(key[1]).get("state") != "LOST":
            assert after.get(key) == value, key
    assert after[("packyard_jobs", (("kind", "packyard.index_pack"), ("state", "SUCCESS")))] == 4
    assert after[("packyard_race_events_total", (("kind", "relisted"),))] == 3
    # LOST is a level (LOST rows now): the pruned LOST row is no longer a LOST job; the series stays, at 0.
    assert before[("packyard_jobs", (("kind", "packyard.index_pack"), ("state", "LOST")))] == 1
    assert after[("packyard_jobs", (("kind", "packyard.index_pack"), ("state", "LOST")))] == 0
    # A second run finds nothing more.
    again = prune(settings_for(url))
    assert (again.jobs_removed, again.lock_events_removed, again.race_events_removed) == (0, 0, 0)


def test_prune_stops_at_its_batch_bound_and_the_next_run_goes_on(sqlite_url):
    from packyard.workers.records import upgrade_database
    from packyard.workers.records.retention import prune

    upgrade_database(sqlite_url)
    for n in range(7):
        finished_job(sqlite_url, f"old-{n}", "packyard.index_pack", f"/srv/bound/{n % 2}.git", days_ago=40)
    finished_job(sqlite_url, "new-0", "packyard.index_pack", "/srv/bound/0.git")
    finished_job(sqlite_url, "new-1", "packyard.index_pack", "/srv/bound/1.git")
    first = prune(settings_for(sqlite_url), batch=2, max_batches=2)
    assert first.jobs_removed == 4 and first.more == ["jobs"]
    second = prune(settings_for(sqlite_url), batch=2, max_batches=2)
    assert second.jobs_removed == 3 and second.more == []
    assert task_ids(sqlite_url) == {"new-0", "new-1"}


def test_records_prune_command_records_what_it_removed(pk, tmp_path):
    from packyard.workers.records import Job, session_scope, upgrade_database

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade_database(url)
    finished_job(url, "old", "packyard.index_pack", "/srv/cli/a.git", days_ago=40)
    finished_job(url, "new", "packyard.index_pack", "/srv/cli/a.git")
    out = subprocess.run(["packyard", "records", "prune", "--json"], env=pk.cli_env(PACKYARD_DATABASE_URL=url),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed["jobs_removed"] == 1 and printed["more"] == ""
    with session_scope(url) as s:
        row = s.scalar(select(Job).where(Job.task_id == printed["job"]))
    assert row.kind == "packyard.prune_records" and row.state.value == "SUCCESS"
    assert row.counters["jobs_removed"] == 1 and row.counters["jobs_before"] == printed["jobs_before"]
    assert task_ids(url) == {"new", printed["job"]}
    daily = subprocess.run(["packyard", "records", "daily", "--json"], env=pk.cli_env(PACKYARD_DATABASE_URL=url),
                           capture_output=True, text=True, timeout=60)
    assert daily.returncode == 0, daily.stderr
    rows = [json.loads(line) for line in daily.stdout.splitlines()]
    # The pruned job still counts in its day's aggregate (both were finished today, then aged).
    (ingests,) = [r for r in rows if r["kind"] == "packyard.index_pack"]
    assert ingests["events"] == 2 and ingests["timed"] == 2


def test_beat_prunes_on_the_configured_interval_and_settings_refuse_a_retention_below_redelivery():
    from packyard.workers.app import beat_schedule
    from packyard.workers.settings import Settings, SettingsError

    s = Settings.from_env()
    assert beat_schedule(replace(s, records_prune_interval=600.0))["prune-records"]["schedule"] == 600.0
    assert "prune-records" not in beat_schedule(replace(s, records_prune_interval=0.0))
    with pytest.raises(SettingsError, match="PACKYARD_RECORDS_KEEP_JOBS_DAYS"):
        Settings.from_env({"PACKYARD_RECORDS_KEEP_JOBS_DAYS": "0.1"})   # 2.4 h < the 4 h visibility timeout
    with pytest.raises(SettingsError, match="PACKYARD_RECORDS_PRUNE_BATCH"):
        Settings.from_env({"PACKYARD_RECORDS_PRUNE_BATCH": "0"})
    assert Settings.from_env({"PACKYARD_RECORDS_KEEP_LOCK_EVENTS_DAYS": "2"}).records_keep_lock_events_days == 2.0


def test_the_task_never_keeps_less_than_the_server_says():
    from packyard.workers.tasks.prune_records import _at_least

    assert _at_least(None, 30.0) == 30.0 and _at_least(1.0, 30.0) == 30.0 and _at_least(90, 30.0) == 90.0


def test_the_beat_task_prunes_on_a_worker_with_the_servers_retention(celery_worker, celery_app, pk, settings):
    """packyard.prune_records on a real worker: a message asking to keep 1 day still gets the server's 30."""
    import uuid

    url = settings.database_url
    tag = uuid.uuid4().hex[:8]
    repo = f"/srv/task-prune/{tag}.git"
    finished_job(url, f"old-{tag}", "packyard.index_pack", repo, days_ago=45)
    finished_job(url, f"mid-{tag}", "packyard.index_pack", repo, days_ago=10)   # inside 30 days: kept
    finished_job(url, f"new-{tag}", "packyard.index_pack", repo)
    res = celery_app.send_task("packyard.prune_records", kwargs={"jobs_days": 1})
    value = res.get(timeout=120)
    left = {t for t in task_ids(url) if t.endswith(tag)}
    assert left == {f"mid-{tag}", f"new-{tag}"}
    assert value["counters"]["jobs_removed"] >= 1
    row = pk.job_row(res.id)
    assert row.kind == "packyard.prune_records" and row.state.value == "SUCCESS"
    assert row.counters["jobs_removed"] == value["counters"]["jobs_removed"]
