"""unpack_objects as a plain function: explode a small pack into loose objects (git unpack-objects)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from packyard.store.errors import InvalidInputError
from packyard.store.repo import Repository
from packyard.store.pack.unpack import DEFAULT_MAX_OBJECTS, unpack_objects as store_unpack
from packyard.workers.commands._bulk import fence_options, flat_counters, parse_ref_updates

Progress = Callable[[str, int, "int | None"], None]


def unpack_objects(repo: str | Path, pack_path: str | Path, *, ref_updates: list[dict] | None = None,
                   max_objects: int = DEFAULT_MAX_OBJECTS, progress: Progress | None = None,
                   lease: Any = None) -> dict[str, Any]:
    """Validate the pack, write every object (deltas resolved, thin bases from the repo), then ``ref_updates``."""
    r = Repository.open(repo)
    try:
        data = Path(pack_path).read_bytes()
    except OSError as err:
        raise InvalidInputError(f"cannot read pack: {err.strerror}", path=str(pack_path)) from err
    res = store_unpack(r, data, ref_updates=parse_ref_updates(ref_updates), where=str(pack_path),
                       max_objects=max_objects, progress=progress, **fence_options(lease))
    return {"repo": str(r.path), "pack": str(pack_path),
            "counters": {"objects": res.objects, "deltas": res.deltas, **flat_counters(res.counters)}}
