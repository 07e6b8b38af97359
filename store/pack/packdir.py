"""Packs: ``objects/pack/pack-<sha>.{pack,idx}`` and the list of them.

The pack list is an immutable :class:`PackList` taken by ONE listing of the
directory and replaced in one assignment, never edited in place. Readers
discover a pack by its ``.idx`` (writers rename the idx last). Nothing here
looks at the directory's mtime to decide whether to re-list: seed
000_9777a3acf68a3210.txt shows that a directory's stat data can miss a change.

``PackDirectory(..., trust_mtime=True)`` is the one exception, and it is UNSAFE on purpose: it
is git's rejected ``stat_validity`` patch from that thread, kept only as the race harness's
negative control (``packyard race --unsafe-dir-cache``). It never reaches production code paths.

A pack's bytes are mapped once (``mmap``) and read with the one entry reader
(:mod:`.entries`) and the one resolver (:mod:`.resolve`); resolved delta bases go
to the process-wide cache (:mod:`.cache`). An open pack keeps working after a
repack renames or unlinks its files; a pack not yet opened raises
FileNotFoundError, which the lookup rules in :mod:`packyard.store.objdir` handle.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import CorruptObjectError, ObjectMissingError, PackFormatError
from ..objects import ObjectType, hash_object
from .entries import read_header
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, decode_delta_header, parse_pack_header
from .idxread import IdxTables, open_idx, read_idx_tables
from .resolve import MAX_DELTA_CHAIN, resolve_chain

#: Errors that mean "this pack's files are gone" (repacked away; ESTALE: deleted on the NFS server).
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESTALE})


def is_gone(err: OSError) -> bool:
    """Did this error say the pack's file vanished (ENOENT, or ESTALE over NFS)?"""
    return err.errno in GONE_ERRNOS


