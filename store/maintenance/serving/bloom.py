"""Changed-path Bloom filters exactly as git 2.39 computes them (bloom.c), for the commit-graph's BIDX/BDAT.

For each commit: the paths its tree changes against its first parent's (a root commit: against the
empty tree), recursively, no rename detection, plus every leading directory of each path (``a/b/c``
adds ``a/b`` and ``a``), deduplicated. More than 512 changes (before or after adding the
directories) gives the one-byte "too large" filter ``ff``; no change at all the one-byte ``00``.
Otherwise the filter is ``ceil(paths * 10 / 8)`` bytes and each path sets 7 bits: ``h0 + i * h1``
modulo the filter's bit count, with ``h0``/``h1`` git's murmur3 with seeds 0x293ae76f and
0x7e646e2c -- including git 2.39's reading of path bytes as *signed* chars (bytes >= 0x80 are
sign-extended before they are combined: what git 2.39 on x86 and ARM64 Linux writes and reads).

This module is the specification; :func:`filters` runs the same diff and filters in C (the _bloom
extension, store/maintenance/serving/_bloom.c, reading trees straight from the packs) unless
``PACKYARD_PURE_PYTHON=1`` or the extension was not built (tests/store/test_bloom_c.py compares the bytes).
"""
from __future__ import annotations

import os
import re
from array import array
from typing import Callable, Iterable, Sequence

from ... import native
from ...errors import CorruptObjectError
from ...objects import ObjectType
from ..walk.parse import parse_tree_entries
from ..walk.reach import c_loop_errors
from ..walk.sources import _layout

#: The filters and the commit-graph's commit reads in C (the ``_bloom`` extension, reading through the walk's
#: Packs), unless PACKYARD_PURE_PYTHON=1 or it was not built (store/native.py); this module specifies them.
_c = native.bloom()
_walk_c = native.walk()

HASH_VERSION = 1
NUM_HASHES = 7
BITS_PER_ENTRY = 10
MAX_CHANGED_PATHS = 512
SEED0 = 0x293ae76f
SEED1 = 0x7e646e2c

TOO_LARGE = b"\xff"
EMPTY = b"\x00"

_M32 = 0xFFFFFFFF
_TREE = b"40000"
#: At most this many parsed trees are kept between commits (consecutive commits share most subtrees).
TREE_CACHE_ENTRIES = 8192
#: At most this many paths' hash positions are kept (a bound on the cache filter_bytes is given).
KEY_CACHE_ENTRIES = 1 << 18


def _rotl(v: int, n: int) -> int:
    return ((v << n) | (v >> (32 - n))) & _M32


def _sx(b: int) -> int:
    """A byte read through git's ``const char *`` (signed on the platforms git ships for), as uint32."""
    return (b - 256) & _M32 if b >= 0x80 else b


def murmur3_seeded(seed: int, data: bytes) -> int:
    """git 2.39's ``murmur3_seeded`` (bloom.c), signed-char reading included."""
    c1, c2 = 0xcc9e2d51, 0x1b873593
    n4 = len(data) // 4
    h = seed
    for i in range(n4):
        b = data[4 * i:4 * i + 4]
        k = (_sx(b[0]) | (_sx(b[1]) << 8) | (_sx(b[2]) << 16) | (_sx(b[3]) << 24)) & _M32
        k = (k * c1) & _M32
        k = _rotl(k, 15)
        k = (k * c2) & _M32
        h ^= k
        h = (_rotl(h, 13) * 5 + 0xe6546b64) & _M32
    tail = data[4 * n4:]
    rest = len(data) & 3
    if rest:
        k1 = 0
        if rest == 3:
            k1 ^= (_sx(tail[2]) << 16) & _M32
        if rest >= 2:
            k1 ^= (_sx(tail[1]) << 8) & _M32
        k1 ^= _sx(tail[0])
        k1 = (k1 * c1) & _M32
        k1 = _rotl(k1, 15)
        k1 = (k1 * c2) & _M32
        h ^= k1
    h ^= len(data) & _M32
    h ^= h >> 16
    h = (h * 0x85ebca6b) & _M32
    h ^= h >> 13
    h = (h * 0xc2b2ae35) & _M32
    h ^= h >> 16
    return h


