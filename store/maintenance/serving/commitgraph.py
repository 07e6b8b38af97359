"""The commit-graph, in git 2.39's format (commit-graph.c, Documentation/technical/commit-graph-format.txt).

Written as git writes it for ``git commit-graph write --reachable --changed-paths --size-multiple=4
--split`` (what Gitaly runs after every repack): a chain of layers in ``objects/info/commit-graphs/``
(``graph-<checksum>.graph`` files, listed base first in ``commit-graph-chain``). Each layer: the header
``CGPH`` v1, the chunk table, ``OIDF`` (fan-out), ``OIDL`` (ids, sorted), ``CDAT`` (root tree, two parent
positions, topological level and commit date), ``GDA2`` (corrected commit date offsets; ``GDO2`` for
offsets over 2^31-1), ``EDGE`` (octopus parents), ``BIDX``/``BDAT`` (changed-path Bloom filters, see
:mod:`.bloom`), ``BASE`` (the layers below), and the SHA-1 of all that. A new layer holds the commits
no layer has; it is merged with the layers above it while a layer holds at most ``size_multiple`` times
the commits of the new one (git's ``split_graph_merge_strategy``). ``replace=True`` writes one layer
of every reachable commit (after unreachable objects were deleted: no layer may name a gone commit).

Writing and installing the chain: :mod:`.graphwrite`.
"""
from __future__ import annotations

import hashlib
import re
import struct
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ... import native
from ...errors import CorruptObjectError, ObjectMissingError
from ...objects import ObjectType
from ..walk.parse import CommitMeta, graph_commit_date
from . import bloom

_c_bloom = native.bloom()   # the commit reads in C (store/native.py), or None

SIGNATURE = b"CGPH"
OIDF, OIDL, CDAT, GDA2, GDO2, EDGE, BIDX, BDAT, BASE = (
    b"OIDF", b"OIDL", b"CDAT", b"GDA2", b"GDO2", b"EDGE", b"BIDX", b"BDAT", b"BASE")
PARENT_NONE = 0x70000000
EXTRA_EDGES_NEEDED = 0x80000000
LAST_EDGE = 0x80000000
GENERATION_V1_MAX = 0x3FFFFFFF
OFFSET_V2_MAX = (1 << 31) - 1
OFFSET_OVERFLOW = 0x80000000
SIZE_MULTIPLE = 4
#: Layers no chain names any more are removed once this old (a reader that just read the old chain).
DEFAULT_EXPIRE_AFTER = 3600.0
GRAPHS_DIR = "info/commit-graphs"           # under objects/
CHAIN = "commit-graph-chain"
MONOLITHIC = "info/commit-graph"            # under objects/

Read = Callable[[bytes], "tuple[ObjectType, bytes]"]


# -- reading (what a layer on disk holds) -----------------------------------------------------------

@dataclass
class Layer:
    """One commit-graph file as read back: its ids, chunks present, checksum."""

    path: Path
    checksum: bytes
    oids: list[bytes]
    chunks: dict[bytes, tuple[int, int]]   # id -> (offset, length)
    num_base: int

    @property
    def has_generation_data(self) -> bool:
        return GDA2 in self.chunks

    @property
    def has_bloom(self) -> bool:
        return BIDX in self.chunks and BDAT in self.chunks

    def bloom_settings(self, data: bytes) -> tuple[int, int, int] | None:
        if BDAT not in self.chunks:
            return None
        off, _ = self.chunks[BDAT]
        return struct.unpack_from(">III", data, off)


