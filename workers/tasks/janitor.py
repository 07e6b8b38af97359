"""janitor: remove what dead jobs left behind in the registered repositories, judged by the job that owned it."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import janitor as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.janitor", bind=True, base=PackyardTask)
def janitor(self: PackyardTask, repos: list[str] | None = None, safety_age: float | None = None) -> dict[str, Any]:
    """Every registered repository within the storage roots (or ``repos``, each confined to them); beat runs it
    every PACKYARD_JANITOR_INTERVAL seconds. The row's counters list each removal with what and why."""
    from packyard.workers.locks import redis_client
    from packyard.workers.settings import get_settings

    s = get_settings()
    return self.call(command.run_janitor, s, repos=command.confined(s, repos), redis_client=redis_client(s),
                     safety_age=safety_age, job_id=self.request.id)
