"""index-pack: turn an incoming packfile into an installed pack (+ idx + rev) in a repository.

Pipeline (each phase timed in :attr:`IndexPackResult.elapsed`):

1. **receive** — the source (path or stream) is read ONCE, in chunks, and
   written into ``objects/incoming-<random>/tmp_pack_*`` while it is parsed:
   header, object count, each entry's type/size header, the bounds of each
   zlib stream (inflated to verify; non-delta objects are hashed), CRC32 per
   entry, the trailing SHA-1. Nothing is allocated from a declared size: a
   zlib stream is inflated with ``max_length = declared size + 1`` (large
   objects in bounded chunks), so a 2^60-byte header costs nothing.
2. **resolve** — OFS_DELTA and REF_DELTA children are resolved depth-first
   from each base, holding only the current chain of inflated objects. The
   bases are shared out to forked worker processes (one per core) which read
   the quarantined pack with pread and write the object ids and types into a
   shared anonymous mmap; they report collisions/strict links over a pipe.
3. **thin** (``fix_thin``) — REF_DELTA bases missing from the pack are read
   from the repository, appended as full objects (zlib level 1, in the order
   ``git index-pack --fix-thin`` uses), the header count and trailer are
   rewritten. For many unresolved deltas all bases are appended at once and
   their subtrees resolved on all cores, then checked to be exactly git's order
   (else redone sequentially, as git does). A delta reached twice (duplicate
   base object) is refused, as git refuses it.
4. **check** — collision check: an incoming object whose id already exists
   must have the same content. Existence comes from ONE
   :meth:`ObjectDirectory.snapshot` taken before the pack is read: no
   per-object stat/open/readdir (seed 000_9777a3acf68a3210.txt). With
   ``strict``, objects linked from incoming commits/trees/tags must exist.
5. **index** — ``.idx`` v2 and ``.rev`` written, byte-identical to git's.
6. **install** — see :meth:`IncomingPack.commit` for the durability order.
7. **refs** — optional all-or-nothing compare-and-swap ref updates.

Any failure before install raises a typed :class:`StoreError` naming the
entry offset, removes the quarantine and leaves the repository unchanged.
"""
from __future__ import annotations

import bisect
import hashlib
import mmap
import os
import resource
import select
import shutil
import struct
import tempfile
import time
import zlib
from array import array
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, ContextManager, Sequence

from .. import durable
from ..errors import (
    CollisionError,
    CorruptObjectError,
    InvalidInputError,
    LimitExceededError,
    ObjectMissingError,
    PackFormatError,
    StoreError,
    WriteFailedError,
)
from ..faults import fault_point
from ..forked import child_main, kill_and_reap, read_outcome
from ..fsck import STRICT, FsckChecker, FsckOptions, FsckState
from ..fsck.linkset import select20, sort_unique20
from ..install import InstallOutcome, PackFiles, install_pack, update_refs
from ..lease import Lease, token_of
from ..lease import check as check_lease
from ..objects import OFS_DELTA, REF_DELTA, ZERO_OID, ObjectType, hash_object
from ..owner import with_owner
from ..refs import RefUpdate
from .format import PACK_HEADER_SIZE, decode_entry_header, encode_entry_header, parse_pack_header
from .idxwrite import DEFAULT_OFF32_LIMIT, write_index
from .quarantine import create_quarantine
from .resolve import apply_delta_checked

if TYPE_CHECKING:
    from ..objdir import ObjectSnapshot

from ..progress import Progress

READ_CHUNK = 1 << 20            # bytes read from the source per call
LARGE_OBJECT = 16 << 20         # objects above this are inflated in bounded pieces
INFLATE_PIECE = 4 << 20         # output piece size for large objects
HEADER_ROOM = 64                # an entry header is at most 1+9+10 (OFS) or 1+9+20 (REF) bytes
THIN_ZLIB_LEVEL = 1             # git's default core.compression for objects index-pack appends
FORK_MIN_DELTAS = 2000          # below this, resolving in-process beats forking
#: Ids of the smallest existing packs are copied into one set (<= ~5 MB); larger packs are probed via their idx (~3 us).
SMALL_PACK_IDS = 50_000

_TYPE_HEADER = {1: b"commit ", 2: b"tree ", 3: b"blob ", 4: b"tag "}


@dataclass(frozen=True)
class IndexPackResult:
    outcome: InstallOutcome
    pack_name: str            # "pack-<hex checksum>"
    checksum: str             # hex pack checksum (trailer)
    pack_path: Path
    idx_path: Path
    rev_path: Path
    keep_path: Path | None    # the .keep this call created (release with release_keep)
    objects: int
    deltas: int
    bytes: int                # size of the installed pack file
    received_bytes: int       # bytes read from the source
    thin_bases_added: int
    collisions_checked: int   # incoming objects that already existed (content compared)
    large_offsets: int        # idx entries in the 64-bit offset table
    workers: int              # resolver processes used (1 = in-process)
    thin_workers: int = 1     # processes that resolved the deltas on appended thin bases
    elapsed: dict[str, float] = field(default_factory=dict)
    peak_rss: int = 0         # bytes: max over this process and its resolver processes
    peak_rss_workers: int = 0
    refs_updated: tuple[str, ...] = ()
    durability: dict[str, int] = field(default_factory=dict)

    def as_counters(self) -> dict[str, object]:
        """Flat counters for a job record."""
        out: dict[str, object] = {
            "objects": self.objects, "deltas": self.deltas, "bytes": self.bytes,
            "received_bytes": self.received_bytes, "thin_bases_added": self.thin_bases_added,
            "collisions_checked": self.collisions_checked, "workers": self.workers,
            "thin_workers": self.thin_workers,
            "peak_rss": self.peak_rss, "peak_rss_workers": self.peak_rss_workers,
            "outcome": self.outcome.value, "pack": self.pack_name,
        }
        for phase, secs in self.elapsed.items():
            out[f"elapsed_{phase}"] = round(secs, 4)
        for key, val in self.durability.items():
            out[f"durability_{key}"] = val
        return out


