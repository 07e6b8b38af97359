"""Explode a (small) pack into loose objects, like ``git unpack-objects``, through one LooseBatch.

The pack is parsed here (a small, strict parser: header, entries, zlib streams,
trailer checksum), deltas are resolved against earlier entries (OFS_DELTA) and
against this pack or the repository (REF_DELTA, thin packs), and every object
is added to a batch: one durable flush, renames at the end, refs last.
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from dulwich.pack import apply_delta

from ..bulk import BatchCounters, begin_batch
from ..errors import LimitExceededError, ObjectMissingError, PackFormatError, StoreError
from ..objects import OFS_DELTA, REF_DELTA, ObjectType, hash_object
from ..refs import RefUpdate
from ..tuning import gc_paused
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, decode_entry_header, parse_pack_header

Progress = Callable[[str, int, "int | None"], None]

#: "small": beyond this many objects a pack should be indexed, not exploded (receive.unpackLimit idea).
DEFAULT_MAX_OBJECTS = 100_000
INFLATE_LIMIT = 1 << 30           # output bound per decompress call (max_length must fit a C ssize_t)


@dataclass
class _Entry:
    offset: int
    type_num: int
    data: bytes                 # object data, or delta instructions
    base_offset: int | None = None
    base_oid: bytes | None = None


@dataclass(frozen=True)
class UnpackResult:
    objects: int
    written: int
    skipped: int
    deltas: int
    counters: dict


def parse_pack(pack: bytes, where: str = "<pack>", max_objects: int | None = DEFAULT_MAX_OBJECTS) -> list[_Entry]:
    """Every entry of a version 2/3 pack, with its trailer checksum verified."""
    view = memoryview(pack)
    _version, count = parse_pack_header(pack, path=where)
    if len(pack) < PACK_HEADER_SIZE + PACK_TRAILER_SIZE:
        raise PackFormatError(f"pack truncated: {len(pack)} bytes cannot hold a header and a trailer", path=where,
                              offset=0)
    if max_objects is not None and count > max_objects:
        raise LimitExceededError(f"pack has {count} objects; more than {max_objects} to explode", path=where)
    body_end = len(pack) - PACK_TRAILER_SIZE
    if hashlib.sha1(view[:body_end]).digest() != pack[body_end:]:
        raise PackFormatError("pack trailer checksum mismatch (truncated or corrupt pack)", path=where,
                              offset=body_end)
    entries: list[_Entry] = []
    pos = PACK_HEADER_SIZE
    for _ in range(count):
        start = pos
        if pos >= body_end:
            raise PackFormatError("pack ends before its last entry", path=where, offset=pos)
        type_num, size, base, pos = decode_entry_header(pack, pos, body_end, start, where)
        base_offset = base if type_num == OFS_DELTA else None
        base_oid = base if type_num == REF_DELTA else None
        d = zlib.decompressobj()
        out = []
        got = 0
        try:
            while not d.eof:
                if pos >= body_end:
                    raise PackFormatError("zlib stream runs past the pack end", path=where, offset=start)
                chunk = view[pos:min(pos + 65536, body_end)]
                # At most one byte more than declared: a stream that inflates past its header's size is
                # refused before it is held in memory (index-pack bounds its inflate the same way).
                piece = d.decompress(chunk, min(size + 1 - got, INFLATE_LIMIT))
                got += len(piece)
                if got > size:
                    raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                          path=where, offset=start)
                out.append(piece)
                pos += len(chunk) - len(d.unconsumed_tail) - len(d.unused_data)
        except zlib.error as err:
            raise PackFormatError(f"entry does not inflate: {err}", path=where, offset=start) from err
        data = b"".join(out)
        if len(data) != size:
            raise PackFormatError(f"entry inflates to {len(data)} bytes, header says {size}", path=where,
                                  offset=start)
        entries.append(_Entry(start, type_num, data, base_offset, base_oid))
    if pos != body_end:
        raise PackFormatError(f"{body_end - pos} unexpected bytes after the last entry", path=where, offset=pos)
    return entries


def resolve_pack(entries: Sequence[_Entry], read_base: Callable[[bytes], tuple[ObjectType, bytes]],
                 where: str = "<pack>") -> Iterator[tuple[ObjectType, bytes]]:
    """Yield (type, data) for every entry, deltas resolved (bases first)."""
    by_offset: dict[int, tuple[int, bytes]] = {}
    by_oid: dict[bytes, tuple[int, bytes]] = {}
    waiting: list[_Entry] = []
    for e in entries:
        if e.type_num in (OFS_DELTA, REF_DELTA):
            waiting.append(e)
            continue
        by_offset[e.offset] = (e.type_num, e.data)
        by_oid[hash_object(e.type_num, e.data)] = (e.type_num, e.data)
        yield ObjectType(e.type_num), e.data
    # Resolve in rounds: a REF_DELTA may name an object that appears later in the pack.
    while waiting:
        still: list[_Entry] = []
        for e in waiting:
            base = by_offset.get(e.base_offset) if e.type_num == OFS_DELTA else by_oid.get(e.base_oid)
            if base is None:
                still.append(e)
                continue
            try:
                data = b"".join(apply_delta(base[1], e.data))
            except Exception as err:
                raise PackFormatError(f"delta does not apply: {err}", path=where, offset=e.offset) from err
            by_offset[e.offset] = (base[0], data)
            by_oid[hash_object(base[0], data)] = (base[0], data)
            yield ObjectType(base[0]), data
        if len(still) == len(waiting):
            # No progress: the remaining REF_DELTA bases must come from the repository (thin pack).
            e = next((x for x in still if x.type_num == REF_DELTA), None)
            if e is None:
                raise PackFormatError("ofs-delta base is not an object in this pack", path=where,
                                      offset=still[0].offset)
            try:
                t, d = read_base(e.base_oid)
            except ObjectMissingError as err:
                raise PackFormatError("ref-delta base is neither in the pack nor in the repository",
                                      path=where, offset=e.offset, oid=e.base_oid) from err
            by_oid[e.base_oid] = (int(t), d)
        waiting = still


@gc_paused()   # many long-lived acyclic objects: see store/tuning.py
def unpack_objects(repo, pack: bytes, *, ref_updates: Sequence[RefUpdate] = (), where: str = "<pack>",
                   counters: BatchCounters | None = None, progress: Progress | None = None,
                   max_objects: int | None = DEFAULT_MAX_OBJECTS, **batch_options) -> UnpackResult:
    """Parse and fully validate the pack first, then write every object in one batch."""
    entries = parse_pack(pack, where, max_objects)
    total = len(entries)
    deltas = sum(1 for e in entries if e.type_num in (OFS_DELTA, REF_DELTA))
    counters = counters if counters is not None else BatchCounters()
    step = max(1, min(1000, total // 100 or 1))
    with begin_batch(repo, counters=counters, expected=total, **batch_options) as batch:
        snap = batch.snapshot

        def read_base(oid: bytes):
            if oid in snap:
                return snap.read(oid)
            return repo.objects.read(oid)

        n = 0
        for obj_type, data in resolve_pack(entries, read_base, where):
            batch.add(obj_type, data)
            n += 1
            if progress is not None and (n % step == 0 or n == total):
                progress("unpack", n, total)
        result = batch.commit(ref_updates)
    return UnpackResult(objects=total, written=result.written, skipped=result.skipped, deltas=deltas,
                        counters=result.counters)


__all__ = ["parse_pack", "resolve_pack", "unpack_objects", "UnpackResult", "StoreError"]
