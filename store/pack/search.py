"""The delta search: which object each object of a new pack is stored as a delta against.

The pack writer's callers (a repack's write plan, an import written as a pack) hand over the
objects that have no delta to reuse -- one entry per *candidate*, in the caller's numbering --
with what the search needs to know without reading them: type, size, a hash of the name
(path) each was reached by, and how deep a delta chain below it may go. The search reads
each candidate's bytes once (``read(i)``) and returns, per candidate, either nothing
(stored whole) or a base (another candidate) and the zlib-compressed delta from it.

The idea is git's (``pack-objects``), written here from the description:

order
    Candidates sorted by type, then :func:`name_hash` (which weighs a name's *last*
    characters most, so ``a/Makefile`` and ``b/Makefile``, or every version of one file,
    sort together), then size, largest first (a delta that removes is smaller than one that
    adds, and the newest version of a file is usually the largest), then the caller's order.
    Objects without a name hash 0: they sort by type and size.
window
    Each candidate (the *target*) is tried against the ``window - 1`` candidates sorted just
    before it that are still in the window, most recent first, same type only. The smallest
    delta wins (a tie goes to the shallower base). The winning base then moves to the front
    of the window (the next target tries it first and it stays longest); a target that
    reached the depth limit does not stay in the window at all (nothing may build on it).
filters (no encoder call)
    The base's chain is already at the target's depth limit; the size difference alone
    exceeds the delta size allowed; the target is less than 1/32 of the base; in reuse mode,
    both were whole objects of the same source pack (the packer that wrote it already found
    no delta between them).
delta size allowed
    At most half the target minus 20 bytes (a delta's header and the base reference cost
    about that much in the pack) for a first delta, at most the current best for a later
    one; scaled down by ``(max_depth - base depth) / (max_depth - target depth + 1)`` so
    deep chains must pay for themselves. The encoder gives up as soon as it passes it.
depth
    A delta's depth is its base's plus one, at most the candidate's ``max_depth`` (the
    caller lowers it for a candidate that reused deltas already sit on, so whole chains
    stay within the limit). The base is always sorted before its delta: no cycles.
memory
    The window keeps each member's bytes and, once it was tried as a base, its block index
    (:class:`~.delta.DeltaIndex`). With ``window_memory`` > 0, the oldest members leave
    before a target is tried while the window holds more than that many bytes (at least one
    base always stays, as git's pack.windowMemory). ``peak_window_bytes`` reports the most
    it held.
eligible
    Trees and blobs (commits and tags: git deltifies them too, but in git.git's own pack
    397 of 36,430 commits are deltas, saving 0.1% of the pack: not worth reading them
    twice), of at least :data:`MIN_SIZE` bytes and at most the encoder's input limit.

Parallel and deterministic: the sorted list is cut into ``processes`` segments of about
equal bytes, each cut moved forward to where the name hash changes (a file's versions stay
in one segment); the first segment is searched here, the others in forked processes (they
inherit the reader, its open packs and caches, copy-on-write) whose results come back over
a pipe. A segment's result depends on its objects only, never on timing, so the same input
gives the same deltas -- and the same pack bytes -- on every run. Processes, not threads:
the encoder releases the GIL, but the window's bookkeeping, reading and inflating the
objects, checking their hashes and compressing the deltas are Python-level work per object
(measured: see the README's delta-search figures).
"""
from __future__ import annotations

import math
import time
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .. import native
from ..forked import ForkedCall
from ..progress import Progress
from .delta import MAX_INPUT_SIZE, DeltaIndex, should_delta

Read = Callable[[int], bytes]

