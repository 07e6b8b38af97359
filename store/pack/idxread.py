"""Reading a whole ``.idx`` v2 at once: every id, CRC32 and offset as compact arrays.

Lookups of one object go through dulwich's mmapped index (binary search in C). Jobs that
visit every entry of a pack -- repack copying entries, verification -- want the tables
themselves: this reads them with a handful of C-level conversions (no per-entry Python
objects) and checks the file's own trailer checksum.
"""
from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

from ..errors import PackFormatError
from .idxwrite import IDX_MAGIC

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


__all__ = ["IdxTables", "read_idx_tables"]
