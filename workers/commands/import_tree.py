"""import_tree as a plain function: a directory or tar archive -> blobs, trees, a commit, then the ref (CAS)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packyard.store.importtree import Identity
from packyard.store.importtree import import_tree as store_import_tree
from packyard.store.lease import Lease
from packyard.store.progress import Progress
from packyard.workers.commands._bulk import flat_counters, flush_options, fsck_options_of, pack_threshold_of
from packyard.workers.repos import open_repository


def import_tree(repo: str | Path, ref: str, source: str | Path, *, message: str = "Import",
                author_name: str = "packyard", author_email: str = "packyard@localhost",
                author_time: int | None = None, max_files: int | None = None, max_bytes: int | None = None,
                pack_threshold: int | None = None, progress: Progress | None = None,
                lease: Lease | None = None) -> dict[str, Any]:
    """Commit ``source`` on top of ``ref`` and move ``ref``. Raises StoreError subclasses for bad input
    (InvalidInputError: nothing written; LimitExceededError past ``max_files`` entries or ``max_bytes``),
    RefUpdateError if the ref moved meanwhile. At least ``pack_threshold`` objects (default:
    PACKYARD_PACK_THRESHOLD; 0: never) are written as one pack: ``counters["write_path"]`` says which."""
    r = open_repository(repo)
    res = store_import_tree(r, ref, source, message=message,
                            author=Identity(author_name, author_email, author_time),
                            max_files=max_files, max_bytes=max_bytes, progress=progress,
                            pack_threshold=pack_threshold_of(pack_threshold), fsck=fsck_options_of(),
                            lease=lease, **flush_options())
    return {"repo": str(r.path), "ref": ref, "commit": res.commit.hex(), "tree": res.tree.hex(),
            "parent": res.parent.hex() if res.parent else None,
            "counters": {"files": res.files, "trees": res.trees, **flat_counters(res.counters),
                         "write_path": res.counters["write_path"]}}
