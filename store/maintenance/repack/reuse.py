"""A repack's write plan, step 1 (:mod:`.writeplan`): where each object's copy lies, and which deltas are reused.

For every object of the plan, by position in its ids: a whole entry of a source pack, a delta entry whose base
is in the plan too (reusable: copied verbatim, never inflated -- unless reuse is off, as ``git repack -f``), a
delta entry whose base stays behind, or a loose file (:func:`find_reuse`; the C ``find_reuse`` where built, with
:func:`_locate` its specification). Reused chains are checked as git's ``pack-objects`` does (:func:`_check_chains`):
a cycle between packs or a chain deeper than the depth drops the delta that closes it, and each remaining
chain's height is remembered at its root. Then two questions for step 2: which copy of an object several packs
hold is taken (:func:`settle_duplicates`), and whether the delta search would provably try nothing
(:func:`nothing_to_try`).
"""
from __future__ import annotations

import bisect
from array import array
from typing import Callable

from ... import native
from ...pack.entries import entry_type, header_fields
from ..walk.sources import SourceIndex

#: The C write plan (find_reuse, check_chains), or None (store/native.py): the Python below is its specification.
_packwrite = native.packwrite()

#: What an object's copy in the sources is (``Reuse.kind``).
LOOSE, WHOLE, DELTA, DELTA_BASE_BEHIND = 0, 1, 2, 3


class Reuse:
    """Step 1's findings, by position in ``ids``."""

    def __init__(self, n: int) -> None:
        self.kind = bytearray(n)
        self.reused = bytearray(n)                 # 1: copied verbatim as a delta
        self.base = array("i", [-1]) * n          # a delta entry's base (position in ids), -1: not in the plan
        self.gid = array("q", [-1]) * n           # global entry number of its copy in the sources, -1: loose
        self.height = array("i", [0]) * n         # longest reused chain resting on this object
        self.dropped = 0                          # reusable deltas dropped (cycle or too deep)


def find_reuse(ids: list[bytes], sources: SourceIndex, *, reuse_deltas: bool, depth: int) -> Reuse:
    """Step 1 over every id; with ``reuse_deltas``, the reusable deltas marked (``Reuse.reused``) and their chains
    checked against ``depth``."""
    n = len(ids)
    r = Reuse(n)
    c_packs = sources.c_packs if _packwrite is not None else None
    found = _packwrite.find_reuse(c_packs, ids) if c_packs is not None else None
    if found is None:
        index_get = {oid: k for k, oid in enumerate(ids)}.get
        for k in range(n):
            _locate(r, k, ids[k], sources, index_get)
    else:
        kind_b, base_b, gid_b = found
        r.kind[:] = kind_b
        r.base = array("i")
        r.base.frombytes(base_b)
        r.gid = array("q")
        r.gid.frombytes(gid_b)
        if _UNDECIDED in kind_b:     # headers the C decoder left to Python (it raises, naming pack and offset)
            index_get = {oid: k for k, oid in enumerate(ids)}.get
            for k in (k for k in range(n) if kind_b[k] == _UNDECIDED):
                _locate(r, k, ids[k], sources, index_get)
    if reuse_deltas:
        r.reused[:] = r.kind.translate(_REUSABLE)
        _check_chains(r, depth)
    return r


_UNDECIDED = 255                                  # (the C find_reuse's kind for "Python decides")
_REUSABLE = bytes(1 if k == DELTA else 0 for k in range(256))


def _locate(r: Reuse, k: int, oid: bytes, sources: SourceIndex, index_get: Callable[[bytes, int], int]) -> None:
    """Step 1 for one object (the specification of the C ``find_reuse``)."""
    r.kind[k], r.base[k], r.gid[k] = LOOSE, -1, -1
    gid = sources.loc.get(oid)
    if gid is None:
        return
    r.gid[k] = gid
    p = sources.packs[sources.pack_no[gid]]
    off = p.offsets[gid - p.base]
    view = p.view
    assert view is not None
    if entry_type(view, off) < 6:
        r.kind[k] = WHOLE
        return
    base_oid = source_base(sources, p, off)
    bk = index_get(base_oid, -1) if base_oid is not None else -1
    r.kind[k] = DELTA if bk >= 0 else DELTA_BASE_BEHIND
    r.base[k] = bk


