"""Reachability bitmaps: git's ``.bitmap`` v1 for a pack (or, given its order, a multi-pack-index).

What git's ``pack-objects --write-bitmap-index`` writes (git 2.39 ``pack-bitmap-write.c``; the format is
Documentation/technical/bitmap-format.txt), and how:

* **Bit order** is the caller's: ``order`` lists the objects, bit *i* = ``order[i]``. A pack's order is its
  idx entries sorted by offset (the order the pack writer wrote them), with the pack's checksum; a MIDX's
  is its pseudo-pack order with the MIDX checksum. Both are parameters of :func:`encode_bitmap`.
* **Index positions** (each bitmap's commit position, the lookup table, the name-hash cache) count in
  object-id order, as git's ``oid_pos`` over the sorted idx entries does.
* **The four type bitmaps** (commits, trees, blobs, tags), built with ``ewah_set``.
* **Commit selection** (:func:`select_commits`, ``bitmap_writer_select_commits``): the commits in the
  order the traversal met them, stably sorted newest first by committer date; fewer than 100: all of
  them; else the 100 newest each get a bitmap, then one per window that grows with the distance (at most
  100 commits apart up to the 20,000th, then up to 5,000), in each window the first commit a
  ``pack.preferBitmapTips`` ref names or else the window's last merge or else its last commit.
* **Each selected commit's bitmap** is the closure of the commit: every commit, tree and blob it reaches
  (gitlinks not followed). :func:`build_bitmaps` computes them oldest first, an ancestor's finished
  bitmap ORed in where the walk meets it (git's builder shares work differently; the sets are the same
  by definition).
* **XOR compression** (``compute_xor_offsets``): each bitmap, in selection order, is stored XORed against
  the one of the 10 before it that makes the smallest EWAH, if smaller than itself.
* **The name-hash cache** (``BITMAP_OPT_HASH_CACHE``, on as in git): ``pack_name_hash`` of the whole path each
  object was first reached by in the traversal (0 for commits and root trees; a tag: its ``tag`` name), one
  be32 per object in index order; the walk computes them as it goes (:attr:`.walk.Reachable.path_hashes`).
* **The lookup table** (``BITMAP_OPT_LOOKUP_TABLE``, git's ``pack.writeBitmapLookupTable``; git 2.39 reads
  and writes it, off by default there, on here as Gitaly sets it): (commit position, file offset of the
  bitmap, row of its XOR base) sorted by commit position.

Given the same order, commits, names and options, the bytes are git's (``tests/workers/test_bitmap.py`` compares
with git's own file for git's own pack).
"""
from __future__ import annotations

import bisect
import contextlib
import hashlib
import heapq
import os
import struct
import sys
from array import array
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from ... import native
from ...errors import CorruptObjectError, StoreError
from ...objects import ObjectType
from ..walk.parse import CommitMeta, name_hash_fold, parse_commit, parse_tree_entries
from ..walk.reach import c_loop_errors
from . import ewah as _ewah

#: The closure loop and EWAH in C (the ``_bitmap`` extension: it reads through the walk's Packs), unless
#: PACKYARD_PURE_PYTHON=1 or it was not built (store/native.py); :func:`build_bitmaps` is its specification.
_c = native.bitmap()
IMPLEMENTATION = "c" if _c is not None else "python"

SIGNATURE = b"BITM"
VERSION = 1
OPT_FULL_DAG = 0x1
OPT_HASH_CACHE = 0x4
OPT_LOOKUP_TABLE = 0x10
HEADER_SIZE = 4 + 2 + 2 + 4 + 20
#: git's MAX_XOR_OFFSET_SEARCH: a bitmap may be stored XORed against one of the 10 before it.
MAX_XOR_OFFSET = 10
#: git's next_commit_index constants.
MUST_REGION = 100
MIN_REGION = 20000
MIN_COMMITS = 100
MAX_COMMITS = 5000