#: git's pack.window default: a target is tried against up to ``window - 1`` predecessors.
DEFAULT_WINDOW = 10
#: git's pack.depth default: the longest delta chain in the pack.
DEFAULT_DEPTH = 50
#: Bytes of objects and block indexes one search process keeps in its window (git's pack.windowMemory
#: is unlimited by default; a service with several workers per host wants a bound). 0: unlimited.
DEFAULT_WINDOW_MEMORY = 256 << 20
#: Objects smaller than this are not tried (git's choice too: a delta's own overhead eats the gain).
MIN_SIZE = 50
#: Object types the search tries (tree, blob); see the module docstring.
DELTA_TYPES = frozenset({2, 3})
#: The search forks when it has this many candidates, or this many bytes of them (and at least
#: FORK_MIN_WITH_BYTES candidates); below, forking costs more than the second core gives back (the
#: 10,000 small objects of an import: 47 ms in one process, 34 ms in two, best of 15).
FORK_MIN_CANDIDATES = 2000
FORK_MIN_BYTES = 8 << 20
FORK_MIN_WITH_BYTES = 100
#: The per-delta overhead subtracted from half the target (git uses its hash length).
DELTA_OVERHEAD = 20
_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def name_hash(name: bytes | None) -> int:
    """A 32-bit sort key of a path that weighs its last characters most (whitespace ignored).

    Each character enters at the top 8 bits and what came before moves down by two, so the
    last characters decide the top bits and anything more than 16 characters from the end is
    gone: versions of one file, and files with one suffix, sort together. (This is the
    specification; the C extension's ``name_hash`` computes the same and is used when present.)
    """
    h = 0
    if name:
        for c in name:
            if c not in _WHITESPACE:
                h = ((h >> 2) + (c << 24)) & 0xFFFFFFFF
    return h


_c_delta = native.delta()   # the C window loop and name hash (store/native.py), or None
_c_name_hash = _c_delta.name_hash if _c_delta is not None else None
_c_search_segment = _c_delta.search_segment if _c_delta is not None else None


def fast_name_hash(name: bytes | None) -> int:
    """:func:`name_hash`, in C when the extension is in use."""
    if not name:
        return 0
    return _c_name_hash(name) if _c_name_hash is not None else name_hash(name)


@dataclass(frozen=True)
class SearchOptions:
    window: int = DEFAULT_WINDOW
    depth: int = DEFAULT_DEPTH
    window_memory: int = DEFAULT_WINDOW_MEMORY   # bytes per search process; 0: unlimited
    max_input: int = MAX_INPUT_SIZE              # larger objects are stored whole
    processes: int = 2
    compression: int = zlib.Z_DEFAULT_COMPRESSION  # zlib level of the deltas (the pack's)

    def check(self) -> None:
        from ..errors import InvalidInputError

        if self.window < 0 or self.depth < 0 or self.window_memory < 0 or self.processes < 1:
            raise InvalidInputError(f"delta search needs window >= 0, depth >= 0, window memory >= 0 and at least "
                                    f"one process, not {self}")


@dataclass
class Candidates:
    """The objects offered to the search, by index: parallel arrays (one entry per candidate).

    ``max_depth``: the deepest this candidate's own delta may be (``depth`` minus the height of
    reused deltas already resting on it; 0 or less: it is only a base). ``groups``/``fixed``
    (reuse mode): the source pack of a candidate (-1: none) and whether it was a whole object
    there -- such a target is not tried against bases from the same pack. ``keep_whole``: a
    candidate the search reads and finds no delta for comes back compressed whole (``zwhole``),
    so the writer neither reads nor compresses it again (a loose object: nothing to copy).
    """

    types: bytearray = field(default_factory=bytearray)
    sizes: array = field(default_factory=lambda: array("Q"))
    hashes: array = field(default_factory=lambda: array("I"))
    max_depth: array = field(default_factory=lambda: array("i"))
    groups: array | None = None
    fixed: bytearray | None = None
    keep_whole: bytearray = field(default_factory=bytearray)
    #: Delta islands (store/maintenance/repack/islands.py): each candidate's island class, and ``island_ok``, the
    #: ``n * n`` table of classes (``island_ok[trg * n + base]``: may a target of class trg rest on a base of
    #: class base?). None: no islands, any base will do.
    islands: array | None = None
    island_ok: bytes | None = None

    def __len__(self) -> int:
        return len(self.types)

    def add(self, type_num: int, size: int, hash_: int, max_depth: int, group: int = -1, fixed: bool = False,
            keep_whole: bool = False) -> int:
        self.types.append(type_num)
        self.sizes.append(size)
        self.hashes.append(hash_)
        self.max_depth.append(max_depth)
        self.keep_whole.append(1 if keep_whole else 0)
        if self.groups is not None:
            self.groups.append(group)
            assert self.fixed is not None
            self.fixed.append(1 if fixed else 0)
        return len(self.types) - 1


