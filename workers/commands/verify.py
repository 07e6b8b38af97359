"""verify_repo as a plain function: the engine's verify_repository, with counters for the job row."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packyard.store.progress import Progress
from packyard.store.verify import verify_repository
from packyard.workers.repos import open_repository


def verify_repo(repo: str | Path, *, progress: Progress | None = None) -> dict[str, Any]:
    """Verify ``repo`` (read-only; its pool too, when it has alternates). Raises the store's typed error for
    the first bad object."""
    report = verify_repository(open_repository(repo), progress=progress)
    return {"repo": str(Path(repo).resolve()), "counters": report.as_counters()}
