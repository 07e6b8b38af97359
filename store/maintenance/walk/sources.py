"""Where each object of a repack's start snapshot lives: an entry of a pack it may replace, a loose
file, or a ``.keep`` pack it must not touch.

Built once from the snapshot with C-level conversions of every idx (:mod:`..pack.idxread`):
an index from id to a global entry number (``loc``), and compact arrays per entry (pack,
offset, end of the entry, CRC32). No per-object lookup walks the idx files of 50 packs; an
OFS_DELTA's base is found by offset with one bisection in its pack's sorted offsets.

With the walk's C extension (:mod:`.walk`), ``loc`` is its ``Packs`` index (``get``, ``in``
and ``[]`` as a dict; no 500,000-entry dict to build) and the packs' layout, ``oid_at`` and
``unreached`` are computed in C; without it, the same answers come from a dict and Python loops
(tests/workers/test_walk.py compares both).

A repository with alternates (a fork and its pool) also gives its alternates' snapshots as ``borrowed``
(a copy into a pool gives the pool's): their packs are
listed after its own packs (so an object it holds itself is found in its own copy first), read by the
walk as fast as its own, and never offered for rewriting: :meth:`present`, ``in`` and :meth:`unreached`
leave out every object an alternate holds (git's ``pack-objects --local``: "an object that is borrowed
from an alternate object store is ignored even if it would have otherwise been packed").
"""
from __future__ import annotations

import bisect
import mmap
import os
from array import array
from dataclasses import dataclass

from ... import fsparallel, native
from ...errors import ObjectMissingError
from ...objdir import Location, ObjectSnapshot
from ...pack.packdir import PackFile

#: The C tables (Packs, pack_layout) of the walk extension, or None (store/native.py).
_walk_c = native.walk()
#: A C reader over these packs gives back the pages of their maps each time it has inflated this many bytes
#: (the walk reads every commit and tree; those pages would otherwise stay in the process's RSS until the
#: next drop_pages). The re-reads it costs come from the page cache: a full repack of git-v2.0.0 in 50 packs,
#: peak RSS 219-246 -> 189-207 MiB for 2-8k more minor faults of 86k (docs/performance.md).
DROP_PAGES_EVERY = 4 << 20


@dataclass
class _PackEntries:
    pack: PackFile
    base: int                 # global number of this pack's first entry (idx order)
    count: int
    oids: bytes               # idx order
    offsets: array            # 'Q', idx order
    crcs: array               # 'I', idx order
    ends: array               # 'Q', idx order: where each entry ends (the next entry, or the trailer)
    sorted_offsets: array     # 'Q', pack order
    order: array              # 'I', idx positions in pack order
    mtimes: array | None      # cruft packs: each object's mtime, idx order
    buffer: mmap.mmap         # the pack's bytes
    view: memoryview          # a view of them (slices without copies); released by SourceIndex.release()
    end: int = 0              # where entries end (the trailer)
    path: str = ""
    number: int = 0           # its position in SourceIndex.packs


def _layout(offsets: array, trailer: int) -> tuple[array, array, array]:
    """(idx positions in pack order, their offsets, where each entry ends in idx order: the next entry's
    offset or the trailer's)."""
    order, sorted_offsets, ends = array("I"), array("Q"), array("Q")
    if _walk_c is not None:
        for arr, raw in zip((order, sorted_offsets, ends), _walk_c.pack_layout(offsets, trailer)):
            arr.frombytes(raw)
        return order, sorted_offsets, ends
    order = array("I", sorted(range(len(offsets)), key=offsets.__getitem__))
    sorted_offsets = array("Q", [offsets[i] for i in order])
    ends = array("Q", bytes(8 * len(offsets)))
    for k in range(len(offsets) - 1):
        ends[order[k]] = sorted_offsets[k + 1]
    if len(offsets):
        ends[order[-1]] = trailer
    return order, sorted_offsets, ends