_DIR_MODES = frozenset({b"40000", b"040000"})
_GITLINK = b"160000"
_TYPE_ROW = {int(ObjectType.COMMIT): 0, int(ObjectType.TREE): 1, int(ObjectType.BLOB): 2, int(ObjectType.TAG): 3}

Read = Callable[[bytes], tuple[int, bytes]]


class BitmapClosureError(StoreError):
    """The objects to bitmap are not closed under reachability (git: "Packfile doesn't have full closure"):
    no bitmap can describe them."""


@dataclass(frozen=True)
class BitmapOptions:
    hash_cache: bool = True                  # git's pack.writeBitmapHashCache (default on)
    lookup_table: bool = True                # git's pack.writeBitmapLookupTable (git's default off; Gitaly on)
    prefer_tips: tuple[str, ...] = ()        # git's pack.preferBitmapTips: ref prefixes whose tips get bitmaps

    @property
    def flags(self) -> int:
        return OPT_FULL_DAG | (OPT_HASH_CACHE if self.hash_cache else 0) | \
            (OPT_LOOKUP_TABLE if self.lookup_table else 0)


def name_hash(name: bytes | None) -> int:
    """git's ``pack_name_hash``: the last ~16 non-space bytes of a path, the last weighing most."""
    return name_hash_fold(0, name) if name else 0


# -- the commits ---------------------------------------------------------------------------------------

@dataclass
class CommitGraph:
    """(tree, parents, committer date) of each commit, read once through ``read``."""

    read: Read
    info: dict[bytes, tuple[bytes, list[bytes], int]] = field(default_factory=dict)

    def __call__(self, oid: bytes) -> tuple[bytes, list[bytes], int]:
        got = self.info.get(oid)
        if got is None:
            _t, data = self.read(oid)
            got = self.info[oid] = parse_commit(data, oid)
        return got


def _next_commit_index(idx: int) -> int:
    if idx <= MUST_REGION:
        return 0
    if idx <= MIN_REGION:
        offset = idx - MUST_REGION
        return offset if offset < MIN_COMMITS else MIN_COMMITS
    offset = idx - MIN_REGION
    nxt = offset if offset < MAX_COMMITS else MAX_COMMITS
    return nxt if nxt > MIN_COMMITS else MIN_COMMITS


def select_commits(commits: Sequence[bytes], graph: CommitGraph, preferred: Iterable[bytes] = ()) -> list[bytes]:
    """``bitmap_writer_select_commits``: which commits get a bitmap, in the order they are written."""
    by_date = sorted(commits, key=lambda c: -graph(c)[2])   # (stable, as glibc's merge-sort qsort)
    n = len(by_date)
    if n < 100:
        return list(by_date)
    wanted = set(preferred)
    out: list[bytes] = []
    i = 0
    while True:   # (bounded: i grows by at least 1 each round and stops at n)
        nxt = _next_commit_index(i)
        if i + nxt >= n:
            break
        if nxt == 0:
            chosen = by_date[i]
        else:
            chosen = by_date[i + nxt]
            for j in range(nxt + 1):
                cm = by_date[i + j]
                if cm in wanted:
                    chosen = cm
                    break
                if len(graph(cm)[1]) > 1:
                    chosen = cm
        out.append(chosen)
        i += nxt + 1
    return out


def preferred_tips(tips: Mapping[str, bytes], prefixes: Sequence[str], peel: Callable[[bytes], bytes | None]
                   ) -> set[bytes]:
    """Commits named (after peeling tags) by refs under ``pack.preferBitmapTips`` prefixes."""
    out: set[bytes] = set()
    if not prefixes:
        return out
    for name, oid in tips.items():
        if any(name.startswith(p) for p in prefixes):
            c = peel(oid)
            if c is not None:
                out.add(c)
    return out


# -- the bitmaps -----------------------------------------------------------------------------------------