def read_layer(path: Path) -> Layer:
    """Parse a commit-graph file's header, chunk table and id list; CorruptObjectError naming the file."""
    data = path.read_bytes()
    if len(data) < 8 + 12 + 20 or data[:4] != SIGNATURE:
        raise CorruptObjectError("not a commit-graph file (bad signature or too short)", path=path)
    version, hash_version, num_chunks, num_base = data[4], data[5], data[6], data[7]
    if version != 1 or hash_version != 1:
        raise CorruptObjectError(f"commit-graph version {version}, hash version {hash_version}: not 1/1",
                                 path=path)
    if hashlib.sha1(data[:-20]).digest() != data[-20:]:
        raise CorruptObjectError("commit-graph checksum mismatch", path=path)
    chunks: dict[bytes, tuple[int, int]] = {}
    toc = [struct.unpack_from(">4sQ", data, 8 + 12 * i) for i in range(num_chunks + 1)]
    for (cid, off), (_next_id, nxt) in zip(toc, toc[1:]):
        if not (0 < off <= nxt <= len(data) - 20):
            raise CorruptObjectError(f"commit-graph chunk {cid!r} at offset {off} out of bounds", path=path)
        chunks[cid] = (off, nxt - off)
    if OIDL not in chunks or CDAT not in chunks or OIDF not in chunks:
        raise CorruptObjectError("commit-graph lacks a required chunk (OIDF, OIDL or CDAT)", path=path)
    off, length = chunks[OIDL]
    oids = [data[off + i:off + i + 20] for i in range(0, length, 20)]
    return Layer(path, data[-20:], oids, chunks, num_base)


def graphs_dir(objects_dir: Path) -> Path:
    return objects_dir / GRAPHS_DIR


def read_chain(objects_dir: Path) -> list[Layer]:
    """The layers ``commit-graph-chain`` names, base first ([] if none). A layer that is missing or does not
    parse ends the chain there (git uses the layers that load, too)."""
    d = graphs_dir(objects_dir)
    try:
        lines = (d / CHAIN).read_text().split()
    except FileNotFoundError:
        return []
    layers: list[Layer] = []
    for line in lines:
        if not re.fullmatch(r"[0-9a-f]{40}", line):
            raise CorruptObjectError(f"commit-graph-chain names {line[:60]!r}, not a graph checksum",
                                     path=d / CHAIN)
        try:
            layer = read_layer(d / f"graph-{line}.graph")
        except (FileNotFoundError, CorruptObjectError):
            break
        if layer.num_base != len(layers):
            break
        layers.append(layer)
    return layers


# -- what goes in: the commits and their numbers -------------------------------------------------------

@dataclass
class Commit:
    tree: bytes
    parents: list[bytes]
    date: int


def parse_commit_for_graph(data: bytes, oid: bytes) -> Commit:
    """tree, parents and the committer date as git's parse_commit_date reads it (0 when the "author" line is
    not followed by a "committer" line or the date does not parse)."""
    if not data.startswith(b"tree ") or len(data) < 46 or data[45:46] != b"\n":
        raise CorruptObjectError("commit does not start with a tree line", oid=oid)
    try:
        tree = bytes.fromhex(data[5:45].decode("ascii"))
        parents = []
        pos = 46
        while data.startswith(b"parent ", pos):
            parents.append(bytes.fromhex(data[pos + 7:pos + 47].decode("ascii")))
            if data[pos + 47:pos + 48] != b"\n":
                raise ValueError
            pos += 48
    except (ValueError, UnicodeDecodeError):
        raise CorruptObjectError("commit has a malformed tree or parent line", oid=oid) from None
    return Commit(tree, parents, graph_commit_date(data, pos))


def commits_from_walk(ids: Sequence[bytes], meta: CommitMeta) -> dict[bytes, Commit]:
    """The commits a repack's walk read (:class:`.walkparse.CommitMeta`), as this module parses them: every one
    the walk saw as the graph reads it (``graph_ok``); the others are left for the graph write to read."""
    n = len(ids)
    if len(meta.graph_ok) != n:
        raise ValueError(f"{n} commits but what the walk kept of {len(meta.graph_ok)}")
    dates = array("Q")
    dates.frombytes(meta.graph_dates)
    counts = array("I")
    counts.frombytes(meta.nparents)
    trees, parents, ok = meta.trees, meta.parents, meta.graph_ok
    out: dict[bytes, Commit] = {}
    at = 0
    for k in range(n):
        np = counts[k]
        if ok[k]:
            out[ids[k]] = Commit(trees[20 * k:20 * k + 20], [parents[at + 20 * j:at + 20 * j + 20] for j in range(np)],
                                 dates[k])
        at += 20 * np
    return out


