"""A full repack's unreachable objects: which old ones stay because a young one links to them.

An unreachable object younger than the expiry goes to the cruft pack; an old one is deleted -- unless a
kept (young) object reaches it, directly or through other unreachable objects: then it stays too, so that
what the cruft pack holds is never missing a link (git's ``enumerate_and_traverse_cruft_objects``, which
walks from the recent objects with missing links ignored).

* When no unreachable object is old, nothing can be saved: no walk at all (the common case of a host that
  deletes refs: everything unreachable is younger than two weeks).
* Otherwise one walk from the young objects, each object read once, stopping at what the tips reach:

  - :func:`reached_from_py` -- the specification, in Python (any object reader);
  - :func:`reached_from_c` -- the same set with the C walker (``_walk.c``): a copy of the main walk's
    seen set (everything the tips reach) so the walk stops there, commits and trees read straight from
    the packs, a young object's type from its entry headers (blobs are never inflated). Missing links
    are skipped as the Python walk skips them (through the fallback reader).

tests/workers/test_walk.py compares the two on histories made with git.
"""
from __future__ import annotations

from typing import Callable, Container

from ... import native
from ...errors import CorruptObjectError, ObjectMissingError
from ...objects import ObjectType
from ...parse import object_links, tag_links
from ..walk.reach import C_CACHE_BYTES, Reachable

Read = Callable[[bytes], tuple[int, bytes]]

_walk_c = native.walk()   # the C walker (store/native.py), or None

#: A missing tree read by the C walk (the empty tree links nothing) and a missing commit (it links nothing
#: but the empty tree): git's traversal of cruft objects ignores missing links the same way.
_EMPTY_TREE = bytes.fromhex("4b825dc642cb6eb9a060e54bf8d69288fbb4904b")
_NO_COMMIT = b"tree " + _EMPTY_TREE.hex().encode() + b"\n"
#: Bound of the C walk's rounds: tags naming tags (each round starts from the targets the last one met).
MAX_TAG_CHAIN = 10_000


def reached_from(young: set[bytes], unreachable: Container[bytes], read: Read, *, reach: Reachable | None = None,
                 c_packs=None, order: list[bytes] | None = None) -> tuple[set[bytes], int]:
    """(found, walked): the unreachable objects (``unreachable``: ids to their ages) that the ``young`` ones link
    to, directly or through other unreachable objects, not counting the young ones themselves; and how many
    objects the walk went through. ``reach``/``c_packs``: the main walk and the SourceIndex's C packs: with
    both (and the C extension), the walk runs in C, starting from the young objects in ``order`` (their pack
    order: commits before trees, trees as git's traversal wrote them, so delta chains are resolved from the
    walker's cache rather than once per tree)."""
    walker = reach._walker if reach is not None and not reach._index_dropped else None
    if c_packs is not None and _walk_c is not None and walker is not None:
        return reached_from_c(young, unreachable, read, walker, c_packs, order)
    return reached_from_py(young, unreachable, read)


def reached_from_py(young: set[bytes], unreachable: Container[bytes], read: Read) -> tuple[set[bytes], int]:
    """The specification (see :func:`reached_from`): each young object read once, its links followed while they
    are unreachable objects; blobs link nothing and are never read."""
    found: set[bytes] = set()
    queue: list[tuple[bytes, ObjectType | None]] = [(oid, None) for oid in young]   # (id, type if known)
    walked = 0
    while queue:
        oid, want = queue.pop()
        walked += 1
        if want == ObjectType.BLOB:
            continue
        try:
            typ, data = read(oid)
        except ObjectMissingError:
            continue   # a young object already missing a link: nothing more to keep for it
        for link, link_type in object_links(typ, data, oid):
            if link in unreachable and link not in young and link not in found:
                found.add(link)
                queue.append((link, link_type))
    return found, walked


def reached_from_c(young: set[bytes], unreachable: Container[bytes], read: Read, main_walker,
                   c_packs, order: list[bytes] | None = None) -> tuple[set[bytes], int]:
    """:func:`reached_from` with the C walker: a copy of ``main_walker`` (its seen set is everything the tips reach;
    the walk never descends there), started from every young object; ids outside the packs and tags come back
    to Python and are started from here. What it walks is then filtered to ``unreachable`` minus ``young``."""
    def fallback(oid: bytes, want: int, referrer: str) -> tuple[int, bytes]:
        try:
            typ, data = read(oid)
        except ObjectMissingError:
            return want, (_NO_COMMIT if want == ObjectType.COMMIT else b"")
        return int(typ), data

    del c_packs   # (the copy reads the same packs as the main walk)
    # Its seen set: everything the tips reach. Half the main walk's cache: this walk reads only the unreachable
    # commits and trees (cruft-expire: the same time, peak RSS 148 -> 137-141 MiB).
    cw = main_walker.copy(C_CACHE_BYTES // 2, fallback)
    roots0 = cw.counts()[3]
    tags: list[bytes] = []
    pending: list[bytes] = list(order) if order is not None else list(young)
    # Each round after the first starts from the targets of tags met in the round before (each tag once: it
    # is marked seen), so the rounds are as many as the longest chain of tags naming tags.
    for _round in range(MAX_TAG_CHAIN):
        if not pending:
            break
        left = cw.start_young(b"".join(pending))
        pending = []
        for oid in left:
            _start_in_python(cw, oid, read, pending, tags)
    else:
        raise CorruptObjectError(f"unreachable tags name tags more than {MAX_TAG_CHAIN} deep")
    cw.walk_commits()
    cw.walk_roots(roots0, cw.counts()[3])
    commits, trees, blobs = cw.result()
    cw.release_reader()
    found: set[bytes] = set()
    for ids in (commits, tags, trees, blobs):
        found.update(oid for oid in ids if oid in unreachable)
    found.difference_update(young)
    return found, len(commits) + len(tags) + len(trees) + len(blobs)


def _start_in_python(cw, oid: bytes, read: Read, pending: list[bytes], tags: list[bytes]) -> None:
    """One start point the C walker left: not in its packs (loose, arrived later) or a tag."""
    if not cw.mark_seen(oid):
        return
    try:
        typ, data = read(oid)
    except ObjectMissingError:
        return
    if typ == ObjectType.COMMIT:
        cw.queue_commit(oid, data)
    elif typ == ObjectType.TREE:
        cw.walk_tree(oid, None, f"tree {oid.hex()}")
    elif typ == ObjectType.TAG:
        tags.append(oid)
        for target, _t in tag_links(data, oid):
            pending.append(target)
    else:
        cw.add_blob(oid, b"")

