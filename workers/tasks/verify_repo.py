"""verify_repo: read every object of a repository and everything reachable from its refs."""
from __future__ import annotations

from typing import Any

from packyard.workers.app import app
from packyard.workers.commands import verify as command
from packyard.workers.tasks.base import PackyardTask


@app.task(name="packyard.verify_repo", bind=True, base=PackyardTask)
def verify_repo(self: PackyardTask, repo: str) -> dict[str, Any]:
    """Check hashes and parsing of every object; counts, or the first bad object as the failure reason."""
    return self.call(command.verify_repo, repo)