def peel_to_commit(read: Read, oid: bytes, limit: int = 64) -> bytes | None:
    """The commit a ref names through tags, or None (a ref to a tree or blob is not in the graph)."""
    for _ in range(limit):
        try:
            obj_type, data = read(oid)
        except ObjectMissingError:
            return None
        if obj_type == ObjectType.COMMIT:
            return oid
        if obj_type != ObjectType.TAG or not data.startswith(b"object "):
            return None
        oid = bytes.fromhex(data[7:47].decode("ascii", "replace"))
    return None


def reachable_commits(read: Read, tips: Iterable[bytes], have: dict[bytes, Commit] | None = None,
                      stop: set[bytes] | None = None, c_packs: object | None = None,
                      known: Mapping[bytes, Commit] | None = None) -> dict[bytes, Commit]:
    """Every commit reachable from ``tips`` (commit ids), parsed; commits in ``stop`` are not walked past.
    ``c_packs`` (:func:`.bloom.open_packs`): the same walk reading the commits in C. ``known``: commits
    already parsed (:func:`commits_from_walk`), taken instead of read; the walk is the same."""
    commits = {} if have is None else have
    stop = stop or set()
    if c_packs is not None and not known:   # the reads in C (bloom.open_packs), the parse here
        with bloom.c_errors():
            got = _c_bloom.commit_reads(c_packs, b"".join(tips), (commits, stop), read)
        for oid, data in got:
            commits[oid] = parse_commit_for_graph(data, oid)
        return commits
    stack = list(tips)
    cached = known or {}
    while stack:   # (bounded: a commit is parsed once, its parents pushed then)
        oid = stack.pop()
        if oid in commits or oid in stop:
            continue
        c = cached.get(oid)
        if c is None:
            obj_type, data = read(oid)
            if obj_type != ObjectType.COMMIT:
                raise CorruptObjectError(f"a commit's parent is a {obj_type.label.decode()}", oid=oid)
            c = parse_commit_for_graph(data, oid)
        commits[oid] = c
        stack.extend(p for p in c.parents if p not in commits)
    return commits


def _parents_first(commits: dict[bytes, Commit], known: dict[bytes, int],
                   value: Callable[[bytes, int], int]) -> dict[bytes, int]:
    """``known`` filled for every commit, parents before children (an explicit stack, no recursion):
    ``value(commit, highest parent's number)`` gives the commit's number (0 for a root)."""
    out = known
    for start in commits:
        if start in out:
            continue
        stack = [start]
        while stack:
            cur = stack[-1]
            pending = None
            top = 0
            for p in commits[cur].parents:
                got = out.get(p)
                if got is None:
                    pending = p
                    break
                top = max(top, got)
            if pending is not None:
                stack.append(pending)
                continue
            stack.pop()
            out[cur] = value(cur, top)
    return out


def topo_levels(commits: dict[bytes, Commit], known: dict[bytes, int]) -> dict[bytes, int]:
    """git's compute_topological_levels: 1 + the highest parent level (capped at 0x3FFFFFFF)."""
    return _parents_first(commits, known, lambda _cur, top: min(top, GENERATION_V1_MAX - 1) + 1)


def corrected_dates(commits: dict[bytes, Commit], known: dict[bytes, int]) -> dict[bytes, int]:
    """git's compute_generation_numbers (v2): max(date, highest parent's + 1)."""
    def value(cur: bytes, top: int) -> int:
        date = commits[cur].date
        return max(date, top + 1) if date else top + 1

    return _parents_first(commits, known, value)


