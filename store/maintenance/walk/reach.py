"""Reachability: every object the tips reach, in the order git packs them.

Order (``git pack-objects --all``, whose write order is: commits, tags, trees, blobs):

* commits in **recency order**: a priority queue on the committer date, newest first, ties
  in the order they were queued (``git rev-list``'s default order);
* annotated tags in the order the tips name them (a tag of a tag: outer first);
* trees and blobs in **traversal order**: first those the tips name directly (a ref or tag
  pointing at a tree or blob), then each commit's root tree in commit order, depth first, a
  tree before its entries, entries in tree order. Gitlinks (submodule commits) are not
  followed: they live in another repository.

Every commit, tree and tag read is checked against its id (a corrupt object stops the walk
with CorruptObjectError naming it); a missing one raises ObjectMissingError naming the object
and what refers to it. Each tree's entry is remembered with its name (the last path
component) for the delta search, which sorts objects by name so that versions of one file meet.

The per-entry work is what costs: a tree of git.git has ~250 entries and there are 65,000 of
them (16.5 million entries). Two implementations produce the same lists:

* the C walk (``_walk.c``, built by ``pip install``), chosen when the caller passes the repack's
  :class:`~.sources.SourceIndex` (``packs=``): it reads commits and trees straight from the packs
  (delta chains resolved with its own delta-base cache), parses them, keeps ``seen`` in a C hash
  set, and releases the GIL while it works. Integrity: every pack entry it inflates has its CRC32
  checked against the idx (whose own SHA-1 trailer was checked when it was read) and zlib checks
  each stream's Adler-32 -- the bytes are the ones index-pack hashed when it wrote that idx -- so
  the SHA-1 of each commit and tree is not computed again (git's traversal checks neither).
  Objects outside those packs (loose, ``.keep`` packs, arrived later) come through :meth:`Walker._read`,
  which checks their SHA-1 as before;
* this module's Python code, the specification: when the extension is absent,
  ``PACKYARD_PURE_PYTHON=1``, or for the rescue walk (``known``). It checks each object's SHA-1.

:data:`IMPLEMENTATION` says which one a repack uses ("c" or "python").
"""
from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Callable, Container, Iterable, Iterator, Sequence

from ... import native
from ...errors import CorruptObjectError, ObjectMissingError, PackFormatError
from ...forked import ForkedCall
from ...objects import ObjectType, hash_object
from ...parse import tag_links
from ...progress import Progress
from .parse import CommitMeta, MetaBuilder, fresh_tree_entries, name_hash_fold, parse_commit

if TYPE_CHECKING:   # sources imports this module (for the C tables)
    from .sources import SourceIndex


#: The C walk (``_walk``), unless PACKYARD_PURE_PYTHON=1 or it was not built (store/native.py).
_c = native.walk()


@contextlib.contextmanager
def c_loop_errors() -> Iterator[None]:
    """The errors of the loops reading through the walk extension's Packs (the _bitmap and _bloom extensions':
    one WalkError, from _walk's C API) as the store's typed
    errors, naming the object and the pack entry's offset (the walk itself also names the file: Walker)."""
    try:
        yield
    except _c.WalkError as err:
        kind, message, oid, _pack_no, offset = err.args
        cls = PackFormatError if kind == "pack" else CorruptObjectError
        raise cls(message, oid=oid, offset=offset if offset is not None and offset >= 0 else None) from None
IMPLEMENTATION = "c" if _c is not None else "python"

Read = Callable[[bytes], tuple[int, bytes]]

_DIR_MODES = frozenset({b"40000", b"040000"})
_GITLINK = b"160000"
COMMIT, TREE, BLOB, TAG = 1, 2, 3, 4
#: The C walk's delta-base cache (split between the two walkers when a helper thread runs). Each tree is
#: read once; what the cache holds is the next older versions' bases. 16-32 MiB walk git.git and the large
#: synthetic repository as fast as 96 MiB (measured) for 60-100 MiB less peak RSS.
C_CACHE_BYTES = 32 << 20
#: Below this many commits the tree walk stays in one process (forking costs more than it saves).
FORK_MIN_COMMITS = 2000
#: Share of the commits (newest first) whose trees the parent walks; the child walks the rest, which in a
#: growing history has smaller trees.
FORK_SHARE = 0.35
#: The C walk's main thread, done with its share before the helper thread, takes half of the roots the
#: helper has left when at least this many are (fewer: not worth a copy of the seen set).
STEAL_MIN_ROOTS = 200


