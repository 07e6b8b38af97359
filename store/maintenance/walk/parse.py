"""The objects a reachability walk reads, parsed: commits (tree, parents, dates) and trees (entries).

:mod:`.walk` reads every commit and tree the tips reach and keeps what its followers need of each commit
(:class:`CommitMeta`: the bitmap and the commit-graph written after a repack do not read the commits again).
The bitmap's and the Bloom filters' own tree walks and the delta search's names parse with the same
functions. Each is the specification of its C counterpart in ``_walk.c`` (the same results, tested).
"""
from __future__ import annotations

import re
from array import array
from binascii import Error as HexError
from binascii import unhexlify
from dataclasses import dataclass

from ...errors import CorruptObjectError

_TREE_ENTRY = re.compile(rb"([0-7]+) ([^\0]+)\0(.{20})", re.S)
_MAX_DATE = (1 << 63) - 1


@dataclass(frozen=True)
class CommitMeta:
    """What the walk read of each commit it reached, in :attr:`.walk.Reachable.commits` order, so that the bitmap
    and the commit-graph written after the repack need not read the commits again (0.17 s and 0.36 s of
    the maintenance of git-v2.0.0): tree ids and parent ids (20 bytes each; the parents of every commit one
    after the other), the walk's committer dates (array 'q', :func:`parse_commit`), the commit-graph's
    dates (array 'Q', :func:`graph_commit_date`), parent counts (array 'I') and, one byte a commit, whether
    the commit-graph reads the commit as the walk did (:func:`graph_fields`)."""

    trees: bytes
    dates: bytes
    graph_dates: bytes
    nparents: bytes
    graph_ok: bytes
    parents: bytes


def graph_commit_date(data: bytes, pos: int) -> int:
    """git's ``parse_commit_date`` from ``pos`` (just past the parent lines): the digits after '>' on the
    "committer" line that must follow the "author" line; 0 when any of that is missing."""
    if not data.startswith(b"author", pos):
        return 0
    nl = data.find(b"\n", pos)
    if nl < 0 or not data.startswith(b"committer", nl + 1):
        return 0
    gt = data.find(b">", nl + 1)
    end = data.find(b"\n", nl + 1)
    if gt < 0 or end < 0 or gt > end:
        return 0
    m = _GRAPH_DATE.match(data, gt + 1, end)   # strtoumax: leading blanks, then digits
    if not m:
        return 0
    return min(int(m.group(1)), (1 << 64) - 1)


_GRAPH_DATE = re.compile(rb"[ \t]*(\d+)")
_HEX40 = re.compile(rb"[0-9a-fA-F]{40}\n")


def graph_fields(data: bytes, nparents: int) -> tuple[bool, int]:
    """(the commit-graph reads the commit as the walk did, its commit-graph date): the header starts with
    "tree <hex>" and "parent <hex>" lines (commitgraph.parse_commit_for_graph's form) and those are all of the
    walk's ``nparents`` parent lines. The specification of the C walker's graph_fields."""
    if len(data) < 46 or not data.startswith(b"tree ") or not _HEX40.match(data, 5):
        return False, 0
    pos, k = 46, 0
    while data.startswith(b"parent ", pos):
        if not _HEX40.match(data, pos + 7):
            return False, 0
        pos += 48
        k += 1
    if k != nparents:
        return False, 0
    return True, graph_commit_date(data, pos)


class MetaBuilder:
    """CommitMeta as the Python walk takes its commits (the C walker's commit_meta() is the same bytes)."""

    def __init__(self) -> None:
        self.trees, self.parents, self.ok = bytearray(), bytearray(), bytearray()
        self.dates, self.graph_dates, self.nparents = array("q"), array("Q"), array("I")

    def add(self, data: bytes, tree: bytes, parents: list[bytes], when: int) -> None:
        ok, graph_date = graph_fields(data, len(parents))
        self.trees += tree
        self.dates.append(when)
        self.graph_dates.append(graph_date)
        self.nparents.append(len(parents))
        self.ok.append(ok)
        self.parents += b"".join(parents)

    def done(self) -> CommitMeta:
        return CommitMeta(bytes(self.trees), self.dates.tobytes(), self.graph_dates.tobytes(),
                          self.nparents.tobytes(), bytes(self.ok), bytes(self.parents))