def build_bitmaps(selected: Sequence[bytes], pos: Mapping[bytes, int], nbits: int, graph: CommitGraph,
                  read: Read) -> list[int]:
    """The closure of each selected commit as an int (bit i: object ``order[i]``), in ``selected``'s order.

    Oldest first: each walk goes newest-first by committer date and takes a finished ancestor's bitmap
    whole where it meets it, then walks the trees of the commits it added, skipping every tree whose bit
    is already set. BitmapClosureError if something reached has no position.
    """
    nbytes = (nbits + 7) // 8
    done: dict[bytes, int] = {}

    def at(oid: bytes, referrer: bytes) -> int:
        p = pos.get(oid)
        if p is None:
            raise BitmapClosureError(f"object {oid.hex()} (reached from {referrer.hex()}) is not among the "
                                     f"objects to bitmap: no full closure", oid=oid)
        return p

    for s in sorted(set(selected), key=lambda c: (graph(c)[2], pos.get(c, 0))):
        work = bytearray(nbytes)
        heap = [(-graph(s)[2], 0, s)]
        seq = 1
        added: list[bytes] = []
        while heap:   # (bounded: a commit is added at most once, its bit set)
            _d, _n, c = heapq.heappop(heap)
            p = at(c, s)
            if work[p >> 3] >> (p & 7) & 1:
                continue
            bm = done.get(c)
            if bm is not None:
                work = bytearray((int.from_bytes(work, "little") | bm).to_bytes(nbytes, "little"))
                continue
            work[p >> 3] |= 1 << (p & 7)
            added.append(c)
            for parent in graph(c)[1]:
                q = at(parent, c)
                if not work[q >> 3] >> (q & 7) & 1:
                    heapq.heappush(heap, (-graph(parent)[2], seq, parent))
                    seq += 1
        for c in added:
            stack = [graph(c)[0]]
            while stack:   # (bounded: a tree is read only when its bit was clear; then it is set)
                t = stack.pop()
                p = at(t, c)
                if work[p >> 3] >> (p & 7) & 1:
                    continue
                work[p >> 3] |= 1 << (p & 7)
                _typ, data = read(t)
                for mode, _name, oid in parse_tree_entries(data, t):
                    if mode == _GITLINK:
                        continue
                    q = at(oid, t)
                    if work[q >> 3] >> (q & 7) & 1:
                        continue
                    if mode in _DIR_MODES:
                        stack.append(oid)
                    else:
                        work[q >> 3] |= 1 << (q & 7)
        done[s] = int.from_bytes(work, "little")
    return [done[s] for s in selected]


def xor_offsets(bitmaps: Sequence[_ewah.Ewah]) -> list[tuple[int, _ewah.Ewah]]:
    """``compute_xor_offsets``: (offset, what to write) for each bitmap, in order."""
    out = []
    for k, cur in enumerate(bitmaps):
        best_offset, best = 0, cur
        for i in range(1, MAX_XOR_OFFSET + 1):
            if k - i < 0:
                break
            test = _ewah.xor(bitmaps[k - i], cur)
            if test.size < best.size:
                best_offset, best = i, test
        out.append((best_offset, best))
    return out


# -- the file ---------------------------------------------------------------------------------------------

def _type_rows(types: Sequence[int]) -> list[_ewah.Ewah]:
    """The four type bitmaps (commits, trees, blobs, tags), each as ``Ewah.set`` of its objects' bits in order
    builds it: the bits as one int per row (a '0'/'1' string in C, reversed: bit i is object i)."""
    raw = bytes(types)
    unknown = set(raw) - set(_TYPE_ROW)
    if unknown:
        raise ValueError(f"object type numbers {sorted(unknown)} have no type bitmap")
    rows = []
    for row in range(4):
        table = bytes(0x31 if _TYPE_ROW.get(t) == row else 0x30 for t in range(256))
        rows.append(_ewah.from_int_as_set(int(raw.translate(table)[::-1] or b"0", 2)))
    return rows


