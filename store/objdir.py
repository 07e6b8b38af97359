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

Alternates (``objects/info/alternates``, :mod:`.alternates`: a fork borrowing from its pool) are
searched by the same loop, after the repository's own packs and loose files at each stage: the
current listings, then every directory re-listed once, then every ``preserved/``. So a fork's reader
survives its pool's repack as it survives its own. An object found only there is
``Location.ALTERNATE``; the snapshot's ``packs`` and ``loose_ids`` stay the repository's own (what a
repack may replace or delete), its ``alternates`` the pool's.

Bulk callers take one :class:`ObjectSnapshot` instead of asking per object; its ``read``
falls back to a fresh lookup when a pack of the snapshot has been repacked away.
"""
from __future__ import annotations

import enum
import errno
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from . import fsparallel
from .errors import CorruptObjectError, ObjectMissingError, PackFormatError
from .loose import LooseObjects
from .objects import ObjectType, hash_object
from .pack.packdir import PackDirectory, PackFile, PackList, is_gone

PRESERVED_DIR = "preserved"   # objects/pack/preserved: packs a repack replaced (JGit's preserved packs)


class Location(enum.Enum):
    """Where an object was found: a result, not a boolean."""

    LOOSE = "loose"
    PACKED = "packed"
    ALTERNATE = "alternate"   # only in an alternate object directory (the pool), loose or packed
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
    #: the alternates' own snapshots, in lookup order (taken with this one; empty without alternates)
    alternates: "tuple[ObjectSnapshot, ...]" = field(default=(), repr=False, compare=False)

    def locate(self, oid: bytes) -> Location:
        if oid in self.loose_ids:
            return Location.LOOSE
        if self.packs.find(oid) is not None:
            return Location.PACKED
        for alt in self.alternates:
            if alt.locate(oid) is not Location.MISSING:
                return Location.ALTERNATE
        return Location.MISSING

    def locate_local(self, oid: bytes) -> Location:
        """LOOSE, PACKED or MISSING in this repository's own listings (its alternates not asked)."""
        if oid in self.loose_ids:
            return Location.LOOSE
        return Location.PACKED if self.packs.find(oid) is not None else Location.MISSING

    def __contains__(self, oid: bytes) -> bool:
        return self.locate(oid) is not Location.MISSING

    def has(self, oid: bytes) -> bool:
        """In the snapshot, or -- on a miss -- found by one lookup of the object directory (re-listing
        objects/pack, then preserved/). The receive checks ask this before they call a linked object absent:
        a snapshot lists objects/pack and then every fan-out dir, and a loose repack (on another NFS host,
        hundreds of round trips later) can move an object from loose to a new pack in between, so the
        snapshot has it in neither (git re-prepares its packs on a miss too). Only misses pay the lookup: a
        link the snapshot lacks is an error or a rare race, never the common case."""
        if self.locate(oid) is not Location.MISSING:
            return True
        if self.objects is None or not self.objects.has(oid):
            return False
        self.objects.counters.snapshot_misses_found += 1
        return True

    def read(self, oid: bytes) -> tuple[ObjectType, bytes]:
        """The object as the snapshot knows it (its own listings, then its alternates'); if its pack or
        loose file is gone since (a repack moved it), or the snapshot lacks it (:meth:`has` found it
        afresh), a fresh lookup through the object directory's rules, as :meth:`read_header` does."""
        for snap in (self, *self.alternates):
            found = snap.packs.find(oid)
            try:
                if found is not None:
                    pack, offset = found
                    return pack.read_at(offset)
                if oid in snap.loose_ids:
                    return snap.loose.read(oid)
            except ObjectMissingError:
                if self.objects is None:
                    raise
                break
            except OSError as err:
                if not is_gone(err) or self.objects is None:
                    raise
                break
        else:
            if self.objects is None:
                raise ObjectMissingError("object not in snapshot", oid=oid)
        self.objects.counters.snapshot_fallbacks += 1
        return self.objects.read(oid)

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        """Type and size: the entry header in the pack the snapshot lists it in, else the object directory's
        lookup rules (a loose object, one not in this snapshot's packs, or one whose pack is gone since: a
        repack moved it, as :meth:`read` falls back)."""
        for snap in (self, *self.alternates):
            found = snap.packs.find(oid)
            if found is not None:
                try:
                    return found[0].header_at(found[1])
                except OSError as err:
                    if not is_gone(err) or self.objects is None:
                        raise
                    self.objects.counters.snapshot_fallbacks += 1
                    break
        if self.objects is None:
            return self.loose.read_header(oid)
        return self.objects.read_header(oid)


