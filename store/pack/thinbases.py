"""index-pack's phase 3: a thin pack's missing REF_DELTA bases appended from the repository.

git's ``index-pack --fix-thin`` (``fix_unresolved_deltas``): for each still-unresolved REF_DELTA, in pack
order, its base is read from the repository and appended as a full object (zlib level 1, git's default
``core.compression`` for them); the subtree hanging off it is resolved by phase 2's resolver; then the header's
object count and the trailer are rewritten. For many unresolved deltas every base is appended at once and the
subtrees are resolved on all cores, then checked to be exactly git's order (else undone and redone in order,
as git does). :class:`.indexpack.IncomingPack` runs it on the quarantined pack it is building.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from typing import TYPE_CHECKING

from ..errors import CorruptObjectError, ObjectMissingError, PackFormatError
from ..fsck import FsckOptions
from ..objects import hash_object
from .format import encode_entry_header
from .receive import READ_CHUNK, Entries, ExistingIds, Stats
from .resolvedeltas import Resolver, run_workers

if TYPE_CHECKING:
    from ..objdir import ObjectSnapshot

THIN_ZLIB_LEVEL = 1             # git's default core.compression for objects index-pack appends


class ThinBases:
    """Appends a thin pack's missing bases to the quarantined pack ``fd_pack`` (read through ``snapshot``)."""

    def __init__(self, fd_pack: int, label: str, snapshot: "ObjectSnapshot", fsck: FsckOptions | None) -> None:
        self.fd_pack = fd_pack
        self.label = label            # the input's name: what errors say
        self.snapshot = snapshot
        self.fsck = fsck
        self.workers = 1              # processes that resolved the appended bases' subtrees
        self.peak_rss_workers = 0

    def fix_unresolved(self, e: Entries, res: Resolver, oids: bytearray, rtypes: bytearray,
                       unresolved: list[int], fix_thin: bool, existing: ExistingIds, stats_all: list[Stats],
                       trailer_off: int, progress, nproc: int = 1, fork: bool = False) -> int:
        """Append missing REF_DELTA bases from the repository (git's fix_unresolved_deltas order); the number
        appended. ``fork``: first try all at once on ``nproc`` processes (the caller's choice to fork)."""
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
        if fork and nproc > 1:
            # All at once needs every base's existence first: one lookup for each the snapshot lacks.
            existing.learn(ref_base.values())
            added = self._fix_thin_parallel(e, oids, rtypes, candidates, ref_base, unresolved, existing,
                                            stats_all, trailer_off, progress, nproc)
            if added is not None:
                return added
        # Drop the received trailer; bases are appended after the last entry.
        os.ftruncate(self.fd_pack, trailer_off)
        e.offsets.pop()  # sentinel
        write_off = trailer_off
        added = 0
        stats = Stats()
        counted = [0]
        res.progress = progress
        res.progress_base = e.deltas - len(unresolved)
        # Appended bases are roots: their id/type go into the local arrays; the deltas they resolve
        # are written by the resolver into the shared maps and copied back below.
        looked_up: set[bytes] = set()
        for i in candidates:
            if res.rtypes[i]:
                continue
            base_oid = ref_base[i]
            if base_oid not in existing:
                # git reads the base (repo_read_object_file: a miss re-prepares the packs) only when its
                # delta is still unresolved at its turn, as here: a base that an appended base's subtree
                # produces (most of a thin push's REF bases) is never looked up in the repository. Each
                # distinct base once: many deltas against one missing base must not re-list once each.
                if base_oid in looked_up:
                    continue
                looked_up.add(base_oid)
                existing.learn((base_oid,))
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

    def _raise_if_unresolved(self, e: Entries, rtypes: bytearray, unresolved: list[int],
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

    def _append_base(self, e: Entries, oids: bytearray, rtypes: bytearray, base_oid: bytes,
                     write_off: int) -> tuple[int, int, bytes]:
        """Append one repository object as a full entry at ``write_off``: (next offset, type, data)."""
        btype, data = self.snapshot.read(base_oid)   # (a base ExistingIds.learn found late: a fresh lookup)
        if hash_object(btype, data) != base_oid:
            raise CorruptObjectError("local object is corrupt (does not hash to its name)", oid=base_oid)
        entry = encode_full_entry(int(btype), data)
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

    def _fix_thin_parallel(self, e: Entries, oids: bytearray, rtypes: bytearray, candidates: list[int],
                           ref_base: dict[int, bytes], unresolved: list[int], existing: ExistingIds,
                           stats_all: list[Stats], trailer_off: int, progress, nproc: int) -> int | None:
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
        res2 = Resolver(e, self.fd_pack, self.label, existing, self.fsck, nslots=nproc)
        res2.skip_duplicates = True
        e.oids = bytearray()
        try:
            res2.rtypes[:len(rtypes)] = bytes(rtypes)   # phase-1 results: resolved deltas stay resolved
            roots = list(range(n, len(e.types)))
            outs, peak = run_workers(res2, roots, nproc, progress, e.deltas,
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
        self.workers = nproc
        self._raise_if_unresolved(e, rtypes, unresolved, ref_base)
        return len(order)

    def rewrite_header_and_trailer(self, count: int) -> bytes:
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


def encode_full_entry(typ: int, data: bytes) -> bytes:
    """A pack entry of a whole object, compressed as git's index-pack compresses the bases it appends."""
    return encode_entry_header(typ, len(data)) + zlib.compress(data, THIN_ZLIB_LEVEL)
