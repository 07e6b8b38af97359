"""The object directory: one front for loose objects and packs (JGit's ObjectDirectory).

Lookup rules (seed 000_9777a3acf68a3210.txt):

* a normal lookup that misses re-lists ``objects/pack`` once and retries
  before saying "missing": a concurrent repack may have moved the object from
  a loose file or an old pack into a new pack;
* ``quick=True`` skips that re-listing, for callers where a miss is the normal
  case (git's OBJECT_INFO_QUICK), e.g. a collision check on incoming objects;
* a directory's mtime/stat data is never used to skip the re-listing.

Bulk callers take one :class:`ObjectSnapshot` instead of asking per object.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .errors import CorruptObjectError, ObjectMissingError
from .loose import LooseObjects
from .objects import ObjectType, hash_object
from .pack.packdir import PackDirectory, PackList


class Location(enum.Enum):
    """Where an object was found: a result, not a boolean."""

    LOOSE = "loose"
    PACKED = "packed"
    MISSING = "missing"

    def __bool__(self) -> bool:  # pragma: no cover - guard against "if locate(...)" bugs
        raise TypeError("Location is an enum; compare with Location.MISSING explicitly")


@dataclass(frozen=True)
class ObjectSnapshot:
    """What existed when it was taken: one listing of objects/pack and of every fan-out dir.

    ``locate`` answers from memory only; objects written after the snapshot are
    not seen (by design: callers that need them take a new snapshot).
    """

    packs: PackList
    loose_ids: frozenset[bytes]
    loose: LooseObjects = field(repr=False)

    def locate(self, oid: bytes) -> Location:
        if oid in self.loose_ids:
            return Location.LOOSE
        if self.packs.find(oid) is not None:
            return Location.PACKED
        return Location.MISSING

    def __contains__(self, oid: bytes) -> bool:
        return self.locate(oid) is not Location.MISSING

    def read(self, oid: bytes) -> tuple[ObjectType, bytes]:
        found = self.packs.find(oid)
        if found is not None:
            pack, offset = found
            return pack.read_at(offset)
        if oid in self.loose_ids:
            return self.loose.read(oid)
        raise ObjectMissingError("object not in snapshot", oid=oid)


class ObjectDirectory:
    """``<git dir>/objects``: delegates to :class:`LooseObjects` and :class:`PackDirectory`."""

    def __init__(self, objects_dir: Path) -> None:
        self.path = objects_dir
        self.loose = LooseObjects(objects_dir)
        self.packs = PackDirectory(objects_dir / "pack")

    def _listings(self) -> Iterator[PackList]:
        """The current pack list, then -- only if the caller keeps looking -- one fresh listing.

        This is the lookup rule in one place: a miss re-lists objects/pack exactly once.
        """
        yield self.packs.prepare()
        yield self.packs.reprepare()

    # -- existence ---------------------------------------------------------
    def _locate_once(self, oid: bytes, packs: PackList) -> Location:
        if packs.find(oid) is not None:
            return Location.PACKED
        if self.loose.has(oid):
            return Location.LOOSE
        return Location.MISSING

    def locate(self, oid: bytes, *, quick: bool = False) -> Location:
        where = self._locate_once(oid, self.packs.prepare())
        if where is Location.MISSING and not quick:
            # A concurrent repack may have packed (and pruned) it since our listing.
            fresh = self.packs.reprepare()
            if fresh.find(oid) is not None:
                return Location.PACKED
        return where

    def has(self, oid: bytes, *, quick: bool = False) -> bool:
        return self.locate(oid, quick=quick) is not Location.MISSING

    # -- reading -----------------------------------------------------------
    def _read_once(self, oid: bytes, packs: PackList, verify: bool) -> tuple[ObjectType, bytes] | None:
        for _attempt in range(2):
            found = packs.find(oid)
            if found is None:
                break
            pack, offset = found
            try:
                obj_type, data = pack.read_at(offset, resolve_ref=self.read)
            except FileNotFoundError:
                # The pack vanished between listing and opening (repacked away): re-list once.
                packs = self.packs.reprepare()
                continue
            if verify and hash_object(obj_type, data) != oid:
                raise CorruptObjectError("packed object does not hash to its name", oid=oid,
                                         path=pack.pack_path, offset=offset)
            return obj_type, data
        try:
            return self.loose.read(oid, verify=verify)
        except ObjectMissingError:
            return None

    def read(self, oid: bytes, *, verify: bool = False) -> tuple[ObjectType, bytes]:
        """The object's type and content; raises ObjectMissingError only after one re-listing."""
        for packs in self._listings():
            got = self._read_once(oid, packs, verify)
            if got is not None:
                return got
        raise ObjectMissingError("object not found (pack directory re-listed once)", oid=oid,
                                 path=self.path)

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        for packs in self._listings():
            found = packs.find(oid)
            if found is not None:
                return found[0].header_at(found[1])
            try:
                return self.loose.read_header(oid)
            except ObjectMissingError:
                continue
        raise ObjectMissingError("object not found (pack directory re-listed once)", oid=oid, path=self.path)

    # -- bulk --------------------------------------------------------------
    def snapshot(self) -> ObjectSnapshot:
        """List objects/pack once and every loose fan-out directory once.

        Every listed pack's idx is opened (mmapped) now, so later lookups in the
        snapshot make no filesystem calls and survive a concurrent repack
        deleting the files.
        """
        packs = self.packs.reprepare()
        opened = []
        for pack in packs:
            try:
                pack.index
            except FileNotFoundError:
                continue  # deleted between the listing and the open: it is not part of this snapshot
            opened.append(pack)
        if len(opened) != len(packs):
            packs = PackList(tuple(opened))
        return ObjectSnapshot(packs=packs, loose_ids=self.loose.list_ids(), loose=self.loose)

    def iter_ids(self) -> Iterator[bytes]:
        """Every object id (duplicates across packs/loose removed)."""
        seen: set[bytes] = set()
        snap = self.snapshot()
        for pack in snap.packs:
            for oid in pack.iter_ids():
                if oid not in seen:
                    seen.add(oid)
                    yield oid
        for oid in snap.loose_ids:
            if oid not in seen:
                seen.add(oid)
                yield oid

    def freshen(self, oid: bytes) -> Location:
        """Touch the object's loose file or containing pack (git's check-and-freshen)."""
        if self.loose.freshen(oid):
            return Location.LOOSE
        for packs in self._listings():
            found = packs.find(oid)
            if found is not None and found[0].freshen():
                return Location.PACKED
        return Location.MISSING
