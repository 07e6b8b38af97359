"""Writing a repack's plan into a pack: reused deltas copied verbatim, new deltas from the delta search,
the rest whole. Three steps, each over every object of the plan:

reuse (:mod:`.reuse`)
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
    its id) and returns new deltas, already compressed. Skipped when it provably has nothing to try:
    reusing, with one source pack, every object without a reused delta whole there (git's
    ``pack-objects`` does not search whole objects of one pack against each other either).
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
from typing import TYPE_CHECKING, Callable, Sequence

from ... import native
from ...errors import CorruptObjectError, ObjectMissingError, StoreError
from ...objects import hash_object
from ...pack.entries import header_fields
from ...pack.search import Candidates, SearchOptions, SearchResult, fast_name_hash, search, search_order
from ...pack.write import WRITE_BUFFER, PackWriter
from ...tuning import release_free_heap
from ..walk.sources import SourceIndex
from .options import DeltaPlan, RepackCounters
from .reuse import LOOSE, WHOLE, Reuse, find_reuse, nothing_to_try, settle_duplicates, source_base

if TYPE_CHECKING:
    from .islands import IslandMarks

from ...progress import Progress


@dataclass(frozen=True)
class ByBase:
    """Names for objects no walk named (a cruft pack's): a delta whose base stays behind in the other pack takes
    the name ``of()`` gives that base (the main walk's names). The versions of one file are deltas of each
    other, so the base's path is the target's: as good a sort key as a walk of the unreachable trees, for none
    of its cost (cruft: 34,204 unreachable trees, 442 MB inflated, 0.7 s of a 3.4 s repack; its cruft pack
    0.98x git's size instead of 0.95x). Whole objects stay unnamed, as every object of git's ``--cruft`` is
    (its pack-objects adds them without a name when nothing expires)."""

    of: Callable[[], dict[bytes, bytes]]


#: id -> the name the walk reached it by, or a function giving that dict (called only if the search runs), or
#: names through each object's delta base (ByBase).
Names = dict[bytes, bytes] | Callable[[], dict[bytes, bytes]] | ByBase

#: The C walk (its Packs, the search's reader) and the C write plan (write_order, copy_entries; step 1's
#: find_reuse and check_chains: reuse.py), or None (store/native.py): the Python steps below are their specification.
_walk_c = native.walk()
_packwrite = native.packwrite()

#: The writer lets go of the source packs' pages it has read every time it has written this many bytes.
DROP_PAGES_EVERY = 8 << 20
#: ... and the delta search every time it has read this many objects.
DROP_PAGES_READS = 2048
#: Loose candidates read whole (and kept for the search and the writer) when their header is read, up to this
#: many bytes per write; past it, the header alone (the file is opened again when read).
LOOSE_HELD_BYTES = 64 << 20
#: The delta-base cache of the C reader that serves the search's reads of packed objects.
SEARCH_CACHE_BYTES = 32 << 20

#: The write plan's default deltas (frozen): reused and searched.
DEFAULT_DELTAS = DeltaPlan()


def write_plan(writer: PackWriter, ids: list[bytes], sources: SourceIndex, c: "RepackCounters", *,
               progress: Progress | None = None, phase: str = "writing objects",
               mtime_of: dict[bytes, int] | None = None, names: Names | None = None,
               preloaded: dict[bytes, tuple[int, bytes]] | None = None, deltas: DeltaPlan = DEFAULT_DELTAS,
               timings: dict[str, float] | None = None, islands: "IslandMarks | None" = None) -> list[int] | None:
    """Write every id of ``ids`` once, in that order except that a delta's base always goes first.

    ``names``: object id -> the name it was reached by (the walk's), for the search's order (or a function
    returning that dict: called only if the search runs).
    ``preloaded``: objects the plan already read and checked (type, data), not read again.
    Returns the mtimes in written order when ``mtime_of`` is given. ``timings`` gets the seconds
    spent in the search (``"search"``). ``islands``: delta islands' marks (islands.py): no delta, reused or new,
    rests on a base that lacks an island of its target.
    """
    t0 = time.monotonic()
    pre = preloaded or {}
    reuse = find_reuse(ids, sources, reuse_deltas=deltas.reuse, depth=deltas.depth)
    sources.drop_pages()   # (every entry's header was read: the pages of the whole input)
    c.deltas_dropped += reuse.dropped
    if islands is not None and deltas.reuse:
        c.island_deltas_dropped += _drop_cross_island(ids, reuse, islands)
        c.islands = len(islands.islands)
    if deltas.reuse:
        c.whole_settled += settle_duplicates(ids, reuse, sources)
    computed: dict[int, tuple[int, int]] = {}   # position -> (candidate, position of its new base)
    zwhole: dict[int, tuple[int, int, bytes]] = {}   # position -> (type, size, compressed object)
    found: SearchResult | None = None
    if deltas.search is not None and not nothing_to_try(reuse, sources, reuse_deltas=deltas.reuse):
        found, cand = _search(ids, sources, reuse, names, pre, deltas, progress, c, islands)
        cand_ids = cand.ids
        for i, b in enumerate(found.base):
            if b >= 0:
                computed[cand_ids[i]] = (i, cand_ids[b])
            elif found.zwhole[i] is not None:
                zwhole[cand_ids[i]] = (cand.types[i], cand.sizes[i], found.zwhole[i])
    if found is not None:
        release_free_heap()   # (the search's windows and indexes are freed: the writer's buffers go there)
    if timings is not None:
        timings["search"] = timings.get("search", 0.0) + time.monotonic() - t0
    return _write(writer, ids, sources, reuse, computed, zwhole, found, pre, c, progress, phase, mtime_of)


# -- step 2: search (step 1, reuse, is reuse.py) ----------------------------------------------------------------------

class _Offered(Candidates):
    """The search's candidates, with their positions in ``ids``."""

    ids: array


def _search(ids: list[bytes], sources: SourceIndex, reuse: Reuse, names: Names | None,
            pre: dict[bytes, tuple[int, bytes]], deltas: DeltaPlan, progress: Progress | None,
            c: "RepackCounters", islands: "IslandMarks | None" = None) -> tuple[SearchResult, _Offered]:
    # Source packs matter only when reusing: that pack's writer tried its whole objects against each other.
    cand = _Offered(groups=array("i"), fixed=bytearray()) if deltas.reuse else _Offered()
    cand.ids = cand_ids = array("i")
    hashes: dict[bytes, int] = {}
    by_base = isinstance(names, ByBase)
    if isinstance(names, ByBase):   # (spelled again for the type checker's narrowing)
        names = names.of()
    elif callable(names):
        names = names()
    names_get = names.get if names is not None else (lambda oid: None)
    kind, reused, gids, pack_no, height = reuse.kind, reuse.reused, reuse.gid, sources.pack_no, reuse.height
    limit = deltas.depth
    assert deltas.search is not None
    packs = sources.packs
    room = [LOOSE_HELD_BYTES]
    # Whole entries' headers in one C pass where it is built (type 255: this one's header is Python's to read).
    heads = (_packwrite.whole_headers(sources.c_packs, kind, gids)
             if _packwrite is not None and sources.c_packs is not None else None)
    htypes, hsizes = (heads[0], array("Q", heads[1])) if heads is not None else (b"", array("Q"))
    # The candidates' arrays, appended to directly (Candidates.add's work, without a call per object).
    t_add, s_add, h_add, d_add, w_add, k_add = (cand.types.append, cand.sizes.append, cand.hashes.append,
                                                cand.max_depth.append, cand.keep_whole.append, cand_ids.append)
    g_add = cand.groups.append if cand.groups is not None else None
    f_add = cand.fixed.append if cand.fixed is not None else None
    for k in [k for k, r in enumerate(reused) if not r]:
        oid = ids[k]
        kd = kind[k]
        if kd == WHOLE and heads is not None and htypes[k] != 255:
            typ, size = htypes[k], hsizes[k]
            group = pack_no[gids[k]]
        elif kd == LOOSE:
            typ, size = _loose_header(sources, oid, pre, room)
            group = -1
        else:
            gid = gids[k]
            group = pack_no[gid]
            p = packs[group]
            off = p.offsets[gid - p.base]
            if kd == WHOLE:
                typ, size, _b, _d = header_fields(p.buffer, off, end=p.end, path=p.path)
            else:
                try:
                    typ, size = p.pack.header_at(off)
                except StoreError as err:
                    raise _named(err, oid, sources) from err
        name = names_get(oid)
        if by_base and not name and kd != WHOLE and kd != LOOSE:
            base = source_base(sources, p, off)
            name = names_get(base) if base is not None else None
        if name:
            h = hashes.get(name)
            if h is None:
                h = hashes[name] = fast_name_hash(name)
        else:
            h = 0
        # A whole entry of a source pack is copied as it is when no delta is found; anything else would be
        # read and compressed again by the writer: the search hands it back compressed instead.
        t_add(int(typ))
        s_add(size)
        h_add(h)
        d_add(limit - height[k])
        w_add(kd != WHOLE)
        if g_add is not None and f_add is not None:
            g_add(group)
            f_add(kd == WHOLE)
        k_add(k)
    if islands is not None:   # each candidate's class of marks, and the rule between classes (islands.py)
        class_of = islands.class_of
        cand.islands = array("i", [class_of(ids[k]) for k in cand_ids])
        cand.island_ok = islands.table()
    cand, idle = _without_idle(cand, deltas.search)
    c.search_skipped += idle
    sources.drop_pages()   # (every candidate's header: a cruft pack's 50k, 40 MB of pages, for ~2,000 searched)
    cand_ids = cand.ids
    types = cand.types

    reads = [0]
    # With the C extension, packed objects are resolved by a walker's reader (its own delta-base cache, each
    # entry's CRC32 checked) instead of the Python resolver; the SHA-1 is checked here either way. A read it
    # cannot do (a corrupt entry) goes through _read_checked, which raises the typed error naming it.
    creader = [_walk_c.Walker(sources.c_packs, lambda oid, want, referrer: sources.read(oid),
                              cache_bytes=SEARCH_CACHE_BYTES, expect=1)
               if _walk_c is not None and sources.c_packs is not None else None]

    def read(i: int) -> bytes:
        oid = ids[cand_ids[i]]
        reads[0] += 1
        if reads[0] % DROP_PAGES_READS == 0:
            sources.drop_pages()   # (in each search process: the pages of the objects read so far)
        got = None
        if creader[0] is not None and oid not in pre:
            try:
                got = creader[0].read_packed(oid)
            except _walk_c.WalkError:
                creader[0] = None
        if got is not None and hash_object(got[0], got[1]) == oid:
            typ, data = got
        else:
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


def _drop_cross_island(ids: list[bytes], reuse: Reuse, islands: "IslandMarks") -> int:
    """Un-reuse every reusable delta whose base lacks an island of its target (git's ``can_reuse_delta`` asks
    ``in_same_island``): the target joins the search, where only bases of its islands are tried. The chain
    heights stay as they were (over-counted where a chain was cut: only ever a shallower limit)."""
    dropped = 0
    allowed = islands.allowed
    base, reused = reuse.base, reuse.reused
    for k in range(len(ids)):
        if reused[k] and base[k] >= 0 and not allowed(ids[k], ids[base[k]]):
            reused[k] = 0
            dropped += 1
    return dropped


def _without_idle(cand: _Offered, options: SearchOptions) -> tuple[_Offered, int]:
    """``cand`` without the candidates the search could never try (and the number left out).

    When reusing, a target whole in a source pack is not tried against a base whole in that same pack (that
    pack's writer found no delta between them). A candidate only ever meets the ``window - 1`` candidates
    sorted on either side of it (one type per window); if each of those is whole in its own source pack too,
    it is neither tried as a target nor as a base (but rarely: a delta at the depth limit leaves the window, so
    a window may reach a little further back), and the search would read and hash it for nothing. (A cruft
    pack of one source pack: 44,000 such objects for 1,900 that lost their delta base.) Its copy is written
    as it is, as when the search finds no delta for it."""
    groups, fixed = cand.groups, cand.fixed
    if groups is None or fixed is None or not fixed.count(1):
        return cand, 0
    order = search_order(cand, options.max_input)
    types = cand.types
    reach = max(1, options.window - 1)
    n = len(order)
    drop = bytearray(len(cand))
    for k in range(n):
        i = order[k]
        if not fixed[i]:
            continue
        ti, gi = types[i], groups[i]
        for j in order[max(0, k - reach):k + reach + 1]:
            if j != i and types[j] == ti and (not fixed[j] or groups[j] != gi):
                break
        else:
            drop[i] = 1
    idle = drop.count(1)
    if not idle:
        return cand, 0
    kept = _Offered(groups=array("i"), fixed=bytearray())
    kept.ids = array("i")
    for i in range(len(cand)):
        if drop[i]:
            continue
        kept.add(cand.types[i], cand.sizes[i], cand.hashes[i], cand.max_depth[i], groups[i], bool(fixed[i]),
                 bool(cand.keep_whole[i]))
        kept.ids.append(cand.ids[i])
    if cand.islands is not None:
        kept.islands = array("i", [cand.islands[i] for i in range(len(cand)) if not drop[i]])
        kept.island_ok = cand.island_ok
    return kept, idle


def _loose_header(sources: SourceIndex, oid: bytes, pre: dict[bytes, tuple[int, bytes]],
                  room: list[int]) -> tuple[int, int]:
    """A loose candidate's (type, size). While ``room[0]`` (bytes) lasts, the whole object is read, checked and
    kept in ``pre``: the search reads every loose candidate next, and the writer may too, so the file is
    opened once instead of two or three times (on NFS each open is round trips)."""
    known = pre.get(oid)
    if known is not None:
        return known[0], len(known[1])
    if room[0] > 0:
        typ, data = _read_checked(sources, oid, pre)
        pre[oid] = (typ, data)
        room[0] -= len(data)
        return typ, len(data)
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

def _write(writer: PackWriter, ids: list[bytes], sources: SourceIndex, reuse: Reuse,
           computed: dict[int, tuple[int, int]], zwhole: dict[int, tuple[int, int, bytes]],
           found: SearchResult | None, pre: dict[bytes, tuple[int, bytes]], c: "RepackCounters",
           progress: Progress | None, phase: str, mtime_of: dict[bytes, int] | None) -> list[int] | None:
    n = len(ids)
    emit = _Emitter(writer, ids, sources, reuse, computed, zwhole, found, pre, c)
    step = max(1, min(5000, n // 100 or 1))
    order: Sequence[int]
    if sources.c_packs is not None and _packwrite is not None:
        order = _write_runs(emit, sources.c_packs, progress, phase, step)
    else:
        order = _write_each(emit, progress, phase, step)
    if progress is not None:
        progress(phase, n, n)
    return [mtime_of[ids[k]] for k in order] if mtime_of is not None else None


class _Emitter:
    """Writes one object of the plan, its delta base (if any) already written; ``offsets``: where each
    position went in the new pack."""

    def __init__(self, writer: PackWriter, ids: list[bytes], sources: SourceIndex, reuse: Reuse,
                 computed: dict[int, tuple[int, int]], zwhole: dict[int, tuple[int, int, bytes]],
                 found: SearchResult | None, pre: dict[bytes, tuple[int, bytes]], c: "RepackCounters") -> None:
        self.writer, self.ids, self.sources, self.reuse = writer, ids, sources, reuse
        self.computed, self.zwhole, self.found, self.pre, self.c = computed, zwhole, found, pre, c
        self.offsets = array("Q", bytes(8 * len(ids)))

    def base_of(self, k: int) -> int:
        """The position of the base ``k`` is written against (-1: none): a new delta's, else a reused one's."""
        new = self.computed.get(k)
        if new is not None:
            return new[1]
        return self.reuse.base[k] if self.reuse.reused[k] else -1

    def one(self, k: int) -> None:
        oid, offsets, writer, c, reuse = self.ids[k], self.offsets, self.writer, self.c, self.reuse
        new = self.computed.get(k)
        if new is not None:
            ci, bk = new
            assert self.found is not None
            offsets[k] = writer.write_compressed_delta(oid, offsets[bk], self.found.delta_size[ci],
                                                       self.found.zdelta[ci])
        elif reuse.reused[k] or reuse.kind[k] == WHOLE:
            gid = reuse.gid[k]
            p = self.sources.packs[self.sources.pack_no[gid]]
            i = gid - p.base
            off = p.offsets[i]
            assert p.view is not None
            if reuse.reused[k]:
                _typ, size, _b, data_off = header_fields(p.buffer, off, end=p.end, path=p.path)
                offsets[k] = writer.copy_delta(oid, p.view, off, data_off, p.ends[i], p.crcs[i], size,
                                               offsets[reuse.base[k]], path=p.path)
                c.deltas_reused += 1
            else:
                offsets[k] = writer.copy_raw(oid, p.view, off, p.ends[i], p.crcs[i], path=p.path)
                c.entries_copied += 1
        elif k in self.zwhole:
            typ, size, body = self.zwhole[k]
            offsets[k] = writer.write_compressed_whole(oid, typ, size, body)
            c.rewritten_whole += 1
        else:
            typ, data = _read_checked(self.sources, oid, self.pre)
            offsets[k] = writer.write_whole(oid, typ, data)
            c.rewritten_whole += 1
        if reuse.kind[k] == LOOSE and self.sources.is_loose(oid):
            c.loose_packed += 1


def _write_each(emit: _Emitter, progress: Progress | None, phase: str, step: int) -> list[int]:
    """Step 3 one object at a time (the specification of the C runs below); returns the positions in the
    order written."""
    n = len(emit.ids)
    state = bytearray(n)            # 0: to do, 1: waiting for its base, 2: written
    order: list[int] = []
    for k0 in range(n):
        if state[k0] == 2:
            continue
        stack = [k0]
        while stack:
            k = stack[-1]
            bk = emit.base_of(k)
            if bk >= 0 and state[bk] == 0:
                state[k] = 1
                stack.append(bk)           # its base first (it comes later in the order)
                continue
            if bk >= 0 and state[bk] == 1:
                raise StoreError(f"delta base cycle in the write plan at object {emit.ids[k].hex()} (a bug)")
            emit.one(k)
            state[k] = 2
            stack.pop()
            order.append(k)
            if progress is not None and len(order) % step == 0:
                progress(phase, len(order), n)
    return order


def _write_runs(emit: _Emitter, packs: object, progress: Progress | None, phase: str, step: int) -> array:
    """Step 3 with the C extension: the order (as :func:`_write_each`'s) computed at once; the whole entries
    and reused deltas between two objects that need Python copied by ``_packwrite.copy_entries`` a run at a time
    (the source CRC32 checked there; an entry it does not copy -- a CRC32 mismatch -- goes through
    :meth:`_Emitter.one`, which raises the typed error); returns the positions in the order written."""
    reuse, writer, c, n = emit.reuse, emit.writer, emit.c, len(emit.ids)
    cbase = array("i", [-1]) * n
    for k, (_ci, bk) in emit.computed.items():
        cbase[k] = bk
    order_b, python_b, cycle = _packwrite.write_order(reuse.kind, reuse.reused, reuse.base, cbase)
    if cycle >= 0:
        raise StoreError(f"delta base cycle in the write plan at object {emit.ids[cycle].hex()} (a bug)")
    order, python = array("i"), array("i")
    order.frombytes(order_b)
    python.frombytes(python_b)
    j = 0
    emit.sources.drop_pages()   # (what the search read)
    dropped_at = writer.position
    for stop in [*python, n]:
        while j < stop:
            j, stuck, entries, offs, crcs, oids, deltas, copied = _packwrite.copy_entries(
                packs, reuse.gid, order, j, min(stop, j + step), reuse.reused, reuse.base, emit.offsets,
                writer.position, WRITE_BUFFER)
            writer.append_copies(entries, offs, crcs, oids, deltas=deltas, copied=copied)
            if writer.position - dropped_at >= DROP_PAGES_EVERY:
                emit.sources.drop_pages()   # (the source pages copied so far: RSS bounded, not the input's size)
                dropped_at = writer.position
            c.deltas_reused += deltas
            c.entries_copied += len(oids) // 20 - deltas
            if stuck:
                emit.one(order[j])
                j += 1
            if progress is not None:
                progress(phase, j, n)
        if stop < n:
            emit.one(order[stop])
            j = stop + 1
    return order


__all__ = ["write_plan", "DeltaPlan", "Names"]