def _check_chains(r: Reuse, limit: int) -> None:
    """Drop reused deltas that close a cycle or pass ``limit``; record each chain's height at its root.
    (The C extension's ``check_chains`` does the same when present.)"""
    if _packwrite is not None:
        height_b, dropped = _packwrite.check_chains(r.reused, r.base, limit)
        r.height = array("i")
        r.height.frombytes(height_b)
        r.dropped += dropped
        return
    reused, base = r.reused, r.base
    n = len(reused)
    depth = array("i", [0]) * n
    root = array("i", [-1]) * n
    state = bytearray(n)            # 0: not seen, 1: on the path being followed, 2: done
    for k0 in range(n):
        if not reused[k0] or state[k0]:
            continue
        path = []
        k = k0
        while reused[k] and not state[k]:
            state[k] = 1
            path.append(k)
            k = base[k]
        if reused[k] and state[k] == 1:
            reused[k] = 0           # a cycle: the delta that closes it goes to the search
            r.dropped += 1
        for node in reversed(path):
            state[node] = 2
            if not reused[node]:
                continue
            b = base[node]
            d = depth[b] + 1 if reused[b] else 1
            if d > limit:
                reused[node] = 0    # too deep: a new chain starts here
                r.dropped += 1
                continue
            depth[node] = d
            root[node] = root[b] if reused[b] else b
    height = r.height
    for k in range(n):
        if reused[k]:
            rt = root[k]
            if depth[k] > height[rt]:
                height[rt] = depth[k]


def settle_duplicates(ids: list[bytes], reuse: Reuse, sources: SourceIndex) -> int:
    """Take each whole object from the source pack that holds most of the plan's whole objects when it is whole
    there too (the same bytes either way); returns how many moved.

    An object can sit in several source packs (a push's pack repeats trees and blobs its ``^`` side already
    had: ``pack-objects --revs`` excludes only what its walk marked). Which copy step 1 takes is the first
    pack's; a lone whole copy in another pack then makes a search of every whole object of the main pack
    (they could be tried against it), though no pair among them can be: cruft-expire's reachable pack, one
    such object among 24,548, searched 45,141 candidates to try 8 pairs (0.5 s of 1.6 s). Moved to the main
    pack, the search is skipped (:func:`nothing_to_try`) or smaller. Bounded by the plan's whole objects,
    one idx lookup each outside the main pack."""
    if len(sources.packs) < 2:
        return 0
    kind, gid, pack_no = reuse.kind, reuse.gid, sources.pack_no
    wholes: list[int] = []
    per_pack: dict[int, int] = {}
    k = kind.find(WHOLE)
    while k >= 0:   # (bounded: k grows)
        p = pack_no[gid[k]]
        per_pack[p] = per_pack.get(p, 0) + 1
        wholes.append(k)
        k = kind.find(WHOLE, k + 1)
    if len(per_pack) < 2:
        return 0
    main_no = max(per_pack, key=lambda p: (per_pack[p], -p))
    main = sources.packs[main_no]
    view = main.view
    moved = 0
    for k in wholes:
        if pack_no[gid[k]] == main_no:
            continue
        off = main.pack.find_offset(ids[k])
        if off is None or entry_type(view, off) >= 6:
            continue   # not there, or a delta there (whole where it was taken from: kept as it is)
        j = bisect.bisect_left(main.sorted_offsets, off)
        gid[k] = main.base + main.order[j]
        moved += 1
    return moved


def nothing_to_try(reuse: Reuse, sources: SourceIndex, *, reuse_deltas: bool) -> bool:
    """Pure question: would the search provably try no pair? When reusing, every object without a reused
    delta is a whole entry of one and the same source pack: the search never tries two whole objects of one
    pack against each other (that pack's writer found no delta between them), so it would only read and hash
    them and come back empty; the writer copies them as they are (CRC32 checked) either way. (One source
    pack among several: the reachable pack of a full repack with a cruft pack, whose 124k objects the search
    otherwise took in as candidates to try 8 pairs, 0.2 s.)"""
    if not reuse_deltas:
        return False
    kind = reuse.kind
    if kind.count(LOOSE) or kind.count(DELTA_BASE_BEHIND) or kind.count(DELTA) != reuse.reused.count(1):
        return False
    if len(sources.packs) == 1:
        return True
    pack_no, gid = sources.pack_no, reuse.gid
    first = -1
    k = kind.find(WHOLE)
    while k >= 0:   # (bounded: k grows)
        p = pack_no[gid[k]]
        if first < 0:
            first = p
        elif p != first:
            return False
        k = kind.find(WHOLE, k + 1)
    return True


def source_base(sources: SourceIndex, p, off: int) -> bytes | None:
    """The id of the base of the delta entry at ``off`` of source pack ``p`` (REF_DELTA: the id it names;
    OFS_DELTA: the entry at its base offset, None when no entry starts there)."""
    _typ, _size, b, _data_off = header_fields(p.view, off, end=p.end, path=p.path)
    return b if isinstance(b, bytes) else sources.oid_at(p, b) if b is not None else None


__all__ = ["DELTA", "DELTA_BASE_BEHIND", "LOOSE", "WHOLE", "Reuse", "find_reuse", "nothing_to_try", "settle_duplicates",
           "source_base"]
