"""One maintenance job per repository at a time, on real prefork workers and a real Redis:

* two repacks of one repository run one after the other (their lease intervals, from the
  records, never overlap) and the wait is on the records;
* a scheduled repack (``on_busy="skip"``) that finds the lease taken is recorded as skipped;
* a worker SIGKILLed while holding the lease: the redelivered job breaks the dead holder's lease
  and takes over, the job ends SUCCESS on its second delivery, git fsck --full passes;
* a holder SIGSTOPped past its lease and resumed deletes nothing: its successor already recorded a
  later token in the maintenance fence, which refuses the stalled one; the abort is recorded.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import replace

import pytest
from sqlalchemy import select

import repackutil as ru
from gitutil import git, snapshot_tree
from packyard.store.fence import FenceKind, recorded_token
from packyard.workers.locks import LeaseKind, acquire, db_event_recorder
from packyard.workers.records import LockEvent, session_scope
from packyard.workers.records.models import LeaseOutcome, LockEventKind
from procutil import stopped


def events_of(settings, job_id: str) -> list[LockEvent]:
    with session_scope(settings) as s:
        rows = list(s.scalars(select(LockEvent).where(LockEvent.job_id == job_id).order_by(LockEvent.id)))
        s.expunge_all()
        return rows


def interval(settings, job_id: str) -> tuple[float, float]:
    """When the job held the maintenance lease: its acquired and released events (from the records)."""
    evs = events_of(settings, job_id)
    acquired = [e.at for e in evs if e.event is LockEventKind.ACQUIRED]
    released = [e.at for e in evs if e.event is LockEventKind.RELEASED]
    assert len(acquired) == 1 and len(released) == 1, [(e.event, e.at) for e in evs]
    return acquired[0].timestamp(), released[0].timestamp()


def test_two_repacks_of_one_repository_run_one_after_the_other(shapes, celery_worker, celery_app, pk, settings,
                                                                redis_client):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    # Hold the lease first, so that both jobs are delivered, start and find it taken.
    holder = acquire(redis_client, bare, ttl=60, job_id="test-holder", on_event=db_event_recorder(settings),
                     kind=LeaseKind.MAINTENANCE)
    try:
        first = celery_app.send_task("packyard.repack", kwargs={"repo": str(bare), "mode": "full", "wait": 120})
        second = celery_app.send_task("packyard.repack", kwargs={"repo": str(bare), "mode": "geometric",
                                                                 "wait": 120})
        pk.wait_until(lambda: all((pk.job_row(r.id) is not None and pk.job_row(r.id).state.value == "STARTED")
                                  for r in (first, second)), 60, what="both repacks to start")
        time.sleep(1.0)   # both are now waiting for the lease (the records say how long, below)
    finally:
        holder.release()
    for res in (first, second):
        res.get(timeout=180)
    jobs = {r.id: pk.job_row(r.id) for r in (first, second)}
    assert all(j.state.value == "SUCCESS" for j in jobs.values()), {k: j.error for k, j in jobs.items()}
    spans = sorted(interval(settings, r.id) + (r.id,) for r in (first, second))
    (a_start, a_end, a_id), (b_start, b_end, b_id) = spans
    assert a_end <= b_start, f"the two repacks overlapped: {spans}"
    # Each waited -- the one that ran second for longer than the first one's whole run -- and says so.
    waited = {r.id: next(e.waited_ms for e in events_of(settings, r.id) if e.event is LockEventKind.ACQUIRED)
              for r in (first, second)}
    assert waited[a_id] >= 900 and waited[b_id] >= waited[a_id] + (a_end - a_start) * 1000 - 250, waited
    for job_id, job in jobs.items():
        assert job.lease is LeaseOutcome.WAITED and job.lease_wait_ms == waited[job_id]
        assert job.started_at.timestamp() < a_end + 1   # delivered while the lease was taken
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing


def test_a_scheduled_repack_that_finds_the_lease_taken_is_recorded_as_skipped(shapes, celery_worker, celery_app,
                                                                              pk, settings, redis_client):
    bare = shapes.bare
    before = snapshot_tree(bare)
    holder = acquire(redis_client, bare, ttl=60, job_id="nightly-gc-holder", kind=LeaseKind.MAINTENANCE)
    try:
        res = celery_app.send_task("packyard.repack", kwargs={"repo": str(bare), "mode": "full", "on_busy": "skip"})
        value = res.get(timeout=60)
    finally:
        holder.release()
    assert value["skipped"] is True and value["holder"]["holder_job"] == "nightly-gc-holder", value
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.lease is LeaseOutcome.SKIPPED and job.counters == {"skipped": 1}
    (ev,) = events_of(settings, res.id)
    assert ev.event is LockEventKind.SKIPPED and ev.detail["holder_token"] == holder.token
    assert snapshot_tree(bare) == before, "a skipped repack touches nothing"
    # The status table marks it.
    import subprocess

    out = subprocess.run(["packyard", "status", "--no-reconcile", "--limit", "50"], env=pk.cli_env(),
                         capture_output=True, text=True, timeout=60)
    row = next(line for line in out.stdout.splitlines() if line.split()[1:2] == [res.id[:8]])
    assert " skipped " in row and "skipped=1" in row, row


def _dedicated_worker(pk, settings, tmp_path, monkeypatch, fault: str, ttl: float):
    once = tmp_path / "fault-once"
    once.mkdir()
    monkeypatch.setenv("PACKYARD_FAULT", fault)
    monkeypatch.setenv("PACKYARD_FAULT_ONCE_DIR", str(once))
    queue = f"maint-{uuid.uuid4().hex[:6]}"
    worker = pk.WorkerProcess(replace(settings, lock_ttl=ttl), f"{queue}-{os.getpid()}@%h",
                              tmp_path / "worker.log", queues=(queue,))
    return worker, queue, once


def test_a_repack_killed_holding_the_lease_is_taken_over_by_its_redelivery(shapes, pk, settings, celery_app,
                                                                           migrated_db, tmp_path, monkeypatch):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    # TTL 600 s: only the dead-holder rule can free the lease within this test.
    worker, queue, once = _dedicated_worker(pk, settings, tmp_path, monkeypatch, "repack.after_write:kill-once",
                                            ttl=600.0)
    try:
        worker.wait_ready()
        res = celery_app.send_task("packyard.repack", queue=queue, kwargs={"repo": str(bare), "mode": "full"})
        pk.wait_until(lambda: (once / "repack.after_write").exists(), 90, what="the repack to be killed")
        value = res.get(timeout=180)
    finally:
        worker.stop()
    job = pk.job_row(res.id)
    assert job.state.value == "SUCCESS" and job.attempts == 2, (job.state, job.attempts, job.error)
    assert job.lease is LeaseOutcome.TOOK_OVER
    evs = [(e.event, e.fencing_token) for e in events_of(settings, res.id)]
    kinds = [k for k, _ in evs]
    assert kinds[:2] == [LockEventKind.ACQUIRED, LockEventKind.BROKEN], evs
    dead_token = evs[0][1]
    assert kinds[2:4] == [LockEventKind.ACQUIRED, LockEventKind.TAKEN_OVER] and kinds[-1] is LockEventKind.RELEASED
    assert set(kinds[4:-1]) <= {LockEventKind.RENEWED}, evs
    taken = next(e for e in events_of(settings, res.id) if e.event is LockEventKind.TAKEN_OVER)
    assert taken.detail["holder_token"] == dead_token and taken.detail["how"] == "broken"
    assert taken.fencing_token > dead_token == evs[1][1]
    assert recorded_token(bare, FenceKind.MAINTENANCE) == taken.fencing_token
    # The killed run's temp files are gone (removed by the run that took over), the repository is whole.
    assert not list((bare / "objects" / "pack").glob("tmp_*")), value
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing


def test_a_holder_stalled_past_its_lease_deletes_nothing_after_it_resumes(shapes, pk, settings, celery_app,
                                                                          migrated_db, tmp_path, monkeypatch):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    worker, queue, once = _dedicated_worker(pk, settings, tmp_path, monkeypatch,
                                            "repack.after_lease_check:stop-once", ttl=2.0)
    stalled_pid = None
    try:
        worker.wait_ready()
        stalled = celery_app.send_task("packyard.repack", queue=queue, kwargs={"repo": str(bare), "mode": "full"})
        pk.wait_until(lambda: (once / "repack.after_lease_check").exists(), 90, what="the repack to stall")
        stalled_pid = pk.job_row(stalled.id).worker_pid
        pk.wait_until(lambda: stopped(stalled_pid), 30, what="the stalled process to be stopped")
        # Past its lease: the next repack (the worker's other process) takes over and finishes.
        successor = celery_app.send_task("packyard.repack", queue=queue, kwargs={"repo": str(bare),
                                                                                 "mode": "full", "wait": 60})
        successor.get(timeout=120)
        succ_job = pk.job_row(successor.id)
        assert succ_job.state.value == "SUCCESS" and succ_job.lease is LeaseOutcome.TOOK_OVER
        taken = next(e for e in events_of(settings, successor.id) if e.event is LockEventKind.TAKEN_OVER)
        assert taken.detail["holder_job"] == stalled.id and taken.detail["how"] == "expired"
        before = snapshot_tree(bare)
        os.kill(stalled_pid, signal.SIGCONT)
        stalled_pid = None
        aborted = pk.wait_until(lambda: [e for e in events_of(settings, stalled.id)
                                         if e.event is LockEventKind.ABORTED], 60, what="the stalled job's abort")
        after = snapshot_tree(bare)
        checked_at = time.time()
        stalled.get(timeout=180)   # its retry runs later, under a new lease, and completes
    finally:
        if stalled_pid is not None:
            os.kill(stalled_pid, signal.SIGCONT)
        worker.stop()
    assert [k for k in before if k not in after] == [], "the resumed holder deleted nothing"
    reason = aborted[0].detail["reason"]
    assert "stale fencing token" in reason and aborted[0].detail["step"] == "delete", reason
    evs = events_of(settings, stalled.id)
    reacquired = [e.at.timestamp() for e in evs if e.event is LockEventKind.ACQUIRED][1:]
    assert reacquired and min(reacquired) > checked_at, "the snapshot was taken before the retry started"
    job = pk.job_row(stalled.id)
    assert job.state.value == "SUCCESS" and job.lease is LeaseOutcome.LOST and job.retries >= 1
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing


def test_a_repack_of_a_directory_that_is_no_repository_fails_and_writes_nothing_there(celery_worker, celery_app,
                                                                                       pk, store_root):
    plain = store_root / "not-a-repo"
    plain.mkdir()
    res = celery_app.send_task("packyard.repack", kwargs={"repo": str(plain), "mode": "full"})
    with pytest.raises(Exception, match="not a git repository"):
        res.get(timeout=60)
    assert pk.job_row(res.id).state.value == "FAILURE"
    assert list(plain.iterdir()) == [], "no fence file (nor anything else) was written outside a repository"