def encode_bitmap(order: Sequence[bytes], types: Sequence[int], checksum: bytes, selected: Sequence[bytes],
                  bitmaps: Sequence[int] | None, *, hashes: Sequence[int] | None, options: BitmapOptions,
                  stored: Sequence[tuple[int, bytes]] | None = None, index: Sequence[int] | None = None) -> bytes:
    """The ``.bitmap`` file: ``order`` (bit order), ``types`` (each object's type number, same order),
    ``checksum`` (the pack's or MIDX's), the selected commits and their closures, ``hashes`` (name hash of
    each object, bit order; None: zeros). ``stored``: (XOR offset, serialized EWAH) of each bitmap already
    computed (the C path), instead of ``bitmaps``. ``index``: the bit position of each object in id order (a
    pack's idx order, which its writer has; None: sorted here, 0.05 s for 164k objects)."""
    n = len(order)
    if len(types) != n or (hashes is not None and len(hashes) != n):
        raise ValueError(f"{n} objects but {len(types)} types / {len(hashes or ())} name hashes")
    rows = _type_rows(types)
    if index is None:
        index = sorted(range(n), key=order.__getitem__)   # index position -> bit position
    elif len(index) != n:
        raise ValueError(f"{n} objects but an index order of {len(index)}")
    by_id = [order[i] for i in index]
    commit_pos = [bisect.bisect_left(by_id, c) for c in selected]   # (a selected commit is among the objects)
    for c, k in zip(selected, commit_pos):
        if k >= n or by_id[k] != c:
            raise ValueError(f"selected commit {c.hex()} is not among the objects (or the index order is not by id)")
    if stored is None:
        stored = [(xo, e.serialize()) for xo, e in xor_offsets([_ewah.from_int(b) for b in bitmaps or ()])]

    out = bytearray(SIGNATURE + struct.pack(">HHI", VERSION, options.flags, len(selected)) + checksum)
    for r in rows:
        out += r.serialize()
    offsets = []
    for cpos, (xo, bm) in zip(commit_pos, stored):
        offsets.append(len(out))
        out += struct.pack(">IBB", cpos, xo, 0)
        out += bm
    if options.lookup_table:
        table = sorted(range(len(selected)), key=commit_pos.__getitem__)
        inv = [0] * len(table)
        for j, i in enumerate(table):
            inv[i] = j
        for i in table:
            xo = stored[i][0]
            out += struct.pack(">IQI", commit_pos[i], offsets[i], inv[i - xo] if xo else 0xFFFFFFFF)
    if options.hash_cache:
        if hashes is None:
            out += bytes(4 * n)
        else:
            cache = array("I", [hashes[i] for i in index])
            if cache.itemsize != 4 or sys.byteorder != "little":   # pragma: no cover (not where packyard runs)
                out += struct.pack(f">{n}I", *cache)
            else:
                cache.byteswap()   # (big-endian on disk)
                out += cache.tobytes()
    out += hashlib.sha1(out).digest()
    return bytes(out)