_SPACE = frozenset(b" \t\n\r")   # git's sane_ctype GIT_SPACE


def name_hash_fold(h: int, s: bytes) -> int:
    """git's ``pack_name_hash`` continued from state ``h`` over ``s`` (whitespace skipped; the hash of a path is
    ``name_hash_fold(0, path)``, and a child's continues its parent's over "/" and its name)."""
    for c in s:
        if c not in _SPACE:
            h = ((h >> 2) + (c << 24)) & 0xFFFFFFFF
    return h


def _hex(value: bytes, what: str, oid: bytes) -> bytes:
    if len(value) != 40:
        raise CorruptObjectError(f"{what} is not a hex object id: {value[:60]!r}", oid=oid)
    try:
        return unhexlify(value)
    except (HexError, ValueError):
        raise CorruptObjectError(f"{what} is not a hex object id: {value[:60]!r}", oid=oid) from None


def parse_commit(data: bytes, oid: bytes) -> tuple[bytes, list[bytes], int]:
    """(tree, parents, committer timestamp) of a commit; CorruptObjectError if it does not parse."""
    end = data.find(b"\n\n")
    head = data if end < 0 else data[:end]
    lines = head.split(b"\n")
    if not lines[0].startswith(b"tree "):
        raise CorruptObjectError("commit does not start with a tree header", oid=oid)
    tree = _hex(lines[0][5:], "commit tree", oid)
    parents = []
    when = 0
    for line in lines[1:]:
        if line.startswith(b"parent "):
            parents.append(_hex(line[7:], "commit parent", oid))
        elif line.startswith(b"committer "):
            # "committer Name <email> 1700000000 +0000": the second field from the end.
            fields = line.rsplit(b" ", 2)
            try:
                when = int(fields[-2]) if len(fields) == 3 else 0
            except ValueError:
                when = 0   # git sorts a bad date as 0 too
            when = max(-_MAX_DATE, min(_MAX_DATE, when))   # 64 bits, as the C walk keeps it
    return tree, parents, when


def parse_tree_entries(data: bytes, oid: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """(mode, name, id) of every entry; CorruptObjectError if the entries do not cover the tree exactly."""
    entries = _TREE_ENTRY.findall(data)
    if entries:
        modes, names, _ids = zip(*entries)
        covered = sum(map(len, modes)) + sum(map(len, names)) + 22 * len(entries)
    else:
        covered = 0
    if covered != len(data):
        raise CorruptObjectError("tree does not parse (malformed entry)", oid=oid)
    return entries


def fresh_tree_entries(data: bytes, oid: bytes, seen: set[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """The entries of a tree whose ids are not in ``seen``, in tree order (a tree's id checked as in
    :func:`parse_tree_entries`). Most entries of most trees were seen in an earlier version of the tree:
    they are filtered with set operations instead of one Python step per entry."""
    entries = _TREE_ENTRY.findall(data)
    if not entries:
        if data:
            raise CorruptObjectError("tree does not parse (malformed entry)", oid=oid)
        return entries
    modes, names, ids = zip(*entries)
    if sum(map(len, modes)) + sum(map(len, names)) + 22 * len(ids) != len(data):
        raise CorruptObjectError("tree does not parse (malformed entry)", oid=oid)
    fresh = set(ids).difference(seen)
    if not fresh:
        return []
    if 16 * len(fresh) >= len(ids):
        return [e for e in entries if e[2] in fresh]
    return [entries[k] for k in sorted({ids.index(e) for e in fresh})]
