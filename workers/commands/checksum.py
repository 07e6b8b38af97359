"""Repository checksums (Gitaly's rule, store/backup/checksum.py) for ``status --repo`` and ``verify --against``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packyard.store.backup.checksum import differing_refs, repository_checksum
from packyard.store.refs import RefStore
from packyard.store.repo import find_git_dir


def checksum_repo(repo: str | Path) -> dict[str, Any]:
    """The checksum of ``repo`` now, with the number of show-ref lines counted."""
    git_dir = find_git_dir(repo)
    c = repository_checksum(git_dir)
    return {"repo": str(git_dir), "checksum": c.hex, "counted": c.counted, "refs": c.refs}


def compare_repos(repo: str | Path, other: str | Path, *, limit: int = 20) -> dict[str, Any]:
    """Both copies' checksums, whether they match, and (up to ``limit``) the counted refs that differ."""
    ours, theirs = find_git_dir(repo), find_git_dir(other)
    a, b = repository_checksum(ours), repository_checksum(theirs)
    result: dict[str, Any] = {"repo": str(ours), "other": str(theirs), "checksum": a.hex,
                              "other_checksum": b.hex, "match": a.hex == b.hex, "differing": []}
    if a.hex != b.hex:
        diff = differing_refs(_counted_refs(ours), _counted_refs(theirs))
        result["differing"] = [{"ref": n, "ours": x, "theirs": y} for n, x, y in diff[:limit]]
        result["differing_total"] = len(diff)
    return result


def _counted_refs(git_dir: Path) -> dict[str, bytes]:
    store = RefStore(git_dir)
    refs = store.as_dict()
    head = store.resolve("HEAD")
    if head is not None:
        refs["HEAD"] = head
    return refs
