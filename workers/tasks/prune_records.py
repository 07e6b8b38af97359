"""prune_records: delete job rows, lock events and race events past their retention (beat, hourly)."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import prune_records as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.prune_records", bind=True, base=PackyardTask)
def prune_records(self: PackyardTask, jobs_days: float | None = None, lock_events_days: float | None = None,
                  race_events_days: float | None = None) -> dict[str, Any]:
    """The settings' retention (PACKYARD_RECORDS_KEEP_*; the server's, a message may only ask for longer);
    the row's counters say what was removed. Beat runs it every PACKYARD_RECORDS_PRUNE_INTERVAL seconds."""
    from packyard.workers.settings import get_settings

    s = get_settings()
    return self.call(command.prune_records, s, jobs_days=_at_least(jobs_days, s.records_keep_jobs_days),
                     lock_events_days=_at_least(lock_events_days, s.records_keep_lock_events_days),
                     race_events_days=_at_least(race_events_days, s.records_keep_race_events_days))


def _at_least(asked: float | None, configured: float) -> float:
    """The server decides how little is kept: a message can ask to keep more, never less."""
    return configured if asked is None else max(float(asked), configured)