@dataclass
class SearchResult:
    """Per candidate: ``base[i]`` (-1: whole), ``depth[i]``, ``delta_size[i]`` (inflated) and ``zdelta[i]``
    (the compressed delta, or None); ``zwhole[i]``: a ``keep_whole`` candidate with no delta, compressed
    whole (None if it was not read); counters for the job record."""

    base: array
    depth: array
    delta_size: array
    zdelta: list
    zwhole: list
    tried: int = 0            # encoder calls
    computed: int = 0         # deltas kept
    bytes_saved: int = 0      # object bytes minus delta bytes, over the deltas kept (inflated sizes)
    considered: int = 0       # candidates that took part (eligible by type and size)
    processes: int = 1        # processes that searched
    peak_window_bytes: int = 0
    seconds: float = 0.0


def _eligible(c: Candidates, i: int, max_input: int) -> bool:
    size = c.sizes[i]
    return c.types[i] in DELTA_TYPES and MIN_SIZE <= size and should_delta(size, max_input)


def should_fork(candidates: int, total_bytes: int) -> bool:
    """Pure question: is a search of this size worth a second process?"""
    return candidates >= FORK_MIN_CANDIDATES or (total_bytes >= FORK_MIN_BYTES and candidates >= FORK_MIN_WITH_BYTES)


def search_order(c: Candidates, max_input: int = MAX_INPUT_SIZE) -> list[int]:
    """The eligible candidates in search order (type, name hash, size: each descending; then index)."""
    types, hashes, sizes = c.types, c.hashes, c.sizes
    idx = [i for i in range(len(c)) if _eligible(c, i, max_input)]
    # One integer per candidate sorts 4x faster than a tuple: type, hash, size descending, index ascending
    # (an eligible size is below 2**40, an index below 2**32).
    m32, m40 = 0xFFFFFFFF, (1 << 40) - 1
    idx.sort(key=lambda i: ((255 - types[i]) << 104) | ((m32 - hashes[i]) << 72) | ((m40 - sizes[i]) << 32) | i)
    return idx


