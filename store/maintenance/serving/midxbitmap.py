"""The multi-pack-index's reachability bitmap: ``multi-pack-index-<MIDX checksum>.bitmap`` (git 2.39).

What ``git multi-pack-index write --bitmap`` writes (midx.c ``write_midx_bitmap``,
pack-bitmap-write.c), through :mod:`.bitmap`'s encoder with the MIDX's parameters:

* **bit order**: the MIDX's pseudo-pack order (its RIDX chunk: the preferred pack's objects first, then
  the packs in PNAM order, each pack's objects by offset, every object once);
* **index positions**: MIDX positions (object-id order);
* **checksum**: the MIDX's trailer;
* **commits**: every commit the refs reach (``for_each_ref``: refs only, not HEAD; tags peeled), in the
  walk's order, those in the MIDX (``find_commits_for_midx_bitmap``); the selection is the pack bitmap's;
* **name-hash cache**: present and all zero -- git 2.39 builds the MIDX's object entries without names
  (``prepare_midx_packing_data``), so every hash it writes is 0.

An object the commits reach that the MIDX lacks (a loose object) means no closure: no bitmap (git fails
the write; packyard writes the MIDX without one).
"""
from __future__ import annotations

from array import array
from pathlib import Path
from typing import Mapping

from ... import native
from ...errors import ObjectMissingError
from ...objects import ObjectType
from ...pack.packdir import PackFile
from ..walk.reach import Read, walk
from ..walk.sources import SourceIndex
from .bitmap import (
    BitmapClosureError,
    BitmapOptions,
    CommitGraph,
    build_bitmaps,
    c_selected_and_stored,
    encode_bitmap,
    preferred_tips,
    select_commits,
)
from .midx import Midx


def midx_bitmap_for(repo, midx: Midx, options: BitmapOptions | None = None, *, processes: int = 1) -> bytes | None:
    """:func:`midx_bitmap` for ``repo``'s refs, reading the MIDX's packs through one SourceIndex (the walk's C
    extension then reads them directly: no per-object lookup over N idx files). ``processes`` > 1: the
    reachability walk's older half in a helper thread, as the repack's own walk (``RepackOptions.processes``)."""
    snapshot = repo.objects.snapshot()
    named = set(midx.pack_stems)
    sources = SourceIndex(snapshot, [p for p in snapshot.packs if p.name in named], [], read_fresh=repo.objects.read)
    try:
        return midx_bitmap(midx, Path(repo.objects.path) / "pack", repo.refs.as_dict(), sources.read, options,
                           sources=sources, processes=processes)
    finally:
        sources.release()


def midx_bitmap(midx: Midx, pack_dir: Path, refs: Mapping[str, bytes], read: Read,
                options: BitmapOptions | None = None, *, sources: SourceIndex | None = None,
                processes: int = 1) -> bytes | None:
    """The bitmap for ``midx`` (installed or about to be, its packs installed), or None without closure."""
    if midx.ridx is None or not midx.count:
        return None
    options = options or BitmapOptions()
    oids = midx.oids
    order = [oids[20 * p:20 * p + 20] for p in midx.ridx]
    pos = {oid: i for i, oid in enumerate(order)}
    try:
        reach = walk(sorted(refs.items()), read, packs=sources, processes=processes)
    except ObjectMissingError:
        return None   # (a ref names a missing object: nothing to bitmap)
    kind: dict[bytes, int] = {}
    for ids, typ in ((reach.commits, ObjectType.COMMIT), (reach.tags, ObjectType.TAG),
                     (reach.trees, ObjectType.TREE), (reach.blobs, ObjectType.BLOB)):
        kind.update(dict.fromkeys(ids, int(typ)))
    if any(oid not in pos for oid in kind):
        return None   # (the refs reach an object the MIDX lacks: no closure)
    types: list[int] = [kind.get(oid, 0) for oid in order]
    packs: dict[int, PackFile] = {}
    try:
        for i, t in enumerate(types):
            if t:
                continue
            p = midx.ridx[i]   # an object no ref reaches: its type from its pack
            pid = midx.pack_ids[p]
            pack = packs.get(pid)
            if pack is None:
                pack = packs[pid] = PackFile(Path(pack_dir) / midx.pack_names[pid])
            types[i] = int(pack.header_at(midx.offsets[p])[0])
    finally:
        for pack in packs.values():
            pack.close()
    commits = [c for c in reach.commits if c in pos]
    graph = CommitGraph(read)

    def peel(oid: bytes) -> bytes | None:
        return oid if kind.get(oid) == int(ObjectType.COMMIT) else _peel_tag(oid, read, kind)

    preferred = preferred_tips(refs, options.prefer_tips, peel)
    c_packs = getattr(sources, "c_packs", None) if sources is not None else None
    try:
        if native.bitmap() is not None and c_packs is not None:
            # The same selection and closures as build_bitmaps, in C (bitmap.py's full-repack path): the
            # Python loop is the specification, and too slow for a geometric repack of a large history.
            walked = reach.commit_meta if len(commits) == len(reach.commits) else None
            selected, stored = c_selected_and_stored(commits, graph, preferred, order, pos, read, c_packs, walked)
            return encode_bitmap(order, types, midx.checksum, selected, None, hashes=None, options=options,
                                 stored=stored, index=_by_id(midx.ridx))
        selected = select_commits(commits, graph, preferred)
        bitmaps = build_bitmaps(selected, pos, len(order), graph, read)
    except BitmapClosureError:
        return None
    return encode_bitmap(order, types, midx.checksum, selected, bitmaps, hashes=None, options=options)


def _by_id(ridx) -> array:
    """The bit position of each MIDX position (object-id order): the inverse of the pseudo-pack order."""
    index = array("I", bytes(4 * len(ridx)))
    for i, p in enumerate(ridx):
        index[p] = i
    return index


def _peel_tag(oid: bytes, read: Read, kind: Mapping[bytes, int]) -> bytes | None:
    for _ in range(64):   # (a tag chain longer than this is not followed)
        if kind.get(oid) != int(ObjectType.TAG):
            return oid if kind.get(oid) == int(ObjectType.COMMIT) else None
        _t, data = read(oid)
        if not data.startswith(b"object ") or len(data) < 47:
            return None
        oid = bytes.fromhex(data[7:47].decode("ascii", "replace"))
    return None


__all__ = ["midx_bitmap", "midx_bitmap_for"]