class PackFile:
    """One installed pack and its idx, opened lazily (idx and pack mmapped: :func:`.idxread.open_idx`)."""

    def __init__(self, idx_path: Path) -> None:
        self.idx_path = idx_path
        self.pack_path = idx_path.with_suffix(".pack")
        self.name = idx_path.stem
        self._index = None
        self._map: mmap.mmap | None = None
        self._end = 0                     # offset of the trailer: entries end there
        self._types: dict[int, int] = {}  # offset -> base object type, for header_at
        self._cruft: bool | None = None
        self._listed: frozenset[str] | None = None   # this pack's files the last listing showed (".keep", ...)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PackFile({self.name})"

    @property
    def index(self):
        if self._index is None:
            with self._lock:
                if self._index is None:
                    try:
                        self._index = open_idx(self.idx_path)
                    except (OSError, PackFormatError):
                        raise
                    except Exception as err:  # dulwich (a v1 idx) raises assorted errors on bad idx files
                        raise PackFormatError(f"cannot read pack index: {err}", path=self.idx_path) from err
        return self._index

    def buffer(self) -> mmap.mmap:
        """The pack's bytes, mapped read-only (FileNotFoundError if the pack is gone)."""
        if self._map is None:
            with self._lock:
                if self._map is None:
                    fd = os.open(self.pack_path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        size = os.fstat(fd).st_size
                        if size < PACK_HEADER_SIZE + PACK_TRAILER_SIZE:
                            raise PackFormatError(f"pack truncated: {size} bytes cannot hold a header and a trailer",
                                                  path=self.pack_path, offset=0)
                        m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
                    finally:
                        os.close(fd)
                    try:
                        parse_pack_header(m[:PACK_HEADER_SIZE], path=self.pack_path)
                    except BaseException:
                        m.close()
                        raise
                    self._end = size - PACK_TRAILER_SIZE
                    self._map = m
        return self._map

    @property
    def size(self) -> int:
        """The pack file's size: from its map when open, else a stat (0 if it is gone)."""
        if self._map is not None:
            return self._end + PACK_TRAILER_SIZE
        try:
            return self.pack_path.stat().st_size
        except OSError as err:
            if is_gone(err):
                return 0
            raise

    @property
    def end(self) -> int:
        """Offset of the pack's trailer (where entries end)."""
        self.buffer()
        return self._end

    @property
    def mtimes_path(self) -> Path:
        return self.idx_path.with_suffix(".mtimes")

    def listed(self, exts: frozenset[str]) -> None:
        """Record which of this pack's files (``".pack"``, ``".keep"``, ``".mtimes"``, ...) the listing that
        found it showed: :attr:`is_cruft`, :meth:`is_kept` and :meth:`has_file` answer from it instead of a
        ``stat`` each (over NFS, a round trip each, and a negative one is never cached)."""
        self._listed = exts

    def has_file(self, ext: str) -> bool:
        """Is ``pack-<sha><ext>`` there (as the last listing showed; asked of the filesystem if never listed)?"""
        if self._listed is not None:
            return ext in self._listed
        return self.idx_path.with_suffix(ext).exists()

    @property
    def is_cruft(self) -> bool:
        """A cruft pack (it has a ``.mtimes``): unreachable objects with their ages; never freshened. A cruft
        pack's ``.mtimes`` is renamed in before its idx (the install sequence), so a listing that shows the
        idx of a pack that was installed before the listing began shows its ``.mtimes`` too."""
        if self._cruft is None:
            self._cruft = self.has_file(".mtimes")
        return self._cruft

    @property
    def keep_path(self) -> Path:
        return self.idx_path.with_suffix(".keep")

    def is_kept(self) -> bool:
        """Does a ``.keep`` protect this pack from repacking, as the last listing of ``objects/pack`` showed?

        git decides it at the same point (``add_packed_git`` checks the keep when it adds a listed pack). A
        ``.keep`` written after the listing is the next listing's: a stat here would be no later than the
        repack's own snapshot either, and a pack repacked for want of its keep still has every object copied
        before it is replaced."""
        return self.has_file(".keep")

    def tables(self) -> IdxTables:
        """Every id, CRC and offset of the idx as arrays (read whole; for jobs visiting every entry), from the
        idx's map when :attr:`index` has it open (no second open of the file)."""
        data = self._index.contents if self._index is not None else None
        return read_idx_tables(self.idx_path, data)

    def find_offset(self, oid: bytes) -> int | None:
        index = self.index
        # The fan-out table first (as git's bsearch_pack bounds its search): a pack holding no id that starts
        # with this byte answers at once. Most probes are such misses -- a lookup tries every pack of a fork
        # and of its pool, newest (smallest) first.
        fan = index.fan_out
        first = oid[0]
        if fan[first] == (fan[first - 1] if first else 0):
            return None
        return index.find(oid)

    def __contains__(self, oid: bytes) -> bool:
        return self.find_offset(oid) is not None

    def __len__(self) -> int:
        return len(self.index)

    def iter_ids(self) -> Iterator[bytes]:
        for sha, _offset, _crc in self.index.iterentries():
            yield sha

    def iter_entries(self) -> Iterator[tuple[bytes, int]]:
        for sha, offset, _crc in self.index.iterentries():
            yield sha, offset

    # -- reading -----------------------------------------------------------
    def read_at(self, offset: int, resolve_ref=None) -> tuple[ObjectType, bytes]:
        """The object at ``offset`` with its delta chain resolved.

        ``resolve_ref(oid) -> (type, bytes)`` resolves REF_DELTA bases outside
        this pack (only thin packs in quarantine have those).
        """
        buf = self.buffer()
        type_num, data = resolve_chain(buf, offset, end=self._end, path=self.pack_path, cache_key=self.name,
                                       find_offset=self.find_offset, resolve_ref=resolve_ref)
        return ObjectType(type_num), data

    def header_at(self, offset: int) -> tuple[ObjectType, int]:
        """Type and size without resolving the chain.

        The size of a delta's result is in the delta's own header, so only the
        first bytes of the delta are inflated; the type is the chain's base type,
        found by walking entry headers (memoised per offset: types never change).
        """
        buf = self.buffer()
        h = read_header(buf, offset, end=self._end, path=self.pack_path)
        if h.base is None:
            return ObjectType(h.type), h.size
        try:
            head = zlib.decompressobj().decompress(buf[h.data_offset:min(h.data_offset + 256, self._end)], 32)
        except zlib.error as err:
            raise PackFormatError(f"delta header unreadable: {err}", path=self.pack_path, offset=offset) from err
        _src_size, size, _hdrlen = decode_delta_header(head, path=self.pack_path, offset=offset)
        return self._base_type(offset, h.type, h.base), size

    def _base_type(self, offset: int, ptype: int, base: int | bytes | None) -> ObjectType:
        visited = []
        cur = offset
        buf = self.buffer()
        while base is not None:
            known = self._types.get(cur)
            if known is not None:
                ptype = known
                break
            visited.append(cur)
            if len(visited) > MAX_DELTA_CHAIN:
                raise PackFormatError("delta chain too long (cycle?)", path=self.pack_path, offset=offset)
            if isinstance(base, bytes):
                nxt = self.find_offset(base)
                if nxt is None:
                    raise PackFormatError("REF_DELTA base not in pack", path=self.pack_path, offset=cur)
                cur = nxt
            else:
                cur = base
            h = read_header(buf, cur, end=self._end, path=self.pack_path)
            ptype, base = h.type, h.base
        for off in visited:
            self._types[off] = ptype
        return ObjectType(ptype)

    def read(self, oid: bytes, *, verify: bool = False) -> tuple[ObjectType, bytes]:
        offset = self.find_offset(oid)
        if offset is None:
            raise ObjectMissingError("object not in pack", oid=oid, path=self.idx_path)
        obj_type, data = self.read_at(offset)
        if verify and hash_object(obj_type, data) != oid:
            raise CorruptObjectError("packed object does not hash to its name", oid=oid,
                                     path=self.pack_path, offset=offset)
        return obj_type, data

    def read_header(self, oid: bytes) -> tuple[ObjectType, int]:
        offset = self.find_offset(oid)
        if offset is None:
            raise ObjectMissingError("object not in pack", oid=oid, path=self.idx_path)
        return self.header_at(offset)

    # -- integrity ---------------------------------------------------------
    def trailer(self) -> bytes:
        buf = self.buffer()
        return buf[self._end:self._end + PACK_TRAILER_SIZE]

    def verify_checksums(self) -> None:
        """Check the idx's own trailer, the pack's trailer, and that they agree."""
        index = self.index
        if index.calculate_checksum() != index.get_stored_checksum():
            raise PackFormatError("pack index checksum mismatch (idx file is corrupt)", path=self.idx_path)
        buf = self.buffer()
        with memoryview(buf) as view:
            digest = hashlib.sha1(view[:self._end]).digest()
        if digest != self.trailer():
            raise PackFormatError("pack trailer checksum mismatch (pack file is corrupt)", path=self.pack_path,
                                  offset=self._end)
        if index.get_pack_checksum() != self.trailer():
            raise PackFormatError("idx names a different pack checksum than the pack carries", path=self.idx_path)

    def freshen(self) -> bool:
        try:
            os.utime(self.pack_path)
            return True
        except FileNotFoundError:
            return False

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a reader still holds a view; the mapping goes when it does
            self._map = None


@dataclass(frozen=True)
class PackList:
    """An immutable snapshot of the installed packs."""

    packs: tuple[PackFile, ...] = ()

    def __iter__(self) -> Iterator[PackFile]:
        return iter(self.packs)

    def __len__(self) -> int:
        return len(self.packs)

    def find(self, oid: bytes, gone: list[PackFile] | None = None) -> tuple[PackFile, int] | None:
        """The first pack holding ``oid`` and its offset. A pack whose idx vanished since the listing
        (a concurrent repack) is skipped, and appended to ``gone`` if given."""
        for pack in self.packs:
            try:
                offset = pack.find_offset(oid)
            except OSError as err:
                if is_gone(err):
                    if gone is not None:
                        gone.append(pack)
                    continue
                raise
            if offset is not None:
                return pack, offset
        return None

    def find_not_cruft(self, oid: bytes) -> tuple[PackFile, int] | None:
        """Like :meth:`find`, skipping cruft packs: where an object can be freshened (git never
        freshens a cruft pack; an object only there is written anew)."""
        for pack in self.packs:
            if pack.is_cruft:
                continue
            try:
                offset = pack.find_offset(oid)
            except OSError as err:
                if is_gone(err):
                    continue
                raise
            if offset is not None:
                return pack, offset
        return None

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.packs)

    def without(self, gone: PackFile) -> "PackList":
        return PackList(tuple(p for p in self.packs if p is not gone))


