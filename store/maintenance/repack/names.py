"""Names for the delta search when no walk from the tips gave them: a geometric repack's rolled-up packs. (A
cruft pack's objects take their delta bases' names instead: writeplan.ByBase.)

The search sorts its candidates by the hash of the name they were reached by, so that the versions of one file
are tried against each other first; without names every candidate hashes to 0 and sorts by size alone, and
the window tries unrelated objects of similar sizes (a geometric repack of 30 ordinary push packs: 38,000 tries
for 4,400 candidates, most of them in vain). git's ``pack-objects --stdin-packs`` walks the packs' commits for
the same reason. Here: every tree among ``ids`` names its entries (the first name met wins); trees outside the
replaceable packs are not read (the names are a sort key, not a result: nothing is checked or written from
them). ``ids`` come in pack order (git writes a tree before the trees below it): a tree started from before
a tree naming it would stay unnamed.

* :func:`names_in` -- the C walker's tree walk from those trees (``start_young``), names recorded as it walks;
* :func:`names_in_py` -- the specification: each tree among ``ids`` read and parsed in Python.
"""
from __future__ import annotations

from typing import Iterable

from ... import native
from ...errors import StoreError
from ...objects import ObjectType
from ..walk.parse import parse_tree_entries
from ..walk.reach import C_CACHE_BYTES

_walk_c = native.walk()   # the C walker (store/native.py), or None


def names_in(sources, ids: Iterable[bytes]) -> dict[bytes, bytes]:
    """{id: entry name} for the entries of every tree among ``ids`` (objects of ``sources``' packs); {} when they
    cannot be read (a corrupt pack: the write that follows names it)."""
    ids = list(ids)
    if sources.c_packs is None or _walk_c is None:
        return names_in_py(sources, ids)

    def outside(oid: bytes, want: int, referrer: str) -> tuple[int, bytes]:
        return want, b""   # (a tree outside the replaceable packs: not read, it names nothing here)

    cw = _walk_c.Walker(sources.c_packs, outside, cache_bytes=C_CACHE_BYTES // 2, expect=len(ids))
    try:
        cw.start_young(b"".join(ids), True)
    except _walk_c.WalkError:
        return {}
    _commits, trees, blobs = cw.result()
    cw.release_reader()
    return cw.names(trees, blobs)


def names_in_py(sources, ids: list[bytes]) -> dict[bytes, bytes]:
    """The specification of :func:`names_in` (the same names): from each tree among ``ids`` not seen yet, depth
    first as the walk goes (walk.Walker._tree), each entry named when it is first met; a subtree outside the
    packs is not read; gitlinks are skipped."""
    names: dict[bytes, bytes] = {}
    seen: set[bytes] = set()
    try:
        for oid in ids:
            if oid in seen or _packed_type(sources, oid) != ObjectType.TREE:
                continue
            seen.add(oid)
            stack = [iter(_entries(sources, oid, seen))]
            while stack:
                for mode, name, eid in stack[-1]:
                    if eid in seen:
                        continue
                    seen.add(eid)
                    names[eid] = name
                    if mode in _DIRS:
                        stack.append(iter(_entries(sources, eid, seen)))
                        break
                else:
                    stack.pop()
    except StoreError:
        return {}
    return names


_DIRS = (b"40000", b"040000")


def _packed_type(sources, oid: bytes) -> int | None:
    """The type of a replaceable pack's copy of ``oid`` (None: not in those packs)."""
    gid = sources.packed(oid)
    if gid is None:
        return None
    p = sources.packs[sources.pack_no[gid]]
    return int(p.pack.header_at(p.offsets[gid - p.base])[0])


def _entries(sources, oid: bytes, seen: set[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """A packed tree's entries not seen yet, gitlinks left out ([] for a tree outside the packs)."""
    if sources.packed(oid) is None:
        return []
    typ, data = sources.read(oid)
    return [e for e in parse_tree_entries(data, oid) if e[0] != b"160000" and e[2] not in seen]
