"""Explode a (small) pack into loose objects, like ``git unpack-objects``, through one LooseBatch.

The pack is parsed with the one entry reader (:mod:`.entries`: header, entries, zlib
streams; trailer checksum here), deltas are resolved by the one resolver (:mod:`.resolve`)
against this pack or the repository (REF_DELTA, thin packs), and every object is added to
a batch: one durable flush, renames at the end, refs last.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..bulk import BatchCounters, begin_batch
from ..errors import LimitExceededError, PackFormatError, StoreError
from ..objects import ObjectType
from ..refs import RefUpdate
from ..tuning import gc_paused
from .entries import EntryHeader, iter_entries
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, parse_pack_header
from .resolve import resolve_all

Progress = Callable[[str, int, "int | None"], None]

#: "small": beyond this many objects a pack should be indexed, not exploded (receive.unpackLimit idea).
DEFAULT_MAX_OBJECTS = 100_000


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
                   max_objects: int | None = DEFAULT_MAX_OBJECTS, **batch_options) -> UnpackResult:
    """Parse and fully validate the pack first, then write every object in one batch."""
    headers = parse_pack(pack, where, max_objects)
    total = len(headers)
    deltas = sum(1 for h in headers if h.is_delta)
    counters = counters if counters is not None else BatchCounters()
    step = max(1, min(1000, total // 100 or 1))
    with begin_batch(repo, counters=counters, expected=total, **batch_options) as batch:
        snap = batch.snapshot

        def read_base(oid: bytes):
            if oid in snap:
                return snap.read(oid)
            return repo.objects.read(oid)

        n = 0
        for obj_type, data in resolve_pack(pack, headers, read_base, where):
            batch.add(obj_type, data)
            n += 1
            if progress is not None and (n % step == 0 or n == total):
                progress("unpack", n, total)
        result = batch.commit(ref_updates)
    return UnpackResult(objects=total, written=result.written, skipped=result.skipped, deltas=deltas,
                        counters=result.counters)


__all__ = ["parse_pack", "resolve_pack", "unpack_objects", "UnpackResult", "StoreError"]
