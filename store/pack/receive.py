"""index-pack's phase 1, receive: the incoming pack parsed while it is copied into the quarantine.

:class:`Receiver` reads the source (a path or a binary stream: :func:`open_source`) ONCE, in chunks,
writes each chunk to the quarantined ``tmp_pack_*`` and parses it on the way: the header, each entry's
type/size header, the bounds of each zlib stream (inflated with bounded output to verify it), CRC32s,
the ids of the non-delta objects and the trailing SHA-1. See :mod:`.indexpack` for the whole pipeline.

The tables the later phases read are defined here too, beside the parser that fills them first:
:class:`Entries` (the parsed entries in pack order as compact arrays, with the delta graph),
:class:`Stats` (what one receiving or resolving process found: collisions to compare, ``--strict``
link state) and :class:`ExistingIds` (membership in the one snapshot taken before the pack is read).
The delta resolver (:mod:`.resolvedeltas`) and :class:`.indexpack.IncomingPack` import them from here.

A module of its own because the stream parser is the hot loop of the receive phase, with its own
buffer bookkeeping, and needs nothing of the resolution, the index or the install.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import zlib
from array import array
from typing import Any, BinaryIO

from ..errors import InvalidInputError, LimitExceededError, PackFormatError
from ..fsck import FsckChecker, FsckOptions, FsckState
from ..objects import OFS_DELTA, REF_DELTA, ZERO_OID
from ..progress import Progress
from .format import PACK_HEADER_SIZE, decode_delta_header, decode_entry_header, parse_pack_header
from .resolve import TYPE_HEADER

READ_CHUNK = 1 << 20            # bytes read from the source per call
LARGE_OBJECT = 16 << 20         # objects above this are inflated in bounded pieces
INFLATE_PIECE = 4 << 20         # output piece size for large objects
HEADER_ROOM = 64                # an entry header is at most 1+9+10 (OFS) or 1+9+20 (REF) bytes
#: Ids of the smallest existing packs are copied into one set (<= ~5 MB); larger packs are probed via their idx (~3 us).
SMALL_PACK_IDS = 50_000


# --------------------------------------------------------------------------------------
# Existence: answered from one snapshot, in memory.


class ExistingIds:
    """Membership of object ids in one :class:`ObjectSnapshot`, with no filesystem calls.

    Loose ids come from the snapshot's listing. Ids of small packs are copied
    into one set (cheaper than probing every idx per object); large packs are
    probed through their already-mmapped idx. The snapshot's alternates (a fork's
    pool) answer too, each the same way, after the repository's own.
    """

    def __init__(self, snapshot, *, _alternate: bool = False) -> None:
        self.snapshot = snapshot
        self.loose = snapshot.loose_ids
        self.alternates: tuple[ExistingIds, ...] = (
            () if _alternate else tuple(ExistingIds(a, _alternate=True) for a in snapshot.alternates))
        packs = list(snapshot.packs)
        small: set[bytes] = set()
        large = []
        budget = SMALL_PACK_IDS
        for pack in sorted(packs, key=len):
            n = len(pack)
            if n <= budget:
                small.update(pack.iter_ids())
                budget -= n
            else:
                large.append(pack)
        self.small = small
        self.large = tuple(large)
        self.empty: bool = not self.loose and not small and not large and all(a.empty for a in self.alternates)
        self.late: set[bytes] = set()   # thin bases the snapshot lacked, found by a normal lookup

    def learn(self, oids) -> None:  # type: ignore[no-untyped-def]
        """One normal lookup (one re-listing) for each of ``oids`` the snapshot lacks: a listing can miss
        an object that exists -- the snapshot lists objects/pack, then every loose fan-out dir, and a loose
        repack elsewhere (another NFS host: those listings are hundreds of round trips) can move it from
        loose to a new pack in between. Used for thin bases and for links the snapshot lacks (a handful:
        a missing link is an error), never per incoming object."""
        if self.snapshot.objects is None:
            return
        for oid in set(oids):
            if oid not in self and self.snapshot.has(oid):
                self.late.add(oid)
                self.empty = False

    def __contains__(self, oid: bytes) -> bool:
        if self.empty:
            return False
        if oid in self.loose or oid in self.small or oid in self.late:
            return True
        for pack in self.large:
            if pack.find_offset(oid) is not None:
                return True
        return any(oid in alt for alt in self.alternates)


# --------------------------------------------------------------------------------------
# Parsed entries (pack order), compact: arrays, not per-object Python objects.


class Entries:
    def __init__(self) -> None:
        self.offsets = array("Q")        # entry start; one sentinel (trailer offset) appended at the end
        self.types = bytearray()         # pack type 1-4, 6, 7
        self.hdrlens = bytearray()       # bytes of entry header (zlib data starts at offset + hdrlen)
        self.sizes = array("Q")          # declared (inflated) size of the entry's data
        self.crcs = array("I")
        self.oids = bytearray()          # 20 bytes per entry, zeros for deltas until resolved
        self.first_child = array("i")    # OFS children of this entry (index), -1 = none
        self.next_sibling = array("i")   # next child of the same base (OFS or REF), -1 = none
        self.ref_first: dict[bytes, int] = {}   # REF base id -> first child index
        self.deltas = 0
        self.ref_deltas = 0
        #: what the deltas' headers say resolving them produces (bytes to apply and hash): the work estimate
        #: the choice to fork resolvers is made on (a delta inflated piecewise adds its own size instead)
        self.result_bytes = 0

    def __len__(self) -> int:
        return len(self.types)


class Stats:
    def __init__(self) -> None:
        self.collisions: list[tuple[int, bytes]] = []   # (entry index, sha256 of incoming content)
        self.fsck: FsckState | None = None              # --strict: links by type, .gitmodules blobs


def make_checker(opts: FsckOptions | None, stats: Stats) -> FsckChecker | None:
    if opts is None:
        return None
    if stats.fsck is None:
        stats.fsck = FsckState()
    return FsckChecker(opts, stats.fsck)


# --------------------------------------------------------------------------------------
# Phase 1: receive.


class Receiver:
    """Copies the source into the quarantined pack file while parsing it."""

    def __init__(self, source: BinaryIO, fd: int, label: str, *, max_pack_bytes: int | None,
                 existing: ExistingIds, fsck: FsckOptions | None, progress: Progress | None) -> None:
        self.source = source
        self.fd = fd
        self.where = label
        self.max_pack_bytes = max_pack_bytes
        self.existing = existing
        self.strict = fsck is not None
        self.fsck_opts = fsck
        self.progress = progress
        self.sha = hashlib.sha1()
        self.buf = b""
        self.mv = memoryview(b"")
        self.bpos = 0        # parse position in buf
        self.hpos = 0        # bytes of buf[0:hpos] already hashed
        self.boff = 0        # pack offset of buf[0]
        self.total = 0       # bytes read from the source
        self.eof = False
        self.stats = Stats()

    # -- source ------------------------------------------------------------
    def _read_more(self) -> bool:
        """Drop consumed bytes, append one chunk from the source; False at end of input."""
        if self.eof:
            return False
        try:
            chunk = self.source.read(READ_CHUNK)
        except OSError as err:
            raise InvalidInputError(f"cannot read the pack source: {err}", path=self.where,
                                    offset=self.total) from err
        if not chunk:
            self.eof = True
            return False
        self.total += len(chunk)
        if self.max_pack_bytes is not None and self.total > self.max_pack_bytes:
            raise LimitExceededError(f"pack is larger than the limit of {self.max_pack_bytes} bytes",
                                     path=self.where, offset=self.max_pack_bytes)
        view = memoryview(chunk)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        if self.hpos < self.bpos:
            self.sha.update(self.mv[self.hpos:self.bpos])
        self.boff += self.bpos
        rest = self.buf[self.bpos:]
        self.buf = rest + chunk if rest else chunk
        self.mv = memoryview(self.buf)
        self.bpos = self.hpos = 0
        return True

    def _ensure(self, need: int) -> int:
        """Make ``need`` unparsed bytes available if the source has them; return how many are."""
        while len(self.buf) - self.bpos < need and self._read_more():
            pass
        return len(self.buf) - self.bpos

    # -- parsing -----------------------------------------------------------
    def run(self) -> tuple[Entries, int, bytes]:
        """Parse everything; returns (entries, trailer offset, pack checksum)."""
        if self._ensure(12) < 12:
            raise PackFormatError("pack truncated: no complete header", path=self.where, offset=0)
        _version, count = parse_pack_header(bytes(self.mv[0:PACK_HEADER_SIZE]), path=self.where)
        self.bpos = PACK_HEADER_SIZE
        entries = Entries()
        self._parse_entries(entries, count)
        # Everything hashed so far is the pack minus its trailer.
        if self.hpos < self.bpos:
            self.sha.update(self.mv[self.hpos:self.bpos])
            self.hpos = self.bpos
        trailer_off = self.boff + self.bpos
        checksum = self.sha.digest()
        avail = self._ensure(21)
        if avail < 20:
            raise PackFormatError(f"pack truncated: {avail} of 20 trailer bytes", path=self.where,
                                  offset=trailer_off)
        trailer = bytes(self.mv[self.bpos:self.bpos + 20])
        if avail > 20:
            self._classify_extra(count, trailer_off)
        if trailer != checksum:
            raise PackFormatError(f"pack trailer checksum mismatch: trailer {trailer.hex()}, "
                                  f"content hashes to {checksum.hex()}", path=self.where, offset=trailer_off)
        entries.offsets.append(trailer_off)  # sentinel: end of the last entry
        return entries, trailer_off, checksum

    def _classify_extra(self, count: int, trailer_off: int) -> None:
        """Data follows the declared objects: more objects than the header says, or junk."""
        sha = self.sha.copy()
        lag = b""
        # Hash all remaining bytes but the last 20; if those 20 are the hash, objects were miscounted.
        while True:
            data = lag + bytes(self.mv[self.bpos:])
            self.bpos = len(self.buf)
            if len(data) > 20:
                sha.update(data[:-20])
                lag = data[-20:]
            else:
                lag = data
            if not self._read_more():
                break
        if sha.digest() == lag:
            raise PackFormatError(f"object count mismatch: header declares {count} objects but the pack "
                                  f"holds more", path=self.where, offset=trailer_off)
        raise PackFormatError("pack has junk after the trailer, or the trailer checksum is wrong",
                              path=self.where, offset=trailer_off)

    def _count_mismatch_if_trailer(self, count: int, parsed: int, offset: int) -> None:
        """At an entry boundary with exactly 20 bytes left that hash-match: the header over-counted."""
        if self._ensure(21) == 20:
            sha = self.sha.copy()
            sha.update(self.mv[self.hpos:self.bpos])
            if sha.digest() == bytes(self.mv[self.bpos:self.bpos + 20]):
                raise PackFormatError(f"object count mismatch: header declares {count} objects, pack ends "
                                      f"after {parsed}", path=self.where, offset=offset)

    def _parse_entries(self, e: Entries, count: int) -> None:
        where = self.where
        offsets, types, hdrlens, sizes, crcs = e.offsets, e.types, e.hdrlens, e.sizes, e.crcs
        oids, first_child, next_sibling, ref_first = e.oids, e.first_child, e.next_sibling, e.ref_first
        existing = self.existing
        check_existing = not existing.empty
        stats = self.stats
        fsck = make_checker(self.fsck_opts, stats)
        crc32 = zlib.crc32
        sha1 = hashlib.sha1
        decompressobj = zlib.decompressobj
        zero_oid = ZERO_OID
        progress = self.progress
        step = max(1, min(1000, count // 100))
        i = 0
        while i < count:
            if len(self.buf) - self.bpos < HEADER_ROOM:
                avail = self._ensure(HEADER_ROOM)
                if avail == 0:
                    raise PackFormatError(f"pack truncated: header declares {count} objects, input ends "
                                          f"after {i}", path=where, offset=self.boff + self.bpos)
                if avail == 20:
                    self._count_mismatch_if_trailer(count, i, self.boff + self.bpos)
            buf = self.buf
            blen = len(buf)
            bpos = self.bpos
            start = self.boff + bpos
            # Entry header: format's one decoder (bounds, messages and offsets; a call per entry costs
            # about 3% of this phase's CPU, measured, which one copy of the bounds is worth).
            typ, size, base, p = decode_entry_header(buf, bpos, blen, start, where)
            if typ == OFS_DELTA:
                base_off: int = base  # type: ignore[assignment]  # OFS_DELTA: an offset (format's contract)
                b = bisect.bisect_left(offsets, base_off)
                if b >= i or offsets[b] != base_off:
                    raise PackFormatError(f"OFS_DELTA base offset {base_off} does not start an entry",
                                          path=where, offset=start)
                next_sibling.append(first_child[b])
                first_child[b] = i
                e.deltas += 1
            elif typ == REF_DELTA:
                base_id: bytes = base  # type: ignore[assignment]  # REF_DELTA: the base's id
                next_sibling.append(ref_first.get(base_id, -1))
                ref_first[base_id] = i
                e.deltas += 1
                e.ref_deltas += 1
            else:
                next_sibling.append(-1)
            first_child.append(-1)
            offsets.append(start)
            types.append(typ)
            hdrlens.append(p - bpos)
            sizes.append(size)

            # Inflate: fast path when the whole zlib stream is in the buffer.
            done = False
            if size <= LARGE_OBJECT:
                fed_end = min(p + size + 64, blen)
                d = decompressobj()
                out = d.decompress(self.mv[p:fed_end], size + 1)
                if d.eof:
                    if len(out) != size:
                        raise PackFormatError(f"entry inflates to {len(out)} bytes, header says {size}",
                                              path=where, offset=start)
                    end = fed_end - len(d.unused_data)
                    crcs.append(crc32(self.mv[bpos:end]))
                    if typ < 6:
                        h = sha1(TYPE_HEADER[typ])
                        h.update(b"%d\0" % size)
                        h.update(out)
                        oid = h.digest()
                        oids += oid
                        if check_existing and oid in existing:
                            stats.collisions.append((i, strong_digest(typ, out)))
                        if fsck is not None:
                            fsck.check_received(typ, out, oid, size, where=where, offset=start)
                    else:
                        oids += zero_oid
                        e.result_bytes += delta_result_size(out)
                    self.bpos = end
                    done = True
                elif len(out) > size:
                    raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                          path=where, offset=start)
            if not done:
                self.bpos = p
                crc, oid, digest, body = self._inflate_slow(typ, size, start, bpos)
                crcs.append(crc)
                if typ < 6:
                    oids += oid
                    if check_existing and oid in existing:
                        stats.collisions.append((i, digest))
                    if fsck is not None:
                        fsck.check_received(typ, body, oid, size, where=where, offset=start)
                else:
                    oids += zero_oid
                    e.result_bytes += size
            i += 1
            if progress is not None and i % step == 0:
                progress("receiving", i, count)
        if progress is not None:
            progress("receiving", count, count)

    def _inflate_slow(self, typ: int, size: int, start: int, hdr_pos: int):
        """Inflate an entry whose stream crosses buffer refills (or is large), in bounded pieces."""
        where = self.where
        crc = zlib.crc32(self.mv[hdr_pos:self.bpos])
        h: Any = None
        h2: Any = None
        pieces: list[bytes] | None = None
        if typ < 6:
            h = hashlib.sha1(TYPE_HEADER[typ] + b"%d\0" % size)
            h2 = hashlib.sha256(TYPE_HEADER[typ] + b"%d\0" % size)
            if self.strict and typ != 3:
                pieces = []
        d = zlib.decompressobj()
        got = 0
        seg = self.bpos
        while True:
            data: bytes | memoryview = self.mv[seg:]
            while True:
                try:
                    out = d.decompress(data, INFLATE_PIECE)
                except zlib.error as err:
                    raise PackFormatError(f"corrupt zlib stream: {err}", path=where, offset=start) from err
                got += len(out)
                if got > size:
                    raise PackFormatError(f"entry inflates to more than the {size} bytes its header says",
                                          path=where, offset=start)
                if h is not None:
                    h.update(out)
                    h2.update(out)
                    if pieces is not None:
                        pieces.append(out)
                if d.eof or not d.unconsumed_tail:
                    break
                data = d.unconsumed_tail
            if d.eof:
                end = len(self.buf) - len(d.unused_data)
                crc = zlib.crc32(self.mv[seg:end], crc)
                self.bpos = end
                break
            crc = zlib.crc32(self.mv[seg:], crc)
            self.bpos = len(self.buf)
            if not self._read_more():
                raise PackFormatError("pack truncated inside a zlib stream", path=where, offset=start)
            seg = self.bpos
        if got != size:
            raise PackFormatError(f"entry inflates to {got} bytes, header says {size}", path=where, offset=start)
        if h is None:
            return crc, None, None, None
        return crc, h.digest(), h2.digest(), (b"".join(pieces) if pieces is not None else None)


def delta_result_size(delta: bytes) -> int:
    """The target size a delta's header declares; 0 when it is unreadable (resolving the delta reports that,
    at its offset, in the order git reports errors: the receive phase does not)."""
    try:
        return decode_delta_header(delta)[1]
    except PackFormatError:
        return 0


# --------------------------------------------------------------------------------------
# The source: a path or a binary stream.


def source_label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


def open_source(source) -> tuple[BinaryIO, bool]:
    if isinstance(source, (str, os.PathLike)):
        try:
            return open(source, "rb", buffering=0), True
        except OSError as err:
            raise InvalidInputError(f"cannot open pack: {err.strerror}", path=str(source)) from err
    if not hasattr(source, "read"):
        raise InvalidInputError(f"pack source must be a path or a binary stream, not {type(source).__name__}")
    return source, False


# --------------------------------------------------------------------------------------
# Collisions: what the receiver and the resolvers record for the check phase to compare.


def strong_digest(typ: int, data: bytes) -> bytes:
    """SHA-256 of an object (git header + content): compares incoming with existing content."""
    h = hashlib.sha256(TYPE_HEADER[typ] + b"%d\0" % len(data))
    h.update(data)
    return h.digest()
