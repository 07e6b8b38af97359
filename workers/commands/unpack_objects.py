"""unpack_objects as a plain function: explode a small pack into loose objects (git unpack-objects)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from packyard.store.errors import InvalidInputError, LimitExceededError
from packyard.store.fsck import FsckOptions
from packyard.store.lease import Lease
from packyard.store.pack.unpack import DEFAULT_MAX_OBJECTS
from packyard.store.pack.unpack import unpack_objects as store_unpack
from packyard.store.progress import Progress
from packyard.workers.commands._bulk import flat_counters, flush_options, parse_ref_updates
from packyard.workers.repos import open_repository


def read_pack(pack: str | Path | BinaryIO, max_bytes: int | None) -> tuple[bytes, str]:
    """(the pack's bytes, its name for errors); more than ``max_bytes`` is a LimitExceededError."""
    where = str(getattr(pack, "name", "<stream>")) if hasattr(pack, "read") else str(pack)
    try:
        if hasattr(pack, "read"):
            data = pack.read(-1 if max_bytes is None else max_bytes + 1)  # type: ignore[union-attr]
        else:
            with open(pack, "rb") as f:  # type: ignore[arg-type]
                data = f.read(-1 if max_bytes is None else max_bytes + 1)
    except OSError as err:
        raise InvalidInputError(f"cannot read pack: {err.strerror}", path=where) from err
    if max_bytes is not None and len(data) > max_bytes:
        raise LimitExceededError(f"pack is larger than {max_bytes} bytes (PACKYARD_MAX_PACK_BYTES); "
                                 "index it (index_pack) instead of exploding it", path=where)
    return data, where


def unpack_objects(repo: str | Path, pack_path: str | Path | BinaryIO, *, ref_updates: list[dict] | None = None,
                   max_objects: int = DEFAULT_MAX_OBJECTS, max_bytes: int | None = None,
                   progress: Progress | None = None, lease: Lease | None = None, strict: bool = False,
                   fsck: FsckOptions | None = None) -> dict[str, Any]:
    """Validate the pack, write every object (deltas resolved, thin bases from the repo), then ``ref_updates``.
    ``strict``: git's fsck first (``fsck``: severities and skip list), nothing written on a refusal.

    ``pack_path``: a path or an open binary file (a queued job's file, opened by the task boundary).
    """
    r = open_repository(repo)
    data, where = read_pack(pack_path, max_bytes)
    res = store_unpack(r, data, ref_updates=parse_ref_updates(ref_updates), where=where,
                       max_objects=max_objects, progress=progress, strict=strict,
                       fsck=fsck if strict else None, lease=lease, **flush_options())
    return {"repo": str(r.path), "pack": where,
            "counters": {"objects": res.objects, "deltas": res.deltas, **flat_counters(res.counters)}}
