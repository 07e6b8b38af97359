"""Hand-built pack entries for tests: the entry header is store's own encoder (format.encode_entry_header;
the tests that build packs with it have git read them); the OFS_DELTA distance and the delta-header
varint are spelled here, independently of store/ (test_pack_write checks write.ofs_encoding against
ofs_bytes).
"""
from __future__ import annotations

from packyard.store.pack.format import encode_entry_header as entry_header

__all__ = ["entry_header", "ofs_bytes", "varint"]


def ofs_bytes(rel: int) -> bytes:
    out = [rel & 0x7F]
    rel >>= 7
    while rel:
        rel -= 1
        out.append(0x80 | (rel & 0x7F))
        rel >>= 7
    return bytes(reversed(out))


def varint(n: int) -> bytes:
    """A delta-header size varint (little-endian base 128)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)
