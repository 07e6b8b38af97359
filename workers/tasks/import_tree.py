"""import_tree: Commit a directory or tar archive on top of a ref and move the ref (CAS)."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import import_tree as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.import_tree", bind=True, base=PackyardTask)
def import_tree(self: PackyardTask, repo: str, ref: str, source: str, message: str = "Import",
                author_name: str = "packyard", author_email: str = "packyard@localhost") -> dict[str, Any]:
    """Commit a directory or tar archive on top of a ref and move the ref (CAS)."""
    with self.repo_lock(repo) as lease:
        return self.call(command.import_tree, repo, ref, source, message=message, author_name=author_name,
                         author_email=author_email, lease=lease)
