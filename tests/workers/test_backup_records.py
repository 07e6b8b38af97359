"""Backup jobs on record (migration 0009): the registry's newest good / last failed backup, what ``packyard
status`` says about them, and the exporter's age histogram, counts and oldest N -- on SQLite and PostgreSQL."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from recordsutil import scrape, settings_for


def _backup_job(url, task_id, repo, *, ok=True, entry="20261207T010000Z-00000001", checksum="ab" * 20,
                days_ago=0.0):
    from packyard.workers.records import JobState, Repository, session_scope, utcnow
    from packyard.workers.records.recorder import record_admitted, record_finished, record_queued, record_started

    record_queued(url, task_id=task_id, kind="packyard.backup", repo=repo)
    record_started(url, task_id=task_id, kind="packyard.backup", repo=repo, params=None, hostname="w@h", pid=1)
    record_admitted(url, task_id=task_id, repo=repo)
    record_finished(url, task_id=task_id, kind="packyard.backup", repo=repo,
                    state=JobState.SUCCESS if ok else JobState.FAILURE,
                    counters={"entry": entry, "checksum": checksum, "objects": 10} if ok else None,
                    error=None if ok else "BackupChecksumError: boom", error_type=None if ok else "BackupChecksumError")
    if days_ago:
        column = Repository.last_backup_at if ok else Repository.last_backup_failed_at
        with session_scope(url) as s:
            s.execute(update(Repository).where(Repository.path == repo)
                      .values({column: utcnow() - timedelta(days=days_ago)}))


def test_a_backup_job_moves_its_repository_and_status_says_so(records_url):
    from packyard.workers.cli.status import backup_line, failing_backups_line
    from packyard.workers.records import jobrows, registry

    url, repo = records_url, "/srv/backups/app.git"
    s = settings_for(url)
    registry.register(url, repo)
    assert "none on record" in backup_line(registry.get(url, repo), 0.0)
    assert jobrows.failing_backups(url, 5) == (0, [])
    _backup_job(url, "b1", repo, days_ago=2.0)
    row = registry.get(url, repo)
    assert (row["backup_entry"], row["backup_checksum"]) == ("20261207T010000Z-00000001", "ab" * 20)
    import time

    line = backup_line(row, time.time())
    assert "newest good 2.0 days ago" in line and "FAILED" not in line, line
    assert failing_backups_line(s) == ""

    _backup_job(url, "b2", repo, ok=False)
    row = registry.get(url, repo)
    assert row["backup_entry"] == "20261207T010000Z-00000001"       # a failure leaves the good one as it was
    assert "FAILED" in backup_line(row, time.time())
    count, rows = jobrows.failing_backups(url, 5)
    assert count == 1 and rows[0][0] == repo and rows[0][2] is not None
    assert failing_backups_line(s).startswith("backups failing: 1 repository: ")

    _backup_job(url, "b3", repo, entry="20261207T020000Z-00000002")   # good again: no longer failing
    assert jobrows.failing_backups(url, 5) == (0, [])
    assert "FAILED" not in backup_line(registry.get(url, repo), time.time())


def test_the_exporter_shows_backup_ages_without_one_series_per_repository(records_url):
    from packyard.workers.records import registry

    url = records_url
    ages = {"/srv/b/fresh.git": 0.5, "/srv/b/week.git": 6.0, "/srv/b/old.git": 40.0}
    for i, (repo, days) in enumerate(ages.items()):
        registry.register(url, repo)
        _backup_job(url, f"ok{i}", repo, days_ago=days)
    registry.register(url, "/srv/b/never.git")
    registry.register(url, "/srv/b/broken.git")
    _backup_job(url, "bad", "/srv/b/broken.git", ok=False)
    registry.register(url, "/srv/b/off.git", enabled=False)
    _backup_job(url, "off", "/srv/b/off.git", days_ago=100.0)

    got = scrape(url)
    hist = {le: got[("packyard_repositories_days_since_backup_bucket", (("le", le),))]
            for le in ("1", "7", "30", "60", "+Inf")}
    assert hist == {"1": 1, "7": 2, "30": 2, "60": 3, "+Inf": 5}, hist     # the disabled one is not counted
    assert got[("packyard_repositories_without_backup", ())] == 2          # never and broken
    assert got[("packyard_repositories_backup_failing", ())] == 1
    oldest = {dict(k[1])["repo"]: v for k, v in got.items() if k[0] == "packyard_repository_backup_age_seconds"}
    assert set(oldest) == set(ages)
    assert 39 * 86400 < oldest["/srv/b/old.git"] < 41 * 86400
    assert abs(got[("packyard_repositories_days_since_backup_sum", ())] - sum(ages.values())) < 0.1