@dataclass
class Reachable:
    """What the tips reach, each list in git's order (see the module docstring).

    ``names``: tree/blob id -> the entry name it was reached by; ``seen``: everything in the lists (and what
    was skipped as known). After the C walk both stay in the C walker until asked for (a repack that reuses
    every delta never needs the 300,000 names; ``oid in`` :meth:`reached` answers from the walker's own set).
    """

    commits: list[bytes] = field(default_factory=list)
    tags: list[bytes] = field(default_factory=list)
    trees: list[bytes] = field(default_factory=list)
    blobs: list[bytes] = field(default_factory=list)
    _names: dict[bytes, bytes] | None = field(default_factory=dict, repr=False)
    _hashes: dict[bytes, int] | None = field(default_factory=dict, repr=False)   # id -> pack_name_hash of its path
    _seen: set[bytes] | None = field(default_factory=set, repr=False)
    _walker: object | None = field(default=None, repr=False)    # the C walk's Walker (its reader released)
    _index_dropped: bool = field(default=False, repr=False)
    commit_meta: CommitMeta | None = field(default=None, repr=False)   # (None: a walk that kept none)

    @property
    def names(self) -> dict[bytes, bytes]:
        if self._names is None:
            self._names = self._walker.names(self.trees, self.blobs)  # type: ignore[attr-defined]
            self._hashes = self._walker.name_hashes(self.trees, self.blobs)  # type: ignore[attr-defined]
            if self._index_dropped:
                self._walker = None     # (nothing more to ask of it)
        return self._names

    @property
    def path_hashes(self) -> dict[bytes, int]:
        """tree/blob id -> git's ``pack_name_hash`` of the whole path it was first reached by ("dir/sub/name";
        a root tree's path is empty): what git's bitmap name-hash cache holds."""
        if self._names is None:
            _ = self.names   # (fetches both from the C walker)
        assert self._hashes is not None
        return self._hashes

    @property
    def seen(self) -> set[bytes]:
        if self._seen is None:
            seen: set[bytes] = set()
            for ids in (self.commits, self.tags, self.trees, self.blobs):
                seen.update(ids)
            self._seen = seen
        return self._seen

    def reached(self) -> Container[bytes]:
        """What answers ``oid in`` as :attr:`seen` does, without building that set after a C walk (the C
        walker's own set; SourceIndex.unreached uses it as it is)."""
        if self._seen is None and self._walker is not None and not self._index_dropped:
            return self._walker  # type: ignore[return-value]
        return self.seen

    def drop_index(self) -> None:
        """The caller is done asking :meth:`reached` in bulk: free the C walker's seen set (tens of MB while the
        search and the writer run); :attr:`seen` is built from the lists if anyone asks again."""
        if self._walker is not None and not self._index_dropped:
            self._walker.release_seen()  # type: ignore[attr-defined]
            self._index_dropped = True
            if self._names is not None:
                self._walker = None

    def __len__(self) -> int:
        return len(self.commits) + len(self.tags) + len(self.trees) + len(self.blobs)

    def ids(self) -> list[bytes]:
        """Every id in :meth:`in_order`'s order, without the types."""
        return self.commits + self.tags + self.trees + self.blobs

    def in_order(self) -> list[tuple[bytes, int]]:
        """(id, type) for every object: commits, tags, trees, blobs."""
        return ([(o, COMMIT) for o in self.commits] + [(o, TAG) for o in self.tags] +
                [(o, TREE) for o in self.trees] + [(o, BLOB) for o in self.blobs])


