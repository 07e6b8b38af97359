"""The reconciler against the real broker and real workers: LOST jobs, live jobs never LOST, stranded deliveries.

Grace periods here are 1 s (PACKYARD_LOST_AFTER defaults to 600 s); passes are repeated with a deadline.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import replace

from gitutil import make_worktree_repo


def reconcile_until(pk, settings, app, predicate, what: str, timeout: float = 60.0):
    """Reconciler passes (grace 1 s) until ``predicate(reports)`` holds; the reports."""
    from packyard.workers.reconcile import reconcile

    reports = []

    def step():
        reports.append(reconcile(replace(settings, lost_after=1.0), app, inspect_timeout=1.0))
        return predicate(reports)

    pk.wait_until(step, timeout, interval=0.5, what=what)
    return reports


def test_unknown_task_ends_lost_and_live_jobs_never_do(celery_worker, celery_app, pk, settings, store_root,
                                                       redis_client):
    from packyard.workers.broker import snapshot

    nope = celery_app.send_task("packyard.nope", kwargs={"repo": str(store_root)})
    assert pk.job_row(nope.id).state.value == "QUEUED"
    # A job waiting in a queue no worker consumes, and one running for a while: both alive.
    waiting = celery_app.send_task("packyard.test_slow", kwargs={"repo": str(store_root / "w"), "steps": 1},
                                   queue=f"nobody-{uuid.uuid4().hex[:6]}")
    running = celery_app.send_task("packyard.test_slow", kwargs={"repo": str(store_root / "r"), "steps": 60})
    pk.wait_until(lambda: nope.id not in snapshot(redis_client).task_ids, 30,
                  what="the worker to discard the unknown task's message")
    pk.wait_until(lambda: pk.job_row(running.id).state.value == "STARTED", 30, what="the slow job to start")

    reports = reconcile_until(pk, settings, celery_app, lambda _: pk.job_row(nope.id).state.value == "LOST",
                              what="the unknown task's row to be marked LOST")
    job = pk.job_row(nope.id)
    assert job.error_type == "JobLost" and "no worker knows task 'packyard.nope'" in job.error
    assert job.error.endswith("s)") and "unseen for" in job.error
    assert any(nope.id in r.unseen for r in reports) and any(nope.id in r.lost for r in reports)
    assert len(reports) >= 2, "one pass starts the grace period, a later one decides"
    for live in (waiting, running):
        assert pk.job_row(live.id).state.value in ("QUEUED", "STARTED", "SUCCESS"), "a live job is never LOST"
        assert all(live.id not in r.lost for r in reports)
    assert running.get(timeout=60) == {"counters": {"steps": 60}}

    # `packyard status` reconciles too and shows the state and the deliveries.
    out = subprocess.run(["packyard", "status", "--repo", str(store_root), "--limit", "5"], env=pk.cli_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.split()[1:2] == [nope.id[:8]])
    assert " LOST " in row and "no worker knows task" in row
    assert out.stderr.startswith("reconcile: ")


def test_a_killed_workers_delivery_is_put_back_and_run_again(celery_worker, celery_app, pk, settings, tmp_path,
                                                            store_root):
    """A whole worker SIGKILLed mid-job (parent included: nobody rejects its message) leaves the delivery
    unacknowledged; kombu would wait for the visibility timeout (hours). The reconciler puts it back once
    no worker holds it for the grace period, and another worker runs it: SUCCESS, attempts 2."""
    from packyard.workers.records.recorder import job_state

    queue = f"stranded-{uuid.uuid4().hex[:6]}"
    first = pk.WorkerProcess(settings, f"doomed-{os.getpid()}@%h", tmp_path / "doomed.log", queues=(queue,))
    second = None
    try:
        first.wait_ready()
        repo = make_worktree_repo(store_root / "r")
        res = celery_app.send_task("packyard.test_slow", kwargs={"repo": str(repo), "steps": 40}, queue=queue)
        pk.wait_until(lambda: (j := pk.job_row(res.id)) is not None and j.state.value == "STARTED", 60,
                      what="the job to start")
        os.killpg(first.child.pid, signal.SIGKILL)
        first.child.proc.wait(30)
        second = pk.WorkerProcess(settings, f"rescuer-{os.getpid()}@%h", tmp_path / "rescuer.log", queues=(queue,))
        second.wait_ready()
        t0 = time.monotonic()
        reports = reconcile_until(pk, settings, celery_app, lambda rs: any(res.id in r.restored for r in rs),
                                  what="the stranded delivery to be put back")
        assert time.monotonic() - t0 < 60 and len(reports) >= 2
        assert res.get(timeout=120) == {"counters": {"steps": 40}}
        job = pk.job_row(res.id)
        assert job.state.value == "SUCCESS" and job.attempts == 2 and job_state(settings, res.id).finished
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_the_beat_task_runs_a_pass_and_records_no_job_row(celery_worker, celery_app, pk, redis_client):
    """packyard.reconcile_jobs (what beat sends) runs on a worker; bookkeeping, not a job: no row."""
    from packyard.workers.app import beat_schedule
    from packyard.workers.settings import get_settings

    entry = beat_schedule(replace(get_settings(), lost_after=120.0))["reconcile-jobs"]
    assert entry["task"] == "packyard.reconcile_jobs" and entry["schedule"] == 60.0
    res = celery_app.send_task("packyard.reconcile_jobs")
    pk.wait_until(lambda: any(line.get("event") == "reconcile.pass" and line.get("job_id") is None
                              for line in celery_worker.log_lines()), 60, what="the worker to log the pass")
    pk.wait_until(lambda: res.id not in _broker_ids(redis_client), 60, what="its message to be acknowledged")
    assert pk.job_row(res.id) is None


def _broker_ids(redis_client) -> frozenset:
    from packyard.workers.broker import snapshot

    return snapshot(redis_client).task_ids