# --------------------------------------------------------------------------------------
# Existence: answered from one snapshot, in memory.


class _ExistingIds:
    """Membership of object ids in one :class:`ObjectSnapshot`, with no filesystem calls.

    Loose ids come from the snapshot's listing. Ids of small packs are copied
    into one set (cheaper than probing every idx per object); large packs are
    probed through their already-mmapped idx.
    """

    def __init__(self, snapshot) -> None:
        self.snapshot = snapshot
        self.loose = snapshot.loose_ids
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
        self.empty = not self.loose and not small and not large
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
        return False


# --------------------------------------------------------------------------------------
# Parsed entries (pack order), compact: arrays, not per-object Python objects.


class _Entries:
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

    def __len__(self) -> int:
        return len(self.types)


class _Stats:
    def __init__(self) -> None:
        self.collisions: list[tuple[int, bytes]] = []   # (entry index, sha256 of incoming content)
        self.fsck: FsckState | None = None              # --strict: links by type, .gitmodules blobs


def _checker(opts: FsckOptions | None, stats: _Stats) -> FsckChecker | None:
    if opts is None:
        return None
    if stats.fsck is None:
        stats.fsck = FsckState()
    return FsckChecker(opts, stats.fsck)


# --------------------------------------------------------------------------------------
# Phase 1: receive.


class _Receiver:
    """Copies the source into the quarantined pack file while parsing it."""

    def __init__(self, source: BinaryIO, fd: int, label: str, *, max_pack_bytes: int | None,
                 existing: _ExistingIds, fsck: FsckOptions | None, progress: Progress | None) -> None:
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
        self.stats = _Stats()

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
    def run(self) -> tuple[_Entries, int, bytes]:
        """Parse everything; returns (entries, trailer offset, pack checksum)."""
        if self._ensure(12) < 12:
            raise PackFormatError("pack truncated: no complete header", path=self.where, offset=0)
        _version, count = parse_pack_header(bytes(self.mv[0:PACK_HEADER_SIZE]), path=self.where)
        self.bpos = PACK_HEADER_SIZE
        entries = _Entries()
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

    def _parse_entries(self, e: _Entries, count: int) -> None:
        where = self.where
        offsets, types, hdrlens, sizes, crcs = e.offsets, e.types, e.hdrlens, e.sizes, e.crcs
        oids, first_child, next_sibling, ref_first = e.oids, e.first_child, e.next_sibling, e.ref_first
        existing = self.existing
        check_existing = not existing.empty
        stats = self.stats
        fsck = _checker(self.fsck_opts, stats)
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
                        h = sha1(_TYPE_HEADER[typ])
                        h.update(b"%d\0" % size)
                        h.update(out)
                        oid = h.digest()
                        oids += oid
                        if check_existing and oid in existing:
                            stats.collisions.append((i, _strong_digest(typ, out)))
                        if fsck is not None:
                            fsck.check_received(typ, out, oid, size, where=where, offset=start)
                    else:
                        oids += zero_oid
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
            h = hashlib.sha1(_TYPE_HEADER[typ] + b"%d\0" % size)
            h2 = hashlib.sha256(_TYPE_HEADER[typ] + b"%d\0" % size)
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


# --------------------------------------------------------------------------------------
# Phase 2: resolve deltas (depth-first from each base; only the chain is held).


