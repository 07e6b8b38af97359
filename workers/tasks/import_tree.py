"""import_tree: Commit a directory or tar archive on top of a ref and move the ref (CAS)."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import import_tree as command
from packyard.workers.confine import InputKind
from packyard.workers.settings import get_settings
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.import_tree", bind=True, base=PackyardTask, inputs={"source": InputKind.FILE_OR_DIRECTORY})
def import_tree(self: PackyardTask, repo: str, ref: str, source: str, message: str = "Import",
                author_name: str = "packyard", author_email: str = "packyard@localhost") -> dict[str, Any]:
    """Commit a directory or tar archive on top of a ref and move the ref (CAS)."""
    s = get_settings()
    with self.repo_lock(repo) as lease:
        return self.call(command.import_tree, repo, ref, source, message=message, author_name=author_name,
                         author_email=author_email, max_files=s.import_max_files, max_bytes=s.import_max_bytes,
                         pack_threshold=s.pack_threshold, lease=lease)
