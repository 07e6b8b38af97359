"""Packs: ``objects/pack/pack-<sha>.{pack,idx}`` and the list of them.

The pack list is an immutable :class:`PackList` taken by ONE listing of the
directory and replaced in one assignment, never edited in place. Readers
discover a pack by its ``.idx`` (writers rename the idx last). Nothing here
looks at the directory's mtime to decide whether to re-list: seed
000_9777a3acf68a3210.txt shows that a directory's stat data can miss a change.
"""
from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from typing import TYPE_CHECKING

from ..errors import CorruptObjectError, ObjectMissingError, PackFormatError
from ..objects import OFS_DELTA, REF_DELTA, ObjectType, hash_object
from .format import PACK_HEADER_SIZE, PACK_TRAILER_SIZE, decode_delta_header, decode_entry_header

if TYPE_CHECKING:
    from dulwich.pack import PackData

# dulwich is imported where a pack is first opened, not here: a bulk write into a
# repository it never reads a pack of should not pay ~15 ms of imports per process.

#: Upper bound on memory kept for resolved delta bases (git: core.deltaBaseCacheLimit = 96 MiB).
DELTA_BASE_CACHE_BYTES = 96 * 1024 * 1024
MAX_DELTA_CHAIN = 10_000


class _BaseCache:
    """A small LRU of resolved objects keyed by pack offset, bounded in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._items: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, offset: int) -> tuple[int, bytes] | None:
        with self._lock:
            item = self._items.get(offset)
            if item is not None:
                self._items.move_to_end(offset)
            return item

    def put(self, offset: int, type_num: int, data: bytes) -> None:
        if len(data) > self.limit // 4:
            return
        with self._lock:
            if offset in self._items:
                return
            self._items[offset] = (type_num, data)
            self.used += len(data)
            while self.used > self.limit:
                _, (_, old) = self._items.popitem(last=False)
                self.used -= len(old)


class PackFile:
    """One installed pack and its idx, opened lazily (idx mmapped by dulwich)."""

    def __init__(self, idx_path: Path) -> None:
        self.idx_path = idx_path
        self.pack_path = idx_path.with_suffix(".pack")
        self.name = idx_path.stem
        self._index = None
        self._data: PackData | None = None
        self._cache = _BaseCache(DELTA_BASE_CACHE_BYTES)
        self._types: dict[int, int] = {}  # offset -> base object type, for header_at
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PackFile({self.name})"

    @property
    def index(self):
        if self._index is None:
            with self._lock:
                if self._index is None:
                    try:
                        from dulwich.object_format import SHA1
                        from dulwich.pack import load_pack_index
                        self._index = load_pack_index(self.idx_path, SHA1)
                    except FileNotFoundError:
                        raise
                    except Exception as err:  # dulwich raises assorted errors on bad idx files
                        raise PackFormatError(f"cannot read pack index: {err}", path=self.idx_path) from err
        return self._index

    @property
    def data(self) -> PackData:
        if self._data is None:
            with self._lock:
                if self._data is None:
                    try:
                        from dulwich.object_format import SHA1
                        from dulwich.pack import PackData
                        self._data = PackData(self.pack_path, SHA1)
                    except FileNotFoundError:
                        raise
                    except Exception as err:
                        raise PackFormatError(f"cannot open pack: {err}", path=self.pack_path) from err
        return self._data

    def find_offset(self, oid: bytes) -> int | None:
        try:
            return self.index.object_offset(oid)
        except KeyError:
            return None

    def __contains__(self, oid: bytes) -> bool:
        return self.find_offset(oid) is not None

    def __len__(self) -> int:
        return len(self.index)

    def iter_ids(self) -> Iterator[bytes]:
        for sha, _offset, _crc in self.index.iterentries():
            yield bytes(sha)

    def iter_entries(self) -> Iterator[tuple[bytes, int]]:
        for sha, offset, _crc in self.index.iterentries():
            yield bytes(sha), offset

    # -- reading -----------------------------------------------------------
    def _entry_at(self, offset: int):
        buf = self.data._buffer()
        try:
            from dulwich.pack import unpack_object_at
            unpacked, _end = unpack_object_at(buf, offset, hashlib.sha1)
        except zlib.error as err:
            raise PackFormatError(f"pack entry does not inflate: {err}", path=self.pack_path,
                                  offset=offset) from err
        except Exception as err:
            raise PackFormatError(f"unreadable pack entry: {err}", path=self.pack_path, offset=offset) from err
        return unpacked

    def read_at(self, offset: int, resolve_ref=None) -> tuple[ObjectType, bytes]:
        """The object at ``offset`` with its delta chain resolved.

        ``resolve_ref(oid) -> (type, bytes)`` resolves REF_DELTA bases outside
        this pack (only thin packs in quarantine have those).
        """
        cached = self._cache.get(offset)
        if cached is not None:
            return ObjectType(cached[0]), cached[1]
        chain: list[tuple[int, bytes]] = []  # (offset, delta data), outermost first
        cur = offset
        base: tuple[int, bytes] | None = None
        while True:
            if len(chain) > MAX_DELTA_CHAIN:
                raise PackFormatError("delta chain too long (cycle?)", path=self.pack_path, offset=offset)
            cached = self._cache.get(cur) if cur != offset else None
            if cached is not None:
                base = cached
                break
            unpacked = self._entry_at(cur)
            ptype = unpacked.pack_type_num
            data = b"".join(unpacked.decomp_chunks)
            if ptype == OFS_DELTA:
                chain.append((cur, data))
                nxt = cur - unpacked.delta_base
                if nxt <= 0 or nxt >= cur:
                    raise PackFormatError("OFS_DELTA base offset out of range", path=self.pack_path, offset=cur)
                cur = nxt
            elif ptype == REF_DELTA:
                chain.append((cur, data))
                base_off = self.find_offset(unpacked.delta_base)
                if base_off is None:
                    if resolve_ref is None:
                        raise PackFormatError(f"REF_DELTA base {bytes(unpacked.delta_base).hex()} not in pack",
                                              path=self.pack_path, offset=cur)
                    btype, bdata = resolve_ref(bytes(unpacked.delta_base))
                    base = (int(btype), bdata)
                    break
                cur = base_off
            elif ptype in (1, 2, 3, 4):
                base = (ptype, data)
                self._cache.put(cur, ptype, data)
                break
            else:
                raise PackFormatError(f"invalid pack entry type {ptype}", path=self.pack_path, offset=cur)
        type_num, data = base
        for off, delta in reversed(chain):
            try:
                data = b"".join(_apply_delta(data, delta))
            except Exception as err:
                raise PackFormatError(f"delta does not apply: {err}", path=self.pack_path, offset=off) from err
            self._cache.put(off, type_num, data)
        return ObjectType(type_num), data

    def _raw_header(self, offset: int) -> tuple[int, int, int | bytes | None, int]:
        """Parse an entry's header without inflating it: (pack type, size, delta base, data offset)."""
        buf = self.data._buffer()
        end = len(buf) - PACK_TRAILER_SIZE
        if offset < PACK_HEADER_SIZE or offset >= end:
            raise PackFormatError("entry offset outside the pack", path=self.pack_path, offset=offset)
        return decode_entry_header(buf, offset, end, offset, self.pack_path)

    def header_at(self, offset: int) -> tuple[ObjectType, int]:
        """Type and size without resolving the chain.

        The size of a delta's result is in the delta's own header, so only the
        first bytes of the delta are inflated; the type is the chain's base type,
        found by walking entry headers (memoised per offset: types never change).
        """
        ptype, size, base, pos = self._raw_header(offset)
        if base is None:
            return ObjectType(ptype), size
        buf = self.data._buffer()
        try:
            head = zlib.decompressobj().decompress(bytes(buf[pos:pos + 256]), 32)
        except zlib.error as err:
            raise PackFormatError(f"delta header unreadable: {err}", path=self.pack_path, offset=offset) from err
        _src_size, size, _hdrlen = decode_delta_header(head, path=self.pack_path, offset=offset)
        return self._base_type(offset, ptype, base), size

    def _base_type(self, offset: int, ptype: int, base: int | bytes | None) -> ObjectType:
        visited = []
        cur = offset
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
            ptype, _size, base, _pos = self._raw_header(cur)
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
    def verify_checksums(self) -> None:
        """Check the idx's own trailer, the pack's trailer, and that they agree."""
        index = self.index
        if index.calculate_checksum() != index.get_stored_checksum():
            raise PackFormatError("pack index checksum mismatch (idx file is corrupt)", path=self.idx_path)
        data = self.data
        if data.calculate_checksum() != data.get_stored_checksum():
            raise PackFormatError("pack trailer checksum mismatch (pack file is corrupt)", path=self.pack_path)
        if index.get_pack_checksum() != data.get_stored_checksum():
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
        if self._data is not None:
            self._data.close()


