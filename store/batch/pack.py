"""A large batch of new objects written as ONE pack with computed deltas (``git fast-import``'s way),
instead of one loose file per object.

Same interface (:class:`.contract.Batch`) and rules as the loose batch (:mod:`.loose`), which stays the
path for small batches (:func:`.api.begin` picks): ``add`` / ``add_file`` hash each object and answer
"exists?" from ONE snapshot taken when the batch begins (existing objects are skipped and freshened, an
object only in a cruft pack is written anew), ``commit(ref_updates)`` publishes and moves the refs last. What differs
is what ``commit`` writes::

    batch = begin(repo, count_hint=n)     # n >= PACK_THRESHOLD; ONE snapshot; temp files of dead pack
                                          #   writers removed
    batch.add(BLOB, data, name=b"a/b.c")  # kept in memory (the name orders the delta search)
    batch.add_file(path, size)            # a big file: hashed now (streamed), read again at write time
    batch.commit([RefUpdate(...)])
        search         the delta search over the objects kept in memory (store/pack/search.py)
        write          one pack: commits, tags, trees, blobs (each in the order added), every delta's
                       base before it; big files streamed in whole, re-hashed (a file that changed since
                       ``add_file`` is an InvalidInputError naming it; nothing is published)
        install        the pack writer's install (store/install.py): temp files in objects/pack ->
                       flush -> renames, .idx LAST -> directory fsync; fault points
                       ``packbatch.after_writeout`` ... ``packbatch.after_fsync_dirs``
        update_refs    compare-and-swap of the refs (``packbatch.after_update_refs`` after it)

A crash leaves either nothing visible (temp files ``objects/pack/tmp_*_<pid>_<host>-<rand>``,
removed by the next batch or repack once their pid is dead; at worst a ``.pack`` without its
``.idx``, invisible to every reader, removed by gc), or the pack installed and the ref old or
new -- never a ref naming an object that is not durably there.

Memory: the objects added with ``add`` are held until ``commit`` (an import's files up to the
large-file threshold, its trees and commit); ``add_file`` objects are not, and take no part in
the delta search (git's fast-import does not deltify big blobs either). ``held_bytes`` says how
much is held: an import adds its further files with ``add_file`` once :data:`PACK_MEMORY` is
reached, so a batch never holds much more than that.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .. import install
from ..errors import InvalidInputError, ObjectMissingError, StoreError
from ..faults import fault_point
from ..lease import Lease, check, token_of
from ..leftovers.passes import remove_stale_temp_files
from ..objects import ObjectType
from ..pack.search import Candidates, SearchOptions, SearchResult, fast_name_hash, search
from ..pack.write import PACK_COMPRESSION, PackWriter
from ..refs import RefUpdate
from ..tuning import keep_heap_slack_if_needed
from .contract import (
    LABEL_SP,
    BatchCounters,
    BatchResult,
    BatchState,
    Progress,
    WriteResult,
    open_source,
    skip_if_exists,
    stream_exactly,
)

#: Bytes of object content a pack batch's caller lets it hold for the delta search (see the docstring).
PACK_MEMORY = 256 << 20
#: Pack write order by type: commits, tags, trees, blobs (git's).
_TYPE_ORDER = (1, 4, 2, 3)
#: The type codes add() and add_file() accept (a set lookup: no enum call per object).
_TYPE_CODES = frozenset(int(t) for t in ObjectType)


@dataclass(slots=True)
class _FileObject:
    """An object added from a file: read again (and re-hashed) when the pack is written."""

    path: str | int          # a path, or a descriptor this batch owns (a dup of the caller's)
    size: int
    where: str


class PackBatch:
    """A batch-write transaction that ends in one pack; see the module docstring. Single-threaded."""

    def __init__(self, repo, *, counters: BatchCounters | None = None, progress: Progress | None = None,
                 expected: int | None = None, lease: Lease | None = None, search_options: SearchOptions | None = None,
                 compression: int = PACK_COMPRESSION, **loose_only) -> None:
        # Options of the loose batch that have no meaning for one pack file (flush method, directory
        # sync, write-out, tmp file age) are accepted so callers pass the same options to either.
        unknown = set(loose_only) - {"flush_method", "flush_policy", "dir_sync", "writeout", "stale_after"}
        if unknown:
            raise TypeError(f"unknown pack batch options: {sorted(unknown)}")
        self.repo = repo
        self.lease = lease   # store/lease.py: checked before the install and the ref update; its token fences refs
        self.counters = counters if counters is not None else BatchCounters()
        self.counters.write_path = "pack"
        self.progress = progress
        self.expected = expected
        self.search_options = search_options or SearchOptions(compression=compression)
        self.compression = compression
        self.state = BatchState.OPEN
        self.batch_id = ""
        self.pack_dir = Path(repo.objects.path) / "pack"
        self._types = bytearray()
        self._oids: list[bytes] = []
        self._data: list[bytes | _FileObject] = []
        self._names: list[bytes | None] = []
        self._seen: dict[bytes, WriteResult] = {}
        self._freshened_packs: set[str] = set()
        self.pack_name: str | None = None
        self.held_bytes = 0
        t0 = time.monotonic()
        self.counters.stale_tmp_removed += remove_stale_temp_files(self.pack_dir, orphans=False)
        self.snapshot = repo.objects.snapshot()   # ONE snapshot: existence answers for the whole batch
        keep_heap_slack_if_needed()
        self._t_collect = time.monotonic()
        self.counters.add_time("snapshot", self._t_collect - t0)

    def __enter__(self) -> "PackBatch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.state is BatchState.OPEN or self.state is BatchState.FAILED:
            self.abort()

    # -- collecting objects ---------------------------------------------------------------------------
    def add(self, obj_type: ObjectType | int, data: bytes, name: bytes | None = None) -> tuple[bytes, WriteResult]:
        """Keep one object for the pack (``name``: the path it is written for); returns its id and what happened."""
        if self.state is not BatchState.OPEN:
            raise StoreError(f"pack batch is {self.state.value}; cannot add objects")
        t = int(obj_type)
        if t not in _TYPE_CODES:
            raise InvalidInputError(f"unknown object type {t}")
        h = hashlib.sha1(LABEL_SP[t] + b"%d\0" % len(data))
        h.update(data)
        oid = h.digest()
        self.counters.bytes_in += len(data)
        return oid, self._keep(oid, t, data, name)

    def add_many(self, objects: Iterable[tuple[ObjectType | int, bytes]]) -> list[tuple[bytes, WriteResult]]:
        return [self.add(t, d) for t, d in objects]

    def add_file(self, source: str | os.PathLike[str] | int, size: int,
                 obj_type: ObjectType | int = ObjectType.BLOB, *, where: str | None = None,
                 progress: Progress | None = None, name: bytes | None = None) -> tuple[bytes, WriteResult]:
        """Hash a file's content now (one chunk in memory, phase ``hash``); it is read again when the pack is
        written, and must still hash the same (else InvalidInputError naming it, nothing published)."""
        if self.state is not BatchState.OPEN:
            raise StoreError(f"pack batch is {self.state.value}; cannot add objects")
        if size < 0:
            raise InvalidInputError(f"negative object size {size}", path=where)
        t = int(obj_type)
        path: str | None = None           # the file, when we open it (it is opened again to be written)
        if isinstance(source, int):
            where = where or f"<fd {source}>"
            fd, owned = source, False
        else:
            path = os.fspath(source)
            where = where or path
            try:
                fd, owned = open_source(source), True
            except OSError as err:
                raise InvalidInputError(f"cannot read file: {err.strerror}", path=where) from err
        try:
            if t not in _TYPE_CODES:
                raise InvalidInputError(f"unknown object type {t}", path=where)
            h = hashlib.sha1(LABEL_SP[t] + b"%d\0" % size)
            for chunk in stream_exactly(fd, size, where, "hash", progress):
                h.update(chunk)
            oid = h.digest()
            self.counters.bytes_in += size
            keep: str | int = path if path is not None else os.dup(fd)
        finally:
            if owned:
                os.close(fd)
        result = self._keep(oid, t, _FileObject(keep, size, where), name)
        if result is not WriteResult.QUEUED and isinstance(keep, int):
            os.close(keep)
        return oid, result

    def _keep(self, oid: bytes, t: int, data: bytes | _FileObject, name: bytes | None) -> WriteResult:
        c = self.counters
        if oid in self._seen:
            c.duplicates += 1
            return WriteResult.DUPLICATE_IN_BATCH
        result = skip_if_exists(self.repo, self.snapshot, oid, c, self._freshened_packs)
        if result is WriteResult.QUEUED:
            self._types.append(t)
            self._oids.append(oid)
            self._data.append(data)
            self._names.append(name)
            if isinstance(data, bytes):
                self.held_bytes += len(data)
            c.objects_written += 1
        else:
            c.objects_skipped += 1
        self._seen[oid] = result
        if self.progress is not None and self.expected and len(self._seen) % 1000 == 0:
            self.progress("write", len(self._seen), self.expected)
        return result

    @property
    def pending_count(self) -> int:
        return len(self._oids)

    # -- commit: the durability order ---------------------------------------------------------------
    def commit(self, ref_updates: Sequence[RefUpdate] = ()) -> BatchResult:
        """Search, write and install the pack, then move the refs; report success last."""
        if self.state is not BatchState.OPEN:
            raise StoreError(f"pack batch is {self.state.value}; cannot commit")
        ref_updates = tuple(ref_updates)
        c = self.counters
        c.add_time("collect", time.monotonic() - self._t_collect)
        writer: PackWriter | None = None
        try:
            self._check_ref_targets(ref_updates)
            if self._oids:
                t0 = time.monotonic()
                found = self._search()
                c.add_time("search", time.monotonic() - t0)
                t0 = time.monotonic()
                writer = PackWriter(self.pack_dir, len(self._oids), counters=c.durable, compression=self.compression,
                                    fault_prefix="packbatch")
                self._write(writer, found)
                writer.finish()
                c.add_time("write", time.monotonic() - t0)
                fault_point("packbatch.after_write")
                check(self.lease)
                t0 = time.monotonic()
                _outcome, files, _keep = writer.install()
                c.add_time("install", time.monotonic() - t0)
                self.pack_name = files.name
                c.pack_bytes = writer.size
                c.bytes_written += writer.size
            if ref_updates:
                check(self.lease)
            t0 = time.monotonic()
            install.update_refs(self.repo, ref_updates, c.durable, token_of(self.lease))
            c.add_time("update_refs", time.monotonic() - t0)
            fault_point("packbatch.after_update_refs")
        except BaseException:
            self.state = BatchState.FAILED
            if writer is not None and not writer.installed:
                writer.abort()
            self.abort()
            raise
        self.state = BatchState.COMMITTED
        self._release()
        return BatchResult(batch_id=self.pack_name or "", written=c.objects_written, skipped=c.objects_skipped,
                           duplicates=c.duplicates, refs=ref_updates, counters=c.as_dict())

    def _check_ref_targets(self, ref_updates: Sequence[RefUpdate]) -> None:
        # A ref must only ever name an object this batch writes or that already exists.
        for u in ref_updates:
            if u.new in self._seen:
                continue
            if u.new not in self.snapshot and not self.repo.objects.has(u.new):
                raise ObjectMissingError(f"ref {u.name} would point to an object that does not exist", oid=u.new)

    def _search(self) -> SearchResult:
        """Deltas among the objects held in memory (files added with add_file take no part)."""
        cand = Candidates()
        hashes: dict[bytes, int] = {}
        types, data, names = self._types, self._data, self._names
        for k in range(len(types)):
            d = data[k]
            name = names[k]
            h = 0
            if name:
                h = hashes.get(name, -1)
                if h < 0:
                    h = hashes[name] = fast_name_hash(name)
            size = len(d) if isinstance(d, bytes) else -1
            # A file object gets a type the search never tries: it is only ever written whole. The others
            # come back compressed when they get no delta (in the search's processes, not here).
            cand.add(types[k] if size >= 0 else 0, max(size, 0), h, self.search_options.depth, keep_whole=True)

        def read(i: int) -> bytes:
            return data[i]  # type: ignore[return-value]   # only objects held in memory are eligible

        found = search(cand, read, self.search_options, progress=self.progress)
        c = self.counters
        c.deltas_computed += found.computed
        c.deltas_tried += found.tried
        c.delta_bytes_saved += found.bytes_saved
        return found

    def _write(self, writer: PackWriter, found: SearchResult) -> None:
        """Every object once: commits, tags, trees, blobs (in the order added), each delta's base first."""
        types, oids, data = self._types, self._oids, self._data
        order = [k for t in _TYPE_ORDER for k in range(len(types)) if types[k] == t]
        n = len(order)
        offsets = [-1] * n
        base, zdelta, dsize, zwhole = found.base, found.zdelta, found.delta_size, found.zwhole
        step = max(1, n // 100)
        done = 0
        for k0 in order:
            if offsets[k0] >= 0:
                continue
            stack = [k0]
            while stack:
                k = stack[-1]
                b = base[k]
                if b >= 0 and offsets[b] < 0:
                    stack.append(b)        # its base first (the search sorted it earlier, not the write order)
                    continue
                fault_point("packbatch.write_object")
                d = data[k]
                if b >= 0:
                    offsets[k] = writer.write_compressed_delta(oids[k], offsets[b], dsize[k], zdelta[k])
                elif zwhole[k] is not None:
                    offsets[k] = writer.write_compressed_whole(oids[k], types[k], len(d), zwhole[k])  # type: ignore[arg-type]
                elif isinstance(d, bytes):
                    offsets[k] = writer.write_whole(oids[k], types[k], d)
                else:
                    offsets[k] = writer.write_whole_stream(oids[k], types[k], d.size,
                                                           self._reread(oids[k], types[k], d))
                stack.pop()
                done += 1
                if self.progress is not None and (done % step == 0 or done == n):
                    self.progress("writing objects", done, n)

    def _reread(self, oid: bytes, t: int, f: _FileObject) -> Iterator[bytes]:
        """A file's bytes again, checked to hash to the id computed when it was added."""
        if isinstance(f.path, int):
            fd, owned = f.path, False
        else:
            try:
                fd, owned = open_source(f.path), True
            except OSError as err:
                raise InvalidInputError(f"cannot read file: {err.strerror}", path=f.where) from err
        try:
            h = hashlib.sha1(LABEL_SP[t] + b"%d\0" % f.size)
            for chunk in stream_exactly(fd, f.size, f.where, "compress", None):
                h.update(chunk)
                yield chunk
            if h.digest() != oid:
                raise InvalidInputError("file changed while it was being imported (its content no longer hashes to "
                                        "the id computed when it was added)", path=f.where, oid=oid)
        finally:
            if owned:
                os.close(fd)

    # -- abort ----------------------------------------------------------------------------------------
    def abort(self) -> None:
        """Nothing is published; the pack writer's temp files are gone (removed by whoever failed)."""
        if self.state is BatchState.COMMITTED or self.state is BatchState.ABORTED:
            return
        self.state = BatchState.ABORTED
        self._release()

    def _release(self) -> None:
        for d in self._data:
            if isinstance(d, _FileObject) and isinstance(d.path, int):
                try:
                    os.close(d.path)
                except OSError:
                    pass
        self._data = []