def bloom_key(path: bytes) -> list[int]:
    """The NUM_HASHES bit positions (before the modulo) git derives for ``path``."""
    h0 = murmur3_seeded(SEED0, path)
    h1 = murmur3_seeded(SEED1, path)
    return [(h0 + i * h1) & _M32 for i in range(NUM_HASHES)]


def filter_bytes(paths: set[bytes] | None, keys: dict[bytes, list[int]] | None = None) -> bytes:
    """The filter for a set of changed paths (directories included); None: too many changes.
    ``keys``: a cache of :func:`bloom_key` per path (the same directories change in commit after commit)."""
    if paths is None or len(paths) > MAX_CHANGED_PATHS:
        return TOO_LARGE
    length = (len(paths) * BITS_PER_ENTRY + 7) // 8
    if not length:
        return EMPTY
    bits = length * 8
    data = bytearray(length)
    for path in paths:
        if keys is None:
            key = bloom_key(path)
        else:
            key = keys.get(path)   # type: ignore[assignment]
            if key is None:
                if len(keys) >= KEY_CACHE_ENTRIES:
                    keys.clear()
                key = keys[path] = bloom_key(path)
        for h in key:
            pos = h % bits
            data[pos >> 3] |= 1 << (pos & 7)
    return bytes(data)


def contains(filt: bytes, path: bytes) -> bool:
    """What git's bloom_filter_contains answers (maybe: True; definitely not: False)."""
    bits = len(filt) * 8
    return all(filt[(h % bits) >> 3] & (1 << ((h % bits) & 7)) for h in bloom_key(path))


class _TooMany(Exception):
    pass


class TreeDiffer:
    """The changed paths between two trees, as git's recursive tree diff lists them (no renames).

    ``read(oid) -> (type, data)``; parsed trees are cached (bounded) since consecutive commits share them.
    """

    def __init__(self, read: Callable[[bytes], tuple[ObjectType, bytes]]) -> None:
        self._read = read
        self._cache: dict[bytes, frozenset[bytes]] = {}

    def _tree(self, oid: bytes | None) -> frozenset[bytes]:
        """A tree's entries as a set of raw entry bytes (``mode name\0id``): two versions of a tree differ
        in a few, and only those are split into their fields."""
        if oid is None:
            return _NO_ENTRIES
        got = self._cache.get(oid)
        if got is not None:
            return got
        obj_type, data = self._read(oid)
        if obj_type != ObjectType.TREE:
            raise CorruptObjectError(f"expected a tree, found a {obj_type.label.decode()}", oid=oid)
        entries = _ENTRY.findall(data)
        if sum(map(len, entries)) != len(data):
            parse_tree_entries(data, oid)   # raises CorruptObjectError naming the tree
            raise CorruptObjectError("tree does not parse (malformed entry)", oid=oid)
        got = frozenset(entries)
        if len(self._cache) >= TREE_CACHE_ENTRIES:
            self._cache.pop(next(iter(self._cache)))
        self._cache[oid] = got
        return got

    def changed(self, old_tree: bytes | None, new_tree: bytes) -> set[bytes] | None:
        """Every changed path and its leading directories; None when git's filter is "too large"."""
        out: list[bytes] = []
        try:
            self._diff(old_tree, new_tree, b"", out)
        except _TooMany:
            return None
        paths: set[bytes] = set()
        for path in out:
            while True:
                if path in paths:
                    break
                paths.add(path)
                cut = path.rfind(b"/")
                if cut < 0:
                    break
                path = path[:cut]
        return None if len(paths) > MAX_CHANGED_PATHS else paths

    def _emit(self, out: list[bytes], path: bytes) -> None:
        out.append(path)
        if len(out) > MAX_CHANGED_PATHS:
            raise _TooMany

    def _diff(self, old: bytes | None, new: bytes | None, prefix: bytes, out: list[bytes]) -> None:
        a = self._tree(old)
        b = self._tree(new)
        # Only entries that are not in both trees (same mode, name and id) can be a change.
        side_a = {name: (_canon(mode), eid) for mode, name, eid in map(_split, a - b)}
        side_b = {name: (_canon(mode), eid) for mode, name, eid in map(_split, b - a)}
        for name in sorted(side_a.keys() | side_b.keys()):   # the set is order-free; sorted: repeatable runs
            ea, eb = side_a.get(name), side_b.get(name)
            if ea == eb:
                continue   # a non-canonical mode only (100664 is 100644 to git's diff)
            path = prefix + name
            a_tree = ea is not None and ea[0] == _TREE
            b_tree = eb is not None and eb[0] == _TREE
            if a_tree or b_tree:
                # A directory on either side is compared recursively; a file on the other side is one change.
                if (ea is not None and not a_tree) or (eb is not None and not b_tree):
                    self._emit(out, path)
                self._diff(ea[1] if a_tree else None, eb[1] if b_tree else None,  # type: ignore[index]
                           path + b"/", out)
            else:
                self._emit(out, path)


