"""The reconciler: job rows against the broker and the workers. Run by beat and by ``packyard status``.

Two repairs, one rule for both: something must be *unseen in two passes at least*
``PACKYARD_LOST_AFTER`` *seconds apart* before anything is done about it.

* **LOST jobs.** A pending row (QUEUED, STARTED, RETRY) whose task id is in no queue, in no
  delivery (``unacked``) and held by no worker is lost: its message vanished (a broker that
  restarted without its data, a publisher that died between writing the row and publishing,
  a task name no worker knows, which the worker discards). The first pass that misses it
  writes ``unseen_since`` on the row; a later pass, ``lost_after`` on, marks it LOST with the
  reason -- with a conditional UPDATE that matches only if nothing wrote the row since
  (every write clears ``unseen_since``). A live job is never marked: while it waits its
  message is in a list, while it runs or waits for a retry countdown it is in ``unacked``
  (acks_late), and the snapshot of both is atomic; the only moments a live message is in
  neither are inside a worker between popping it and recording the delivery, or inside a
  publisher between writing the row and pushing the message -- milliseconds, never the
  same message twice ``lost_after`` apart. A LOST row that later starts or finishes is
  simply overwritten by the truth.
* **Stranded deliveries.** A message in ``unacked`` whose task no worker holds belongs to a
  worker that died or lost its broker connection (a Redis restart while it ran). kombu would
  put it back only after the visibility timeout (hours); here it goes back to the head of its
  queue once it was seen stranded twice ``lost_after`` apart. If the job had finished
  meanwhile, the redelivery is acknowledged without running (exactly-once outcomes), and
  counted on the row. The first-seen times live in the broker (``packyard:reconcile:stranded``).
  A live worker that did not answer ``inspect`` in time in both passes gets its running job
  redelivered too: the copy waits for the repository lease and, once the first run has
  recorded its outcome, is acknowledged without running -- wasted work, never a second
  outcome. Beat asks with a 5 s timeout, ``packyard status`` with 1 s.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from packyard.workers import broker
from packyard.workers import logs as plog
from packyard.workers.records import Job, session_scope, utcnow
from packyard.workers.records.recorder import PENDING_STATES, mark_seen, mark_unseen, record_lost
from packyard.workers.settings import Settings

log = plog.get_logger("packyard.reconcile")

STRANDED_KEY = "packyard:reconcile:stranded"
INSPECT_TIMEOUT = 1.0


@dataclass
class ReconcileReport:
    pending: int = 0
    unseen: list[str] = field(default_factory=list)        # task ids whose grace period started now
    lost: dict[str, str] = field(default_factory=dict)     # task id -> reason
    restored: list[str] = field(default_factory=list)      # task ids of stranded deliveries put back
    workers: int = 0

    def summary(self) -> str:
        parts = [f"{self.pending} pending job(s) checked against the broker and {self.workers} worker(s)"]
        if self.unseen:
            parts.append(f"{len(self.unseen)} unseen (LOST if still unseen in a later pass)")
        if self.lost:
            parts.append(f"{len(self.lost)} marked LOST")
        if self.restored:
            parts.append(f"{len(self.restored)} stranded deliveries put back in their queue")
        return "; ".join(parts)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)  # SQLite returns naive UTC


def reconcile(settings: Settings, app: Any, client: Any = None, *, inspect_timeout: float = INSPECT_TIMEOUT,
              lost_after: float | None = None) -> ReconcileReport:
    """One pass (see the module doc). ``client``: a redis-py client of the broker (default: from settings)."""
    from packyard.workers.locks import redis_client

    grace = settings.lost_after if lost_after is None else lost_after
    client = client or redis_client(settings)
    report = ReconcileReport()
    # Rows first, then the broker: a job that moves on after we read its row is then seen, or its
    # row has changed (and the conditional updates below do nothing).
    with session_scope(settings) as s:
        rows = s.execute(select(Job.id, Job.task_id, Job.kind, Job.unseen_since)
                         .where(Job.state.in_(PENDING_STATES))).all()
    report.pending = len(rows)
    snap = broker.snapshot(client)
    held = broker.held_by_workers(app, timeout=inspect_timeout)
    report.workers = len(held.workers)
    seen = snap.task_ids | held.task_ids
    now = utcnow()
    known_tasks = set(app.tasks)
    for job_id, task_id, kind, unseen_since in rows:
        if task_id in seen:
            if unseen_since is not None:
                mark_seen(settings, job_id)
            continue
        if unseen_since is None:
            if mark_unseen(settings, job_id, now):
                report.unseen.append(task_id)
            continue
        waited = (now - _aware(unseen_since)).total_seconds()
        if waited < grace:
            continue
        reason = lost_reason(kind, waited, known_tasks)
        if record_lost(settings, job_id, unseen_since, reason):
            report.lost[task_id] = reason
            log.warning("job.lost", job_id=task_id, task=kind, reason=reason)
    if held.complete:
        report.restored = restore_stranded(app, client, snap, held, grace)
    else:  # without the workers' answer a running job's delivery looks stranded: decide next pass
        log.warning("reconcile.stranded_skipped", reason="the workers could not be asked")
    return report


def lost_reason(kind: str, waited: float, known_tasks: set[str]) -> str:
    where = f"no broker queue holds its message and no worker runs it (unseen for {waited:.0f}s)"
    if kind not in known_tasks:
        return f"no worker knows task {kind!r}: {where}"
    return where


def restore_stranded(app: Any, client: Any, snap: broker.BrokerSnapshot, held: broker.WorkerView,
                     grace: float) -> list[str]:
    """Put back deliveries nobody holds, once they were stranded in two passes ``grace`` apart."""
    now = time.time()
    stranded = {tag: task_id for tag, task_id in snap.deliveries.items() if task_id not in held.task_ids}
    first_seen = {broker._text(k): float(v) for k, v in client.hgetall(STRANDED_KEY).items()}
    restored: list[str] = []
    for tag in set(first_seen) - set(stranded):
        client.hdel(STRANDED_KEY, tag)           # acknowledged, restored or picked up meanwhile
    for tag, task_id in stranded.items():
        since = first_seen.get(tag)
        if since is None:
            client.hset(STRANDED_KEY, tag, now)
        elif now - since >= grace:
            broker.restore_delivery(app, tag)
            client.hdel(STRANDED_KEY, tag)
            restored.append(task_id)
            log.warning("job.delivery_restored", job_id=task_id, delivery_tag=tag, stranded_for=round(now - since))
    return restored
