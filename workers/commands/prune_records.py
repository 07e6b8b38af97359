"""prune_records as a plain function: the records' retention (workers/records/retention.py), as a job's result."""
from __future__ import annotations

from typing import Any

from packyard.store.progress import Progress
from packyard.workers.records.retention import prune
from packyard.workers.settings import Settings


def prune_records(settings: Settings, *, jobs_days: float | None = None, lock_events_days: float | None = None,
                  race_events_days: float | None = None, batch: int | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Delete job rows, lock events and race events past their retention (the settings', or the ones given);
    ``{"counters": ...}`` says how many of each went, before which time, in how many batches, and whether a
    table still has more (``more``: the batch limit stopped it; the next run goes on)."""
    report = prune(settings, jobs_days=jobs_days, lock_events_days=lock_events_days,
                   race_events_days=race_events_days, batch=batch, progress=progress)
    return {"counters": report.counters()}
