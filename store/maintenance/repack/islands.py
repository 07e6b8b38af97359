"""Delta islands (git's ``pack.island``, ``repack -i``): in a pack shared by several repositories, no object is
stored as a delta against a base that some repository reaching the object does not reach, so serving one
fork never has to send (or resolve) another fork's objects.

As git's ``delta-islands.c`` defines them:

* **islands** come from the refs: each ref is matched against the ``pack.island`` regexes (anchored at its
  start, as git prepends ``^``; the last regex that matches wins); the island's name is the regex's capture
  groups joined with ``-``. A ref no regex matches is in no island.
* **marks**: an object's marks are the islands whose refs reach it (a tag's target as the tag). git spreads
  them along its traversal (commits to their parents and root trees, trees to their entries, gitlinks not
  followed); here they are computed exactly -- commits in an order with every child before its parents, then
  one tree walk per distinct set of marks a commit carries (a fork network has few: the shared history, and
  each fork's own commits), so the cost is about one more walk of the trees.
* **the rule** (``in_same_island``): a target without marks may rest on any base; a base without marks
  takes no marked target; otherwise every island of the target must be an island of the base. It holds for
  new deltas (the search skips such a pair) and reused ones (a delta whose base breaks it is searched again).

Marks are interned into *classes* (one per distinct set of islands, class 0: no marks), and the rule into a
``classes x classes`` table the delta search reads (:class:`..pack.search.Candidates`: ``islands``,
``island_ok``). ``pack.islandCore`` names one island the *core*: git writes its objects first (its layer 0,
``compute_pack_layers``: every core object before every other, each layer in the usual write order) and gives its
refs' commits bitmaps (``NEEDS_BITMAP``); here :func:`core_first` reorders the main pack's write (a delta's base
still goes first: the rule keeps a core object's base in the core) and the repack adds the core refs to the
bitmap's preferred tips.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ...errors import InvalidInputError
from ...objects import ObjectType
from ...parse import tag_links
from ..walk.parse import parse_commit
from ..walk.reach import Reachable, walk

#: At most this many islands (git keeps no limit; 32 bits a word): a regex that makes one per ref of a large
#: repository is almost surely a mistake, and the marks would cost islands/8 bytes per distinct set.
MAX_ISLANDS = 65_536
#: At most this many distinct sets of islands (the search's table is their square, in bytes).
MAX_CLASSES = 4096
#: A tag of a tag of ...: at most this deep (git's peel limit is the same order).
MAX_TAG_DEPTH = 100

Read = Callable[[bytes], tuple[int, bytes]]


@dataclass(frozen=True)
class IslandOptions:
    """``pack.island`` regexes in configuration order (the last that matches a ref wins); ``core``: git's
    ``pack.islandCore``, the name of the island written first (None: none)."""

    regexes: tuple[str, ...]
    core: str | None = None

    def compiled(self) -> list[re.Pattern[str]]:
        out = []
        for rx in self.regexes:
            try:
                out.append(re.compile(rx if rx.startswith("^") else "^" + rx))
            except re.error as err:
                raise InvalidInputError(f"cannot read the island regex {rx!r}: {err}") from None
        return out


def island_of(ref: str, compiled: list[re.Pattern[str]]) -> str | None:
    """The island of ``ref``: the capture groups of the last regex that matches, joined with '-' (None: none)."""
    for rx in reversed(compiled):
        m = rx.match(ref)
        if m:
            return "-".join(g for g in m.groups() if g is not None)
    return None


def islands_of(refs: Mapping[str, bytes], options: IslandOptions) -> dict[str, list[bytes]]:
    """island name -> the tips of its refs, in ref order."""
    compiled = options.compiled()
    out: dict[str, list[bytes]] = {}
    for name in sorted(refs):
        island = island_of(name, compiled)
        if island is not None:
            out.setdefault(island, []).append(refs[name])
    if len(out) > MAX_ISLANDS:
        raise InvalidInputError(f"the island regexes make {len(out)} islands, more than {MAX_ISLANDS}")
    return out


@dataclass
class IslandMarks:
    """Each object's class of marks; ``masks[c]``: the islands of class c (bit i: the i-th island by name)."""

    islands: tuple[str, ...] = ()
    masks: list[int] = field(default_factory=lambda: [0])
    of: dict[bytes, int] = field(default_factory=dict)
    core_mask: int = 0      # the core island's bit (pack.islandCore; 0: none named, or no ref in it)

    def class_of(self, oid: bytes) -> int:
        return self.of.get(oid, 0)

    def allowed(self, target: bytes, base: bytes) -> bool:
        """git's ``in_same_island(target, base)``."""
        t = self.masks[self.class_of(target)]
        if not t:
            return True
        b = self.masks[self.class_of(base)]
        return b != 0 and t & ~b == 0

    def table(self) -> bytes:
        """``ok[t * n + b]`` for classes t, b: the rule above, for the delta search."""
        masks = self.masks
        return bytes(1 if not t or (b and t & ~b == 0) else 0 for t in masks for b in masks)


def _intern(mask_of: dict[bytes, int]) -> IslandMarks:
    classes: dict[int, int] = {0: 0}
    of: dict[bytes, int] = {}
    for oid, mask in mask_of.items():
        if mask:
            c = classes.get(mask)
            if c is None:
                if len(classes) >= MAX_CLASSES:
                    raise InvalidInputError(f"the islands' marks form more than {MAX_CLASSES} distinct sets")
                c = classes[mask] = len(classes)
            of[oid] = c
    masks = [0] * len(classes)
    for mask, c in classes.items():
        masks[c] = mask
    return IslandMarks(masks=masks, of=of)


