"""The task contract through a real worker: retry on a lost lease, fail on StoreError, PROGRESS, lease events."""
from __future__ import annotations

import os
import time
import uuid

from sqlalchemy import select


def test_lock_lost_is_retried_then_succeeds(celery_worker, celery_app, pk, store_root):
    key = f"test:attempts:{uuid.uuid4().hex}"
    res = celery_app.send_task("packyard.test_flaky", kwargs={"repo": str(store_root), "key": key, "failures": 2})
    assert res.get(timeout=60) == {"counters": {"attempts": 3}}
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.retries == 2 and job.counters == {"attempts": 3}
    assert job.error is None


def test_lock_lost_too_often_fails_after_max_retries(celery_worker, celery_app, pk, store_root):
    key = f"test:attempts:{uuid.uuid4().hex}"
    res = celery_app.send_task("packyard.test_flaky", kwargs={"repo": str(store_root), "key": key, "failures": 99})
    res.get(timeout=60, propagate=False)
    job = pk.job_row(res.id)
    assert job.state.value == "FAILURE" and job.error_type == "LockLostError"
    assert job.retries == 5  # PACKYARD_TASK_MAX_RETRIES default
    assert "lease lost on attempt 6" in job.error


def test_store_error_fails_without_retry(celery_worker, celery_app, pk, store_root):
    res = celery_app.send_task("packyard.test_corrupt", kwargs={"repo": str(store_root)})
    res.get(timeout=60, propagate=False)
    assert res.state == "FAILURE"
    job = pk.job_row(res.id)
    assert job.state.value == "FAILURE" and job.retries == 0
    assert job.error == f"bad object for the test (object {'ab' * 20}, file {store_root})"


def test_progress_is_visible_and_lease_events_recorded(celery_worker, celery_app, pk, store_root):
    from packyard.workers.records import LockEvent, LockEventKind, session_scope

    res = celery_app.send_task("packyard.test_slow", kwargs={"repo": str(store_root), "steps": 20})
    seen = []
    deadline = time.monotonic() + 60
    while not res.ready() and time.monotonic() < deadline:
        if res.state == "PROGRESS":
            seen.append(dict(res.info))
        time.sleep(0.05)
    assert res.get(timeout=10) == {"counters": {"steps": 20}}
    assert seen, "no PROGRESS state observed"
    assert all(s["phase"] == "stepping" and s["total"] == 20 and 0 <= s["done"] <= 20 for s in seen)
    assert len({s["done"] for s in seen}) >= 2  # progress moved while we watched
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        events = s.scalars(select(LockEvent).where(LockEvent.job_id == res.id).order_by(LockEvent.id)).all()
    assert [e.event for e in events] == [LockEventKind.ACQUIRED, LockEventKind.RELEASED]
    assert events[0].fencing_token == events[1].fencing_token and events[0].fencing_token >= 1


def test_busy_repository_is_retried_until_the_lease_is_free(celery_worker, celery_app, pk, store_root, redis_client):
    from packyard.workers.locks import try_acquire

    repo = store_root / "busy.git"
    held = try_acquire(redis_client, repo, ttl=30, job_id="someone-else")
    res = celery_app.send_task("packyard.test_locked", kwargs={"repo": str(repo)})
    pk.wait_until(lambda: (job := pk.job_row(res.id)) is not None and job.retries >= 1, 30,
                  what="a retry while the repository is locked")
    held.release()
    value = res.get(timeout=60)
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.retries >= 1
    assert value["counters"]["token"] > held.token  # fencing: the later holder has the larger token


def test_race_event_recorded_by_worker(celery_worker, celery_app, pk, store_root):
    from packyard.workers.records import RaceEvent, Repository, session_scope

    res = celery_app.send_task("packyard.test_race", kwargs={"repo": str(store_root)})
    res.get(timeout=60)
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        rows = s.execute(select(RaceEvent, Repository.path).join(Repository)
                         .where(RaceEvent.job_id == res.id)).all()
    assert [(r.kind, r.detail, path) for r, path in rows] == [
        ("pack_vanished", {"pack": "pack-1234.pack", "retried": True}, str(store_root.resolve()))]


# -- exactly-once outcomes: a delivery of a finished job is acknowledged without running -------------

