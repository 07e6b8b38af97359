"""Writing a repack's plan into a pack: reused deltas copied verbatim, new deltas from the delta search,
the rest whole. Three steps, each over every object of the plan:

reuse
    Where each object's copy lies: a whole entry of a source pack, a delta entry whose base is in
    the plan too (reusable: copied verbatim, never inflated -- unless ``reuse`` is off, as
    ``git repack -f``), a delta entry whose base stays behind, or a loose file. Reused chains are
    checked as git's ``pack-objects`` does: a cycle between packs (A a delta of B in one pack, B of
    A in another) or a chain deeper than ``depth`` drops the delta that closes it; that object
    joins the search. Each remaining chain's height is remembered at its root, so that a delta
    computed for the root leaves room for the chain resting on it.
search
    Every object without a reused delta goes to the delta search (:mod:`..pack.search`) with its
    type, size (from its entry header: nothing is inflated but a delta's first bytes), the name
    the walk reached it by, its source pack (two whole objects of one pack are not tried against
    each other when reusing: that pack's writer already found no delta between them) and the
    depth its own delta may reach. The search reads the objects it tries (each checked against
    its id) and returns new deltas, already compressed.
write
    The ids in their order (git's: recency for commits, traversal for trees and blobs), each
    delta's base pulled in just before it when it comes later in the order (OFS_DELTA points
    backwards). Whole entries of source packs are copied verbatim (CRC checked); objects that
    were deltas in their source and got no new delta are resolved, checked and written whole.
"""
from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import CorruptObjectError, ObjectMissingError, StoreError
from ..objects import REF_DELTA, hash_object
from ..pack.format import decode_entry_header
from ..pack.search import DEFAULT_DEPTH, Candidates, SearchOptions, SearchResult, fast_name_hash, search
from ..pack.write import PackWriter
from .sources import SourceIndex, _PackEntries

if TYPE_CHECKING:
    from .repack import RepackCounters

Progress = Callable[[str, int, "int | None"], None]

# What an object's copy in the sources is (``_Reuse.kind``).
LOOSE, WHOLE, DELTA, DELTA_BASE_BEHIND = 0, 1, 2, 3


@dataclass(frozen=True)
class DeltaPlan:
    """How a plan's deltas are made: reused (``reuse``) and/or searched (``search``; None: no search,
    everything without a reused delta is written whole). ``depth`` bounds every chain, reused ones too."""

    reuse: bool = True
    search: SearchOptions | None = SearchOptions()
    depth: int = DEFAULT_DEPTH


class _Reuse:
    """Step 1's findings, by position in ``ids``."""

    def __init__(self, n: int) -> None:
        self.kind = bytearray(n)
        self.reused = bytearray(n)                 # 1: copied verbatim as a delta
        self.base = array("i", [-1]) * n          # a delta entry's base (position in ids), -1: not in the plan
        # delta entries: (pack, idx pos, offset, size, data offset)
        self.entry: dict[int, tuple[_PackEntries, int, int, int, int]] = {}
        self.height = array("i", [0]) * n         # longest reused chain resting on this object
        self.dropped = 0                          # reusable deltas dropped (cycle or too deep)


def write_plan(writer: PackWriter, ids: list[bytes], sources: SourceIndex, c: "RepackCounters", *,
               progress: Progress | None = None, phase: str = "writing objects",
               mtime_of: dict[bytes, int] | None = None, names: dict[bytes, bytes] | None = None,
               preloaded: dict[bytes, tuple[int, bytes]] | None = None, deltas: DeltaPlan = DeltaPlan(),
               timings: dict[str, float] | None = None) -> list[int] | None:
    """Write every id of ``ids`` once, in that order except that a delta's base always goes first.

    ``names``: object id -> the name it was reached by (the walk's), for the search's order.
    ``preloaded``: objects the plan already read and checked (type, data), not read again.
    Returns the mtimes in written order when ``mtime_of`` is given. ``timings`` gets the seconds
    spent in the search (``"search"``).
    """
    t0 = time.monotonic()
    pre = preloaded or {}
    reuse = _find_reuse(ids, sources, deltas)
    c.deltas_dropped += reuse.dropped
    computed: dict[int, tuple[int, int]] = {}   # position -> (candidate, position of its new base)
    zwhole: dict[int, tuple[int, int, bytes]] = {}   # position -> (type, size, compressed object)
    found: SearchResult | None = None
    if deltas.search is not None:
        found, cand = _search(ids, sources, reuse, names, pre, deltas, progress, c)
        cand_ids = cand.ids
        for i, b in enumerate(found.base):
            if b >= 0:
                computed[cand_ids[i]] = (i, cand_ids[b])
            elif found.zwhole[i] is not None:
                zwhole[cand_ids[i]] = (cand.types[i], cand.sizes[i], found.zwhole[i])
    if timings is not None:
        timings["search"] = timings.get("search", 0.0) + time.monotonic() - t0
    return _write(writer, ids, sources, reuse, computed, zwhole, found, pre, c, progress, phase, mtime_of)