# -- writing one layer -----------------------------------------------------------------------------------

@dataclass
class LayerInput:
    oids: list[bytes]                              # sorted, the commits of this layer
    commits: dict[bytes, Commit]                   # at least these commits (and their parents' numbers)
    levels: dict[bytes, int]
    generations: dict[bytes, int]
    filters: dict[bytes, bytes] | None             # id -> Bloom filter; None: no BIDX/BDAT
    base_oids: list[bytes] = field(default_factory=list)       # the layers below, their ids in order
    base_checksums: list[bytes] = field(default_factory=list)


def layer_bytes(inp: LayerInput) -> bytes:
    """One commit-graph file, byte for byte what git writes for the same commits and base."""
    n = len(inp.oids)
    pos = {oid: i + len(inp.base_oids) for i, oid in enumerate(inp.oids)}
    if inp.base_oids:
        for i, oid in enumerate(inp.base_oids):
            pos.setdefault(oid, i)
    fanout = bytearray()
    count = 0
    firsts = [oid[0] for oid in inp.oids]
    for b in range(256):
        while count < n and firsts[count] == b:
            count += 1
        fanout += struct.pack(">I", count)
    cdat = bytearray()
    gda = bytearray()
    gdo = bytearray()
    edges = bytearray()
    extra = 0
    for oid in inp.oids:
        c = inp.commits[oid]
        cdat += c.tree
        ps = c.parents
        try:
            p1 = pos[ps[0]] if ps else PARENT_NONE
            if len(ps) < 2:
                p2 = PARENT_NONE
            elif len(ps) > 2:
                p2 = EXTRA_EDGES_NEEDED | extra
                for j, p in enumerate(ps[1:], 1):
                    edges += struct.pack(">I", pos[p] | (LAST_EDGE if j == len(ps) - 1 else 0))
                extra += len(ps) - 1
            else:
                p2 = pos[ps[1]]
        except KeyError as err:
            raise ObjectMissingError("a commit's parent is in no commit-graph layer", oid=err.args[0]) from None
        date = c.date
        cdat += struct.pack(">III", p1, p2, ((inp.levels[oid] << 2) | ((date >> 32) & 3)) & 0xFFFFFFFF)
        cdat += struct.pack(">I", date & 0xFFFFFFFF)
        offset = inp.generations[oid] - date
        if offset > OFFSET_V2_MAX:
            gda += struct.pack(">I", OFFSET_OVERFLOW | (len(gdo) // 8))
            gdo += struct.pack(">Q", offset)
        else:
            gda += struct.pack(">I", offset)
    chunks: list[tuple[bytes, bytes]] = [(OIDF, bytes(fanout)), (OIDL, b"".join(inp.oids)), (CDAT, bytes(cdat)),
                                         (GDA2, bytes(gda))]
    if gdo:
        chunks.append((GDO2, bytes(gdo)))
    if edges:
        chunks.append((EDGE, bytes(edges)))
    if inp.filters is not None:
        bidx = bytearray()
        end = 0
        datas = []
        for oid in inp.oids:
            f = inp.filters[oid]
            end += len(f)
            bidx += struct.pack(">I", end)
            datas.append(f)
        chunks.append((BIDX, bytes(bidx)))
        chunks.append((BDAT, struct.pack(">III", bloom.HASH_VERSION, bloom.NUM_HASHES, bloom.BITS_PER_ENTRY)
                       + b"".join(datas)))
    if inp.base_checksums:
        chunks.append((BASE, b"".join(inp.base_checksums)))
    out = bytearray(SIGNATURE + bytes([1, 1, len(chunks), len(inp.base_checksums)]))
    offset = 8 + 12 * (len(chunks) + 1)
    for cid, body in chunks:
        out += struct.pack(">4sQ", cid, offset)
        offset += len(body)
    out += struct.pack(">4sQ", b"\0\0\0\0", offset)
    for _cid, body in chunks:
        out += body
    out += hashlib.sha1(out).digest()
    return bytes(out)


# -- the whole write: which layers, their install ----------------------------------------------------

@dataclass
class GraphResult:
    """What one commit-graph write did (for the job's counters)."""

    commits: int = 0                 # commits in the layer written
    layers_before: int = 0
    layers_after: int = 0
    layers_merged: int = 0           # old layers folded into the new one
    filters_computed: int = 0
    filters_reused: int = 0          # taken from the layers merged or replaced (as git loads them)
    filters_large: int = 0
    filters_empty: int = 0
    expired: int = 0                 # unreferenced layer files removed
    commits_from_walk: int = 0       # commits taken as the repack's walk read them (not read again)
    written: str | None = None       # the new layer's checksum (None: nothing new to write)
    replaced: bool = False
    seconds_bloom: float = 0.0

    def as_counters(self) -> dict[str, object]:
        return {f"commit_graph_{k}": v for k, v in self.__dict__.items()}


def ref_tips(repo) -> list[bytes]:
    """The commits the refs under refs/ name, peeled (git's ``--reachable``: for_each_ref, HEAD not included)."""
    read = repo.objects.read
    out = []
    for _name, oid in repo.refs.as_dict().items():
        c = peel_to_commit(read, oid)
        if c is not None:
            out.append(c)
    return out


def layer_filters(layer: Layer) -> dict[bytes, bytes]:
    """The Bloom filters a layer on disk holds (id -> filter), if written with git's settings (1, 7, 10);
    {} otherwise. git reuses them the same way (load_bloom_filter_from_graph) instead of diffing again."""
    if not layer.has_bloom:
        return {}
    data = layer.path.read_bytes()
    if layer.bloom_settings(data) != (bloom.HASH_VERSION, bloom.NUM_HASHES, bloom.BITS_PER_ENTRY):
        return {}
    (ioff, ilen), (doff, dlen) = layer.chunks[BIDX], layer.chunks[BDAT]
    ends = struct.unpack_from(f">{ilen // 4}I", data, ioff)
    if len(ends) != len(layer.oids) or (ends and ends[-1] > dlen - 12):
        raise CorruptObjectError("commit-graph Bloom index runs past its data chunk", path=layer.path)
    out = {}
    start = 0
    base = doff + 12
    for oid, end in zip(layer.oids, ends):
        if end < start:
            raise CorruptObjectError("commit-graph Bloom index is not ascending", path=layer.path)
        out[oid] = data[base + start:base + end]
        start = end
    return out


def compute_filters(read: Read, commits: dict[bytes, Commit], oids: Iterable[bytes],
                    result: GraphResult, order: dict[bytes, int] | None = None,
                    known: dict[bytes, bytes] | None = None, c_packs: object | None = None) -> dict[bytes, bytes]:
    """The Bloom filter of each commit in ``oids``, computed in ``order`` (generation numbers: as git's
    compute_bloom_filters sorts them, so a commit comes soon after its parent and the parent's trees are
    still in the differ's cache; the filters do not depend on the order). ``known``: filters already
    written for some of them (layers being merged), reused as they are. ``c_packs``: the repository's packs for
    the C loop to read trees from (:func:`.bloom.open_packs`)."""
    t0 = time.monotonic()
    out: dict[bytes, bytes] = {}
    if known:
        todo = []
        for oid in oids:
            f = known.get(oid)
            if f:
                out[oid] = f
                result.filters_reused += 1
            else:
                todo.append(oid)
        oids = todo
    if order is not None:
        oids = sorted(oids, key=lambda o: (order.get(o, 0), o))
    oids = list(oids)
    pairs: list[tuple[bytes | None, bytes]] = []
    for oid in oids:
        c = commits[oid]
        parent_tree = None
        if c.parents:
            parent = commits.get(c.parents[0])
            if parent is None:
                obj_type, data = read(c.parents[0])
                parent = parse_commit_for_graph(data, c.parents[0])
            parent_tree = parent.tree
        pairs.append((parent_tree, c.tree))
    for oid, f in zip(oids, bloom.filters(read, pairs, c_packs)):
        out[oid] = f
        result.filters_computed += 1
        if f == bloom.TOO_LARGE:   # (one byte ff: only "too large"; a filter of n >= 1 paths has >= 2 bytes)
            result.filters_large += 1
        elif f == bloom.EMPTY:
            result.filters_empty += 1
    result.seconds_bloom += time.monotonic() - t0
    return out


def build_single(repo, *, changed_paths: bool = True) -> tuple[bytes, GraphResult]:
    """The bytes of ``git commit-graph write --reachable [--changed-paths]``'s one file for ``repo`` now."""
    result = GraphResult()
    read = repo.objects.read
    c_packs = bloom.open_packs(repo.objects.packs.prepare())
    try:
        commits = reachable_commits(read, ref_tips(repo), c_packs=c_packs)
        oids = sorted(commits)
        gens = corrected_dates(commits, {})
        inp = LayerInput(oids, commits, topo_levels(commits, {}), gens,
                         compute_filters(read, commits, oids, result, gens, c_packs=c_packs) if changed_paths else None)
    finally:
        bloom.close_packs(c_packs)
    result.commits = len(oids)
    return layer_bytes(inp), result


def chain_commits(layers: list[Layer]) -> dict[bytes, tuple[Commit, int, int]]:
    """Every commit of the chain as its layers record it: (tree, parents, date), topological level and
    corrected commit date -- what a split write needs of the commits below the new layer, without reading
    one object (git reads them from the graph too). CorruptObjectError naming the file if it does not add up."""
    out: dict[bytes, tuple[Commit, int, int]] = {}
    order: list[bytes] = []
    for L in layers:
        order.extend(L.oids)
    for L in layers:
        data = L.path.read_bytes()
        coff, clen = L.chunks[CDAT]
        goff, _ = L.chunks[GDA2]
        over = L.chunks.get(GDO2, (0, 0))[0]
        eoff = L.chunks.get(EDGE, (0, 0))[0]
        if clen != 36 * len(L.oids):
            raise CorruptObjectError("commit-graph CDAT size does not match its commit count", path=L.path)
        try:
            for i, oid in enumerate(L.oids):
                tree = data[coff + 36 * i:coff + 36 * i + 20]
                p1, p2, high, low = struct.unpack_from(">IIII", data, coff + 36 * i + 20)
                parents = [] if p1 == PARENT_NONE else [order[p1]]
                if p2 & EXTRA_EDGES_NEEDED and p2 != PARENT_NONE:
                    k = p2 & 0x7FFFFFFF
                    while True:
                        (edge,) = struct.unpack_from(">I", data, eoff + 4 * k)
                        parents.append(order[edge & 0x7FFFFFFF])
                        if edge & LAST_EDGE:
                            break
                        k += 1
                elif p2 != PARENT_NONE:
                    parents.append(order[p2])
                date = ((high & 3) << 32) | low
                (offset,) = struct.unpack_from(">I", data, goff + 4 * i)
                if offset & OFFSET_OVERFLOW:
                    (offset,) = struct.unpack_from(">Q", data, over + 8 * (offset & 0x7FFFFFFF))
                out[oid] = (Commit(tree, parents, date), high >> 2, date + offset)
        except (IndexError, struct.error):
            raise CorruptObjectError("commit-graph parent or edge position out of range", path=L.path) from None
    return out


__all__ = ["build_single", "read_chain", "read_layer", "layer_bytes", "chain_commits", "layer_filters",
           "compute_filters", "Layer", "LayerInput", "Commit", "GraphResult"]