def bitmap_for(order: Sequence[bytes], types: Sequence[int], checksum: bytes, commits: Sequence[bytes],
               read: Read, *, names: Mapping[bytes, bytes] | None = None, tips: Mapping[str, bytes] | None = None,
               options: BitmapOptions = BitmapOptions(), packs: object = None,
               path_hashes: Mapping[bytes, int] | None = None, index: Sequence[int] | None = None,
               walked: CommitMeta | None = None) -> bytes:
    """Everything from the objects: select among ``commits`` (traversal order), build, encode (``index``: see
    :func:`encode_bitmap`; ``walked``: what the walk read of exactly ``commits``, in that order).

    ``names``: object -> the whole path it was first reached by, or ``path_hashes``: object -> git's hash of that
    path (the walk's :attr:`~.walk.Reachable.path_hashes`); tags are named by their ``tag`` header, as git's traversal
    names them. ``tips``: the refs, for ``prefer_tips``.
    """
    graph = CommitGraph(read)
    pos = {oid: i for i, oid in enumerate(order)}

    def peel(oid: bytes) -> bytes | None:
        for _ in range(64):   # (a tag chain longer than this is not followed)
            p = pos.get(oid)
            if p is None:
                return None
            t = types[p]
            if t == int(ObjectType.COMMIT):
                return oid
            if t != int(ObjectType.TAG):
                return None
            _typ, data = read(oid)
            if not data.startswith(b"object ") or len(data) < 47:
                return None
            oid = bytes.fromhex(data[7:47].decode("ascii", "replace"))
        return None

    preferred = preferred_tips(tips or {}, options.prefer_tips, peel)
    if _c is not None and packs is not None:
        selected, stored = c_selected_and_stored(commits, graph, preferred, order, pos, read, packs, walked)
        bitmaps = None
    else:
        selected = select_commits(commits, graph, preferred)
        bitmaps = build_bitmaps(selected, pos, len(order), graph, read)
        stored = None
    hashes = None
    if options.hash_cache:
        commit, tag = int(ObjectType.COMMIT), int(ObjectType.TAG)
        if path_hashes is not None:
            get = path_hashes.get
            hashes = [0 if t == commit else get(oid, 0) for oid, t in zip(order, types)]
        else:
            named = names or {}
            hashes = [0 if t == commit else name_hash(named.get(oid)) for oid, t in zip(order, types)]
        raw = bytes(types)
        i = raw.find(tag)
        while i >= 0:   # tags are named by their tag header, as git's traversal names them
            _typ, data = read(order[i])
            hashes[i] = name_hash(_tag_name(data))
            i = raw.find(tag, i + 1)
    return encode_bitmap(order, types, checksum, selected, bitmaps, hashes=hashes, options=options, stored=stored,
                         index=index)


def c_selected_and_stored(commits: Sequence[bytes], graph: CommitGraph, preferred: Iterable[bytes],
                          order: Sequence[bytes], pos: Mapping[bytes, int], read: Read,
                          packs: object, walked: CommitMeta | None = None
                          ) -> tuple[list[bytes], Sequence[tuple[int, bytes]]]:
    """The selection and the XOR-compressed bitmaps in C (``packs``: the walk extension's view of the packs):
    the commits' dates and parents read in C (or taken from ``walked``, what the walk read of ``commits``,
    the same dates and counts), git's selection in Python, the closures and EWAH in C."""
    assert _c is not None
    with _c_errors():
        if walked is not None and len(walked.nparents) == 4 * len(commits):
            dates, nparents = walked.dates, walked.nparents
        else:
            dates, nparents = _c.bitmap_commits(packs, b"".join(commits), read)
        graph.info.update(_c_dates(commits, dates, nparents))
        selected = select_commits(commits, graph, preferred)
        stored = _c.ewah_stored(_c_build(selected, order, pos, graph, read, packs), MAX_XOR_OFFSET)
    return selected, stored


def _c_dates(commits: Sequence[bytes], dates: bytes, nparents: bytes):
    """CommitGraph entries for the selection from the C reads: (no tree, as many parents, the date)."""
    d = array("q")
    d.frombytes(dates)
    k = array("I")
    k.frombytes(nparents)
    return {c: (b"", [b""] * n, when) for c, when, n in zip(commits, d, k)}


def _c_build(selected: Sequence[bytes], order: Sequence[bytes], pos: Mapping[bytes, int], graph: CommitGraph,
             read: Read, packs: object) -> list[bytes]:
    """build_bitmaps in C: the same walks in the same order (oldest first), the same bits, as native 64-bit words
    (what ewah_stored takes)."""
    todo = sorted(set(selected), key=lambda c: (graph(c)[2], pos.get(c, 0)))
    got = _c.bitmap_closures(packs, b"".join(order), b"".join(todo), read,
                             int.from_bytes(os.urandom(8), "little"))
    if got is None:
        raise BitmapClosureError("objects reached from the selected commits are not all among the objects to "
                                 "bitmap: no full closure")
    done = dict(zip(todo, got))
    return [done[c] for c in selected]