def _commit_links(reach: Reachable, read: Read) -> Iterable[tuple[bytes, bytes, list[bytes]]]:
    """(commit, its tree, its parents) for every commit the walk reached (from its CommitMeta if it kept one)."""
    meta = reach.commit_meta
    if meta is not None and len(meta.trees) == 20 * len(reach.commits):
        from array import array

        counts = array("I")
        counts.frombytes(meta.nparents)
        pos = 0
        for k, oid in enumerate(reach.commits):
            n = counts[k]
            parents = [meta.parents[20 * (pos + j):20 * (pos + j + 1)] for j in range(n)]
            pos += n
            yield oid, meta.trees[20 * k:20 * k + 20], parents
        return
    for oid in reach.commits:
        _typ, data = read(oid)
        tree, parents, _when = parse_commit(data, oid)
        yield oid, tree, parents


def compute_marks(refs: Mapping[str, bytes], options: IslandOptions, reach: Reachable, read: Read, *,
                  packs: object | None = None, processes: int = 1) -> IslandMarks:
    """Every reachable object's marks (see the module docstring). ``reach``: the repack's walk from ``refs``;
    ``read``/``packs``: its reader and SourceIndex (the tree walks read through them)."""
    islands = islands_of(refs, options)
    names = tuple(sorted(islands))
    if not names:
        return IslandMarks()
    bit = {name: 1 << i for i, name in enumerate(names)}
    mask: dict[bytes, int] = {}
    # 1. each island's tips, tags peeled (the tag and what it names carry the island).
    direct_trees: dict[int, list[bytes]] = {}
    roots_of: dict[int, list[bytes]] = {}
    in_walk = reach.reached()
    for name, tips in islands.items():
        b = bit[name]
        for oid in tips:
            for _ in range(MAX_TAG_DEPTH):
                if oid not in in_walk:
                    break
                mask[oid] = mask.get(oid, 0) | b
                typ, data = read(oid)
                if typ != ObjectType.TAG:
                    if typ in (ObjectType.TREE, ObjectType.BLOB):
                        direct_trees.setdefault(b, []).append(oid)
                    break
                oid = tag_links(data, oid)[0][0]
    # 2. commits, every child before its parents: a parent carries the marks of all its children.
    links = {oid: (tree, parents) for oid, tree, parents in _commit_links(reach, read)}
    children = dict.fromkeys(links, 0)
    for _tree, parents in links.values():
        for p in parents:
            if p in children:
                children[p] += 1
    ready = [oid for oid, n in children.items() if n == 0]
    done = 0
    while ready:
        oid = ready.pop()
        done += 1
        m = mask.get(oid, 0)
        tree, parents = links[oid]
        if m:
            roots_of.setdefault(m, []).append(tree)
        for p in parents:
            if p in children:
                if m:
                    mask[p] = mask.get(p, 0) | m
                children[p] -= 1
                if children[p] == 0:
                    ready.append(p)
    if done != len(links):   # (a cycle cannot be hashed into existence; a corrupt walk could)
        raise InvalidInputError(f"the commit graph has a cycle: {len(links) - done} commits never became ready")
    # 3. trees and blobs: one walk per distinct set of marks, from the root trees of the commits carrying it.
    #    Commits' root trees go to the walk as trees (read in C, as the main walk read them); trees and blobs a
    #    tip names directly, as tips (their type is checked).
    for m in direct_trees:
        roots_of.setdefault(m, [])
    for m, roots in roots_of.items():
        roots_named = [(f"island-roots/{k}", oid) for k, oid in enumerate(dict.fromkeys(roots))]
        named = [(f"island-tips/{k}", oid) for k, oid in enumerate(dict.fromkeys(direct_trees.get(m, ())))]
        sub = walk(named, read, packs=packs, processes=processes, trees=roots_named)   # type: ignore[arg-type]
        for oid in (*sub.trees, *sub.blobs):
            mask[oid] = mask.get(oid, 0) | m
    marks = _intern(mask)
    marks.islands = names
    marks.core_mask = bit.get(options.core, 0) if options.core is not None else 0
    return marks


def core_refs(refs: Mapping[str, bytes], options: IslandOptions) -> list[str]:
    """The refs of the core island (``pack.islandCore``), sorted; [] when none is named."""
    if options.core is None:
        return []
    compiled = options.compiled()
    return [name for name in sorted(refs) if island_of(name, compiled) == options.core]


def core_first(ids: list[bytes], marks: IslandMarks) -> list[bytes]:
    """``ids`` with the core island's objects first, each part in its own order (git's two write layers)."""
    if not marks.core_mask:
        return ids
    core: list[bytes] = []
    rest: list[bytes] = []
    masks, of, bit = marks.masks, marks.of, marks.core_mask
    for oid in ids:
        (core if masks[of.get(oid, 0)] & bit else rest).append(oid)
    return core + rest


__all__ = ["IslandMarks", "IslandOptions", "MAX_CLASSES", "MAX_ISLANDS", "compute_marks", "core_first", "core_refs",
           "island_of", "islands_of"]
