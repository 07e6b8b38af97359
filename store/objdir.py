"""The object directory: one front for loose objects and packs (JGit's ObjectDirectory).

Lookup rules (seed 000_9777a3acf68a3210.txt):

* a normal lookup that misses re-lists ``objects/pack`` once and retries
  before saying "missing": a concurrent repack may have moved the object from
  a loose file or an old pack into a new pack;
* ``quick=True`` skips that re-listing, for callers where a miss is the normal
  case (git's OBJECT_INFO_QUICK), e.g. a collision check on incoming objects;
* a directory's mtime/stat data is never used to skip the re-listing (the one exception is
  ``unsafe_trust_dir_mtime=True``, git's rejected stat_validity patch, which exists only as the
  race harness's negative control: ``packyard race --unsafe-dir-cache``);
* a pack that vanished under a reader (ENOENT, or ESTALE over NFS: a repack replaced it)
  is dropped, the directory re-listed and the object looked up in the new packs; a *read*
  that still misses looks in ``objects/pack/preserved/`` (packs a repack replaced, kept
  there for a while: JGit's preserved packs) before it says "missing". Existence checks
  (``locate``/``has``/``freshen``) never answer from ``preserved/``: a writer that skipped an
  object because it exists there would lose it when the preserved pack expires.

Bulk callers take one :class:`ObjectSnapshot` instead of asking per object; its ``read``
falls back to a fresh lookup when a pack of the snapshot has been repacked away.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from .errors import CorruptObjectError, ObjectMissingError
from .loose import LooseObjects
from .objects import ObjectType, hash_object
from .pack.packdir import PackDirectory, PackList, is_gone

PRESERVED_DIR = "preserved"   # objects/pack/preserved: packs a repack replaced (JGit's preserved packs)


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
    objects: "ObjectDirectory | None" = field(default=None, repr=False, compare=False)

    def locate(self, oid: bytes) -> Location:
        if oid in self.loose_ids:
            return Location.LOOSE
        if self.packs.find(oid) is not None:
            return Location.PACKED
        return Location.MISSING

    def __contains__(self, oid: bytes) -> bool:
        return self.locate(oid) is not Location.MISSING

    def read(self, oid: bytes) -> tuple[ObjectType, bytes]:
        """The object as the snapshot knows it; if its pack or loose file is gone since (a repack
        moved it), a fresh lookup through the object directory's rules."""
        found = self.packs.find(oid)
        try:
            if found is not None:
                pack, offset = found
                return pack.read_at(offset)
            if oid in self.loose_ids:
                return self.loose.read(oid)
        except ObjectMissingError:
            if self.objects is None:
                raise
        except OSError as err:
            if not is_gone(err) or self.objects is None:
                raise
        else:
            raise ObjectMissingError("object not in snapshot", oid=oid)
        self.objects.counters.snapshot_fallbacks += 1
        return self.objects.read(oid)