class _Resolver:
    """Shared state for resolving; forked workers inherit it (copy-on-write + shared mmaps)."""

    def __init__(self, e: _Entries, fd: int, where: str, existing: _ExistingIds, fsck: FsckOptions | None,
                 nslots: int) -> None:
        self.e = e
        self.fd = fd
        self.where = where
        self.existing = existing
        self.fsck_opts = fsck
        n = len(e)
        self.n = n
        # Shared between processes: object ids, resolved types, per-worker progress, work counter.
        self.shared_oids = mmap.mmap(-1, max(20 * n, 1))
        self.shared_oids[:20 * n] = e.oids
        self.rtypes = mmap.mmap(-1, max(n, 1))
        rt = bytes(t if t < 6 else 0 for t in e.types)
        self.rtypes[:n] = rt
        self.ctl = mmap.mmap(-1, 8 * (nslots + 4))
        self.nslots = nslots
        self.skip_duplicates = False             # the parallel thin path checks duplicates afterwards
        self.progress: Progress | None = None   # in-process only; forked workers report via ctl
        self.progress_base = 0
        self.progress_total = e.deltas

    def close(self) -> None:
        for m in (self.shared_oids, self.rtypes, self.ctl):
            m.close()

    # -- control block: [0] next root index, [1] abort flag, [4+w] progress of worker w
    def _ctl_get(self, k: int) -> int:
        return struct.unpack_from("<q", self.ctl, 8 * k)[0]

    def _ctl_set(self, k: int, v: int) -> None:
        struct.pack_into("<q", self.ctl, 8 * k, v)

    def resolved_count(self) -> int:
        return sum(self._ctl_get(4 + w) for w in range(self.nslots))

    def inflate(self, i: int) -> bytes:
        e = self.e
        start = e.offsets[i] + e.hdrlens[i]
        end = e.offsets[i + 1]
        raw = os.pread(self.fd, end - start, start)
        try:
            return zlib.decompress(raw, 15, max(e.sizes[i], 1))
        except zlib.error as err:  # verified while receiving; the file changed under us
            raise PackFormatError(f"entry no longer inflates: {err}", path=self.where, offset=e.offsets[i]) from err

    def children(self, i: int, oid: bytes) -> list[int]:
        e = self.e
        kids = []
        nxt = e.next_sibling
        c = e.first_child[i]
        while c >= 0:
            kids.append(c)
            c = nxt[c]
        c = e.ref_first.get(oid, -1)
        while c >= 0:
            kids.append(c)
            c = nxt[c]
        return kids

    def resolve_tree(self, root: int, base: bytes, rtype: int, oid: bytes, stats: _Stats, slot: int,
                     counted: list[int]) -> None:
        """Resolve every delta below ``root`` depth-first, keeping only the current chain in memory."""
        e = self.e
        where = self.where
        offsets = e.offsets
        rtypes = self.rtypes
        shared = self.shared_oids
        existing = self.existing
        check_existing = not existing.empty
        fsck = _checker(self.fsck_opts, stats)
        sha1 = hashlib.sha1
        header = _TYPE_HEADER[rtype]
        kids = self.children(root, oid)
        stack: list[list] = [[base, kids, 0]] if kids else []
        del base
        while stack:
            frame = stack[-1]
            base, kids, k = frame
            ch = kids[k]
            if k + 1 == len(kids):
                stack.pop()          # last child: the base is no longer needed after this one
            else:
                frame[2] = k + 1
            if rtypes[ch]:
                # Reached twice: two objects with this delta's base id (git dies here too).
                if self.skip_duplicates:
                    continue
                raise PackFormatError("REF_DELTA already resolved (duplicate base object in the pack?)",
                                      path=where, offset=offsets[ch])
            delta = self.inflate(ch)
            obj = apply_delta_checked(base, delta, path=where, offset=offsets[ch])
            del delta
            h = sha1(header)
            h.update(b"%d\0" % len(obj))
            h.update(obj)
            coid = h.digest()
            shared[20 * ch:20 * ch + 20] = coid
            rtypes[ch] = rtype
            if check_existing and coid in existing:
                stats.collisions.append((ch, _strong_digest(rtype, obj)))
            if fsck is not None:
                fsck.check(rtype, obj, coid, where=where, offset=offsets[ch])
            counted[0] += 1
            if counted[0] & 255 == 0:
                self._ctl_set(4 + slot, counted[0])
                if self.progress is not None:
                    self.progress("resolving", self.progress_base + counted[0], self.progress_total)
            ckids = self.children(ch, coid)
            if ckids:
                stack.append([obj, ckids, 0])
            del obj
        self._ctl_set(4 + slot, counted[0])

    def resolve_roots(self, roots: Sequence[int], slot: int, batch: int, lock) -> _Stats:
        """Take batches of roots from the shared counter until none are left (or another worker failed)."""
        stats = _Stats()
        counted = [0]
        e = self.e
        while True:
            with lock if lock is not None else nullcontext():
                start = self._ctl_get(0)
                self._ctl_set(0, start + batch)
            if start >= len(roots) or self._ctl_get(1):
                break
            for r in roots[start:start + batch]:
                self.resolve_tree(r, self.inflate(r), e.types[r], bytes(self.shared_oids[20 * r:20 * r + 20]),
                                  stats, slot, counted)
        return stats


def _check_no_double_resolution(res: _Resolver, e: _Entries, where: str, among: Sequence[int] | None = None) -> None:
    """Two workers may both resolve a delta reachable twice (duplicate base): the counts tell."""
    rt = res.rtypes
    types = e.types
    idx = range(len(types)) if among is None else among
    distinct = sum(1 for i in idx if types[i] >= 6 and rt[i])
    if res.resolved_count() > distinct:
        raise PackFormatError("a REF_DELTA was resolved twice (duplicate base object in the pack?)", path=where)


def _resolve_share(res: "_Resolver", roots: list[int], slot: int, batch: int,
                   lock: Any) -> tuple[list[tuple[int, bytes]], FsckState | None]:
    """In a forked resolver: resolve this slot's share of ``roots``; what the parent merges."""
    stats = res.resolve_roots(roots, slot, batch, lock)
    return stats.collisions, stats.fsck


