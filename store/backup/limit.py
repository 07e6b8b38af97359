"""What an incremental bundle leaves out: git's ``A..B`` limit (revision.c ``limit_list``, list-objects.c
``mark_edges_uninteresting``), for a walk that reads only the new part of the history.

The exact set -- everything the prerequisites reach -- costs a walk of their whole history (git.git at v2.0.0:
~1 s in C) for an incremental of a hundred commits. Instead, as git does:

1. **commits**: a queue ordered by committer date, newest first, seeded with the prerequisites (uninteresting)
   and the tips' commits (interesting); each popped commit queues its parents with its own flag, an
   uninteresting flag spreads to a commit already seen (and from it to its parents), and the walk stops once no
   interesting commit is queued. The uninteresting commits seen are left out;
2. **trees and blobs**: everything the root trees of the *edge* commits reach (the prerequisites, and each
   uninteresting parent of an interesting commit) is left out: one C walk of a few trees.

What the tips reach is then walked with those as ``known`` (store/maintenance/walk/reach.py): only the new
commits and the trees and blobs they add are read. The result may hold an object the prerequisites reach
through an older commit only (a file restored to an old version; a commit dated out of order), as git's does: a
bundle with an object the receiver has already is still a valid bundle (index-pack compares it with the copy
it has). After :data:`COMMIT_LIMIT` commits the walk gives up (None) and the caller takes the exact set.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable

from ..errors import CorruptObjectError
from ..maintenance.walk.parse import parse_commit
from ..maintenance.walk.reach import COMMIT, TAG, walk
from ..maintenance.walk.sources import SourceIndex
from ..parse import tag_links

#: Commits read by the limit walk before it gives up (a ref moved back to an old commit, a new branch off an old
#: one: the walk would go deep into the history; the prerequisites' whole reach is walked in C instead).
COMMIT_LIMIT = 5000
MAX_PEEL = 64


class _TooFar(Exception):
    pass


def peel_to_commit(sources: SourceIndex, oid: bytes) -> bytes | None:
    """The commit ``oid`` names through annotated tags, or None (a tree or blob)."""
    for _ in range(MAX_PEEL):
        typ, data = sources.read(oid)
        if typ == COMMIT:
            return oid
        if typ != TAG:
            return None
        (oid, _t), = tag_links(data, oid)
    return None


def excluded_by_edges(sources: SourceIndex, prerequisites: Iterable[bytes], tips: Iterable[bytes]
                      ) -> Callable[[bytes], bool] | None:
    """``known(oid)`` for the walk of ``tips`` (see the module docstring): True for what the prerequisites'
    edges reach. None when the commit walk would pass :data:`COMMIT_LIMIT`."""
    flags: dict[bytes, bool] = {}                     # commit -> uninteresting
    info: dict[bytes, tuple[bytes, list[bytes]]] = {}  # commit -> (tree, parents)
    popped: set[bytes] = set()
    pending: set[bytes] = set()                       # interesting commits queued
    heap: list[tuple[int, int, bytes]] = []
    counter = [0]

    def add(oid: bytes, uninteresting: bool) -> None:
        if oid in flags:
            if uninteresting and not flags[oid]:
                spread(oid)
            return
        if len(flags) >= COMMIT_LIMIT:
            raise _TooFar
        typ, data = sources.read(oid)
        if typ != COMMIT:
            raise CorruptObjectError("a commit's parent is not a commit", oid=oid)
        tree, parents, when = parse_commit(data, oid)
        info[oid] = (tree, parents)
        flags[oid] = uninteresting
        if not uninteresting:
            pending.add(oid)
        counter[0] += 1
        heapq.heappush(heap, (-when, counter[0], oid))

    def spread(oid: bytes) -> None:
        """``oid`` (seen interesting) is uninteresting after all: so is what it leads to that was seen."""
        stack = [oid]
        for _ in range(COMMIT_LIMIT + 1):
            if not stack:
                return
            c = stack.pop()
            if flags.get(c, True):
                continue
            flags[c] = True
            pending.discard(c)
            if c in popped:
                stack.extend(p for p in info[c][1] if p in flags)
        raise _TooFar

    try:
        prereqs = list(dict.fromkeys(prerequisites))
        for p in prereqs:
            add(p, True)
        for t in tips:
            c = peel_to_commit(sources, t)
            if c is not None:
                add(c, False)
        for _ in range(COMMIT_LIMIT + 1):
            if not pending:
                break
            _, _, oid = heapq.heappop(heap)
            popped.add(oid)
            pending.discard(oid)
            for parent in info[oid][1]:
                add(parent, flags[oid])
        else:
            raise _TooFar
    except _TooFar:
        return None
    uninteresting = {c for c, u in flags.items() if u}
    edges = set(prereqs)
    for c in popped:
        if not flags[c]:
            edges.update(p for p in info[c][1] if flags.get(p))
    trees = [(f"commit {c.hex()}", info[c][0]) for c in sorted(edges)]
    reach = walk([], sources.read, packs=sources, trees=trees)
    seen = reach.reached()
    return lambda oid: oid in uninteresting or oid in seen


__all__ = ["excluded_by_edges", "peel_to_commit", "COMMIT_LIMIT"]