@dataclass(frozen=True)
class PackList:
    """An immutable snapshot of the installed packs."""

    packs: tuple[PackFile, ...] = ()

    def __iter__(self) -> Iterator[PackFile]:
        return iter(self.packs)

    def __len__(self) -> int:
        return len(self.packs)

    def find(self, oid: bytes) -> tuple[PackFile, int] | None:
        for pack in self.packs:
            try:
                offset = pack.find_offset(oid)
            except FileNotFoundError:
                continue  # removed by a concurrent repack since the listing
            if offset is not None:
                return pack, offset
        return None

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.packs)


class PackDirectory:
    """``objects/pack``: owns the current PackList snapshot (JGit's PackDirectory)."""

    def __init__(self, pack_dir: Path) -> None:
        self.path = pack_dir
        self._snapshot: PackList | None = None
        self.rescans = 0  # how many times the directory was listed (tests and counters read it)

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
        old = {p.name: p for p in (self._snapshot.packs if self._snapshot else ())}
        self.rescans += 1
        try:
            with os.scandir(self.path) as it:
                idx_names = [e.name for e in it if e.name.startswith("pack-") and e.name.endswith(".idx")]
        except FileNotFoundError:
            idx_names = []
        packs = []
        for name in sorted(idx_names):
            stem = name[:-4]
            packs.append(old.get(stem) or PackFile(self.path / name))
        # Newest first is what git does (recently written packs are most likely to be hit).
        packs.sort(key=lambda p: _mtime_or_zero(p.idx_path), reverse=True)
        snap = PackList(tuple(packs))
        self._snapshot = snap
        return snap


def _mtime_or_zero(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _apply_delta(base: bytes, delta: bytes) -> list[bytes]:
    from dulwich.pack import apply_delta
    return apply_delta(base, delta)
