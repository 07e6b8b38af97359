"""Backups as a hosting service runs them: the queued backup, restore and backup_fleet jobs on a real Celery
worker (job rows, leases, confinement, the registry's backup columns, ``packyard status``), and git as the
oracle (``git bundle verify`` of what the job wrote, ``git fsck --full --strict`` of what the restore made)."""
from __future__ import annotations

import json
import subprocess

from backuputil import gitaly_checksum_by_git
from gitutil import fsck_strict, git
from poolutil import make_source, refs


def _job(pk, celery_app, name: str, task_id: str | None = None, **kwargs):
    res = celery_app.send_task(name, kwargs=kwargs, task_id=task_id)
    return pk.wait_job(res.id, timeout=180)


def test_a_queued_backup_and_restore_on_a_worker(store_root, celery_worker, celery_app, pk, settings) -> None:
    from packyard.workers.commands.backup import backup_dir_for
    from packyard.workers.records import registry

    source, _work = make_source(store_root)
    job = _job(pk, celery_app, "packyard.backup", repo=str(source))
    assert job.state.value == "SUCCESS", job.error
    assert job.lease is None or job.lease.value != "lost"
    assert job.counters["checksum"] == gitaly_checksum_by_git(source)
    backup_dir = backup_dir_for(source, settings)
    manifest = json.loads((backup_dir / "manifest.json").read_text())
    (entry,) = manifest["entries"]
    assert entry["id"] == job.counters["entry"] and entry["verified"]
    git("bundle", "verify", str(backup_dir / entry["file"]), git_dir=source)
    row = registry.get(settings, source)
    assert row["backup_entry"] == entry["id"] and row["last_backup_at"] is not None

    target = store_root / "restored.git"
    restored = _job(pk, celery_app, "packyard.restore", repo=str(target), source=str(source))
    assert restored.state.value == "SUCCESS", restored.error
    fsck_strict(target)
    assert refs(target) == refs(source) and gitaly_checksum_by_git(target) == job.counters["checksum"]

    # A queued restore never replaces a repository that is there (the CLI's --force is an operator's).
    again = _job(pk, celery_app, "packyard.restore", repo=str(target), source=str(source))
    assert again.state.value == "FAILURE" and "restored.git" in again.error, again.error
    fsck_strict(target)

    # Outside the storage roots: refused at the boundary, nothing read or written.
    outside = _job(pk, celery_app, "packyard.restore", repo=str(store_root / "x.git"), source="/etc")
    assert outside.state.value == "FAILURE" and "outside the storage roots" in outside.error


def test_a_failed_backup_is_on_record_and_in_status(store_root, celery_worker, celery_app, pk, settings) -> None:
    source, _work = make_source(store_root)
    for pack in (source / "objects" / "pack").glob("pack-*.pack"):   # every object gone: a ref names nothing
        pack.with_suffix(".idx").unlink()
        pack.unlink()
    job = _job(pk, celery_app, "packyard.backup", repo=str(source))
    assert job.state.value == "FAILURE" and job.error, job
    from packyard.workers.commands.backup import backup_dir_for

    backup_dir = backup_dir_for(source, settings)           # no manifest entry, no bundle left visible
    assert not (backup_dir / "manifest.json").exists() or not json.loads(
        (backup_dir / "manifest.json").read_text())["entries"]
    assert not list(backup_dir.glob("*.bundle")) if backup_dir.exists() else True
    out = subprocess.run(["packyard", "status", "--no-reconcile"], env=pk.cli_env(), capture_output=True, text=True,
                         timeout=60, cwd=pk.session_dir)
    assert out.returncode == 0, out.stderr
    assert "backups failing:" in out.stdout and source.name in out.stdout, out.stdout
    detail = subprocess.run(["packyard", "status", "--no-reconcile", "--repo", str(source)], env=pk.cli_env(),
                            capture_output=True, text=True, timeout=60, cwd=pk.session_dir)
    assert "backup: none on record; FAILED" in detail.stdout, detail.stdout


def test_the_fleet_run_queues_one_backup_per_registered_repository(store_root, celery_worker, celery_app, pk,
                                                                   settings) -> None:
    from packyard.workers.app import beat_schedule
    from packyard.workers.commands.backup import fleet_task_id
    from packyard.workers.records import registry

    assert beat_schedule(settings)["backup-fleet"]["task"] == "packyard.backup_fleet"
    repos = []
    for i in range(2):
        r, _ = make_source(store_root / f"fleet{i}")
        registry.register(settings, r)
        repos.append(r)
    fleet = _job(pk, celery_app, "packyard.backup_fleet")
    assert fleet.state.value == "SUCCESS", fleet.error
    day = fleet.counters["day"]
    assert fleet.counters["queued"] >= len(repos)
    for r in repos:
        task_id = fleet_task_id(str(r.resolve()), day)
        done = pk.wait_job(task_id, timeout=180)
        assert done.state.value == "SUCCESS", done.error
        assert done.counters["entry"] and done.counters["checksum"] == gitaly_checksum_by_git(r)
