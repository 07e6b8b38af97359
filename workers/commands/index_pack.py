"""index_pack as a plain function: ingest a pack (file or stdin) into a repository, then update refs.

Receiving, resolving and indexing run without any lock (they only touch the
quarantine ``objects/incoming-*``); the repository lock (``lock``, e.g. the
task's Redis lease from :mod:`packyard.workers.locks`) is held only around install +
ref updates, and the lease is checked (fencing) right before publishing.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager

from packyard.store.fsck import FsckOptions
from packyard.store.pack.indexpack import IncomingPack, IndexPackResult
from packyard.store.progress import Progress
from packyard.workers.commands._bulk import parse_ref_updates
from packyard.workers.repos import open_repository

LockFactory = Callable[[], ContextManager[Any]]


def redis_repo_lock(repo: str | Path) -> LockFactory:
    """A lock factory using the configured Redis lease (auto-renewed), for callers outside a task."""

    def factory() -> ContextManager[Any]:
        from packyard.workers.locks import redis_client, repo_lock
        from packyard.workers.settings import get_settings

        s = get_settings()
        return repo_lock(redis_client(s), repo, ttl=s.lock_ttl, auto_renew=True)

    return factory


def index_pack_counters(result: IndexPackResult) -> dict[str, int]:
    """Job-row counters: objects, deltas, bytes, thin bases, per-phase elapsed (µs), peak RSS, durability."""
    out = {
        "objects": result.objects, "deltas": result.deltas, "bytes": result.bytes,
        "received_bytes": result.received_bytes, "thin_bases_added": result.thin_bases_added,
        "collisions_checked": result.collisions_checked, "workers": result.workers,
        "peak_rss": result.peak_rss, "peak_rss_workers": result.peak_rss_workers,
        "already_present": int(result.outcome.value == "already-present"),
    }
    for phase, seconds in result.elapsed.items():
        out[f"elapsed_us_{phase}"] = int(round(seconds * 1_000_000))
    out.update({k: int(v) for k, v in result.durability.items()})
    return out


def index_pack(repo: str | Path, pack: str | Path | BinaryIO, *, fix_thin: bool = False, strict: bool = False,
               fsck: FsckOptions | None = None, keep: str | None = None, ref_updates: list[dict] | None = None,
               max_pack_bytes: int | None = None, processes: int | None = None,
               progress: Progress | None = None, lock: LockFactory | None = None) -> dict[str, Any]:
    """Receive and verify ``pack`` (a path, ``-`` for stdin, or an open binary file), install it under ``lock``,
    then ``ref_updates``.

    ``strict``: git's fsck (``fsck``: its severities and skip list; default git's).
    ``ref_updates``: ``[{"ref": "refs/heads/x", "old": hex | None, "new": hex}, ...]`` (all or nothing).
    Raises the store's typed errors for bad input; the repository is then unchanged.
    """
    r = open_repository(repo)
    updates = parse_ref_updates(ref_updates)
    source: BinaryIO | Path
    if hasattr(pack, "read"):
        source = pack  # type: ignore[assignment]
    else:
        source = sys.stdin.buffer if str(pack) == "-" else Path(pack)  # type: ignore[arg-type]
    with IncomingPack.begin(r, source, fix_thin=fix_thin, strict=strict, fsck=fsck if strict else None,
                            keep_message=keep,
                            max_pack_bytes=max_pack_bytes, processes=processes, progress=progress) as incoming:
        with (lock() if lock is not None else nullcontext()) as lease:
            result = incoming.commit(updates, lease=lease)   # checks it before publishing; its token fences refs
    return {"repo": str(r.path), "pack": result.pack_name, "checksum": result.checksum,
            "outcome": result.outcome.value, "keep": str(result.keep_path) if result.keep_path else None,
            "refs_updated": list(result.refs_updated), "counters": index_pack_counters(result)}
