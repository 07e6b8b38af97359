"""The delta encoder in pure Python: the fallback of the C extension ``_delta.c``, byte for byte.

Both implementations run ONE algorithm and must return identical bytes for the same
input (tests/store/test_delta.py asserts it), so a pack written on a machine without a
compiler is the same pack. The algorithm, stated once here for both:

Index of the base
    The base is cut into aligned blocks of ``BLOCK`` (16) bytes; only whole blocks are
    indexed. Each block goes into a bucket chosen by a hash of its 16 bytes (two
    little-endian 64-bit words, multiplied and mixed, top ``bits`` bits; ``2**bits``
    is the smallest power of two >= the number of blocks, at least 2). A bucket lists
    its blocks by ascending offset; a bucket with more than ``BUCKET_CAP`` (64)
    blocks keeps only ``BUCKET_CAP`` of them, evenly spaced: entry ``k*n // CAP`` for
    ``k`` in ``0..CAP-1``. The cap keeps pathological bases (long runs, many
    repeats) linear: a target position never tries more than 64 candidates.

Walk of the target
    At each target position ``pos`` with a whole window ``target[pos:pos+16]``, the
    candidates are the bucket's kept blocks whose 16 bytes equal the window, in
    ascending offset. Each is extended forwards as far as base and target agree;
    the longest wins (the first, i.e. lowest offset, on a tie) and the walk over the
    candidates stops early once a match reaches ``STOP_LEN`` (64 KiB). No candidate:
    ``pos += 1``. A winner is then extended backwards into the bytes still pending
    as inserts (never into the previous copy, never before base offset 0); the
    pending bytes before it are emitted as inserts, the match as copies, and the
    walk resumes right after the match. Whatever is pending at the end is inserted.

Encoding (git's delta format, readable by every git and dulwich)
    Header: base size, target size, each a little-endian base-128 varint. Insert:
    one byte ``n`` (1..127) then ``n`` literal bytes. Copy: ``0x80`` | bits 0-3 for
    the non-zero offset bytes (little-endian, up to 4) | bits 4-6 for the non-zero
    size bytes (up to 3; no size bytes = 0x10000). A copy op moves at most
    ``MAX_COPY`` (0x10000) bytes, as git's own encoder does, so every decoder --
    including ones that read only two size bytes -- applies it; a longer match
    becomes several ops.

Size limit
    ``max_size`` >= 0: the encoder returns None as soon as the delta written so far
    exceeds it (the search passes its limit and gives up early); a result that is
    returned is exactly the unlimited delta. -1: no limit.

This module is the specification's executable form; its speed matters only where
the extension is absent (``PACKYARD_PURE_PYTHON=1`` or no compiler): the window
lookups are a dict of block bytes (the hash above only decides which blocks the cap
drops, so it is computed for the base only), and forward matches are measured by
comparing doubling slices.
"""
from __future__ import annotations

import struct

BLOCK = 16               # bytes per indexed base block and per target window
BUCKET_CAP = 64          # candidates kept per hash bucket (evenly spaced)
STOP_LEN = 0x10000       # a match this long ends the walk over a position's candidates
MAX_COPY = 0x10000       # bytes per copy op (size bytes omitted = 0x10000)
MAX_INSERT = 127         # bytes per insert op
MAX_BASE = 0xFFFFFFFF    # copy offsets are 32-bit: a larger base cannot be indexed

_M64 = (1 << 64) - 1
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xC2B2AE3D27D4EB4F
_K3 = 0x165667B19E3779F9
_WORDS = struct.Struct("<QQ")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _table_bits(nblocks: int) -> int:
    return max(1, (nblocks - 1).bit_length())


def _byte_size(buf) -> int:
    with memoryview(buf) as mv:
        return mv.nbytes


