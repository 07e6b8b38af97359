"""plan_maintenance: plan one repository (``repo=``), or run a round of the nightly window over the registry."""
from __future__ import annotations

import time
from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import plan_maintenance as command
from packyard.workers.tasks.base import PackyardTask


def _send(name: str, kwargs: dict[str, Any], task_id: str, countdown: float) -> None:
    app.send_task(name, kwargs=kwargs, task_id=task_id, countdown=countdown or None)


@app.task(name="packyard.plan_maintenance", bind=True, base=PackyardTask)
def plan_maintenance(self: PackyardTask, repo: str | None = None, trigger: str = "manual",
                     window_start: float | None = None, window_end: float | None = None) -> dict[str, Any]:
    """Statistics → plan → at most PACKYARD_MAINTENANCE_CONCURRENCY repack/gc jobs in flight; rounds until done."""
    from packyard.workers.settings import get_settings
    from packyard.workers.slots import fleet_slots

    settings = get_settings()
    slots = fleet_slots(settings)
    if repo is not None:
        planned = self.call(command.plan_repository, repo, settings=settings, send=_send, slots=slots,
                            trigger=trigger)
        return {"plan": planned.record(trigger, time.time()), "counters": planned.counters()}
    if window_start is None or window_end is None:
        window_start, window_end = command.window_bounds(settings, time.time())
    result = self.call(command.sweep, settings=settings, send=_send, slots=slots, window_start=window_start,
                       window_end=window_end)
    if result["counters"]["waiting"] and time.time() < window_end:  # every slot taken: the next round
        nxt = app.send_task(self.name, kwargs={"trigger": trigger, "window_start": window_start,
                                               "window_end": window_end}, countdown=settings.maintenance_tick)
        result["next_round"] = nxt.id
    return result