class SourceIndex:
    """The objects a repack may rewrite, and how to read and copy each."""

    def __init__(self, snapshot: ObjectSnapshot, packs: list[PackFile], kept: list[PackFile], *,
                 read_fresh=None, progress=None, borrowed: "tuple[ObjectSnapshot, ...]" = ()) -> None:
        from ...pack.mtimes import read_mtimes

        self.snapshot = snapshot
        self.kept = kept
        self.read_fresh = read_fresh       # objects not in the snapshot (arrived later): their own lookup
        self.loose_ids = snapshot.loose_ids
        self.packs: list[_PackEntries] = []
        self.loc: dict[bytes, int] = {}   # (or the C index: see below)
        # Objects in .keep packs are never copied: they stay where they are (git's --honor-pack-keep).
        self.kept_ids: set[bytes] = set()
        for pack in kept:
            t = pack.tables()
            self.kept_ids.update(t.oids[20 * i:20 * i + 20] for i in range(t.count))
        total = 0
        #: the borrowed snapshots (the pool): an object any of them holds is never rewritten here
        self.alternates: tuple[ObjectSnapshot, ...] = tuple(borrowed)
        borrowed_packs = [p for alt in self.alternates for p in alt.packs]
        # Every pack is mapped first, together (an open is a round trip over NFS: :mod:`..fsparallel`).
        fsparallel.each(lambda p: p.buffer(), packs, where=packs[0].idx_path.parent if packs else None)
        fsparallel.each(lambda p: p.buffer(), borrowed_packs,
                        where=borrowed_packs[0].idx_path.parent if borrowed_packs else None)
        #: the first global entry number of a borrowed pack, and the first borrowed pack's position
        self.local_end, self.local_packs = 0, len(packs)
        for k, pack in enumerate([*packs, *borrowed_packs]):
            if k == len(packs):
                self.local_end = total
            t = pack.tables()
            trailer = pack.end
            order, sorted_offsets, ends = _layout(t.offsets, trailer)
            mtimes = (read_mtimes(pack.mtimes_path, t.count, t.pack_checksum)
                      if pack.is_cruft and k < len(packs) else None)
            self.packs.append(_PackEntries(pack, total, t.count, t.oids, t.offsets, t.crcs, ends, sorted_offsets,
                                           order, mtimes, pack.buffer(), memoryview(pack.buffer()), trailer,
                                           str(pack.pack_path), len(self.packs)))
            total += t.count
        if not borrowed_packs:
            self.local_end = total
        # id -> global entry number: the first pack holding an id, never an id of a .keep pack. With the C
        # walk that index is the C one (it answers get() and ``in`` as the dict does, and the walk uses it).
        self.c_packs = None
        if _walk_c is not None:
            self.c_packs = _walk_c.Packs(
                [(p.buffer, p.end, p.oids, p.offsets, p.crcs, p.ends, p.sorted_offsets, p.order) for p in self.packs],
                self.kept_ids, int.from_bytes(os.urandom(8), "little"), drop_every=DROP_PAGES_EVERY)
            self.loc = self.c_packs
        else:
            loc = self.loc
            kept_ids = self.kept_ids
            for p in self.packs:
                oids = p.oids
                for i in range(p.count):
                    oid = oids[20 * i:20 * i + 20]
                    if oid not in loc and oid not in kept_ids:
                        loc[oid] = p.base + i
        self._starts = [p.base for p in self.packs]
        # Global entry number -> its pack's position in self.packs (no bisection per object).
        self.pack_no = array("H" if len(self.packs) < 1 << 16 else "I")
        for k, p in enumerate(self.packs):
            self.pack_no.extend(array(self.pack_no.typecode, [k]) * p.count)

    # -- where ----------------------------------------------------------------------------------
    def packed(self, oid: bytes) -> int | None:
        """The global entry number of ``oid`` in a replaceable pack, or None."""
        return self.loc.get(oid)

    def entry(self, gid: int) -> tuple[_PackEntries, int]:
        """(pack, idx position) of a global entry number."""
        p = self.packs[self.pack_no[gid]]
        return p, gid - p.base

    def is_loose(self, oid: bytes) -> bool:
        return oid in self.loose_ids

    def borrowed(self, oid: bytes) -> bool:
        """Does an alternate (the pool) hold ``oid``? Then this repository's repack leaves it out."""
        if not self.alternates:
            return False
        gid = self.loc.get(oid)
        if gid is not None and gid >= self.local_end:
            return True
        return any(alt.locate(oid) is not Location.MISSING for alt in self.alternates)

    def __contains__(self, oid: bytes) -> bool:
        """Is ``oid`` one of the objects this repack may rewrite (not in a .keep pack, not borrowed)?"""
        return (oid in self.loc or (oid in self.loose_ids and oid not in self.kept_ids)) and not self.borrowed(oid)

    def unreached(self, seen) -> list[list[int]]:
        """For each pack of :attr:`packs`, the idx positions whose id is neither in ``seen`` nor in a .keep
        pack: the copies a full repack did not reach."""
        if self.c_packs is not None:
            got = self.c_packs.unreached(seen, self.kept_ids)
            return [*got[:self.local_packs], *([] for _ in got[self.local_packs:])]   # (never a borrowed copy)
        out: list[list[int]] = []
        for p in self.packs[:self.local_packs]:
            oids, kept = p.oids, self.kept_ids
            out.append([i for i in range(p.count)
                        if (oid := oids[20 * i:20 * i + 20]) not in seen and oid not in kept])
        return out + [[] for _ in self.packs[self.local_packs:]]

    def present(self, ids: list[bytes]) -> list[bytes]:
        """The ids of ``ids`` this repack may rewrite (what ``in`` answers), in their order."""
        if self.c_packs is not None:
            got = self.c_packs.present(ids, self.loose_ids, self.kept_ids)
        else:
            loc, loose, kept = self.loc, self.loose_ids, self.kept_ids
            got = [oid for oid in ids if oid in loc or (oid in loose and oid not in kept)]
        if self.alternates:
            got = [oid for oid in got if not self.borrowed(oid)]
        return got

    def oid_at(self, p: _PackEntries, offset: int) -> bytes | None:
        """The id of the entry starting at ``offset`` in ``p`` (None if no entry starts there)."""
        if self.c_packs is not None:
            return self.c_packs.oid_at(p.number, offset)
        k = bisect.bisect_left(p.sorted_offsets, offset)
        if k >= p.count or p.sorted_offsets[k] != offset:
            return None
        i = p.order[k]
        return p.oids[20 * i:20 * i + 20]

    def release(self) -> None:
        """Drop the views on the packs' maps (so the packs can be closed)."""
        if self.c_packs is not None:
            self.c_packs.close()
        for p in self.packs:
            p.view.release()      # (a second release is a no-op)

    def drop_pages(self) -> None:
        """Let the kernel take back the pages of the packs' maps this process has touched (they stay in the
        page cache; a later read faults them in again from there). The walk reads every commit and tree, the
        writer copies every entry: without this the peak RSS would count the whole input pack once more,
        on top of the work (the maps are read-only, so nothing is lost)."""
        for p in self.packs:
            try:
                p.buffer.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):
                return   # (no madvise here, or a closed map: the pages simply stay)

    # -- reading ----------------------------------------------------------------------------------
    def read(self, oid: bytes) -> tuple[int, bytes]:
        """(type, data): from the replaceable packs, the loose files, the kept packs, or (objects that
        arrived after the snapshot) a fresh lookup. ObjectMissingError if none has it."""
        gid = self.loc.get(oid)
        if gid is not None:
            p, i = self.entry(gid)
            t, data = p.pack.read_at(p.offsets[i])   # an installed pack holds its own delta bases
            return int(t), data
        if oid in self.loose_ids:
            try:
                t, data = self.snapshot.loose.read(oid, verify=False)
                return int(t), data
            except ObjectMissingError:
                pass   # gone since the snapshot (packed by someone else): the fresh lookup finds it
        for pack in self.kept:
            off = pack.find_offset(oid)
            if off is not None:
                t, data = pack.read_at(off)
                return int(t), data
        if self.read_fresh is not None:
            t, data = self.read_fresh(oid)
            return int(t), data
        raise ObjectMissingError("object not found", oid=oid)

    def where(self, oid: bytes) -> tuple[str, int | None]:
        """(file, offset) naming an object's copy, for error messages."""
        gid = self.loc.get(oid)
        if gid is not None:
            p, i = self.entry(gid)
            return str(p.pack.pack_path), p.offsets[i]
        return str(self.snapshot.loose.path_for(oid)), None


__all__ = ["SourceIndex"]
