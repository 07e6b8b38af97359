"""Reading a cruft pack's ``.mtimes`` (git's format; written by :func:`.idxwrite.write_mtimes`).

``MTME``, version 1, hash id 1 (SHA-1), one 4-byte big-endian mtime per object in idx
order, the pack's checksum, the file's own checksum.
"""
from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from pathlib import Path

from ..errors import PackFormatError
from .idxwrite import MTIMES_MAGIC


def read_mtimes(path: str | Path, count: int, pack_checksum: bytes | None = None) -> array:
    """Every object's mtime in idx order ('I' array); PackFormatError naming the file if it is malformed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != 12 + 4 * count + 40:
        raise PackFormatError(f".mtimes has {len(data)} bytes; {count} objects need {12 + 4 * count + 40}",
                              path=path)
    magic, version, hash_id = data[:4], *struct.unpack_from(">II", data, 4)
    if magic != MTIMES_MAGIC or version != 1 or hash_id != 1:
        raise PackFormatError("not a version 1 SHA-1 .mtimes file", path=path, offset=0)
    if hashlib.sha1(memoryview(data)[:-20]).digest() != data[-20:]:
        raise PackFormatError(".mtimes checksum mismatch", path=path, offset=len(data) - 20)
    if pack_checksum is not None and data[-40:-20] != pack_checksum:
        raise PackFormatError(".mtimes names a different pack checksum than its pack", path=path,
                              offset=len(data) - 40)
    out = array("I")
    out.frombytes(data[12:12 + 4 * count])
    if sys.byteorder == "little":
        out.byteswap()
    return out


__all__ = ["read_mtimes"]
