"""write_objects: Write raw objects (type + base64 data) in one batch, then apply ref updates."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import write_objects as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.write_objects", bind=True, base=PackyardTask)
def write_objects(self: PackyardTask, repo: str, objects: list[dict], ref_updates: list[dict] | None = None) -> dict[str, Any]:
    """Write raw objects (type + base64 data) in one batch, then apply ref updates."""
    with self.repo_lock(repo) as lease:
        return self.call(command.write_objects, repo, objects, ref_updates=ref_updates, lease=lease)