def test_forced_redelivery_of_a_finished_job_leaves_its_row_untouched(celery_worker, celery_app, pk, tmp_path,
                                                                     store_root, redis_client):
    key = f"test:runs:{uuid.uuid4().hex}"
    res = celery_app.send_task("packyard.test_slow", kwargs={"repo": str(store_root), "steps": 2, "key": key})
    assert res.get(timeout=60) == {"counters": {"steps": 2}}
    first = pk.job_row(res.id)
    assert first.state.value == "SUCCESS" and first.attempts == 1
    # The same message again (same task id, same arguments): what a broker redelivery hands a worker.
    celery_app.send_task("packyard.test_slow", kwargs={"repo": str(store_root), "steps": 2, "key": key},
                         task_id=res.id)
    pk.wait_until(lambda: pk.job_row(res.id).attempts == 2, 60, what="the redelivery to be counted")
    again = pk.job_row(res.id)
    assert again.state.value == "SUCCESS" and again.attempts == 2
    for field in ("counters", "started_at", "finished_at", "duration_ms", "error", "retries", "first_started_at",
                  "worker_pid"):
        assert getattr(again, field) == getattr(first, field), field
    assert again.last_started_at > first.last_started_at
    assert redis_client.get(key) == b"1", "the command ran once"
    assert celery_app.AsyncResult(res.id).get(timeout=10) == {"counters": {"steps": 2}}, "stored result kept"
    pk.wait_until(lambda: not any(tid == res.id for tid in _unacked_task_ids(redis_client)), 30,
                  what="the redelivered message to be acknowledged")


def _unacked_task_ids(redis_client) -> list[str]:
    from packyard.workers.broker import snapshot

    return list(snapshot(redis_client).deliveries.values())


def test_a_second_delivery_waiting_on_the_lease_does_not_run_the_job_again(celery_worker, celery_app, pk, tmp_path,
                                                                         store_root, redis_client):
    """Two deliveries of one job at once (a redelivery while the first still runs): the second waits
    for the repository lease, then finds the outcome recorded and stops. One run, one outcome."""
    from packyard.workers.records import LockEvent, LockEventKind, session_scope

    key = f"test:runs:{uuid.uuid4().hex}"
    task_id = str(uuid.uuid4())
    kwargs = {"repo": str(store_root), "steps": 20, "key": key}
    res = celery_app.send_task("packyard.test_slow", kwargs=kwargs, task_id=task_id)
    pk.wait_until(lambda: redis_client.get(key) == b"1", 60, what="the first delivery to run")
    celery_app.send_task("packyard.test_slow", kwargs=kwargs, task_id=task_id)
    assert res.get(timeout=60) == {"counters": {"steps": 20}}
    pk.wait_until(lambda: pk.job_row(task_id).attempts == 2, 60, what="the second delivery to be counted")

    def second_done() -> bool:
        with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
            events = s.scalars(select(LockEvent.event).where(LockEvent.job_id == task_id)).all()
        return events.count(LockEventKind.RELEASED) == 2

    pk.wait_until(second_done, 60, what="the second delivery to take and release the lease")
    job = pk.job_row(task_id)
    assert job.state.value == "SUCCESS" and job.counters == {"steps": 20} and job.error is None
    assert redis_client.get(key) == b"1", "the second delivery did not run the command"


def test_a_contended_ref_lock_is_retried_not_failed(celery_worker, celery_app, pk, tmp_path, store_root):
    """A live writer holding <ref>.lock is a moment's contention (LockContendedError): retried with
    backoff, then the job succeeds; git agrees with the result."""
    from gitutil import commit_objects, git
    from packyard.store import lockfile

    repo = store_root / "r.git"
    git("init", "-q", "--bare", str(repo))
    objects, commit = commit_objects(tmp_path, "contended\n")
    (repo / "refs" / "heads").mkdir(parents=True, exist_ok=True)
    claim = lockfile.acquire(repo / "refs" / "heads" / "main.lock", "ref refs/heads/main")   # a live holder
    try:
        res = celery_app.send_task("packyard.write_objects", kwargs={
            "repo": str(repo), "objects": objects,
            "ref_updates": [{"ref": "refs/heads/main", "old": None, "new": commit}]})
        pk.wait_until(lambda: (job := pk.job_row(res.id)) is not None and job.retries >= 1, 60,
                      what="a retry while the ref is claimed")
        job = pk.job_row(res.id)
        assert job.state.value in ("RETRY", "STARTED") and "locked by another writer" in job.error
    finally:
        lockfile.release(claim)
    res.get(timeout=120)
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.retries >= 1
    assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == commit
    git("fsck", "--full", git_dir=repo)
