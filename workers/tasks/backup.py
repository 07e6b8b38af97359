"""backup, restore and backup_fleet: a repository's bundle chain in the backup root (workers/commands/backup.py).

``backup`` holds the repository's maintenance lease for the whole run (one backup of a repository at a time;
no repack deletes a pack the bundle is being read from) and its repository lease only while the refs are
read. ``restore`` writes a new repository under its repository lease; a queued restore never replaces an
existing non-empty repository (``--force`` is the CLI's, run by an operator at a shell: the message does not
decide what is destroyed). ``backup_fleet`` is beat's nightly entry: one backup job per enabled registered
repository, with ids that a redelivered run repeats.
"""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import backup as command
from packyard.workers.confine import InputKind
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.backup", bind=True, base=PackyardTask)
def backup(self: PackyardTask, repo: str, full: bool = False, wait: float | None = None,
           on_busy: str = "wait") -> dict[str, Any]:
    """A full or incremental bundle of ``repo``'s refs (unchanged refs: nothing written), verified, then the
    chains past PACKYARD_BACKUP_KEEP_FULL expired."""
    from packyard.workers.commands.index_pack import redis_repo_lock

    with self.maintenance_lock(repo, wait=wait, on_busy=on_busy) as lease:
        return self.call(command.backup, repo, full=full, lease=lease, snapshot_lock=redis_repo_lock(repo))


@app.task(name="packyard.restore", bind=True, base=PackyardTask, inputs={"source": InputKind.REPOSITORY})
def restore(self: PackyardTask, repo: str, source: str, entry: str | None = None) -> dict[str, Any]:
    """Restore ``source``'s backups (up to ``entry``, default the newest) into the new repository ``repo``."""
    with self.repo_lock(repo):
        return self.call(command.restore, repo, source, entry=entry)


@app.task(name="packyard.backup_fleet", bind=True, base=PackyardTask)
def backup_fleet(self: PackyardTask) -> dict[str, Any]:
    """Queue a backup of every enabled registered repository (beat, at PACKYARD_BACKUP_CRON)."""
    from packyard.workers.settings import get_settings

    def send(name: str, kwargs: dict[str, Any], task_id: str) -> None:
        app.send_task(name, kwargs=kwargs, task_id=task_id)

    return self.call(command.queue_fleet, settings=get_settings(), send=send)