class DeltaIndex:
    """The index of one base; reuse it for every target tried against that base.

    ``DeltaIndex(base)``: ``base`` is any contiguous bytes-like object, at most
    ``MAX_BASE`` bytes (OverflowError otherwise). ``base_size``: its length;
    ``memory``: the bytes the C extension's index takes for this base (the same
    figure from both implementations, so a memory-bounded window decides alike).
    """

    __slots__ = ("_base", "_blocks", "base_size", "memory")

    def __init__(self, base) -> None:
        size = _byte_size(base)
        if size > MAX_BASE:
            raise OverflowError(f"delta base of {size} bytes is larger than {MAX_BASE} bytes")
        self._base = base if type(base) is bytes else bytes(memoryview(base).cast("B"))
        self.base_size = size
        nblocks = size // BLOCK
        self._blocks: dict[bytes, list[int]] = {}
        self.memory = 0
        if not nblocks:
            return
        bits = _table_bits(nblocks)
        shift = 64 - bits
        buckets: dict[int, list[int]] = {}
        off = 0
        for lo, hi in _WORDS.iter_unpack(memoryview(self._base)[: nblocks * BLOCK]):
            h = ((lo * _K1) ^ (hi * _K2)) & _M64
            h ^= h >> 29
            b = ((h * _K3) & _M64) >> shift
            lst = buckets.get(b)
            if lst is None:
                buckets[b] = [off]
            else:
                lst.append(off)
            off += BLOCK
        kept = 0
        blocks = self._blocks
        base = self._base
        for offs in buckets.values():
            n = len(offs)
            if n > BUCKET_CAP:
                offs = [offs[k * n // BUCKET_CAP] for k in range(BUCKET_CAP)]
            kept += len(offs)
            for o in offs:
                key = base[o:o + BLOCK]
                lst = blocks.get(key)
                if lst is None:
                    blocks[key] = [o]
                else:
                    lst.append(o)
        # Same-content blocks share a bucket, so each list is already ascending.
        self.memory = 4 * ((1 << bits) + 1) + 4 * kept

    def create_delta(self, target, max_size: int = -1) -> bytes | None:
        """The delta from this base to ``target``; None when it would exceed ``max_size``."""
        if max_size < -1:
            raise ValueError(f"max_size must be >= 0, or -1 for no limit, not {max_size}")
        t = target if type(target) is bytes else bytes(memoryview(target).cast("B"))
        base = self._base
        blen = self.base_size
        tlen = len(t)
        limit = max_size if max_size >= 0 else None
        out = bytearray(_varint(blen))
        out += _varint(tlen)
        if limit is not None and len(out) > limit:
            return None
        get = self._blocks.get
        pos = ins = 0
        last = tlen - BLOCK
        while pos <= last:
            cands = get(t[pos:pos + BLOCK])
            if cands is None:
                pos += 1
                continue
            best_len = 0
            best_off = 0
            for o in cands:
                n = BLOCK + _common_prefix(base, o + BLOCK, t, pos + BLOCK, min(blen - o, tlen - pos) - BLOCK)
                if n > best_len:
                    best_len, best_off = n, o
                    if n >= STOP_LEN:
                        break
            back = 0
            most = min(pos - ins, best_off)
            while back < most and base[best_off - back - 1] == t[pos - back - 1]:
                back += 1
            start = pos - back
            if start > ins:
                _emit_inserts(out, t, ins, start)
            _emit_copies(out, best_off - back, best_len + back)
            if limit is not None and len(out) > limit:
                return None
            pos = ins = pos + best_len
        if ins < tlen:
            _emit_inserts(out, t, ins, tlen)
        if limit is not None and len(out) > limit:
            return None
        return bytes(out)


def create_delta(base, target, max_size: int = -1) -> bytes | None:
    return DeltaIndex(base).create_delta(target, max_size)


def _common_prefix(a: bytes, i: int, b: bytes, j: int, limit: int) -> int:
    """How many bytes a[i:] and b[j:] share, up to ``limit``: doubling equal slices, then halving."""
    n = 0
    step = 32
    while n < limit:
        k = min(step, limit - n)
        if a[i + n:i + n + k] == b[j + n:j + n + k]:
            n += k
            step <<= 1
            continue
        lo, hi = 0, k           # a[i+n : i+n+lo] equal; the first difference lies before n+hi
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if a[i + n + lo:i + n + mid] == b[j + n + lo:j + n + mid]:
                lo = mid
            else:
                hi = mid
        return n + lo
    return n


def _emit_inserts(out: bytearray, t: bytes, start: int, end: int) -> None:
    while start < end:
        k = min(MAX_INSERT, end - start)
        out.append(k)
        out += t[start:start + k]
        start += k


def _emit_copies(out: bytearray, off: int, n: int) -> None:
    while n:
        size = min(n, MAX_COPY)
        at = len(out)
        out.append(0)
        op = 0x80
        for i in range(4):
            byte = (off >> (8 * i)) & 0xFF
            if byte:
                out.append(byte)
                op |= 1 << i
        if size != 0x10000:
            for i in range(3):
                byte = (size >> (8 * i)) & 0xFF
                if byte:
                    out.append(byte)
                    op |= 0x10 << i
        out[at] = op
        off += size
        n -= size
