"""repack: full, geometric or loose repack of a repository under its maintenance lease."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import repack as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.repack", bind=True, base=PackyardTask)
def repack(self: PackyardTask, repo: str, mode: str = "full", factor: int = 2, expire: str | float | None = None,
           preserve_for: float | None = None, no_reuse: bool = False, window: int | None = None,
           depth: int | None = None) -> dict[str, Any]:
    """Repack under the maintenance lease; its token fences the deletions (recorded in the counters)."""
    self.bind_log(mode=mode)
    with self.maintenance_lock(repo) as lease:
        return self.call(command.repack, repo, mode=mode, factor=factor, expire=expire,
                         preserve_for=preserve_for, no_reuse=no_reuse, window=window, depth=depth, lease=lease)