def list_packs(directory: Path, old: dict[str, PackFile] | None = None) -> tuple[PackFile, ...]:
    """The packs in ``directory`` (by their .idx), newest first; reuses open PackFiles from ``old``.

    An ``.idx`` whose ``.pack`` is not in the same listing is not a pack (git's ``add_packed_git``
    skips it too): git's own ``unlink_pack_path`` removes the ``.pack`` before the ``.idx``, so an
    interrupted ``git repack``/``gc`` leaves exactly that, and a reader that listed it would find it
    gone on every re-listing. The janitor removes such an orphan by its age rule.
    """
    old = old or {}
    try:
        with os.scandir(directory) as it:
            names = {e.name for e in it if e.name.startswith("pack-")}
    except FileNotFoundError:
        names = set()
    files: dict[str, set[str]] = {}
    for n in names:
        stem, dot, ext = n.rpartition(".")
        if dot:
            files.setdefault(stem, set()).add("." + ext)
    idx_names = [n for n in names if n.endswith(".idx") and n[:-4] + ".pack" in names]
    # (``is None``, not ``or``: a PackFile's truth is its length, which opens its idx -- a round trip over NFS,
    # and FileNotFoundError out of a listing when the pack went since it was listed.)
    packs = [p if (p := old.get(name[:-4])) is not None else PackFile(directory / name) for name in sorted(idx_names)]
    for p in packs:
        p.listed(frozenset(files.get(p.name, ())))
    # Newest first is what git does (recently written packs are most likely to be hit).
    packs.sort(key=lambda p: _mtime_or_zero(p.idx_path), reverse=True)
    return tuple(packs)


