"""gc: remove leftovers (dead writers' temp files, abandoned quarantines, expired preserved packs)."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import gc as command
from packyard.workers.tasks.base import PackyardTask
from packyard.workers.tasks.boundary import PRESERVATION


@app.task(name="packyard.gc", bind=True, base=PackyardTask, unsafe=PRESERVATION)
def gc(self: PackyardTask, repo: str, preserve_for: float = command.PRESERVE_FOR,
       quarantine_after: float = command.QUARANTINE_AFTER, wait: float | None = None,
       on_busy: str = "wait") -> dict[str, Any]:
    """Under the repository's maintenance lease (never beside a repack); every deletion checks it first."""
    with self.maintenance_lock(repo, wait=wait, on_busy=on_busy) as lease:
        return self.call(command.run_gc, repo, preserve_for=preserve_for, quarantine_after=quarantine_after,
                         lease=lease)
