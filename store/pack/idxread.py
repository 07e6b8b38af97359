"""Reading a ``.idx`` v2: one object's offset (:class:`IdxV2`, mapped), or every id, CRC32 and offset at once.

Lookups of one object go through :func:`open_idx`: a v2 idx (what git writes) is mapped and searched here,
the fan-out table first, then a binary search of its ids (in C when built: ~0.6 us a miss in a 165k-object
idx through the call, instead of 1.9 us; a thin push to a fork probes its pool's packs for every object it
receives). A v1 idx goes to dulwich's reader (imported only then: ~8 ms of imports that an index-pack process
would otherwise pay at start). Jobs that visit every entry of a pack -- repack copying entries, verification
-- want the tables themselves: :func:`read_idx_tables` reads them with a handful of C-level conversions (no
per-entry Python objects) and checks the file's own trailer checksum.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, cast

from .. import native
from ..errors import PackFormatError
from .idxwrite import IDX_MAGIC

#: The id search in C (``store/fsck/_fsck.c``: with the id-set helpers the connectivity check uses), or None.
_C = native.fsck()

_LITTLE = sys.byteorder == "little"


def _from_be(typecode: str, raw: bytes) -> array:
    arr = array(typecode)
    arr.frombytes(raw)
    if _LITTLE:
        arr.byteswap()
    return arr


@dataclass(frozen=True)
class IdxTables:
    """An idx's tables in idx (sorted id) order."""

    count: int
    oids: bytes              # 20 bytes per object, sorted
    crcs: array              # 'I': CRC32 of each entry's raw bytes
    offsets: array           # 'Q': each entry's offset in the pack
    pack_checksum: bytes

    def oid(self, i: int) -> bytes:
        return self.oids[20 * i:20 * i + 20]

    def pack_order(self) -> array:
        """Idx positions sorted by pack offset (what a ``.rev`` file stores)."""
        offsets = self.offsets
        return array("I", sorted(range(self.count), key=offsets.__getitem__))