def split_segments(order: list[int], c: Candidates, parts: int) -> list[list[int]]:
    """``order`` cut into at most ``parts`` runs of about equal bytes, never inside a run of one name hash."""
    if parts <= 1 or len(order) < 2:
        return [order]
    sizes, hashes, types = c.sizes, c.hashes, c.types
    total = sum(sizes[i] for i in order)
    cuts = []
    acc = 0
    k = 0
    n = len(order)
    for part in range(1, parts):
        goal = total * part // parts
        while k < n and acc < goal:
            acc += sizes[order[k]]
            k += 1
        # Move forward to where the name hash (or type) changes: one file's versions stay together.
        while 0 < k < n and hashes[order[k]] and hashes[order[k]] == hashes[order[k - 1]] \
                and types[order[k]] == types[order[k - 1]]:
            acc += sizes[order[k]]
            k += 1
        cuts.append(k)
    bounds = [0] + cuts + [n]
    return [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def search(c: Candidates, read: Read, options: SearchOptions = SearchOptions(), *,
           progress: Progress | None = None, phase: str = "compressing objects") -> SearchResult:
    """Find a delta base for each candidate it pays for (see the module docstring).

    ``read(i)`` returns candidate ``i``'s bytes (checked against its id by the caller: a corrupt
    object raises a StoreError there, and the search re-raises it, from a forked process too).
    """
    options.check()
    t0 = time.monotonic()
    n = len(c)
    res = SearchResult(base=array("i", [-1]) * n, depth=array("i", [0]) * n, delta_size=array("Q", [0]) * n,
                       zdelta=[None] * n, zwhole=[None] * n)
    order = search_order(c, options.max_input)
    res.considered = len(order)
    if options.window <= 1 or options.depth <= 0 or not order:
        res.seconds = time.monotonic() - t0
        return res
    parts = options.processes
    if not should_fork(len(order), sum(c.sizes[i] for i in order)):
        parts = 1
    segments = split_segments(order, c, parts)
    res.processes = len(segments)
    children: list[ForkedCall[_SegmentResult]] = []
    try:
        for seg in segments[1:]:
            children.append(ForkedCall.start(_Segment(c, read, options, seg, None).run, what="delta search"))
        total = len(order)
        scale = total / max(1, len(segments[0]))

        def mine(done: int) -> None:
            if progress is not None:
                progress(phase, min(total, int(done * scale)), total)

        out = _Segment(c, read, options, segments[0], mine if progress is not None else None).run()
        _merge(res, out)
        for child in children:
            _merge(res, child.result())
    finally:
        for child in children:
            child.close()
    if progress is not None:
        progress(phase, len(order), len(order))
    res.seconds = time.monotonic() - t0
    return res


@dataclass
class _SegmentResult:
    targets: array            # candidate indexes that got a delta
    bases: array
    depths: array
    sizes: array
    zdeltas: list
    tried: int
    saved: int
    peak: int
    whole: array              # keep_whole candidates with no delta
    zwholes: list             # ... compressed whole


def _merge(res: SearchResult, out: _SegmentResult) -> None:
    for k, i in enumerate(out.targets):
        res.base[i] = out.bases[k]
        res.depth[i] = out.depths[k]
        res.delta_size[i] = out.sizes[k]
        res.zdelta[i] = out.zdeltas[k]
    for k, i in enumerate(out.whole):
        res.zwhole[i] = out.zwholes[k]
    res.tried += out.tried
    res.computed += len(out.targets)
    res.bytes_saved += out.saved
    res.peak_window_bytes = max(res.peak_window_bytes, out.peak)


# A window member, as a list (the loop below touches these fields a million times in a repack):
# candidate, its bytes, its size, its depth, the encoder of its block index (None until it is tried as
# a base), the bytes it holds (data and index), its source pack when reusing (-1: none).
_I, _DATA, _SIZE, _DEPTH, _ENCODE, _MEM, _GROUP = range(7)


class _Segment:
    """The window search over one run of the sorted candidates (one process).

    :meth:`run_python` is the specification (and the loop when the C extension is absent or
    ``PACKYARD_PURE_PYTHON=1``); the extension's ``search_segment`` runs the same loop in C and
    returns the same result (tests compare them).
    """

    def __init__(self, c: Candidates, read: Read, options: SearchOptions, order: Sequence[int],
                 progress: Callable[[int], None] | None) -> None:
        self.c, self.read, self.options, self.order, self.progress = c, read, options, order, progress

    def run(self) -> _SegmentResult:
        if _c_search_segment is None:
            return self.run_python()
        return self.run_c()

    def run_c(self) -> _SegmentResult:
        c, opts = self.c, self.options
        assert _c_search_segment is not None
        targets, bases, depths, dsizes, zdeltas, tried, saved, peak, whole, zwholes = _c_search_segment(
            self.order, c.types, c.max_depth, c.groups, c.fixed, c.keep_whole, self.read, zlib.compress,
            opts.compression, opts.window, opts.window_memory, self.progress,
            *((c.islands, c.island_ok) if c.islands is not None else ()))
        return _SegmentResult(array("i", targets), array("i", bases), array("i", depths), array("Q", dsizes),
                              zdeltas, tried, saved, peak, array("i", whole), zwholes)

    def run_python(self) -> _SegmentResult:
        c, read = self.c, self.read
        types, max_depths = c.types, c.max_depth
        groups = c.groups if c.groups is not None else array("i", [-1]) * len(c)
        fixed = c.fixed if c.fixed is not None else bytearray(len(c))
        opts = self.options
        keep = opts.window - 1               # bases a target may try
        mem_limit = opts.window_memory
        max_input = opts.max_input
        level = opts.compression
        compress = zlib.compress
        win: list[list] = []                 # oldest first; all of one type (emptied when the type changes)
        wtype = -1
        mem = 0
        peak = 0
        tried = saved = 0
        targets, bases, depths, dsizes = array("i"), array("i"), array("i"), array("Q")
        zdeltas: list[bytes] = []
        whole, zwholes = array("i"), []
        keep_whole = c.keep_whole
        islands, island_ok = c.islands, c.island_ok
        nclasses = 0 if island_ok is None else math.isqrt(len(island_ok))
        step = 1000
        for done, t in enumerate(self.order, 1):
            if self.progress is not None and done % step == 0:
                self.progress(done)
            data = read(t)
            tsize = len(data)
            ttype = types[t]
            if ttype != wtype:
                win.clear()                  # sorted by type: nothing before this one can be its base
                mem = 0
                wtype = ttype
            while len(win) > keep:
                mem -= win.pop(0)[_MEM]
            mem += tsize
            while mem_limit and mem > mem_limit and len(win) > 1:
                mem -= win.pop(0)[_MEM]
            if mem > peak:
                peak = mem
            max_depth = max_depths[t]
            best = None
            best_delta = b""                 # the winning delta; read only once best is set
            best_len = 0
            tdepth = 0
            if max_depth > 0:
                tgroup = groups[t] if fixed[t] else -1
                half = tsize // 2 - DELTA_OVERHEAD
                for s in reversed(win):
                    sdepth = s[_DEPTH]
                    if sdepth >= max_depth:
                        continue
                    if tgroup >= 0 and s[_GROUP] == tgroup:
                        continue                    # both whole in one source pack: its packer found nothing
                    if islands is not None and island_ok is not None \
                            and not island_ok[islands[t] * nclasses + islands[s[_I]]]:
                        continue                    # another island lacks this base (git's in_same_island)
                    if best is None:
                        limit = half * (max_depth - sdepth) // max_depth
                    else:
                        limit = best_len * (max_depth - sdepth) // (max_depth - tdepth + 1)
                    if limit <= 0:
                        continue
                    ssize = s[_SIZE]
                    if ssize < tsize and tsize - ssize >= limit:
                        continue
                    if tsize < ssize >> 5:
                        continue
                    encode = s[_ENCODE]
                    if encode is None:
                        index = DeltaIndex(s[_DATA], max_input=max_input)
                        encode = s[_ENCODE] = index.encode
                        s[_MEM] += index.memory
                        mem += index.memory
                        if mem > peak:
                            peak = mem
                    tried += 1
                    delta = encode(data, limit)
                    if delta is None:
                        continue
                    if best is not None and len(delta) == best_len and sdepth + 1 >= tdepth:
                        continue                    # same size: only a shallower base is better
                    best, best_delta, best_len, tdepth = s, delta, len(delta), sdepth + 1
            slot = [t, data, tsize, tdepth, None, tsize, groups[t]]
            if best is None and keep_whole[t]:
                whole.append(t)
                zwholes.append(compress(data, level))
            if best is not None:
                targets.append(t)
                bases.append(best[_I])
                depths.append(tdepth)
                dsizes.append(best_len)
                zdeltas.append(compress(best_delta, level))
                saved += tsize - best_len
                if tdepth >= max_depth:
                    mem -= tsize                # at the depth limit: nothing may build on it
                    continue
                # The winning base goes to the front, before its delta (tried first next, kept longest).
                win.remove(best)
                win.append(slot)
                win.append(best)
                continue
            win.append(slot)
        return _SegmentResult(targets, bases, depths, dsizes, zdeltas, tried, saved, peak, whole, zwholes)


__all__ = ["Candidates", "SearchOptions", "SearchResult", "search", "search_order", "split_segments", "name_hash",
           "DEFAULT_WINDOW", "DEFAULT_DEPTH", "DEFAULT_WINDOW_MEMORY", "MIN_SIZE", "DELTA_TYPES"]