@dataclass
class LookupCounters:
    """What the lookup rules had to do (the race harness and job records read these)."""

    packs_vanished: int = 0       # a listed pack was gone when opened (ENOENT/ESTALE): dropped, re-listed
    relisted_hits: int = 0        # found only after re-listing objects/pack
    preserved_hits: int = 0       # found only in objects/pack/preserved/
    snapshot_fallbacks: int = 0   # an ObjectSnapshot read fell back to a fresh lookup
    snapshot_misses_found: int = 0  # an object a snapshot lacked, found by a fresh lookup (ObjectSnapshot.has)
    packs_unreadable: int = 0     # a listed pack could not be read (truncated, corrupt): skipped for that lookup

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


#: A lookup re-lists a pack directory at most this many times because packs it found vanished; past it
#: the lookup goes on with the listing it has (every pack found gone stays out of the candidates, so a
#: finite listing always ends). Bounds a lookup under a directory whose packs keep disappearing.
MAX_VANISHED_RELISTINGS = 8

#: What a probe of one pack found: a result, or ``None`` when the object is not where the idx said
#: (only freshen can say that: the pack's file vanished before its mtime could be touched).
T = TypeVar("T")


class Stage(enum.Enum):
    """Which listing of the search answered (a result, not a boolean)."""

    CURRENT = "current"        # the pack list this reader had, or its loose file
    RELISTED = "relisted"      # objects/pack listed again after a miss
    PRESERVED = "preserved"    # objects/pack/preserved: a pack a repack replaced


@dataclass
class _Search:
    """One lookup's memory across listings: packs found gone or unreadable stay out of its candidates."""

    gone: set[Path] = field(default_factory=set)          # by idx path: preserved/ reuses the names
    unreadable: dict[Path, PackFormatError] = field(default_factory=dict)
    relistings_left: int = MAX_VANISHED_RELISTINGS

    def skips(self, pack: PackFile) -> bool:
        return pack.idx_path in self.gone or pack.idx_path in self.unreadable


