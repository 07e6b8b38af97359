"""Retention: delete job rows, lock events and race events older than the settings, in short batches.

What is never deleted:

* a pending job (queued, started, retrying), however old;
* the newest job of each (repository, kind) -- so every repository keeps its last job, its last
  plan (``packyard.plan_maintenance``), its last verify, ... -- and of each kind without a
  repository (the last janitor run, the last prune);
* the counters (``record_totals``, ``record_daily``): they were moved when the rows were written,
  so the dashboards and ``packyard records daily`` keep the history the rows no longer hold. The one
  level among them, the LOST job rows now (``record_totals``' ``level`` rows), is moved by the LOST rows
  each batch deletes, in that batch's transaction.

Each batch is one short transaction deleting at most PACKYARD_RECORDS_PRUNE_BATCH rows found
through an index (oldest first), so a prune never holds the database's write lock (SQLite) or
many row locks (PostgreSQL) for long, and at most PACKYARD_RECORDS_PRUNE_MAX_BATCHES batches run
per table per call: the rest is left for the next run, which the result says (``more``).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, exists, not_, or_, select
from sqlalchemy.orm import aliased

from packyard.store.progress import Progress
from packyard.workers.records import aggregates
from packyard.workers.records.db import session_scope
from packyard.workers.records.models import Job, JobState, LockEvent, RaceEvent, utcnow
from packyard.workers.settings import Settings

PENDING = (JobState.QUEUED, JobState.STARTED, JobState.RETRY)


@dataclass
class PruneReport:
    jobs_removed: int = 0
    lock_events_removed: int = 0
    race_events_removed: int = 0
    batches: int = 0
    more: list[str] = field(default_factory=list)   # tables whose batch limit was reached: the next run goes on
    cutoffs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def counters(self) -> dict[str, Any]:
        return {"jobs_removed": self.jobs_removed, "lock_events_removed": self.lock_events_removed,
                "race_events_removed": self.race_events_removed, "batches": self.batches,
                "more": ",".join(self.more), **{f"{k}_before": v for k, v in self.cutoffs.items()},
                "elapsed_ms": int(self.seconds * 1000)}


def _has_newer_of_its_kind() -> Any:
    """True for a job a newer job of the same (repository, kind) follows: one index search
    (ix_jobs_repo_id_kind_id). The newest of each is kept."""
    newer = aliased(Job)
    same_repo = exists().where(newer.repo_id == Job.repo_id, newer.kind == Job.kind, newer.id > Job.id)
    no_repo = exists().where(newer.repo_id.is_(None), newer.kind == Job.kind, newer.id > Job.id)
    return or_(and_(Job.repo_id.is_not(None), same_repo), and_(Job.repo_id.is_(None), no_repo))


def prune_jobs(settings: Settings | str, before: datetime, *, batch: int, max_batches: int,
               report: PruneReport) -> None:
    """Finished (or LOST) job rows that finished before ``before``, except each (repository, kind)'s newest."""
    cursor: tuple[datetime, int] | None = None
    for _ in range(max_batches):
        with session_scope(settings) as s:
            q = select(Job.id, Job.finished_at).where(Job.finished_at < before)
            if cursor is not None:   # resume after the last row looked at (kept rows are not looked at again)
                q = q.where(Job.finished_at >= cursor[0], not_(and_(Job.finished_at == cursor[0], Job.id <= cursor[1])))
            found = s.execute(q.order_by(Job.finished_at, Job.id).limit(batch)).all()
            if not found:
                return
            ids = [r.id for r in found]
            deleted = s.execute(delete(Job).where(Job.id.in_(ids), Job.state.not_in(PENDING), _has_newer_of_its_kind())
                                .returning(Job.kind, Job.state).execution_options(synchronize_session=False)).all()
            report.jobs_removed += len(deleted)
            # The LOST rows deleted leave the LOST level, in this batch's transaction (RETURNING: the rows as
            # deleted, whatever a concurrent write made of them); kinds in order, the same lock order each time.
            lost = Counter(kind for kind, state in deleted if state is JobState.LOST)
            for kind in sorted(lost):
                aggregates.move_level(s, kind, aggregates.LOST, -lost[kind])
        report.batches += 1
        cursor = (found[-1].finished_at, found[-1].id)
        if len(found) < batch:
            return
    report.more.append("jobs")


def prune_events(settings: Settings | str, model: Any, column: Any, before: datetime, *, batch: int,
                 max_batches: int, report: PruneReport, name: str) -> int:
    """Rows of ``model`` whose ``column`` is before ``before``, oldest first, ``batch`` per transaction."""
    removed = 0
    for _ in range(max_batches):
        with session_scope(settings) as s:
            ids = list(s.scalars(select(model.id).where(column < before).order_by(column).limit(batch)))
            if not ids:
                return removed
            res = s.execute(delete(model).where(model.id.in_(ids)).execution_options(synchronize_session=False))
            removed += res.rowcount  # type: ignore[attr-defined]  # DML: a CursorResult
        report.batches += 1
        if len(ids) < batch:
            return removed
    report.more.append(name)
    return removed


def prune(settings: Settings, *, now: datetime | None = None, jobs_days: float | None = None,
          lock_events_days: float | None = None, race_events_days: float | None = None,
          batch: int | None = None, max_batches: int | None = None,
          progress: Progress | None = None) -> PruneReport:
    """One prune run with the settings' retention (each overridable); see the module docstring."""
    t0 = time.monotonic()
    now = now or utcnow()
    batch = batch or settings.records_prune_batch
    max_batches = max_batches or settings.records_prune_max_batches
    report = PruneReport()
    days = {"jobs": settings.records_keep_jobs_days if jobs_days is None else jobs_days,
            "lock_events": settings.records_keep_lock_events_days if lock_events_days is None else lock_events_days,
            "race_events": settings.records_keep_race_events_days if race_events_days is None else race_events_days}
    cut = {k: now - timedelta(days=v) for k, v in days.items()}
    report.cutoffs = {k: v.isoformat(timespec="seconds") for k, v in cut.items()}
    prune_jobs(settings, cut["jobs"], batch=batch, max_batches=max_batches, report=report)
    if progress:
        progress("jobs", 1, 3)
    report.lock_events_removed = prune_events(settings, LockEvent, LockEvent.at, cut["lock_events"], batch=batch,
                                              max_batches=max_batches, report=report, name="lock_events")
    if progress:
        progress("lock_events", 2, 3)
    report.race_events_removed = prune_events(settings, RaceEvent, RaceEvent.observed_at, cut["race_events"],
                                              batch=batch, max_batches=max_batches, report=report, name="race_events")
    if progress:
        progress("race_events", 3, 3)
    report.seconds = time.monotonic() - t0
    return report
