"""The pool jobs: create, fetch, link, disconnect, delete (a fork network's life, workers/commands/pool.py).

Each holds the leases :func:`packyard.workers.locks.pool_lease_order` names, in that order (the pool's first),
through ``self.pool_lock``. ``repo`` is the repository the job row is about (the pool for create, fetch and
delete; the member for link and disconnect); ``pool`` and ``source`` are confined to the storage roots as
``repo`` is (``InputKind.REPOSITORY``).
"""
from __future__ import annotations

import os
from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import pool as command
from packyard.workers.confine import InputKind
from packyard.workers.tasks.base import PackyardTask

REPOSITORIES = {"pool": InputKind.REPOSITORY, "source": InputKind.REPOSITORY}


@app.task(name="packyard.pool_create", bind=True, base=PackyardTask, inputs=REPOSITORIES)
def pool_create(self: PackyardTask, repo: str, source: str, key: str | None = None,
                wait: float | None = None) -> dict[str, Any]:
    """Make the pool ``repo`` from ``source`` (its objects, its refs under refs/virtual/<key>/)."""
    self.call(command.prepare_pool_dir, repo)   # (the pool's fence lives in its git dir)
    with self.pool_lock(repo, refs=True, wait=wait) as lease:
        return self.call(command.create, repo, source, key=key, lease=lease)


@app.task(name="packyard.pool_fetch", bind=True, base=PackyardTask, inputs=REPOSITORIES)
def pool_fetch(self: PackyardTask, repo: str, source: str | None = None, key: str | None = None,
               wait: float | None = None) -> dict[str, Any]:
    """Bring ``source``'s (default: the pool's own source's) new objects and refs into the pool ``repo``."""
    with self.pool_lock(repo, refs=True, wait=wait) as lease:
        return self.call(command.fetch, repo, source, key=key, lease=lease)


@app.task(name="packyard.pool_link", bind=True, base=PackyardTask, inputs=REPOSITORIES)
def pool_link(self: PackyardTask, repo: str, pool: str, wait: float | None = None) -> dict[str, Any]:
    """Make ``repo`` borrow from ``pool`` and drop the objects the pool holds (git repack -a -d -l)."""
    with self.pool_lock(pool, repo, wait=wait) as lease:
        return self.call(command.link, repo, pool, lease=lease)


@app.task(name="packyard.pool_disconnect", bind=True, base=PackyardTask, inputs=REPOSITORIES)
def pool_disconnect(self: PackyardTask, repo: str, pool: str | None = None,
                    wait: float | None = None) -> dict[str, Any]:
    """Copy back what ``repo`` borrows, verify it without its pool, then remove its alternates."""
    from packyard.workers.repos import open_repository

    pool = pool or str(command.pool_of(open_repository(repo)))
    with self.pool_lock(pool, repo, ingest=True, wait=wait) as lease:   # no push between copy and unlink
        return self.call(command.disconnect, repo, pool, lease=lease)


@app.task(name="packyard.pool_delete", bind=True, base=PackyardTask)
def pool_delete(self: PackyardTask, repo: str, wait: float | None = None) -> dict[str, Any]:
    """Delete the pool ``repo``; refused while a repository links to it."""
    if not os.path.exists(repo):   # a delete killed after its rename: finish it (no pool left to lock)
        return self.call(command.delete, repo)
    with self.pool_lock(repo, wait=wait) as lease:
        return self.call(command.delete, repo, lease=lease)