def open_packs(packs: Iterable) -> object | None:   # type: ignore[type-arg]
    """The C loops' view of the repository's packs (:class:`~..pack.packdir.PackFile` s: objects not in
    them are read through ``read``), or None without the extension. Close it with :func:`close_packs`."""
    if _c is None or _walk_c is None:
        return None
    tables = []
    for pack in packs:
        try:
            t = pack.tables()
            order, sorted_offsets, ends = _layout(t.offsets, pack.end)
            tables.append((pack.buffer(), pack.end, t.oids, t.offsets, t.crcs, ends, sorted_offsets, order))
        except OSError:
            continue   # (a pack removed since it was listed: its objects come through read())
    return _walk_c.Packs(tables, set(), int.from_bytes(os.urandom(8), "little"))


def close_packs(c_packs: object | None) -> None:
    if c_packs is not None:
        c_packs.close()   # type: ignore[attr-defined]


def filters(read: Callable[[bytes], tuple[ObjectType, bytes]], pairs: Sequence[tuple[bytes | None, bytes]],
            c_packs: object | None = None) -> list[bytes]:
    """The filter of each (first parent's tree or None, tree) pair, in order: in C with the extension (trees
    from ``c_packs``, see :func:`open_packs`, and the rest through ``read``), else :class:`TreeDiffer` and
    :func:`filter_bytes`."""
    if _c is None:
        differ = TreeDiffer(read)
        keys: dict[bytes, list[int]] = {}
        return [filter_bytes(differ.changed(old, new), keys) for old, new in pairs]
    own = c_packs is None
    if own:
        c_packs = open_packs(())
    try:
        with c_errors():
            data, ends_raw = _c.bloom_filters(c_packs, b"".join((old or _ZERO_ID) + new for old, new in pairs),
                                              read)
    finally:
        if own:
            close_packs(c_packs)
    ends = array("I")
    ends.frombytes(ends_raw)
    out, start = [], 0
    for end in ends:
        out.append(data[start:end])
        start = end
    return out


#: The C loop's errors as the store's typed errors (the walk extension's one mapping).
c_errors = c_loop_errors


_ZERO_ID = bytes(20)
_NO_ENTRIES: frozenset[bytes] = frozenset()
#: One whole tree entry: octal mode, space, name, NUL, 20-byte id (as walkparse.parse_tree_entries reads them).
_ENTRY = re.compile(rb"[0-7]+ [^\0]+\0.{20}", re.S)


def _split(entry: bytes) -> tuple[bytes, bytes, bytes]:
    sp = entry.index(b" ")
    nul = entry.index(b"\0", sp)
    return entry[:sp], entry[sp + 1:nul], entry[nul + 1:]
_CANON = {b"100644": b"100644", b"100755": b"100755", b"40000": _TREE, b"120000": b"120000",
          b"160000": b"160000"}


def _canon(mode: bytes) -> bytes:
    """git's canon_mode: what tree diff compares (a 100664 file is a 100644 file)."""
    got = _CANON.get(mode)
    if got is not None:
        return got
    value = int(mode, 8)
    kind = value & 0o170000
    if kind == 0o040000:
        return _TREE
    if kind == 0o120000:
        return b"120000"
    if kind == 0o160000:
        return b"160000"
    return b"100755" if value & 0o100 else b"100644"


__all__ = ["murmur3_seeded", "bloom_key", "filter_bytes", "filters", "open_packs", "close_packs", "c_errors",
           "contains", "TreeDiffer", "MAX_CHANGED_PATHS", "NUM_HASHES", "BITS_PER_ENTRY", "HASH_VERSION",
           "TOO_LARGE", "EMPTY"]
