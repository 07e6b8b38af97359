"""Writing a repack's plan into a pack: verbatim copies where the delta base comes along, the rest whole.

This is the seam for the delta search (issue 10): the objects :func:`write_plan` writes whole
(``_write_whole``: loose objects, deltas whose base stays behind) are the ones a search would try
to deltify against their neighbours, through :meth:`~..pack.write.PackWriter.write_delta`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import CorruptObjectError, StoreError
from ..objects import REF_DELTA, hash_object
from ..pack.format import decode_entry_header
from ..pack.write import PackWriter
from .sources import SourceIndex

if TYPE_CHECKING:
    from .repack import RepackCounters

Progress = Callable[[str, int, "int | None"], None]


def write_plan(writer: PackWriter, ids: list[bytes], sources: SourceIndex, c: "RepackCounters", *,
               progress: Progress | None = None, phase: str = "writing objects",
               mtime_of: dict[bytes, int] | None = None) -> list[int] | None:
    """Write every id of ``ids`` once, in that order except that a delta's base always goes first.

    A delta whose base is in ``ids`` is copied verbatim (OFS_DELTA to the base's new offset);
    a delta whose base is not (or a base cycle between packs) is resolved and written whole,
    as is every loose object. Returns the mtimes in written order when ``mtime_of`` is given.

    This is the seam for the delta search (issue 10): objects written whole here are the ones
    a search would try to deltify against their neighbours.
    """
    index = {oid: k for k, oid in enumerate(ids)}
    n = len(ids)
    state = bytearray(n)            # 0: to do, 1: waiting for its base, 2: written
    offsets = [0] * n
    waiting: dict[int, tuple] = {}  # a delta waiting for its base: its parsed entry, not parsed twice
    mtimes: list[int] | None = [] if mtime_of is not None else None
    step = max(1, min(5000, n // 100 or 1))
    done = 0
    # The loop runs once per object (500,000 in a large repository): names are looked up once here.
    loc_get, packs, pack_no, index_get = sources.loc.get, sources.packs, sources.pack_no, index.get
    copy_raw, copy_delta = writer.copy_raw, writer.copy_delta
    for k0 in range(n):
        if state[k0] == 2:
            continue
        stack = [k0]
        while stack:
            k = stack[-1]
            oid = ids[k]
            gid = loc_get(oid)
            if gid is None:
                offsets[k] = _write_whole(writer, oid, sources, c)
                if sources.is_loose(oid):
                    c.loose_packed += 1
            else:
                entry = waiting.pop(k, None)
                if entry is None:
                    p = packs[pack_no[gid]]
                    i = gid - p.base
                    off = p.offsets[i]
                    if (p.buffer[off] >> 4) & 7 < 6:
                        # The common case, kept short: a whole object's entry is copied as it is.
                        offsets[k] = copy_raw(oid, p.view, off, p.ends[i], p.crcs[i], path=p.path)
                        c.entries_copied += 1
                        bk = -1
                    else:
                        typ, size, base, data_off = decode_entry_header(p.buffer, off, p.end, off, p.path)
                        base_oid = base if typ == REF_DELTA else sources.oid_at(p, base)
                        bk = index_get(base_oid, None) if base_oid is not None else None
                        entry = (p, i, off, size, data_off, bk)
                else:
                    p, i, off, size, data_off, bk = entry
                if entry is not None:
                    if bk is not None and state[bk] == 0:
                        state[k] = 1
                        waiting[k] = entry
                        stack.append(bk)   # its base first (it comes later in the order)
                        continue
                    if bk is not None and state[bk] == 2:
                        offsets[k] = copy_delta(oid, p.view, off, data_off, p.ends[i], p.crcs[i], size,
                                                offsets[bk], path=p.path)
                        c.deltas_reused += 1
                    else:
                        # The base is not in this pack (or waits on this one: a cycle between packs).
                        offsets[k] = _write_whole(writer, oid, sources, c)
            state[k] = 2
            stack.pop()
            if mtimes is not None:
                mtimes.append(mtime_of[oid])
            done += 1
            if progress is not None and done % step == 0:
                progress(phase, done, n)
    if progress is not None:
        progress(phase, n, n)
    return mtimes


def _write_whole(writer: PackWriter, oid: bytes, sources: SourceIndex, c: "RepackCounters") -> int:
    """Resolve, check and store one object whole; errors name the object, its file and offset."""
    try:
        typ, data = sources.read(oid)
    except StoreError as err:
        where, offset = sources.where(oid)
        raise type(err)(f"cannot repack object: {err.message}", oid=oid, path=err.path or where,
                        offset=err.offset if err.offset is not None else offset) from err
    if hash_object(typ, data) != oid:
        where, offset = sources.where(oid)
        raise CorruptObjectError("object does not hash to its name; not repacked", oid=oid, path=where, offset=offset)
    c.rewritten_whole += 1
    return writer.write_whole(oid, typ, data)



__all__ = ["write_plan"]