# -- step 1: reuse ---------------------------------------------------------------------------------------------

def _find_reuse(ids: list[bytes], sources: SourceIndex, deltas: DeltaPlan) -> _Reuse:
    n = len(ids)
    r = _Reuse(n)
    index_get = {oid: k for k, oid in enumerate(ids)}.get
    loc_get, packs, pack_no = sources.loc.get, sources.packs, sources.pack_no
    kind, base, entry = r.kind, r.base, r.entry
    for k in range(n):
        gid = loc_get(ids[k])
        if gid is None:
            continue                               # LOOSE
        p = packs[pack_no[gid]]
        i = gid - p.base
        off = p.offsets[i]
        if (p.buffer[off] >> 4) & 7 < 6:
            kind[k] = WHOLE
            continue
        typ, size, b, data_off = decode_entry_header(p.buffer, off, p.end, off, p.path)
        # b is the base's id for a REF_DELTA and its offset for an OFS_DELTA (a delta here: never None);
        # mypy cannot tie its type to typ, and an isinstance() per entry would cost a call in this loop.
        base_oid: bytes | None = b if typ == REF_DELTA else sources.oid_at(p, b)  # type: ignore[assignment,arg-type]
        bk = index_get(base_oid, -1) if base_oid is not None else -1
        entry[k] = (p, i, off, size, data_off)
        if bk < 0:
            kind[k] = DELTA_BASE_BEHIND
        else:
            kind[k] = DELTA
            base[k] = bk
            if deltas.reuse:
                r.reused[k] = 1
    if deltas.reuse:
        _check_chains(r, deltas.depth)
    return r


def _check_chains(r: _Reuse, limit: int) -> None:
    """Drop reused deltas that close a cycle or pass ``limit``; record each chain's height at its root."""
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


# -- step 2: search ------------------------------------------------------------------------------------------

class _Offered(Candidates):
    """The search's candidates, with their positions in ``ids``."""

    ids: array


def _search(ids: list[bytes], sources: SourceIndex, reuse: _Reuse, names: dict[bytes, bytes] | None,
            pre: dict[bytes, tuple[int, bytes]], deltas: DeltaPlan, progress: Progress | None,
            c: "RepackCounters") -> tuple[SearchResult, _Offered]:
    # Source packs matter only when reusing: that pack's writer tried its whole objects against each other.
    cand = _Offered(groups=array("i"), fixed=bytearray()) if deltas.reuse else _Offered()
    cand.ids = cand_ids = array("i")
    hashes: dict[bytes, int] = {}
    names_get = names.get if names is not None else (lambda oid: None)
    kind, reused, entry, pack_no, loc = reuse.kind, reuse.reused, reuse.entry, sources.pack_no, sources.loc
    limit = deltas.depth
    assert deltas.search is not None
    packs = sources.packs
    for k, oid in enumerate(ids):
        if reused[k]:
            continue
        kd = kind[k]
        if kd == WHOLE:
            gid = loc[oid]
            p = packs[pack_no[gid]]
            off = p.offsets[gid - p.base]
            typ, size, _b, _d = decode_entry_header(p.buffer, off, p.end, off, p.path)
            group = pack_no[gid]
        elif kd == LOOSE:
            typ, size = _loose_header(sources, oid, pre)
            group = -1
        else:
            p, i, off, _size, _d = entry[k]
            try:
                typ, size = p.pack.header_at(off)
            except StoreError as err:
                raise _named(err, oid, sources) from err
            group = pack_no[p.base + i]
        name = names_get(oid)
        if name:
            h = hashes.get(name)
            if h is None:
                h = hashes[name] = fast_name_hash(name)
        else:
            h = 0
        # A whole entry of a source pack is copied as it is when no delta is found; anything else would be
        # read and compressed again by the writer: the search hands it back compressed instead.
        cand.add(int(typ), size, h, limit - reuse.height[k], group, kd == WHOLE, kd != WHOLE)
        cand_ids.append(k)
    types = cand.types

    def read(i: int) -> bytes:
        oid = ids[cand_ids[i]]
        typ, data = _read_checked(sources, oid, pre)
        if typ != types[i]:
            where, offset = sources.where(oid)
            raise CorruptObjectError(f"object's type changed between its header ({types[i]}) and its content ({typ})",
                                     oid=oid, path=where, offset=offset)
        return data

    found = search(cand, read, deltas.search, progress=progress)
    c.delta_candidates += found.considered
    c.deltas_tried += found.tried
    c.deltas_computed += found.computed
    c.delta_bytes_saved += found.bytes_saved
    c.search_processes = max(c.search_processes, found.processes)
    c.window_peak_bytes = max(c.window_peak_bytes, found.peak_window_bytes)
    return found, cand