class Walker:
    """One reachability walk. ``read(oid) -> (type, data)``; ``known(oid)``: already accounted for
    elsewhere (not added, not descended into -- the rescue walk before deletions uses it)."""

    def __init__(self, read: Read, *, known: Callable[[bytes], bool] | None = None,
                 progress: Progress | None = None, processes: int = 1,
                 packs: SourceIndex | None = None) -> None:
        self.read = read
        self.known = known
        self.progress = progress
        self.processes = processes if known is None else 1
        self.result = Reachable()
        self._counter = 0
        # The C walk (see _walk.c) reads the packs itself; ``packs`` is a SourceIndex with C tables.
        self.sources: SourceIndex | None = (
            packs if known is None and packs is not None and packs.c_packs is not None else None)

    def _read(self, oid: bytes, want: int | None, referrer: str) -> tuple[int, bytes]:
        try:
            typ, data = self.read(oid)
        except ObjectMissingError as err:
            raise ObjectMissingError(f"reachable object is missing (referenced by {referrer})", oid=oid,
                                     path=err.path, offset=err.offset) from err
        typ = int(typ)
        if want is not None and typ != want:
            raise CorruptObjectError(f"object is a {ObjectType(typ).label.decode()} but {referrer} refers to it "
                                     f"as a {ObjectType(want).label.decode()}", oid=oid)
        if hash_object(typ, data) != oid:
            raise CorruptObjectError(f"object does not hash to its name (reached from {referrer})", oid=oid)
        return typ, data

    def _skip(self, oid: bytes) -> bool:
        """Seen already, or known elsewhere (then marked seen). A pure bookkeeping step."""
        seen = self.result.seen
        if oid in seen:
            return True
        if self.known is not None and self.known(oid):
            seen.add(oid)
            return True
        return False

    def run(self, tips: Iterable[tuple[str, bytes]], trees: Sequence[tuple[str, bytes]] = ()) -> Reachable:
        """``trees``: (referrer, id) of roots known to be trees (commits' root trees a caller has from an earlier
        walk): the C walk reads them in C, as it reads a commit's tree, instead of peeling each as a tip."""
        if self.sources is not None:
            return self._run_c(tips, self.sources, trees)
        tips = [*tips, *trees]
        res = self.result
        seen = res.seen
        heap: list[tuple[int, int, bytes, bytes]] = []   # (-date, order queued, commit id, its tree)
        pending: list[tuple[bytes, int, bytes, str]] = []  # trees/blobs named by tips: (id, type, name, referrer)
        for tip_name, oid in tips:
            self._tip(tip_name, oid, heap, pending)
        # Commits, newest first.
        n = 0
        roots: list[tuple[bytes, str]] = []
        meta = MetaBuilder()
        while heap:
            _, _, oid, data = heapq.heappop(heap)
            res.commits.append(oid)
            tree, parents, when = parse_commit(data, oid)
            meta.add(data, tree, parents, when)
            roots.append((tree, oid.hex()))
            for parent in parents:
                if not self._skip(parent):
                    seen.add(parent)
                    _, pdata = self._read(parent, COMMIT, f"commit {oid.hex()}")
                    self._queue_commit(heap, parent, pdata)
            n += 1
            if self.progress is not None and n % 1000 == 0:
                self.progress("counting commits", n, None)
        res.commit_meta = meta.done()
        # Trees and blobs: what tips name directly, then every commit's tree. With two processes the
        # older part of the history is walked in a forked child at the same time (see _walk_in_child).
        split = len(roots)
        child = None
        if self.processes > 1 and len(roots) >= FORK_MIN_COMMITS:
            split = int(len(roots) * FORK_SHARE)
            child = ForkedCall.start(partial(self._walk_in_child, roots[split:]), what="reachability walk")
        try:
            for oid, typ, name, referrer in pending:
                if typ == BLOB:
                    res.blobs.append(oid)
                    res.names[oid] = name
                    res._hashes[oid] = name_hash_fold(0, name)  # type: ignore[index]
                else:
                    self._tree(oid, name, referrer)
            for tree, referrer in roots[:split]:
                if not self._skip(tree):
                    seen.add(tree)
                    self._tree(tree, b"", f"commit {referrer}")
            if child is not None:
                self._merge(child.result())   # the child's StoreError (corrupt, missing object) raised here
        finally:
            if child is not None:
                child.close()
        if self.progress is not None:
            self.progress("counting objects", len(res), len(res))
        return res

    def _walk_roots(self, roots: list[tuple[bytes, str]]) -> None:
        seen = self.result.seen
        for tree, referrer in roots:
            if not self._skip(tree):
                seen.add(tree)
                self._tree(tree, b"", f"commit {referrer}")

    def _walk_in_child(self, roots: list[tuple[bytes, str]]
                       ) -> tuple[list[bytes], list[bytes], dict[bytes, bytes], dict[bytes, int] | None]:
        """In the forked helper (store/forked.py): walk the older ``roots`` with the state inherited so far,
        return the trees, blobs and names found (the parent merges them)."""
        self.progress = None
        self._walk_roots(roots)
        r = self.result
        return r.trees, r.blobs, r.names, r._hashes

    def _merge(self, other: tuple[list[bytes], list[bytes], dict[bytes, bytes], dict[bytes, int] | None]) -> None:
        """Append what the child found and this walk did not, in the child's order: the same lists a
        single walk would have made (everything below a tree this walk saw was seen here too)."""
        res = self.result
        seen, names, hashes = res.seen, res.names, res._hashes
        trees, blobs, child_names, child_hashes = other
        assert hashes is not None and child_hashes is not None
        for src, dst in ((trees, res.trees), (blobs, res.blobs)):
            for oid in src:
                if oid not in seen:
                    seen.add(oid)
                    dst.append(oid)
                    name = child_names.get(oid)
                    if name:
                        names[oid] = name
                    hashes[oid] = child_hashes.get(oid, 0)

    def _queue_commit(self, heap, oid: bytes, data: bytes) -> None:
        _tree, _parents, when = parse_commit(data, oid)
        self._counter += 1
        heapq.heappush(heap, (-when, self._counter, oid, data))

    def _tip(self, name: str, oid: bytes, heap, pending) -> None:
        """A starting point: commits go to the queue, tags are peeled (each tag recorded), others pend."""
        referrer = name
        while not self._skip(oid):
            self.result.seen.add(oid)
            typ, data = self._read(oid, None, referrer)
            if typ == COMMIT:
                self._queue_commit(heap, oid, data)
                return
            if typ == TAG:
                self.result.tags.append(oid)
                (target, target_type), = tag_links(data, oid)
                referrer, oid = f"tag {oid.hex()}", target
                continue
            pending.append((oid, typ, b"", referrer))
            return

    # -- the C walk: the same lists, with the per-object work in _walk.c ----------------------------
    def _run_c(self, tips: Iterable[tuple[str, bytes]], sources: SourceIndex,
               trees: Sequence[tuple[str, bytes]] = ()) -> Reachable:
        """:meth:`run` with the commit queue and the tree walk in C. The tips are peeled here (a few
        objects, read by ``read`` and checked as the Python walk checks them); everything else the C
        walker reads from the packs, or through :meth:`_read` when it is not in them."""
        res = self.result
        # With a helper thread, each walker gets half the cache (it walks half the history).
        cache = C_CACHE_BYTES // 2 if self.processes > 1 else C_CACHE_BYTES
        cw = _c.Walker(sources.c_packs, self._read, progress=self.progress, cache_bytes=cache)
        pending: list[tuple[bytes, int, str]] = []
        with self._c_errors():
            for name, oid in tips:
                referrer = name
                while cw.mark_seen(oid):
                    typ, data = self._read(oid, None, referrer)
                    if typ == COMMIT:
                        cw.queue_commit(oid, data)
                        break
                    if typ == TAG:
                        res.tags.append(oid)
                        (target, _target_type), = tag_links(data, oid)
                        referrer, oid = f"tag {oid.hex()}", target
                        continue
                    pending.append((oid, typ, referrer))
                    break
            for referrer, oid in trees:
                if cw.mark_seen(oid):
                    pending.append((oid, TREE, referrer))
            cw.walk_commits()
            n_roots = cw.counts()[3]
            split = n_roots
            helper = None
            if self.processes > 1 and n_roots >= FORK_MIN_COMMITS:
                split = int(n_roots * FORK_SHARE)
                helper = _HelperThread(cw.copy(cache), split, n_roots)
            try:
                for oid, typ, referrer in pending:
                    if typ == BLOB:
                        cw.add_blob(oid, b"")
                    else:
                        cw.walk_tree(oid, None, referrer)
                cw.walk_roots(0, split)
                tail = helper.steal(cw, cache) if helper is not None else None
                if helper is not None:
                    cw.merge(helper.join())
                if tail is not None:
                    cw.merge(tail)
            finally:
                if helper is not None:
                    helper.cancel()
        res.commits, res.trees, res.blobs = cw.result()
        res.commit_meta = CommitMeta(*cw.commit_meta())
        cw.release_reader()
        res._walker, res._names, res._seen = cw, None, None   # (names and the seen set: built when asked for)
        if self.progress is not None:
            self.progress("counting objects", len(res), len(res))
        return res

    @contextlib.contextmanager
    def _c_errors(self):
        """The C walk's errors as the store's typed errors, naming the pack file (or loose file) and offset."""
        try:
            yield
        except _c.WalkError as err:
            kind, message, oid, pack_no, offset = err.args
            if pack_no >= 0:
                path = self.sources.packs[pack_no].path
            elif oid is not None:
                path, offset = self.sources.where(oid)
            else:
                path = None
            cls = {"pack": PackFormatError, "missing": ObjectMissingError}.get(kind, CorruptObjectError)
            raise cls(message, oid=oid, path=path, offset=offset if offset is not None and offset >= 0 else None
                      ) from None

    def _tree(self, root: bytes, name: bytes, referrer: str) -> None:
        """Depth first as git's traversal: a tree, then its entries in tree order, a subtree walked
        completely before the entries after it."""
        res = self.result
        trees, blobs, names, seen = res.trees, res.blobs, res.names, res.seen
        hashes = res._hashes
        assert hashes is not None
        known = self.known
        read = self._read
        trees.append(root)
        if name:
            names[root] = name
        hashes[root] = name_hash_fold(0, name)
        base = name_hash_fold(hashes[root], b"/") if name else 0   # (a root tree's entries: their own names)
        stack = [(fresh_tree_entries(read(root, TREE, referrer)[1], root, seen), 0, root, base)]
        while stack:
            entries, i, parent, base = stack[-1]
            n = len(entries)
            while i < n:
                mode, ename, eid = entries[i]
                i += 1
                if mode == _GITLINK or eid in seen:   # (seen: twice in one tree, or reached meanwhile)
                    continue
                seen.add(eid)
                if known is not None and known(eid):
                    continue
                if mode in _DIR_MODES:
                    stack[-1] = (entries, i, parent, base)
                    trees.append(eid)
                    names[eid] = ename
                    h = hashes[eid] = name_hash_fold(base, ename)
                    data = read(eid, TREE, f"tree {parent.hex()}")[1]
                    stack.append((fresh_tree_entries(data, eid, seen), 0, eid, name_hash_fold(h, b"/")))
                    break
                blobs.append(eid)
                names[eid] = ename
                hashes[eid] = name_hash_fold(base, ename)
            else:
                stack.pop()
                if self.progress is not None and len(trees) % 2000 == 0:
                    self.progress("counting objects", len(res), None)


