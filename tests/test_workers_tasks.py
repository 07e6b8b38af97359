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