def _run_workers(res: _Resolver, roots: list[int], nproc: int, progress: Progress | None,
                 total_deltas: int, progress_base: int = 0) -> tuple[list[_Stats], int]:
    """Fork ``nproc`` workers over ``roots``; returns their stats and the max RSS among them (bytes)."""
    import multiprocessing

    lock = multiprocessing.get_context("fork").Lock()
    batch = max(1, min(32, len(roots) // (nproc * 64) or 1))
    children: dict[int, tuple[int, int]] = {}   # pid -> (read fd, slot)
    results: dict[int, bytearray] = {}
    peak = 0
    try:
        for slot in range(nproc):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # ---- child: never returns (store/forked.py's protocol)
                os.close(rfd)
                child_main(wfd, partial(_resolve_share, res, roots, slot, batch, lock),
                           on_failure=partial(res._ctl_set, 1, 1))   # tells the siblings to stop
            os.close(wfd)
            children[pid] = (rfd, slot)
            results[pid] = bytearray()
        open_fds = {rfd: pid for pid, (rfd, _slot) in children.items()}
        last = 0.0
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [], 0.1)
            for rfd in ready:
                chunk = os.read(rfd, 1 << 20)
                if chunk:
                    results[open_fds[rfd]] += chunk
                else:
                    os.close(rfd)
                    del open_fds[rfd]
            now = time.monotonic()
            if progress is not None and now - last >= 0.1:
                last = now
                progress("resolving", progress_base + res.resolved_count(), total_deltas)
        outs: list[_Stats] = []
        errors: list[StoreError] = []
        crashes: list[str] = []
        for pid in list(children):
            _pid, status, rusage = os.wait4(pid, 0)
            del children[pid]
            peak = max(peak, rusage.ru_maxrss * 1024)
            out = read_outcome(bytes(results[pid]), status)
            if out.error is not None:
                errors.append(out.error)
            elif out.crash is not None:
                crashes.append(out.crash)
            else:
                st = _Stats()
                st.collisions, st.fsck = out.value
                outs.append(st)
        if errors:
            raise min(errors, key=lambda err: err.offset if err.offset is not None else 1 << 62)
        if crashes:
            raise StoreError(f"delta resolver process failed: {crashes[0]}", path=res.where)
        return outs, peak
    finally:
        for pid, (rfd, _slot) in children.items():
            kill_and_reap(pid)
            try:
                os.close(rfd)
            except OSError:
                pass


# --------------------------------------------------------------------------------------
# The incoming pack: begin (receive → index in quarantine), commit (install), abort.


def _source_label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


def _open_source(source) -> tuple[BinaryIO, bool]:
    if isinstance(source, (str, os.PathLike)):
        try:
            return open(source, "rb", buffering=0), True
        except OSError as err:
            raise InvalidInputError(f"cannot open pack: {err.strerror}", path=str(source)) from err
    if not hasattr(source, "read"):
        raise InvalidInputError(f"pack source must be a path or a binary stream, not {type(source).__name__}")
    return source, False


class IncomingPack:
    """A pack received, verified and indexed inside ``objects/incoming-*``, not yet installed.

    ``begin`` does phases 1-5; :meth:`commit` installs (and updates refs);
    :meth:`abort` removes the quarantine. Used as a context manager, leaving
    the block without ``commit`` aborts.
    """

    # Set by begin(); declared here so the class says what an incoming pack holds.
    keep_message: str | None
    elapsed: dict[str, float]
    counters: durable.DurabilityCounters
    pack_dir: Path
    snapshot: ObjectSnapshot
    fd_pack: int              # -1 once closed

    def __init__(self) -> None:  # use begin()
        self.repo: Any = None
        self.quarantine: Path | None = None
        self.committed = False
        self.result: IndexPackResult | None = None

    # -------------------------------------------------------------------------------
    @classmethod
    def begin(cls, repo, source, *, fix_thin: bool = False, strict: bool = False,
              fsck: FsckOptions | None = None, keep_message: str | None = None, max_pack_bytes: int | None = None,
              processes: int | None = None, progress: Progress | None = None,
              off32_limit: int = DEFAULT_OFF32_LIMIT) -> "IncomingPack":
        self = cls()
        self.repo = repo
        self.keep_message = keep_message
        self.elapsed = {}
        self.counters = durable.DurabilityCounters()
        objects_dir = Path(repo.objects.path)
        self.pack_dir = objects_dir / "pack"
        t0 = time.monotonic()
        # One snapshot of what exists, before the pack is read: every existence question is answered from it.
        snapshot = repo.objects.snapshot()
        existing = _ExistingIds(snapshot)
        self.snapshot = snapshot
        self.quarantine = create_quarantine(objects_dir)
        self._writing = self.quarantine   # the file being written: what a full disk's error names
        try:
            opts = None
            if strict or fsck is not None:
                # index-pack's FSCK_OPTIONS_MISSING_GITMODULES: a .gitmodules blob absent everywhere is
                # printed by git, not refused (the links check refuses a missing object anyway).
                opts = replace(fsck or STRICT, missing_gitmodules_is_error=False)
            self._build(source, existing, fix_thin=fix_thin, strict=opts, max_pack_bytes=max_pack_bytes,
                        processes=processes, progress=progress, off32_limit=off32_limit, t0=t0)
        except OSError as err:
            # Reading the source already raised InvalidInputError: this is our own writing (ENOSPC, EFBIG, EIO).
            self.abort()
            raise WriteFailedError(f"writing the incoming pack failed: {err.strerror}", errno=err.errno,
                                   path=self._writing) from err
        except BaseException:
            self.abort()
            raise
        return self

    def _build(self, source, existing: _ExistingIds, *, fix_thin, strict, max_pack_bytes, processes,
               progress, off32_limit, t0) -> None:
        q = self.quarantine
        self.strict = strict is not None
        self.fsck_opts: FsckOptions | None = strict
        fd_pack, tmp_pack = tempfile.mkstemp(prefix="tmp_pack_", dir=q)
        self.tmp_pack = self._writing = Path(tmp_pack)
        self.fd_pack = fd_pack
        stream, close_stream = _open_source(source)
        # Errors name the input (offsets are offsets in it), not the quarantine file that is removed.
        self.label = label = _source_label(source)
        try:
            rx = _Receiver(stream, fd_pack, label, max_pack_bytes=max_pack_bytes, existing=existing,
                           fsck=strict, progress=progress)
            try:
                entries, trailer_off, checksum = rx.run()
            except zlib.error as err:
                raise PackFormatError(f"corrupt zlib stream: {err}", path=label,
                                      offset=rx.boff + rx.bpos) from err
        finally:
            if close_stream:
                stream.close()
        self.received_bytes = rx.total
        stats_all = [rx.stats]
        t1 = time.monotonic()
        self.elapsed["receive"] = t1 - t0

        # ---- resolve
        n = len(entries)
        nproc = processes if processes is not None else len(os.sched_getaffinity(0))
        nproc = max(1, nproc)
        res = _Resolver(entries, fd_pack, label, existing, strict, nslots=max(nproc, 1))
        entries.oids = bytearray()  # the shared map holds them now
        self.peak_rss_workers = 0
        self.workers = 1
        self.thin_workers = 1
        try:
            if entries.deltas:
                shared = res.shared_oids
                roots = [i for i in range(n) if entries.types[i] < 6 and
                         (entries.first_child[i] >= 0 or shared[20 * i:20 * i + 20] in entries.ref_first)]
                if nproc > 1 and entries.deltas >= FORK_MIN_DELTAS and len(roots) > 1:
                    # Big trees first so the last batches are small ones.
                    roots.sort(key=lambda r: -self._direct_children(entries, r, shared))
                    outs, self.peak_rss_workers = _run_workers(res, roots, nproc, progress, entries.deltas)
                    stats_all.extend(outs)
                    self.workers = nproc
                    _check_no_double_resolution(res, entries, label)
                else:
                    res.progress = progress
                    stats_all.append(res.resolve_roots(roots, 0, len(roots) or 1, None))
                    res.progress = None
            t2 = time.monotonic()
            self.elapsed["resolve"] = t2 - t1

            # ---- thin bases
            oids = bytearray(res.shared_oids) if n else bytearray()
            rtypes = bytearray(res.rtypes) if n else bytearray()
            unresolved = [i for i in range(n) if not rtypes[i]]
            thin_added = 0
            if unresolved:
                thin_added = self._fix_unresolved(entries, res, oids, rtypes, unresolved, fix_thin, existing,
                                                  stats_all, trailer_off, progress, nproc)
            if progress is not None and entries.deltas:
                progress("resolving", entries.deltas, entries.deltas)
        finally:
            res.close()
        if thin_added:
            checksum = self._rewrite_header_and_trailer(len(entries))
        # The delta graph is no longer needed: free it before the checks and the index.
        entries.ref_first = {}
        entries.first_child = entries.next_sibling = entries.sizes = None  # type: ignore[assignment]
        t3 = time.monotonic()
        self.elapsed["thin"] = t3 - t2

        # ---- checks: collisions and (strict) connectivity, against the snapshot
        self.collisions_checked = self._check_collisions(stats_all, entries, oids, rtypes)
        nobj = len(entries)
        fsck = None
        if strict is not None:
            fsck = self._check_links(strict, stats_all, oids, rtypes, nobj, existing)
        t4 = time.monotonic()
        self.elapsed["check"] = t4 - t3

        # ---- index
        offsets = entries.offsets[:nobj]
        fd_idx, tmp_idx = tempfile.mkstemp(prefix="tmp_idx_", dir=self.quarantine)
        self._writing = Path(tmp_idx)
        fd_rev, tmp_rev = tempfile.mkstemp(prefix="tmp_rev_", dir=self.quarantine)
        with open(fd_idx, "wb", buffering=1 << 16) as f_idx, open(fd_rev, "wb", buffering=1 << 16) as f_rev:
            info = write_index(f_idx, f_rev, oids, offsets, entries.crcs, checksum, off32_limit=off32_limit)
            os.fchmod(f_idx.fileno(), 0o444)
            os.fchmod(f_rev.fileno(), 0o444)
        self.tmp_idx, self.tmp_rev = Path(tmp_idx), Path(tmp_rev)
        self.oids = oids
        if fsck is not None:
            self._finish_fsck(fsck, tmp_pack=self.tmp_pack, tmp_idx=self.tmp_idx)
        self.large_offsets = info.large_offsets
        self.checksum = checksum
        self.pack_name = f"pack-{checksum.hex()}"
        self.tmp_keep = None
        if self.keep_message is not None:
            # git ignores a .keep's content: packyard's owner record first, the message after it.
            self.tmp_keep = self._write_tmp("tmp_keep_", with_owner(self.keep_message), mode=0o644)
        os.fchmod(self.fd_pack, 0o444)
        self.objects = nobj
        self.deltas = entries.deltas
        self.thin_bases_added = thin_added
        self.pack_bytes = os.fstat(self.fd_pack).st_size
        self.elapsed["index"] = time.monotonic() - t4

    @staticmethod
    def _direct_children(e: _Entries, i: int, oids) -> int:
        k = 0
        c = e.first_child[i]
        while c >= 0:
            k += 1
            c = e.next_sibling[c]
        c = e.ref_first.get(oids[20 * i:20 * i + 20], -1)
        while c >= 0:
            k += 1
            c = e.next_sibling[c]
        return k

    def _write_tmp(self, prefix: str, data: bytes, mode: int = 0o444) -> Path:
        fd, path = tempfile.mkstemp(prefix=prefix, dir=self.quarantine)
        self._writing = Path(path)
        try:
            durable.write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return Path(path)

    # -- thin packs --------------------------------------------------------------
    def _fix_unresolved(self, e: _Entries, res: _Resolver, oids: bytearray, rtypes: bytearray,
                        unresolved: list[int], fix_thin: bool, existing: _ExistingIds, stats_all: list[_Stats],
                        trailer_off: int, progress, nproc: int = 1) -> int:
        """Append missing REF_DELTA bases from the repository (git's fix_unresolved_deltas order)."""
        where = self.label
        unresolved_set = set(unresolved)
        ref_base: dict[int, bytes] = {}
        for base, first in e.ref_first.items():
            c = first
            while c >= 0:
                if c in unresolved_set:
                    ref_base[c] = bytes(base)
                c = e.next_sibling[c]
        candidates = sorted(ref_base)  # by position in the pack
        if not candidates:
            i = unresolved[0]
            raise PackFormatError("delta could not be resolved (its base is an unresolvable delta)",
                                  path=where, offset=e.offsets[i])
        if not fix_thin:
            i = candidates[0]
            hint = " (the base exists in the repository: thin pack, use fix_thin)" if ref_base[i] in existing else ""
            raise ObjectMissingError(f"delta base missing{hint}; {len(unresolved)} unresolved deltas",
                                     oid=ref_base[i], path=where, offset=e.offsets[i])
        existing.learn(ref_base.values())
        if nproc > 1 and len(unresolved) >= FORK_MIN_DELTAS:
            added = self._fix_thin_parallel(e, oids, rtypes, candidates, ref_base, unresolved, existing,
                                            stats_all, trailer_off, progress, nproc)
            if added is not None:
                return added
        # Drop the received trailer; bases are appended after the last entry.
        os.ftruncate(self.fd_pack, trailer_off)
        e.offsets.pop()  # sentinel
        write_off = trailer_off
        added = 0
        stats = _Stats()
        counted = [0]
        res.progress = progress
        res.progress_base = e.deltas - len(unresolved)
        # Appended bases are roots: their id/type go into the local arrays; the deltas they resolve
        # are written by the resolver into the shared maps and copied back below.
        for i in candidates:
            if res.rtypes[i]:
                continue
            base_oid = ref_base[i]
            if base_oid not in existing:
                continue
            write_off, btype, data = self._append_base(e, oids, rtypes, base_oid, write_off)
            added += 1
            # Resolve everything hanging off this base now (may resolve later candidates too).
            e.offsets.append(write_off)   # temporary sentinel so inflate() of earlier entries still works
            res.resolve_tree(len(e.types) - 1, data, btype, base_oid, stats, 0, counted)
            e.offsets.pop()
        res.progress = None
        e.offsets.append(write_off)  # sentinel back
        stats_all.append(stats)
        # Pull the ids/types the in-process resolution wrote into the shared maps.
        for i in unresolved:
            t = res.rtypes[i]
            if t:
                rtypes[i] = t
                oids[20 * i:20 * i + 20] = res.shared_oids[20 * i:20 * i + 20]
        self._raise_if_unresolved(e, rtypes, unresolved, ref_base)
        return added

    def _raise_if_unresolved(self, e: _Entries, rtypes: bytearray, unresolved: list[int],
                             ref_base: dict[int, bytes]) -> None:
        """After appending thin bases: name the first delta still unresolved (its missing base if REF)."""
        still = [i for i in unresolved if not rtypes[i]]
        if still:
            i = still[0]
            base = ref_base.get(i)
            if base is not None:
                raise ObjectMissingError(f"delta base missing from the pack and the repository; "
                                         f"{len(still)} unresolved deltas", oid=base, path=self.label,
                                         offset=e.offsets[i])
            raise PackFormatError(f"delta could not be resolved; {len(still)} unresolved deltas", path=self.label,
                                  offset=e.offsets[i])

    def _append_base(self, e: _Entries, oids: bytearray, rtypes: bytearray, base_oid: bytes,
                     write_off: int) -> tuple[int, int, bytes]:
        """Append one repository object as a full entry at ``write_off``: (next offset, type, data)."""
        btype, data = self.snapshot.read(base_oid)   # (a base _ExistingIds.learn found late: a fresh lookup)
        if hash_object(btype, data) != base_oid:
            raise CorruptObjectError("local object is corrupt (does not hash to its name)", oid=base_oid)
        entry = _encode_entry(int(btype), data)
        view = memoryview(entry)
        pos = write_off
        while view:
            k = os.pwrite(self.fd_pack, view, pos)
            view = view[k:]
            pos += k
        e.offsets.append(write_off)
        e.types.append(int(btype))
        e.hdrlens.append(len(encode_entry_header(int(btype), len(data))))
        e.sizes.append(len(data))
        e.crcs.append(zlib.crc32(entry))
        e.first_child.append(-1)
        e.next_sibling.append(-1)
        oids += base_oid
        rtypes.append(int(btype))
        return write_off + len(entry), int(btype), data

    def _fix_thin_parallel(self, e: _Entries, oids: bytearray, rtypes: bytearray, candidates: list[int],
                           ref_base: dict[int, bytes], unresolved: list[int], existing: _ExistingIds,
                           stats_all: list[_Stats], trailer_off: int, progress, nproc: int) -> int | None:
        """Append every missing base at once and resolve their subtrees on all cores.

        git appends, for each still-unresolved REF_DELTA in pack order, its base. That is the
        first-occurrence order of the distinct missing bases *unless* a base's id is produced by
        resolving another appended base's subtree (then git never appends it). We resolve with
        the first-occurrence order, check that condition, and return None (state restored) when
        it fails so the caller redoes it sequentially, exactly as git does.
        """
        order: list[bytes] = []
        seen: set[bytes] = set()
        for i in candidates:
            b = ref_base[i]
            if b not in seen:
                seen.add(b)
                if b in existing:
                    order.append(b)
        if len(order) < 2:
            return None
        n = len(e.types)
        os.ftruncate(self.fd_pack, trailer_off)
        e.offsets.pop()  # sentinel
        write_off = trailer_off
        for b in order:
            write_off, _btype, _data = self._append_base(e, oids, rtypes, b, write_off)
        e.offsets.append(write_off)
        e.oids = oids  # copied into the new resolver's shared map
        res2 = _Resolver(e, self.fd_pack, self.label, existing, self.fsck_opts, nslots=nproc)
        res2.skip_duplicates = True
        e.oids = bytearray()
        try:
            res2.rtypes[:len(rtypes)] = bytes(rtypes)   # phase-1 results: resolved deltas stay resolved
            roots = list(range(n, len(e.types)))
            outs, peak = _run_workers(res2, roots, nproc, progress, e.deltas,
                                      progress_base=e.deltas - len(unresolved))
            self.peak_rss_workers = max(self.peak_rss_workers, peak)
            new_oids = bytes(res2.shared_oids)
            new_types = bytes(res2.rtypes)
            newly = sum(1 for i in unresolved if new_types[i])
            reached_twice = res2.resolved_count() > newly
        finally:
            res2.close()
        produced = {new_oids[20 * i:20 * i + 20] for i in unresolved if new_types[i]}
        if reached_twice or any(b in produced for b in order):
            # git would not have appended that base (or would die on a delta reached twice): undo, and
            # let the sequential path decide exactly as git does.
            os.ftruncate(self.fd_pack, trailer_off)
            for arr in (e.offsets, e.types, e.hdrlens, e.sizes, e.crcs, e.first_child, e.next_sibling):
                del arr[n:]
            e.offsets.append(trailer_off)
            del oids[20 * n:]
            del rtypes[n:]
            return None
        oids[:] = new_oids
        rtypes[:] = new_types
        stats_all.extend(outs)
        self.thin_workers = nproc
        self._raise_if_unresolved(e, rtypes, unresolved, ref_base)
        return len(order)

    def _rewrite_header_and_trailer(self, count: int) -> bytes:
        """New object count in the header, new SHA-1 trailer over the whole rewritten pack."""
        fd = self.fd_pack
        os.pwrite(fd, struct.pack(">I", count), 8)
        size = os.fstat(fd).st_size
        sha = hashlib.sha1()
        pos = 0
        while pos < size:
            chunk = os.pread(fd, min(READ_CHUNK * 4, size - pos), pos)
            if not chunk:
                break
            sha.update(chunk)
            pos += len(chunk)
        digest = sha.digest()
        os.pwrite(fd, digest, size)
        return digest

    # -- checks ------------------------------------------------------------------
    def _check_collisions(self, stats_all: list[_Stats], e: _Entries, oids: bytearray, rtypes: bytearray) -> int:
        checked = 0
        for st in stats_all:
            for i, digest in st.collisions:
                oid = bytes(oids[20 * i:20 * i + 20])
                have_type, have = self._read_existing(oid)
                if _strong_digest(int(have_type), have) != digest or rtypes[i] != int(have_type):
                    raise CollisionError("incoming object has the id of an existing object but different "
                                         "content (possible SHA-1 collision)", oid=oid, path=self.label,
                                         offset=e.offsets[i])
                checked += 1
        return checked

    def _read_existing(self, oid: bytes) -> tuple[ObjectType, bytes]:
        # Read what the repository stores under ``oid`` without checking it hashes to its name: a
        # different content under the same name is exactly what the collision check must report.
        snap = self.snapshot
        found = snap.packs.find(oid)
        if found is not None:
            return found[0].read_at(found[1])
        return snap.loose.read(oid, verify=False)

    def _check_links(self, opts: FsckOptions, stats_all: list[_Stats], oids: bytearray, rtypes: bytearray, n: int,
                     existing: _ExistingIds) -> FsckChecker:
        """--strict: every link names an object of the type it claims, in the pack or the repository.

        Memory: the links are packed ids (store/fsck/linkset.py); the resolvers' states are merged into
        the largest one (each freed once merged), and the incoming objects of each type are struck off
        that type's links in one merge walk; what is left links to the repository, to nothing, or to
        an object of another type."""
        states = [st.fsck for st in stats_all if st.fsck is not None]
        for st in stats_all:
            st.fsck = None
        states.sort(key=lambda fs: -sum(len(v) for v in fs.links.values()))
        state = states[0] if states else FsckState()
        for other in states[1:]:
            state.merge(other)
        del states
        checker = FsckChecker(opts, state)
        links = state.links
        ob = memoryview(oids)[:20 * n]       # no copy: 3.3 MB for git.git
        try:
            for t, type_links in links.items():
                type_links.discard_packed(sort_unique20(select20(ob, rtypes, t)))
        finally:
            ob.release()                      # oids may be resized later (thin bases)
        repo_type = self._existing_type(existing)

        def incoming_or_repo_type(oid: bytes) -> int | None:
            got = repo_type(oid)
            if got is not None:
                return got
            k = oids.find(oid, 0, 20 * n)   # only for a link the repository does not have: an error either way
            while k >= 0:
                if k % 20 == 0:
                    return int(rtypes[k // 20])
                k = oids.find(oid, k + 1, 20 * n)
            return None
        checker.check_links(lambda oid: None, incoming_or_repo_type, where=self.label)
        return checker

    def _existing_type(self, existing: _ExistingIds) -> Callable[[bytes], int | None]:
        snap = self.snapshot

        def existing_type(oid: bytes) -> int | None:
            if oid not in existing:
                existing.learn((oid,))   # a miss is looked up afresh (ObjectSnapshot.has) before it is "absent"
                if oid not in existing:
                    return None
            return int(snap.read_header(oid)[0])
        return existing_type

    def _finish_fsck(self, checker: FsckChecker, *, tmp_pack: Path, tmp_idx: Path) -> None:
        """fsck_finish: .gitmodules blobs not checked while resolving, read from the quarantined pack
        (now indexed) or the repository."""
        if not checker.state.has_queued_checks():
            return
        from .packdir import PackFile
        pf = PackFile(tmp_idx)
        pf.pack_path = tmp_pack
        snap = self.snapshot
        try:
            def read(oid: bytes) -> tuple[int, bytes] | None:
                off = pf.find_offset(oid)
                if off is not None:
                    t, data = pf.read_at(off)
                    return int(t), data
                if snap.has(oid):
                    t, data = snap.read(oid)
                    return int(t), data
                return None
            checker.finish_gitmodules(read, where=self.label)
        finally:
            pf.close()

    def contains(self, oid: bytes) -> bool:
        """Is ``oid`` one of the incoming objects?"""
        oids = self.oids
        k = oids.find(oid)
        while k >= 0:
            if k % 20 == 0:
                return True
            k = oids.find(oid, k + 1)
        return False

    # -- install -----------------------------------------------------------------
    def commit(self, ref_updates: Sequence[RefUpdate] = (), *, peak_rss_hint: int = 0,
               lease: Lease | None = None) -> IndexPackResult:
        """Install the pack, then update refs: the durability order of store/install.py.

        ``lease`` (store/lease.py): checked before the install and before the ref update (LockLostError:
        nothing published, the quarantine stays for the caller to remove); its token is checked by the
        storage at the ref update (RefStore.update refuses a token older than one that already moved refs here)."""
        if self.committed:
            raise InvalidInputError("incoming pack already committed")
        ref_updates = list(ref_updates)
        self._check_ref_targets(ref_updates)
        check_lease(lease)   # publish only while the lease is still ours
        t0 = time.monotonic()
        files = PackFiles(name=self.pack_name, pack=self.tmp_pack, idx=self.tmp_idx, rev=self.tmp_rev,
                          keep=self.tmp_keep)
        outcome, keep_path = install_pack(files, self.pack_dir, self.counters, fault_prefix="index_pack",
                                          open_fds=[self.fd_pack])
        final = files.finals(self.pack_dir)
        self.remove_quarantine()
        fault_point("index_pack.after_quarantine_removed")
        self.committed = True
        t1 = time.monotonic()
        self.elapsed["install"] = t1 - t0
        if ref_updates:
            check_lease(lease)
        update_refs(self.repo, ref_updates, self.counters, token_of(lease))
        fault_point("index_pack.after_refs")
        self.elapsed["refs"] = time.monotonic() - t1
        peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.result = IndexPackResult(
            outcome=outcome, pack_name=self.pack_name, checksum=self.checksum.hex(),
            pack_path=final["pack"], idx_path=final["idx"], rev_path=final["rev"], keep_path=keep_path,
            objects=self.objects, deltas=self.deltas, bytes=self.pack_bytes, received_bytes=self.received_bytes,
            thin_bases_added=self.thin_bases_added, collisions_checked=self.collisions_checked,
            large_offsets=self.large_offsets, workers=self.workers, thin_workers=self.thin_workers,
            elapsed=dict(self.elapsed),
            peak_rss=max(peak_self, self.peak_rss_workers, peak_rss_hint), peak_rss_workers=self.peak_rss_workers,
            refs_updated=tuple(u.name for u in ref_updates), durability=self.counters.as_dict())
        return self.result

    def _check_ref_targets(self, updates: list[RefUpdate]) -> None:
        """A ref may only name an object that is in this pack or already in the repository."""
        for u in updates:
            if not isinstance(u, RefUpdate):
                raise InvalidInputError(f"ref update must be a RefUpdate, not {type(u).__name__}")
            if len(u.new) != 20:
                raise InvalidInputError(f"ref update for {u.name}: new value must be a 20-byte id")
            if not self.contains(u.new) and u.new not in self.snapshot:
                raise ObjectMissingError(f"ref update for {u.name} names an object that is neither in the pack "
                                         f"nor in the repository", oid=u.new)

    def remove_quarantine(self) -> None:
        """Close the pack fd and delete objects/incoming-* with whatever is left in it."""
        fd = getattr(self, "fd_pack", -1)
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
            self.fd_pack = -1
        if self.quarantine is not None:
            shutil.rmtree(self.quarantine, ignore_errors=True)
            self.quarantine = None

    def abort(self) -> None:
        if not self.committed:
            self.remove_quarantine()

    def __enter__(self) -> "IncomingPack":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()


# --------------------------------------------------------------------------------------

def _strong_digest(typ: int, data: bytes) -> bytes:
    """SHA-256 of an object (git header + content): compares incoming with existing content."""
    h = hashlib.sha256(_TYPE_HEADER[typ] + b"%d\0" % len(data))
    h.update(data)
    return h.digest()


def _encode_entry(typ: int, data: bytes) -> bytes:
    return encode_entry_header(typ, len(data)) + zlib.compress(data, THIN_ZLIB_LEVEL)


def index_pack(repo, source: BinaryIO | str | os.PathLike[str], *, fix_thin: bool = False, strict: bool = False,
               fsck: FsckOptions | None = None, keep_message: str | None = None, ref_updates: Sequence[RefUpdate] = (),
               max_pack_bytes: int | None = None, processes: int | None = None,
               progress: Progress | None = None,
               install_guard: Callable[[], ContextManager] | None = None,
               off32_limit: int = DEFAULT_OFF32_LIMIT) -> IndexPackResult:
    """Receive, verify, index and install a pack; then apply ``ref_updates`` (all or nothing).

    ``install_guard`` (e.g. a repository lock) is entered around install + ref updates only,
    so the long receive/resolve phases run without holding it.
    """
    with IncomingPack.begin(repo, source, fix_thin=fix_thin, strict=strict, fsck=fsck, keep_message=keep_message,
                            max_pack_bytes=max_pack_bytes, processes=processes, progress=progress,
                            off32_limit=off32_limit) as incoming:
        with (install_guard() if install_guard is not None else nullcontext()):
            return incoming.commit(ref_updates)
