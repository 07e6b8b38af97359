"""The pack format's byte-level pieces, decoded in one place.

Readers of ``.pack`` data (the read path in :mod:`packyard.store.pack.packdir`, index-pack's receiver in
:mod:`packyard.store.pack.receive`, unpack-objects in :mod:`packyard.store.pack.unpack`) all decode the
same three things; they live here so that every reader applies the same bounds
and names the same offsets in its errors:

* the 12-byte pack header (``PACK``, version 2 or 3, object count);
* an entry header: type and size varint, then the OFS_DELTA base offset
  (git's "offset minus one per continuation byte" encoding) or the REF_DELTA
  base id;
* a delta's header: the source and target size varints.

Nothing here allocates from a declared size: the decoders only read the
header bytes and return numbers. What a caller does about a size (bounded
inflate, refusing an impossible delta) stays with the caller. Every error is a
:class:`PackFormatError` naming the file and the entry offset.
"""
from __future__ import annotations

import struct

from ..errors import PackFormatError
from ..objects import OFS_DELTA, REF_DELTA

PACK_SIGNATURE = b"PACK"
PACK_HEADER_SIZE = 12            # "PACK", version, object count
PACK_TRAILER_SIZE = 20           # SHA-1 of everything before it
SUPPORTED_VERSIONS = (2, 3)
MAX_OFS_BYTES = 10               # an OFS_DELTA offset needs at most 10 bytes for 64 bits
MAX_VARINT_SHIFT = 63            # a size varint that still continues past this shift overflows


def parse_pack_header(head: bytes, *, path: object) -> tuple[int, int]:
    """(version, object count) from the first 12 bytes of a pack; raises on anything else."""
    if len(head) < PACK_HEADER_SIZE:
        raise PackFormatError("pack truncated: no complete header", path=path, offset=0)
    if head[:4] != PACK_SIGNATURE:
        # Never echo the bytes: the file may be anything the caller named (a key, a password file).
        raise PackFormatError("not a pack file (bad signature)", path=path, offset=0)
    version, count = struct.unpack_from(">II", head, 4)
    if version not in SUPPORTED_VERSIONS:
        raise PackFormatError(f"unsupported pack version {version}", path=path, offset=4)
    return version, count


def decode_entry_header(buf, pos: int, end: int, start: int, path: object) -> tuple[int, int, int | bytes | None, int]:
    """Decode the entry header at ``buf[pos]``: (pack type, size, base, position after the header).

    ``end`` is where readable bytes stop (exclusive); ``start`` is the pack offset of
    ``buf[pos]`` (they differ when ``buf`` is a window into a stream) and is the offset
    errors name. ``base`` is None for a full object, the absolute pack offset of the
    base for OFS_DELTA (checked to lie after the pack header and before the entry), or
    the 20-byte base id for REF_DELTA. The one decoder: entries.py and index-pack's receive
    loop both call it.
    """
    if pos >= end:
        raise PackFormatError("pack truncated inside an entry header", path=path, offset=start)
    c = buf[pos]
    pos += 1
    typ = (c >> 4) & 7
    size = c & 15
    shift = 4
    while c & 0x80:
        if pos >= end:
            raise PackFormatError("pack truncated inside an entry header", path=path, offset=start)
        if shift > MAX_VARINT_SHIFT:
            raise PackFormatError("entry size overflows 64 bits", path=path, offset=start)
        c = buf[pos]
        pos += 1
        size |= (c & 0x7F) << shift
        shift += 7
    if typ == OFS_DELTA:
        if pos >= end:
            raise PackFormatError("pack truncated inside an OFS_DELTA header", path=path, offset=start)
        c = buf[pos]
        pos += 1
        rel = c & 0x7F
        nbytes = 1
        while c & 0x80:
            if pos >= end or nbytes >= MAX_OFS_BYTES:
                raise PackFormatError("OFS_DELTA offset overflows or is truncated", path=path, offset=start)
            c = buf[pos]
            pos += 1
            nbytes += 1
            rel = ((rel + 1) << 7) | (c & 0x7F)
        if rel == 0:
            raise PackFormatError("delta cycle: OFS_DELTA names itself as its base", path=path, offset=start)
        base_off = start - rel
        if base_off < PACK_HEADER_SIZE:
            raise PackFormatError(f"OFS_DELTA base offset {base_off} is out of bounds", path=path, offset=start)
        return typ, size, base_off, pos
    if typ == REF_DELTA:
        if pos + 20 > end:
            raise PackFormatError("pack truncated inside a REF_DELTA header", path=path, offset=start)
        return typ, size, bytes(buf[pos:pos + 20]), pos + 20
    if 1 <= typ <= 4:
        return typ, size, None, pos
    raise PackFormatError(f"invalid object type {typ} in pack entry", path=path, offset=start)


def decode_delta_header(delta, *, path: object = None, offset: int | None = None) -> tuple[int, int, int]:
    """(source size, target size, header length) of a git delta's instructions."""
    pos = 0
    n = len(delta)
    vals = []
    for _ in range(2):
        val = shift = 0
        while True:
            if pos >= n or shift > MAX_VARINT_SHIFT:
                raise PackFormatError("delta header unreadable: delta header truncated or overflowing",
                                      path=path, offset=offset)
            c = delta[pos]
            pos += 1
            val |= (c & 0x7F) << shift
            shift += 7
            if not c & 0x80:
                break
        vals.append(val)
    return vals[0], vals[1], pos


def encode_entry_header(typ: int, size: int) -> bytes:
    """The type/size varint that starts an entry (what git's ``encode_in_pack_object_header`` writes)."""
    c = (typ << 4) | (size & 15)
    size >>= 4
    out = bytearray()
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    return bytes(out)


__all__ = ["PACK_SIGNATURE", "PACK_HEADER_SIZE", "PACK_TRAILER_SIZE", "parse_pack_header",
           "decode_entry_header", "decode_delta_header", "encode_entry_header"]