@dataclass
class LookupCounters:
    """What the lookup rules had to do (the race harness and job records read these)."""

    packs_vanished: int = 0       # a listed pack was gone when opened (ENOENT/ESTALE): dropped, re-listed
    relisted_hits: int = 0        # found only after re-listing objects/pack
    preserved_hits: int = 0       # found only in objects/pack/preserved/
    snapshot_fallbacks: int = 0   # an ObjectSnapshot read fell back to a fresh lookup

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class ObjectDirectory:
    """``<git dir>/objects``: delegates to :class:`LooseObjects` and :class:`PackDirectory`."""

    def __init__(self, objects_dir: Path, *, unsafe_trust_dir_mtime: bool = False) -> None:
        """``unsafe_trust_dir_mtime``: UNSAFE, for the race harness's negative control only -- a miss
        re-lists objects/pack only if its stat data changed (see :class:`PackDirectory`)."""
        self.path = objects_dir
        self.loose = LooseObjects(objects_dir)
        self.packs = PackDirectory(objects_dir / "pack", trust_mtime=unsafe_trust_dir_mtime)
        self.preserved = PackDirectory(objects_dir / "pack" / PRESERVED_DIR)
        self.counters = LookupCounters()

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
    def _read_packed(self, oid: bytes, packs: PackList, directory: PackDirectory | None,
                     verify: bool) -> tuple[ObjectType, bytes] | None:
        """Look in ``packs``; a pack found gone is dropped and ``directory`` re-listed (once per vanished pack)."""
        while True:
            gone: list = []
            found = packs.find(oid, gone)
            self.counters.packs_vanished += len(gone)
            if found is None:
                return None
            pack, offset = found
            try:
                obj_type, data = pack.read_at(offset, resolve_ref=self.read)
            except OSError as err:
                if not is_gone(err):
                    raise
                # The pack vanished between listing and opening (repacked away): drop it, re-list.
                self.counters.packs_vanished += 1
                packs = directory.reprepare() if directory is not None else packs.without(pack)
                packs = packs.without(pack)
                continue
            if verify and hash_object(obj_type, data) != oid:
                raise CorruptObjectError("packed object does not hash to its name", oid=oid,
                                         path=pack.pack_path, offset=offset)
            return obj_type, data

    def _read_once(self, oid: bytes, packs: PackList, verify: bool) -> tuple[ObjectType, bytes] | None:
        got = self._read_packed(oid, packs, self.packs, verify)
        if got is not None:
            return got
        try:
            return self.loose.read(oid, verify=verify)
        except ObjectMissingError:
            return None

    def read(self, oid: bytes, *, verify: bool = False) -> tuple[ObjectType, bytes]:
        """The object's type and content; ObjectMissingError only after one re-listing and a look in preserved/."""
        got = self._read_once(oid, self.packs.prepare(), verify)
        if got is not None:
            return got
        # A concurrent repack may have moved it into a new pack (and deleted the loose file or old pack).
        got = self._read_once(oid, self.packs.reprepare(), verify)
        if got is not None:
            self.counters.relisted_hits += 1
            return got
        # ...or replaced the pack this reader's view of the refs still needs: preserved/ has it for a while.
        got = self._read_packed(oid, self.preserved.reprepare(), self.preserved, verify)
        if got is not None:
            self.counters.preserved_hits += 1
            return got
        raise ObjectMissingError("object not found (pack directory re-listed once, preserved packs searched)",
                                 oid=oid, path=self.path)

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        """Type and size; the same rules as :meth:`read` (one re-listing, then preserved/)."""
        for attempt in range(3):
            packs = (self.packs.prepare() if attempt == 0 else self.packs.reprepare() if attempt == 1
                     else self.preserved.reprepare())
            while True:
                found = packs.find(oid)
                if found is None:
                    break
                try:
                    return found[0].header_at(found[1])
                except OSError as err:
                    if not is_gone(err):
                        raise
                    self.counters.packs_vanished += 1
                    packs = packs.without(found[0])
            if attempt < 2:
                try:
                    return self.loose.read_header(oid)
                except ObjectMissingError:
                    continue
        raise ObjectMissingError("object not found (pack directory re-listed once, preserved packs searched)",
                                 oid=oid, path=self.path)

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
                _ = pack.index   # opened (mmapped) now: later lookups in the snapshot make no filesystem calls
            except OSError as err:
                if not is_gone(err):
                    raise
                continue  # deleted between the listing and the open: it is not part of this snapshot
            opened.append(pack)
        if len(opened) != len(packs):
            packs = PackList(tuple(opened))
        return ObjectSnapshot(packs=packs, loose_ids=self.loose.list_ids(), loose=self.loose, objects=self)

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
        """Touch the object's loose file or containing pack (git's check-and-freshen); an object found
        only in a cruft pack is MISSING (the caller writes it anew, as git does)."""
        if self.loose.freshen(oid):
            return Location.LOOSE
        for packs in self._listings():
            found = packs.find_not_cruft(oid)   # a cruft pack's mtime is never touched: write it anew
            if found is not None and found[0].freshen():
                return Location.PACKED
        return Location.MISSING