class _HelperThread:
    """The older part of the roots walked by a second C walker in a thread (the C walk releases the GIL);
    it starts with a copy of the walk's seen set, as the forked child does, and is merged the same way."""

    def __init__(self, walker, start: int, stop: int) -> None:
        import threading

        self.walker = walker
        self.error: BaseException | None = None
        walker.claim_roots(start, stop)   # (before the thread starts: steal() sees them from now on)
        self.thread = threading.Thread(target=self._run, name="packyard-walk", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.walker.walk_claimed()
        except BaseException as err:  # raised again by join()
            self.error = err

    def steal(self, main, cache: int):
        """Called when the main walk is done with its share: walk the second half of the roots the helper has
        not started yet, here, with a copy of the main walk's seen set (the helper stops where that half
        begins); the walker that did it, to merge after the helper's, or None when too little was left.

        Merging the helper's results and then this one's gives the lists one walk makes: each walker's seen
        set holds every object below each tree in it, so what a walker found and an earlier part of the
        order had already seen is exactly what the merge leaves out."""
        span = self.walker.steal_roots(STEAL_MIN_ROOTS)
        if span is None:
            return None
        main.release_reader()      # (done walking: its delta-base cache goes before the tail's fills)
        tail = main.copy(cache)
        tail.walk_roots(*span)
        tail.release_reader()
        return tail

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        self.walker.release_reader()   # (its lists are merged; its cache is no longer needed)
        return self.walker

    def cancel(self) -> None:
        """Stop the helper early (the main walk failed) and wait for it."""
        self.walker.cancel()
        self.thread.join()


def walk(tips: Iterable[tuple[str, bytes]], read: Read, *, known: Callable[[bytes], bool] | None = None,
         progress: Progress | None = None, processes: int = 1, packs: SourceIndex | None = None,
         trees: Sequence[tuple[str, bytes]] = ()) -> Reachable:
    """Everything ``tips`` reach (see :class:`Reachable`); ``known`` objects are neither added nor descended.
    With ``processes`` > 1 the older part of the history's trees is walked at the same time (a thread in
    the C walk, a forked process in the Python one; the C walk's main thread, done first, takes half of what
    the helper thread has left). ``packs``: the repack's SourceIndex; with the C
    extension, the walk reads its packs directly (``read`` then serves only objects outside them). ``trees``:
    (referrer, id) roots known to be trees (:meth:`Walker.run`)."""
    return Walker(read, known=known, progress=progress, processes=processes, packs=packs).run(tips, trees)


__all__ = ["IMPLEMENTATION", "Reachable", "Walker", "walk"]
