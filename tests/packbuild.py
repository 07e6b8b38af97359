"""Hand-built pack entries for tests: written independently of store/ so they check it, not mirror it."""
from __future__ import annotations


def entry_header(typ: int, size: int) -> bytes:
    c = (typ << 4) | (size & 15)
    size >>= 4
    out = bytearray()
    while size:
        out.append(c | 0x80)
        c = size & 0x7F
        size >>= 7
    out.append(c)
    return bytes(out)


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
