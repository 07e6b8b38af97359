"""Backups among the race's repacks and pushes (issue 38): ``packyard race --backup-every``.

A short run against the session's Redis and prefork worker queues a ``packyard.backup`` every 2 s (every
third a full one) while repacks and pushes race readers; afterwards the harness restores every backup written
(those retention expired from copies it kept) and compares it with git (for-each-ref and HEAD against the
entry's recorded refs, Gitaly's checksum from ``git show-ref --head``, git fsck --full --strict on three).
The test asks that backups really happened
(several, full and incremental, every one restored) and that nothing differed; then, independently of the
harness, restores the newest entry itself and checks it with git against the manifest.
"""
from __future__ import annotations

import json
import os
import subprocess

from backuputil import gitaly_checksum_by_git
from gitutil import git

SECONDS = float(os.environ.get("PACKYARD_TEST_RACE_BACKUP_SECONDS", "16"))


def race(pk, repo, *args: str, timeout: float) -> tuple[int, dict]:
    proc = subprocess.run(["packyard", "race", "--repo", str(repo), "--json", *args], env=pk.cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1])


def test_every_backup_of_a_race_restores_to_its_recorded_refs(celery_worker, store_root, pk, settings, tmp_path):
    from packyard.store.backup.manifest import load_manifest
    from packyard.workers.commands.backup import backup_dir_for, restore

    repo = store_root / "race-backup.git"
    code, out = race(pk, repo, "--readers", "2", "--duration", str(SECONDS), "--repack-every", "3",
                     "--ingest-every", "1", "--backup-every", "2", "--cloners", "0", "--seed", "23",
                     timeout=SECONDS + 180)
    shown = json.dumps({k: v for k, v in out.items() if k != "pushed_ids"})[:3000]
    assert code == 0 and out["ok"], shown
    assert out["events"]["lost"] == 0 and out["final_missing"] == 0, shown
    assert out["backups"] >= 3 and out["backups_failed"] == 0, shown
    assert out["restore_mismatches"] == 0 and not out["restore_examples"], shown
    # Every backup written is restored: those the manifest still holds from the backup directory, those a later
    # backup's retention expired (PACKYARD_BACKUP_KEEP_FULL) from the harness's kept copies.
    manifest = load_manifest(backup_dir_for(repo.resolve(), settings))
    assert out["restores_checked"] == out["backups"], shown
    assert len(manifest.entries) == out["backups"] - out["backups_expired"], shown
    assert out["restores_from_kept"] == out["backups_expired"], shown
    assert out["restores_fscked"] == 3, shown
    kinds = [e.kind for e in manifest.entries]
    assert "incremental" in kinds and "full" in kinds, kinds   # chains of several bundles were restored
    assert sum(out["repacks"].values()) >= 2 and sum(out["ingests"].values()) >= 5, shown   # it really raced
    job = pk.job_row(out["run_id"])
    assert job.state.value == "SUCCESS" and job.counters["restores_checked"] == out["restores_checked"]

    # The newest entry once more, by the test: git's refs and checksum are the manifest's.
    newest = manifest.latest()
    assert newest is not None
    target = tmp_path / "again.git"
    restore(target, repo.resolve(), entry=newest.id, backup_dir=backup_dir_for(repo.resolve(), settings))
    refs = git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=target).decode()
    assert dict(line.split() for line in refs.splitlines()) == newest.refs
    assert gitaly_checksum_by_git(target) == newest.checksum
    git("fsck", "--full", "--strict", git_dir=target)