def _loose_header(sources: SourceIndex, oid: bytes, pre: dict[bytes, tuple[int, bytes]]) -> tuple[int, int]:
    known = pre.get(oid)
    if known is not None:
        return known[0], len(known[1])
    try:
        typ, size = sources.snapshot.loose.read_header(oid)
        return int(typ), size
    except ObjectMissingError:
        now_typ, data = _read_checked(sources, oid, pre)   # gone since the snapshot: wherever it is now
        return int(now_typ), len(data)


def _read_checked(sources: SourceIndex, oid: bytes, pre: dict[bytes, tuple[int, bytes]]) -> tuple[int, bytes]:
    """Resolve one object and check it against its id; errors name the object, its file and offset.
    (Objects in ``pre`` were checked when the plan read them.)"""
    known = pre.get(oid)
    if known is not None:
        return known
    try:
        typ, data = sources.read(oid)
    except StoreError as err:
        raise _named(err, oid, sources) from err
    if hash_object(typ, data) != oid:
        where, offset = sources.where(oid)
        raise CorruptObjectError("object does not hash to its name; not repacked", oid=oid, path=where, offset=offset)
    return typ, data


def _named(err: StoreError, oid: bytes, sources: SourceIndex) -> StoreError:
    """``err`` again, naming the object being repacked and (if it did not) the file and offset of its copy."""
    where, offset = sources.where(oid)
    return type(err)(f"cannot repack object: {err.message}", oid=oid, path=err.path or where,
                     offset=err.offset if err.offset is not None else offset)


# -- step 3: write -------------------------------------------------------------------------------------------

def _write(writer: PackWriter, ids: list[bytes], sources: SourceIndex, reuse: _Reuse,
           computed: dict[int, tuple[int, int]], zwhole: dict[int, tuple[int, int, bytes]],
           found: SearchResult | None, pre: dict[bytes, tuple[int, bytes]], c: "RepackCounters",
           progress: Progress | None, phase: str, mtime_of: dict[bytes, int] | None) -> list[int] | None:
    n = len(ids)
    state = bytearray(n)            # 0: to do, 1: waiting for its base, 2: written
    offsets = [0] * n
    mtimes: list[int] | None = [] if mtime_of is not None else None
    mtime_table: dict[bytes, int] = mtime_of if mtime_of is not None else {}   # read only when mtimes is a list
    step = max(1, min(5000, n // 100 or 1))
    done = 0
    # The loop runs once per object (500,000 in a large repository): names are looked up once here.
    loc, packs, pack_no = sources.loc, sources.packs, sources.pack_no
    copy_raw, copy_delta = writer.copy_raw, writer.copy_delta
    kind, reused, rbase, entry = reuse.kind, reuse.reused, reuse.base, reuse.entry
    computed_get = computed.get
    for k0 in range(n):
        if state[k0] == 2:
            continue
        stack = [k0]
        while stack:
            k = stack[-1]
            oid = ids[k]
            new = computed_get(k)
            if new is not None:
                ci, bk = new
            elif reused[k]:
                bk = rbase[k]
            else:
                bk = -1
            if bk >= 0 and state[bk] == 0:
                state[k] = 1
                stack.append(bk)           # its base first (it comes later in the order)
                continue
            if bk >= 0 and state[bk] == 1:
                raise StoreError(f"delta base cycle in the write plan at object {oid.hex()} (a bug)")
            if new is not None:
                assert found is not None
                offsets[k] = writer.write_compressed_delta(oid, offsets[bk], found.delta_size[ci], found.zdelta[ci])
            elif reused[k]:
                p, i, off, size, data_off = entry[k]
                offsets[k] = copy_delta(oid, p.view, off, data_off, p.ends[i], p.crcs[i], size, offsets[bk],
                                        path=p.path)
                c.deltas_reused += 1
            elif kind[k] == WHOLE:
                gid = loc[oid]             # (a WHOLE object is in a source pack: step 1 found it there)
                p = packs[pack_no[gid]]
                i = gid - p.base
                offsets[k] = copy_raw(oid, p.view, p.offsets[i], p.ends[i], p.crcs[i], path=p.path)
                c.entries_copied += 1
            elif k in zwhole:
                typ, size, body = zwhole[k]
                offsets[k] = writer.write_compressed_whole(oid, typ, size, body)
                c.rewritten_whole += 1
            else:
                typ, data = _read_checked(sources, oid, pre)
                offsets[k] = writer.write_whole(oid, typ, data)
                c.rewritten_whole += 1
            if kind[k] == LOOSE and sources.is_loose(oid):
                c.loose_packed += 1
            state[k] = 2
            stack.pop()
            if mtimes is not None:
                mtimes.append(mtime_table[oid])
            done += 1
            if progress is not None and done % step == 0:
                progress(phase, done, n)
    if progress is not None:
        progress(phase, n, n)
    return mtimes


__all__ = ["write_plan", "DeltaPlan"]
