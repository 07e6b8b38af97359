"""unpack_objects: Explode a small pack into loose objects, then apply ref updates."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import unpack_objects as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.unpack_objects", bind=True, base=PackyardTask)
def unpack_objects(self: PackyardTask, repo: str, pack_path: str, ref_updates: list[dict] | None = None) -> dict[str, Any]:
    """Explode a small pack into loose objects, then apply ref updates."""
    with self.repo_lock(repo) as lease:
        return self.call(command.unpack_objects, repo, pack_path, ref_updates=ref_updates, lease=lease)