class ObjectDirectory:
    """``<git dir>/objects``: delegates to :class:`LooseObjects` and :class:`PackDirectory`.

    Every lookup (``locate``, ``read``, ``read_header``, ``freshen``) goes through ONE search loop,
    :meth:`_search` (JGit's ``searchPacksAgain``), with ONE handler for a pack that failed under it,
    :meth:`_pack_failed` (JGit's ``handlePackError``).
    """

    def __init__(self, objects_dir: Path, *, unsafe_trust_dir_mtime: bool = False,
                 alternates: Sequence[Path] = ()) -> None:
        """``unsafe_trust_dir_mtime``: UNSAFE, for the race harness's negative control only -- a miss
        re-lists objects/pack only if its stat data changed (see :class:`PackDirectory`).
        ``alternates``: the object directories this one borrows from, in lookup order (the whole chain,
        already read and confined: :func:`.alternates.read_chain`)."""
        self.path = objects_dir
        self.loose = LooseObjects(objects_dir)
        self.packs = PackDirectory(objects_dir / "pack", trust_mtime=unsafe_trust_dir_mtime)
        self.preserved = PackDirectory(objects_dir / "pack" / PRESERVED_DIR)
        self.counters = LookupCounters()
        #: one ObjectDirectory per alternate (each without alternates of its own: the chain is flat here)
        self.alternates: tuple[ObjectDirectory, ...] = tuple(
            ObjectDirectory(Path(p), unsafe_trust_dir_mtime=unsafe_trust_dir_mtime) for p in alternates)
        self._chain: tuple[ObjectDirectory, ...] = (self, *self.alternates)

    # -- the one search loop -------------------------------------------------
    def _search(self, oid: bytes, probe: Callable[[PackFile, int], T | None],
                loose: Callable[[LooseObjects, bytes], T | None] | None, *, relist: bool, preserved: bool,
                skip_cruft: bool = False) -> tuple[T, Stage, ObjectDirectory] | None:
        """The lookup rule, in one place: the current pack list (then the loose file), a miss re-lists
        ``objects/pack`` once (then the loose file again), and a read that still misses looks in
        ``preserved/``; at each stage this directory first, then each alternate (the pool) the same way.
        ``probe(pack, offset)`` reads what the caller wants from one pack, ``loose(loose_objects, oid)``
        from one loose half; a pack found gone or unreadable under it is handled by :meth:`_pack_failed` and
        stays out of this lookup's candidates across every re-listing, so the loop ends (a finite number of
        packs and directories, a bounded number of re-listings) even when dead packs keep being listed.
        Returns (what the probe gave, the stage, the directory that answered)."""
        search = _Search()
        for where in self._chain:
            got = self._in_packs(oid, where.packs, where.packs.prepare(), probe, search, skip_cruft)
            if got is None and loose is not None:
                got = loose(where.loose, oid)
            if got is not None:
                return got, Stage.CURRENT, where
        if relist:
            # A concurrent repack (here or in the pool) may have packed (and pruned) it since our listing.
            for where in self._chain:
                got = self._in_packs(oid, where.packs, where.packs.reprepare(), probe, search, skip_cruft)
                if got is None and loose is not None:
                    got = loose(where.loose, oid)
                if got is not None:
                    self.counters.relisted_hits += 1
                    return got, Stage.RELISTED, where
        if preserved:
            # ...or replaced the pack this reader's view of the refs still needs: preserved/ has it for a while.
            for where in self._chain:
                got = self._in_packs(oid, where.preserved, where.preserved.reprepare(), probe, search, skip_cruft)
                if got is not None:
                    self.counters.preserved_hits += 1
                    return got, Stage.PRESERVED, where
        if search.unreadable:   # it may be in a pack that cannot be read: say so rather than "missing"
            raise next(iter(search.unreadable.values()))
        return None

    def _in_packs(self, oid: bytes, directory: PackDirectory, packs: PackList,
                  probe: Callable[[PackFile, int], T | None], search: _Search, skip_cruft: bool) -> T | None:
        while True:
            found = None
            for pack in packs:
                if search.skips(pack) or (skip_cruft and pack.is_cruft):
                    continue
                try:
                    offset = pack.find_offset(oid)
                except (OSError, PackFormatError) as err:
                    if not self._pack_failed(pack, err, search):
                        raise
                    continue
                if offset is not None:
                    found = pack, offset
                    break
            if found is None:
                return None
            pack, offset = found
            try:
                got = probe(pack, offset)
            except (OSError, PackFormatError) as err:
                if not self._pack_failed(pack, err, search):
                    raise
                got = None
            if got is not None:
                return got
            if pack.idx_path in search.gone and search.relistings_left > 0:
                # The repack that removed it installed what replaces it: list the directory again.
                search.relistings_left -= 1
                packs = directory.reprepare()
            elif not search.skips(pack):
                return None

    def _pack_failed(self, pack: PackFile, err: BaseException, search: _Search) -> bool:
        """The one handler for a pack that failed under a lookup; True if the lookup goes on without it.

        Gone (ENOENT, ESTALE: repacked away, or only its .idx is left): counted, and left out of the
        rest of this lookup. Unreadable (truncated, a bad header or idx, a corrupt entry:
        PackFormatError naming the file and offset): left out too, and raised if no other pack
        answers, as git falls back to another copy of a corrupt packed object. Anything else: False.
        """
        if isinstance(err, OSError) and is_gone(err):
            search.gone.add(pack.idx_path)
            self.counters.packs_vanished += 1
            return True
        if isinstance(err, PackFormatError):
            search.unreadable.setdefault(pack.idx_path, err)
            self.counters.packs_unreadable += 1
            return True
        return False

    # -- existence ---------------------------------------------------------
    def locate(self, oid: bytes, *, quick: bool = False) -> Location:
        def in_pack(pack: PackFile, offset: int) -> Location:
            return Location.PACKED

        def in_loose(loose: LooseObjects, oid: bytes) -> Location | None:
            return Location.LOOSE if loose.has(oid) else None

        try:
            got = self._search(oid, in_pack, in_loose, relist=not quick, preserved=False)
        except PackFormatError:   # only in a pack that cannot be read: not an answer to "does it exist?"
            return Location.MISSING
        return _located(got, self)

    def has(self, oid: bytes, *, quick: bool = False) -> bool:
        return self.locate(oid, quick=quick) is not Location.MISSING

    # -- reading -----------------------------------------------------------
    def read(self, oid: bytes, *, verify: bool = False) -> tuple[ObjectType, bytes]:
        """The object's type and content; ObjectMissingError only after one re-listing and a look in preserved/."""
        def in_pack(pack: PackFile, offset: int) -> tuple[ObjectType, bytes]:
            obj_type, data = pack.read_at(offset, resolve_ref=self.read)
            if verify and hash_object(obj_type, data) != oid:
                raise CorruptObjectError("packed object does not hash to its name", oid=oid,
                                         path=pack.pack_path, offset=offset)
            return obj_type, data

        return self._found(oid, in_pack, lambda lo, o: lo.read(o, verify=verify))

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        """Type and size; the same rules as :meth:`read` (one re-listing, then preserved/)."""
        def in_pack(pack: PackFile, offset: int) -> tuple[ObjectType, int]:
            return pack.header_at(offset)

        return self._found(oid, in_pack, LooseObjects.read_header)

    def _found(self, oid: bytes, in_pack: Callable[[PackFile, int], T],
               loose: Callable[[LooseObjects, bytes], T]) -> T:
        """A read's search (current list, re-listed, preserved/; loose files between; each alternate after
        this directory): the answer, or ObjectMissingError once every place was looked at."""
        def in_loose(lo: LooseObjects, oid: bytes) -> T | None:
            try:
                return loose(lo, oid)
            except ObjectMissingError:
                return None

        got = self._search(oid, in_pack, in_loose, relist=True, preserved=True)
        if got is None:
            raise ObjectMissingError("object not found (pack directory re-listed once, preserved packs searched)",
                                     oid=oid, path=self.path)
        return got[0]

    # -- bulk --------------------------------------------------------------
    def snapshot(self) -> ObjectSnapshot:
        """List objects/pack once and every loose fan-out directory once.

        Every listed pack's idx is opened (mmapped) now, so later lookups in the
        snapshot make no filesystem calls and survive a concurrent repack
        deleting the files.
        """
        alternates = tuple(alt.snapshot() for alt in self.alternates)
        packs = self.packs.reprepare()

        def open_index(pack: PackFile) -> bool:
            try:
                _ = pack.index   # opened (mmapped) now: later lookups in the snapshot make no filesystem calls
            except OSError as err:
                if not is_gone(err):
                    raise
                return False  # deleted between the listing and the open: it is not part of this snapshot
            return True

        # The idx files are opened together (over NFS an open is a round trip; :mod:`.fsparallel`).
        opened = [p for p, ok in zip(packs, fsparallel.each(open_index, packs, where=self.packs.path)) if ok]
        if len(opened) != len(packs):
            packs = PackList(tuple(opened))
        return ObjectSnapshot(packs=packs, loose_ids=self.loose.list_ids(), loose=self.loose, objects=self,
                              alternates=alternates)

    def iter_ids(self) -> Iterator[bytes]:
        """Every object id of this directory's own (duplicates across packs/loose removed; not the
        alternates')."""
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
        """Touch the object's loose file or containing pack (git's check-and-freshen, which freshens an
        alternate's copy too: the pool keeps what a fork just relied on); an object found only in a cruft
        pack is MISSING (the caller writes it anew, as git does)."""
        if self.loose.freshen(oid):
            return Location.LOOSE

        def touch(pack: PackFile, offset: int) -> Location | None:
            if pack.freshen():
                return Location.PACKED
            raise FileNotFoundError(errno.ENOENT, "pack vanished before it could be freshened", str(pack.pack_path))

        def touch_alternate_loose(loose: LooseObjects, oid: bytes) -> Location | None:
            return Location.LOOSE if loose is not self.loose and loose.freshen(oid) else None

        try:
            # a cruft pack's mtime is never touched: an object only there is written anew
            got = self._search(oid, touch, touch_alternate_loose, relist=True, preserved=False, skip_cruft=True)
        except PackFormatError:
            return Location.MISSING
        return _located(got, self)


def _located(got: tuple[Location, Stage, ObjectDirectory] | None, own: ObjectDirectory) -> Location:
    """A search's Location: MISSING when nothing answered, ALTERNATE when an alternate did."""
    if got is None:
        return Location.MISSING
    return got[0] if got[2] is own else Location.ALTERNATE
