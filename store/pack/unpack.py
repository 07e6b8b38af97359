"""Explode a (small) pack into loose objects, like ``git unpack-objects``, through one LooseBatch.

The pack is parsed with the one entry reader (:mod:`.entries`: header, entries, zlib
streams; trailer checksum here), deltas are resolved by the one resolver (:mod:`.resolve`)
against this pack or the repository (REF_DELTA, thin packs), and every object is added to
a batch: one durable flush, renames at the end, refs last.

With ``strict`` (git's ``unpack-objects --strict``), every object is checked first (store/fsck:
git's rules, links by type in the pack or the repository, ``.gitmodules`` blobs at the end) and
nothing is written unless all pass: a refusal raises FsckError (or ObjectMissingError) with no
loose object, temp file or ref left behind.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..batch.api import begin
from ..batch.contract import BatchCounters
from ..errors import LimitExceededError, PackFormatError, StoreError
from ..fsck import STRICT, FsckChecker, FsckOptions
from ..objects import ObjectType, hash_object
from ..progress import Progress
from ..refs import RefUpdate
from ..tuning import gc_paused
from .entries import EntryHeader, iter_entries
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, parse_pack_header
from .resolve import resolve_all

#: "small": beyond this many objects a pack should be indexed, not exploded (receive.unpackLimit idea).
DEFAULT_MAX_OBJECTS = 100_000
#: --strict keeps the checked objects in memory for the write pass up to this many bytes (else resolves again).
STRICT_KEEP_BYTES = 64 << 20


@dataclass(frozen=True)
class UnpackResult:
    objects: int
    written: int
    skipped: int
    deltas: int
    counters: dict


def parse_pack(pack: bytes, where: str = "<pack>", max_objects: int | None = DEFAULT_MAX_OBJECTS) -> list[EntryHeader]:
    """Every entry header of a version 2/3 pack; trailer checksum and every zlib stream verified."""
    _version, count = parse_pack_header(pack, path=where)
    if len(pack) < PACK_HEADER_SIZE + PACK_TRAILER_SIZE:
        raise PackFormatError(f"pack truncated: {len(pack)} bytes cannot hold a header and a trailer", path=where,
                              offset=0)
    if max_objects is not None and count > max_objects:
        raise LimitExceededError(f"pack has {count} objects; more than {max_objects} to explode", path=where)
    body_end = len(pack) - PACK_TRAILER_SIZE
    if hashlib.sha1(memoryview(pack)[:body_end]).digest() != pack[body_end:]:
        raise PackFormatError("pack trailer checksum mismatch (truncated or corrupt pack)", path=where,
                              offset=body_end)
    return [header for header, _data in iter_entries(pack, count, path=where)]


def resolve_pack(pack: bytes, headers: Sequence[EntryHeader], read_base: Callable[[bytes], tuple[ObjectType, bytes]],
                 where: str = "<pack>") -> Iterator[tuple[ObjectType, bytes]]:
    """Yield (type, data) for every entry, deltas resolved (bases first; thin bases from ``read_base``)."""
    end = len(pack) - PACK_TRAILER_SIZE
    for _header, type_num, data, _oid in resolve_all(pack, headers, end=end, path=where, read_external=read_base):
        yield ObjectType(type_num), data


@gc_paused()   # many long-lived acyclic objects: see store/tuning.py
def unpack_objects(repo, pack: bytes, *, ref_updates: Sequence[RefUpdate] = (), where: str = "<pack>",
                   counters: BatchCounters | None = None, progress: Progress | None = None,
                   max_objects: int | None = DEFAULT_MAX_OBJECTS, strict: bool = False,
                   fsck: FsckOptions | None = None, **batch_options) -> UnpackResult:
    """Parse and fully validate the pack first (with ``strict``/``fsck``: git's fsck too), then
    write every object in one batch."""
    headers = parse_pack(pack, where, max_objects)
    total = len(headers)
    deltas = sum(1 for h in headers if h.is_delta)
    counters = counters if counters is not None else BatchCounters()
    step = max(1, min(1000, total // 100 or 1))
    with begin(repo, counters=counters, expected=total, **batch_options) as batch:   # no count_hint: loose
        snap = batch.snapshot

        read_base = snap.read   # what the batch's snapshot lacks: a fresh lookup (ObjectSnapshot.read)

        kept: list[tuple[ObjectType, bytes]] | None = None
        if strict or fsck is not None:
            kept = strict_check(repo, snap, pack, headers, read_base, fsck or STRICT, where)
        n = 0
        objects = kept if kept is not None else resolve_pack(pack, headers, read_base, where)
        for obj_type, data in objects:
            batch.add(obj_type, data)
            n += 1
            if progress is not None and (n % step == 0 or n == total):
                progress("unpack", n, total)
        result = batch.commit(ref_updates)
    return UnpackResult(objects=total, written=result.written, skipped=result.skipped, deltas=deltas,
                        counters=result.counters)


def strict_check(repo, snap, pack: bytes, headers: Sequence[EntryHeader], read_base, opts: FsckOptions,
                 where: str) -> list[tuple[ObjectType, bytes]] | None:
    """git unpack-objects --strict before anything is written: every object fsck'd, every link of the
    type it claims (in the pack or the repository), then the .gitmodules blobs. Returns the objects
    when they fit in STRICT_KEEP_BYTES (the write pass reuses them), else None (resolve again)."""
    checker = FsckChecker(opts)
    ours: dict[bytes, int] = {}
    kept: list[tuple[ObjectType, bytes]] | None = []
    size = 0
    blobs: dict[bytes, bytes] = {}
    for obj_type, data in resolve_pack(pack, headers, read_base, where):
        oid = hash_object(obj_type, data)
        ours[oid] = int(obj_type)
        checker.check(int(obj_type), data, oid, where=where)
        if kept is not None:
            size += len(data)
            if size > STRICT_KEEP_BYTES:
                kept = None
            else:
                kept.append((obj_type, data))
                if obj_type == ObjectType.BLOB:
                    blobs[oid] = data

    def existing_type(oid: bytes) -> int | None:
        if not snap.has(oid):
            return None
        return int(repo.objects.read_header(oid)[0])

    def read(oid: bytes) -> tuple[int, bytes] | None:
        if oid in ours:
            if oid in blobs:
                return int(ObjectType.BLOB), blobs[oid]
            for obj_type, data in resolve_pack(pack, headers, read_base, where):
                if hash_object(obj_type, data) == oid:
                    return int(obj_type), data
        if snap.has(oid):
            t, data = snap.read(oid)
            return int(t), data
        return None

    checker.finish(ours.get, existing_type, read, where=where)
    return kept


__all__ = ["parse_pack", "resolve_pack", "unpack_objects", "UnpackResult", "StoreError"]