@contextlib.contextmanager
def _c_errors() -> Iterator[None]:
    """The C loop's errors as the store's typed errors (:func:`.walk.c_loop_errors`; a ValueError from a
    malformed object becomes a CorruptObjectError)."""
    try:
        with c_loop_errors():
            yield
    except ValueError as err:
        raise CorruptObjectError(str(err)) from None


def _tag_name(data: bytes) -> bytes | None:
    end = data.find(b"\n\n")
    for line in (data if end < 0 else data[:end]).split(b"\n"):
        if line.startswith(b"tag "):
            return line[4:]
    return None


# -- a repack's new pack ------------------------------------------------------------------------------------

def write_pack_bitmap(writer, reach, tips: Mapping[str, bytes], read: Read, options: BitmapOptions, *,
                      packs: object = None) -> int | None:
    """A full repack's bitmap for its finished pack (``writer``: :class:`~..pack.write.PackWriter` after
    ``finish()``; ``reach``: the plan's :class:`~.walk.Reachable`), attached to be installed with the pack.
    Returns the commits bitmapped, or None when the pack is not closed (objects left in a .keep pack: git
    too writes no bitmap then)."""
    oids = bytes(writer.oids)
    if len(oids) // 20 != len(reach):
        return None   # (some reached objects stay in .keep packs: no closure)
    order = [oids[k:k + 20] for k in range(0, len(oids), 20)]   # write order = offset order = bit order
    kind: dict[bytes, int] = {}
    for ids, t in ((reach.commits, ObjectType.COMMIT), (reach.tags, ObjectType.TAG), (reach.trees, ObjectType.TREE),
                   (reach.blobs, ObjectType.BLOB)):
        kind.update(dict.fromkeys(ids, int(t)))
    try:
        types = [kind[o] for o in order]
    except KeyError:
        return None   # (an object the walk did not reach: not a full repack's pack)
    in_pack = set(order)
    commits = [c for c in reach.commits if c in in_pack]
    try:
        index = None
        if len(writer.index_order) == 4 * len(order) and array("I").itemsize == 4:
            index = array("I")
            index.frombytes(writer.index_order)   # (the idx it wrote: object ids in order, by pack position)
        data = bitmap_for(order, types, writer.checksum, commits, read,
                          path_hashes=reach.path_hashes if options.hash_cache else None, tips=tips,
                          options=options, packs=packs, index=index,
                          walked=reach.commit_meta if len(commits) == len(reach.commits) else None)
    except BitmapClosureError:
        return None
    writer.attach_bitmap(data)
    return read_header(data).entries


# -- reading the header (the strategy's "does the bitmap match the pack?") ---------------------------------

@dataclass(frozen=True)
class BitmapHeader:
    flags: int
    entries: int
    checksum: bytes


def read_header(data: bytes) -> BitmapHeader:
    """The header of a ``.bitmap``; ValueError if it is not one git 2.39 reads (signature, version 1,
    FULL_DAG) or its trailing SHA-1 does not match."""
    if len(data) < HEADER_SIZE + 20 or data[:4] != SIGNATURE:
        raise ValueError("not a bitmap file (no BITM signature)")
    version, flags, entries = struct.unpack_from(">HHI", data, 4)
    if version != VERSION or not flags & OPT_FULL_DAG:
        raise ValueError(f"bitmap version {version} flags {flags:#x}: not what git 2.39 reads")
    if hashlib.sha1(data[:-20]).digest() != data[-20:]:
        raise ValueError("bitmap trailer checksum does not match its contents")
    return BitmapHeader(flags=flags, entries=entries, checksum=data[12:32])


__all__ = ["BitmapOptions", "BitmapClosureError", "BitmapHeader", "name_hash", "select_commits", "build_bitmaps",
           "xor_offsets", "encode_bitmap", "bitmap_for", "read_header", "CommitGraph", "preferred_tips",
           "write_pack_bitmap"]
