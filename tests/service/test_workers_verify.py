"""verify_repo run by a real prefork worker process; the job rows that process wrote; its log lines."""
from __future__ import annotations

import os
import zlib
from collections import Counter

import pytest

from gitutil import batch_check_all, git, make_worktree_repo, snapshot_tree
from packyard.store.objects import ObjectType, hash_object

TYPE_FIELD = {"commit": "commits", "tree": "trees", "blob": "blobs", "tag": "tags"}


def loose_path(repo, hex_oid):
    return repo / "objects" / hex_oid[:2] / hex_oid[2:]


def test_verify_repo_success_recorded_by_worker(store_root, celery_worker, celery_app, pk):
    repo = make_worktree_repo(store_root)
    oracle = batch_check_all(repo)
    before = snapshot_tree(repo)

    res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(repo)})
    value = res.get(timeout=60)
    job = pk.job_row(res.id)  # written before the result was stored: no waiting needed

    assert job is not None and job.state.value == "SUCCESS", job and (job.state, job.error)
    assert job.kind == "packyard.verify_repo"
    assert job.queued_at is not None and job.started_at is not None and job.finished_at is not None
    assert job.queued_at <= job.started_at <= job.finished_at
    assert job.duration_ms is not None and job.duration_ms >= 0
    assert job.worker_pid not in (None, os.getpid())
    assert job.worker_hostname.startswith("test-")
    assert job.error is None
    # Counters are what the worker returned, and they agree with git.
    assert job.counters == value["counters"]
    types = Counter(t for t, _ in oracle.values())
    assert job.counters["objects"] == len(oracle)
    for label, field in TYPE_FIELD.items():
        assert job.counters[field] == types.get(label, 0), field
    assert job.counters["bytes"] == sum(size for _, size in oracle.values())
    assert job.counters["refs"] == len(git("for-each-ref", git_dir=repo).splitlines())
    assert snapshot_tree(repo) == before

    # The repository row exists and was marked verified.
    from sqlalchemy import select

    from packyard.workers.records import Repository, session_scope

    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        row = s.scalar(select(Repository).where(Repository.id == job.repo_id))
        assert row.path == str(repo.resolve())
        assert row.last_verified_at is not None

    # One summary event per job, with the job's context bound, in the worker's JSON log.
    lines = pk.wait_until(lambda: [ln for ln in celery_worker.log_lines()
                                   if ln.get("job_id") == res.id and ln.get("event") == "job.finished"],
                          10, what="job.finished log line")
    assert len(lines) == 1
    assert lines[0]["task"] == "packyard.verify_repo" and lines[0]["repo"] == str(repo.resolve())
    assert lines[0]["counters"] == value["counters"] and lines[0]["state"] == "SUCCESS"
    started = [ln for ln in celery_worker.log_lines()
               if ln.get("job_id") == res.id and ln.get("event") == "job.started"]
    assert started and started[0]["repo"] == str(repo.resolve())


def _truncate_loose(repo):
    oid = sorted(h for h, (t, _) in batch_check_all(repo).items() if t == "blob")[0]
    p = loose_path(repo, oid)
    p.chmod(0o644)
    p.write_bytes(p.read_bytes()[:10])
    return oid, p


def _mismatched_loose(repo):
    """A loose file named after one blob whose (valid) content is another blob."""
    oid = sorted(h for h, (t, _) in batch_check_all(repo).items() if t == "blob")[0]
    p = loose_path(repo, oid)
    p.chmod(0o644)
    body = b"not the content this name promises\n"
    assert hash_object(ObjectType.BLOB, body).hex() != oid
    p.write_bytes(zlib.compress(b"blob %d\0" % len(body) + body))
    return oid, p


@pytest.mark.parametrize("damage", ["truncated", "mismatched"])
def test_verify_repo_bad_object_fails_with_reason(store_root, celery_worker, celery_app, pk, damage):
    repo = make_worktree_repo(store_root)
    oid, path = (_truncate_loose if damage == "truncated" else _mismatched_loose)(repo)
    before = snapshot_tree(repo)

    res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(repo)})
    res.get(timeout=60, propagate=False)
    assert res.state == "FAILURE"
    job = pk.job_row(res.id)
    assert job.state.value == "FAILURE"
    assert job.error_type == "CorruptObjectError"
    # The reason names the object (by id, or by its loose file, which is the id) and the file.
    assert oid in job.error or f"{oid[:2]}/{oid[2:]}" in job.error, job.error
    assert str(path) in job.error, job.error
    assert job.finished_at is not None and job.duration_ms is not None
    assert snapshot_tree(repo) == before              # verify never writes


@pytest.mark.parametrize("kind", ["missing", "plain-dir"])
def test_verify_repo_not_a_repository(store_root, celery_worker, celery_app, pk, kind):
    target = store_root / "nothing-here.git"
    if kind == "plain-dir":
        target.mkdir()
        (target / "file.txt").write_text("not a repository\n")
    before = snapshot_tree(store_root)
    res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(target)})
    res.get(timeout=60, propagate=False)
    job = pk.job_row(res.id)
    assert job.state.value == "FAILURE"
    assert job.error_type == "NotARepositoryError"
    assert str(target) in job.error
    assert snapshot_tree(store_root) == before


def test_worker_records_jobs_in_postgres(tmp_path, store_root, postgres_url, redis_server, settings, celery_app, pk,
                                         monkeypatch):
    """Same as the SQLite path, with the worker process (and the publisher) writing to PostgreSQL."""
    import dataclasses

    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope, upgrade_database

    upgrade_database(postgres_url)
    monkeypatch.setenv("PACKYARD_DATABASE_URL", postgres_url)  # the publisher's queued row goes there too
    pg_settings = dataclasses.replace(settings, database_url=postgres_url)
    worker = pk.WorkerProcess(pg_settings, f"pg-{os.getpid()}@%h", tmp_path / "pg-worker.log", queues=("pgtest",))
    try:
        worker.wait_ready()
        repo = make_worktree_repo(store_root)
        ok = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(repo)}, queue="pgtest")
        bad = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(store_root / "absent")}, queue="pgtest")
        ok_value = ok.get(timeout=60)
        bad.get(timeout=60, propagate=False)
    finally:
        worker.stop()
    with session_scope(postgres_url) as s:
        jobs = {j.task_id: j for j in s.scalars(select(Job))}
    assert jobs[ok.id].state.value == "SUCCESS" and jobs[ok.id].counters == ok_value["counters"]
    assert jobs[ok.id].counters["objects"] == len(batch_check_all(repo))
    assert jobs[ok.id].queued_at <= jobs[ok.id].started_at <= jobs[ok.id].finished_at
    assert jobs[ok.id].worker_hostname.startswith("pg-") and jobs[ok.id].duration_ms >= 0
    assert jobs[bad.id].state.value == "FAILURE" and jobs[bad.id].error_type == "NotARepositoryError"