#: What git's ``stat_validity`` compares for a directory, as git builds by default (without USE_NSEC):
#: whole-second mtime and ctime, size and inode (``match_stat_data`` in git's read-cache.c).
StatData = tuple[int, int, int, int]


def dir_stat_data(path: Path) -> StatData | None:
    """The directory's stat data as the rejected stat_validity patch records it (None: unreadable)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return int(st.st_mtime), int(st.st_ctime), st.st_size, st.st_ino


class PackDirectory:
    """``objects/pack``: owns the current PackList snapshot (JGit's PackDirectory).

    ``trust_mtime=True`` -- UNSAFE, off by default, the race harness's negative control only:
    a re-listing is skipped while the directory's stat data (:func:`dir_stat_data`: whole-second
    mtime and ctime, size, inode) equals what it was when the directory was last listed. That is
    the stat_validity patch seed 000 rejected: a pack installed in the same second as the
    listing (or on a filesystem with coarse or cached timestamps, e.g. NFS attribute caching)
    leaves the stat data unchanged, and the reader never sees the pack.
    """

    def __init__(self, pack_dir: Path, *, trust_mtime: bool = False) -> None:
        self.path = pack_dir
        self._snapshot: PackList | None = None
        self.rescans = 0  # how many times the directory was listed (tests and counters read it)
        self.trust_mtime = trust_mtime
        self.rescans_skipped = 0          # re-listings the unsafe trust_mtime shortcut skipped
        self._stat: StatData | None = None

    @property
    def snapshot(self) -> PackList:
        return self.prepare()

    def prepare(self) -> PackList:
        """The current snapshot, listing the directory only if it was never listed."""
        snap = self._snapshot
        if snap is None:
            snap = self.reprepare()
        return snap

    def reprepare(self) -> PackList:
        """List ``objects/pack`` again, unconditionally, and replace the snapshot.

        Packs still present keep their open PackFile (and caches); new ones are
        added; vanished ones drop out. The new list is built aside and
        published in one assignment.
        """
        if self.trust_mtime and self._snapshot is not None:
            # UNSAFE (see the class doc): the rejected patch's shortcut.
            current = dir_stat_data(self.path)
            if current is not None and current == self._stat:
                self.rescans_skipped += 1
                return self._snapshot
        old = {p.name: p for p in (self._snapshot.packs if self._snapshot else ())}
        self.rescans += 1
        if self.trust_mtime:
            self._stat = dir_stat_data(self.path)   # before the listing, as the patch's fstat of the open dir
        snap = PackList(list_packs(self.path, old))
        self._snapshot = snap
        return snap


def _mtime_or_zero(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