def read_idx_tables(path: str | Path, data: bytes | None = None) -> IdxTables:
    """Parse ``path`` (or ``data``, its bytes) as an idx v2; PackFormatError naming the file if it is not one."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    n_bytes = len(data)
    if n_bytes < 8 + 1024 + 40 or data[:4] != IDX_MAGIC:
        raise PackFormatError("not a version 2 pack index (bad magic or truncated)", path=path, offset=0)
    (version,) = struct.unpack_from(">I", data, 4)
    if version != 2:
        raise PackFormatError(f"unsupported pack index version {version}", path=path, offset=4)
    fanout = _from_be("I", data[8:8 + 1024])
    n = fanout[255]
    if any(fanout[i] > fanout[i + 1] for i in range(255)):
        raise PackFormatError("pack index fan-out table is not monotonic", path=path, offset=8)
    base = 8 + 1024
    crc_at = base + 20 * n
    off_at = crc_at + 4 * n
    large_at = off_at + 4 * n
    if n_bytes < large_at + 40:
        raise PackFormatError(f"pack index truncated: {n} objects need more than {n_bytes} bytes", path=path)
    if hashlib.sha1(memoryview(data)[:n_bytes - 20]).digest() != data[n_bytes - 20:]:
        raise PackFormatError("pack index checksum mismatch (idx file is corrupt)", path=path, offset=n_bytes - 20)
    oids = data[base:crc_at]
    crcs = _from_be("I", data[crc_at:off_at])
    small = _from_be("I", data[off_at:large_at])
    n_large = (n_bytes - 40 - large_at) // 8
    large = _from_be("Q", data[large_at:large_at + 8 * n_large])
    offsets = array("Q", small)
    if n_large:
        for i, v in enumerate(small):
            if v & 0x80000000:
                k = v & 0x7FFFFFFF
                if k >= n_large:
                    raise PackFormatError(f"pack index names large offset #{k} of {n_large}", path=path,
                                          offset=off_at + 4 * i)
                offsets[i] = large[k]
    elif small and max(small) & 0x80000000:   # (one C-level pass: a generator took 40 ms for 500,000)
        raise PackFormatError("pack index names a 64-bit offset but has no 64-bit offset table", path=path,
                              offset=off_at)
    return IdxTables(count=n, oids=oids, crcs=crcs, offsets=offsets, pack_checksum=data[n_bytes - 40:n_bytes - 20])


_NAMES_AT = 8 + 1024        # a v2 idx: magic, version, fan-out, then the ids


class IdxV2:
    """A version 2 ``.idx``, mapped read-only: the lookup of one id (:meth:`find`) and what a pack's checks
    read (count, entries, trailer checksums). The interface :class:`.packdir.PackFile` uses, which
    :class:`DulwichIdx` gives a v1 idx too."""

    def __init__(self, path: str | Path, data: Any) -> None:
        self.path = path
        self.contents = data
        size = len(data)
        if size < _NAMES_AT or data[:4] != IDX_MAGIC:
            raise PackFormatError("not a version 2 pack index (bad magic or truncated)", path=path, offset=0)
        (version,) = struct.unpack_from(">I", data, 4)
        if version != 2:
            raise PackFormatError(f"unsupported pack index version {version}", path=path, offset=4)
        self.fan_out = fan = struct.unpack_from(">256I", data, 8)
        for b in range(255):   # (as git's check_packed_git_idx: every bucket then lies inside the id table)
            if fan[b] > fan[b + 1]:
                raise PackFormatError("non-monotonic index: the fan-out table decreases", path=path,
                                      offset=8 + 4 * (b + 1))
        n = self.count = fan[255]
        self._crc_at = _NAMES_AT + 20 * n
        self._off_at = self._crc_at + 4 * n
        self._large_at = self._off_at + 4 * n
        if size < self._large_at + 40:
            raise PackFormatError(f"pack index truncated: {n} objects need more than {size} bytes", path=path)

    def __len__(self) -> int:
        return self.count

    def find(self, oid: bytes) -> int | None:
        """The pack offset of ``oid`` (20 bytes), or None: a binary search within its fan-out bucket, in C
        (``_fsck.idx_find``) when built; :meth:`find_py` is its specification."""
        first = oid[0]
        lo = self.fan_out[first - 1] if first else 0
        hi = self.fan_out[first]
        if _C is None:
            return self._search(oid, lo, hi)
        i = _C.idx_find(self.contents, oid, lo, hi)
        return None if i < 0 else self.offset_at(i)

    def find_py(self, oid: bytes) -> int | None:
        """:meth:`find` in Python (the fallback, and what tests compare the C with)."""
        first = oid[0]
        return self._search(oid, self.fan_out[first - 1] if first else 0, self.fan_out[first])

    def _search(self, oid: bytes, lo: int, hi: int) -> int | None:
        data = self.contents
        while lo < hi:
            mid = (lo + hi) >> 1
            at = _NAMES_AT + 20 * mid
            name = data[at:at + 20]
            if name < oid:
                lo = mid + 1
            elif name == oid:
                return self.offset_at(mid)
            else:
                hi = mid
        return None

    def offset_at(self, i: int) -> int:
        (off,) = struct.unpack_from(">I", self.contents, self._off_at + 4 * i)
        if off & 0x80000000:
            at = self._large_at + 8 * (off & 0x7FFFFFFF)
            if at + 8 > len(self.contents) - 40:
                raise PackFormatError(f"pack index names large offset #{off & 0x7FFFFFFF} past its table",
                                      path=self.path, offset=self._off_at + 4 * i)
            (off,) = struct.unpack_from(">Q", self.contents, at)
        return off

    def iterentries(self) -> Iterator[tuple[bytes, int, int]]:
        """(id, pack offset, CRC32) of every entry, in id order."""
        data = self.contents
        for i in range(self.count):
            at = _NAMES_AT + 20 * i
            (crc,) = struct.unpack_from(">I", data, self._crc_at + 4 * i)
            yield data[at:at + 20], self.offset_at(i), crc

    def calculate_checksum(self) -> bytes:
        with memoryview(self.contents) as view:
            return hashlib.sha1(view[:-20]).digest()

    def get_stored_checksum(self) -> bytes:
        return bytes(self.contents[-20:])

    def get_pack_checksum(self) -> bytes:
        return bytes(self.contents[-40:-20])

    def close(self) -> None:
        close = getattr(self.contents, "close", None)
        if close is not None:
            close()


class DulwichIdx:
    """A v1 idx (no magic: git's format before 1.5.2) through dulwich's reader, with :class:`IdxV2`'s interface."""

    def __init__(self, path: str | Path) -> None:
        from dulwich.object_format import SHA1
        from dulwich.pack import load_pack_index

        # (its mapped bytes and fan-out table are private fields of dulwich's reader)
        self._index = cast(Any, load_pack_index(path, SHA1))
        self.contents = self._index._contents
        self.fan_out = tuple(self._index._fan_out_table)

    def __len__(self) -> int:
        return len(self._index)

    def find(self, oid: bytes) -> int | None:
        try:
            return int(self._index.object_offset(oid))
        except KeyError:
            return None

    def iterentries(self) -> Iterator[tuple[bytes, int, int | None]]:
        """(id, pack offset, None: a v1 idx has no CRC32s) of every entry, in id order."""
        for sha, offset, crc in self._index.iterentries():
            yield bytes(sha), offset, crc

    def calculate_checksum(self) -> bytes:
        return bytes(self._index.calculate_checksum())

    def get_stored_checksum(self) -> bytes:
        return bytes(self._index.get_stored_checksum())

    def get_pack_checksum(self) -> bytes:
        return bytes(self._index.get_pack_checksum())

    def close(self) -> None:
        self._index.close()


def open_idx(path: str | Path) -> IdxV2 | DulwichIdx:
    """The idx at ``path``, mapped (OSError if it is gone; PackFormatError if it is not an idx)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < 4:
            raise PackFormatError(f"pack index truncated: {size} bytes", path=path, offset=0)
        data = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if data[:4] != IDX_MAGIC:
        data.close()
        return DulwichIdx(path)
    try:
        return IdxV2(path, data)
    except BaseException:
        data.close()
        raise


__all__ = ["DulwichIdx", "IdxTables", "IdxV2", "open_idx", "read_idx_tables"]
