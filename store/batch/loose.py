"""The loose batch: bulk loose-object writes, one durable flush per batch, all renames at the end, refs last.

This is "METHOD FOUR" from seed 001_b60f0a0927ea1ee2.txt, plus the directory
fsync that git's batch mode leaves out::

    batch = begin(repo)                       # (store/batch/api.py) ONE snapshot of what exists; stale
                                              #   tmp cleanup
    batch.add(BLOB, data)   ...               # compress -> objects/xx/tmp_obj_<pid>_<batch>_<n>;
                                              #   write-out starts without waiting (a background
                                              #   syncfs every EARLY_FLUSH_EVERY files, <= 3 per
                                              #   batch); existing objects are skipped from the
                                              #   snapshot and freshened
    batch.add_file(path, size)                # a big blob: hashed in one streamed pass, then
                                              #   re-hashed + compressed in a second; one chunk in memory
    batch.commit(ref_updates=[RefUpdate(...)])  # the steps of store/install.py, loose variants:
        writeout_each    start write-out of any tmp file not started yet (fallback path)
        barrier_flush    ONE durable flush of every tmp file's data and inode (after the
                         last write; it waits for a background syncfs still running first)
        publish_renames  rename tmp -> final name, never replacing an existing object
        fsync_dirs       make the renames themselves durable
        update_refs      compare-and-swap of the refs (RefStore.update)
    # only now is success reported

Crash at any point leaves: objects under their final names that are complete
(their bytes were durable before the rename was issued), stale tmp files (removed
later by name + age + dead pid), and the ref either old or pointing to a commit
whose objects are all durable and named.

**Which flush is honest on Linux.** git's ``core.fsyncMethod=batch`` issues
``sync_file_range(SYNC_FILE_RANGE_WRITE)`` per object and then one ``fsync`` of
a cookie file. sync_file_range writes no metadata (sizes, block maps) and does
not wait; fsync of the cookie only commits *the cookie's* inode. That happens to
carry everything on ext4's single journal in data=ordered mode, but not on
btrfs (per-inode log tree) and not for XFS data whose I/O had not completed
(the on-disk size is logged at I/O completion). git documents batch mode as
durable only on macOS (HFS+/APFS) and Windows (NTFS/ReFS), not on Linux.
So on Linux the barrier here is ``syncfs(2)`` on a descriptor of the objects
directory, opened when the batch begins: the kernel writes back and waits for
every dirty page *and inode* of that filesystem, then commits the journal and
flushes the device cache -- on every filesystem, one syscall. Since Linux 5.8
it also reports writeback errors (EIO, ENOSPC at writeback time) that happened
since the descriptor was opened, which is why it is opened first. Its honest
cost: it also flushes other writers' dirty data on the same filesystem.
Write-out (``sync_file_range(WRITE)``) is an optimisation only, never what
makes data durable: with the syncfs barrier it is started early only for big
tmp files (WRITEOUT_MIN_BYTES) -- for small ones it forces ext4's delayed
allocation file by file and submits thousands of tiny I/Os, which measured
slower than letting syncfs allocate and write them together. Where syncfs does
not exist the barrier is an ``fsync`` of every tmp file (FlushMethod.FSYNC_EACH:
correct, N flushes), and write-out is started for every file as it is written
so those fsyncs mostly wait on I/O already in flight (git's trick). After the renames
``fsync_dirs`` either fsyncs each touched fan-out directory (portable, one call
per directory) or issues one more syncfs (DirSync.SYNCFS, the default with the
syncfs barrier: one device flush for all directories). Which of the two a batch uses is decided at
commit by store/flush.py's ``choose_flush`` (a small batch beside much dirty data, or on FUSE: per file).
"""
from __future__ import annotations

import hashlib
import os
import secrets
import stat
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Sequence

from .. import durable, install, leftovers
from ..errors import InvalidInputError, ObjectMissingError, StoreError, WriteFailedError
from ..faults import fault_point
from ..flush import AUTO, DirSync, FlushMethod, FlushPolicy, choose_flush, dir_sync_for, filesystem_type
from ..lease import Lease, check, token_of
from ..objdir import Location
from ..objects import ObjectType
from ..owner import host_identity
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

TMP_PREFIX = "tmp_obj_"
_HOST_TAG = hashlib.sha1(host_identity().encode()).hexdigest()[:4]   # host name + PID namespace
# tmp_obj_<pid>_<host tag 4 hex>-<random 8 hex>_<n>; git's own temp files are tmp_obj_XXXXXX.

#: A dead batch's marker (and with it its tmp files) goes once this old: the leftovers table's rule.
STALE_AFTER = leftovers.DEAD_WRITER_AFTER
LOOSE_COMPRESSION = 1  # git's core.looseCompression default (Z_BEST_SPEED)
#: With the syncfs barrier, write-out is started early only for tmp files at least this big.
#: For small files it costs more than it saves: sync_file_range forces ext4's delayed block
#: allocation file by file (one journal update and one tiny I/O each, 10,000 of them for a
#: web import), while the barrier's syncfs allocates and submits them together.
WRITEOUT_MIN_BYTES = 64 * 1024
#: While objects are still being added, a background thread calls syncfs each time this many
#: tmp files were written since the previous one started (at most MAX_EARLY_FLUSHES per batch):
#: the device writes the early objects while later ones are compressed, and the barrier then
#: waits only for the tail. It makes nothing durable that the barrier would not (the barrier
#: is still the one flush after the last write, on its own descriptor, so it also reports any
#: writeback error the early calls saw). The flush count stays a constant per batch.
#: (Writer threads for the tmp files themselves measured 3x slower on 2 cores: every syscall
#: return waits for the GIL held by the thread hashing the next object.)
EARLY_FLUSH_EVERY = 2_000
MAX_EARLY_FLUSHES = 3




def default_flush_method() -> FlushMethod:
    return FlushMethod.SYNCFS if durable.HAVE_SYNCFS else FlushMethod.FSYNC_EACH


@dataclass(slots=True)
class _Pending:
    oid: bytes
    tmp_name: str        # names inside ``fanout`` (opened once as a directory fd per batch)
    final_name: str
    fanout: str
    writeout_started: bool

    @property
    def tmp(self) -> str:
        return os.path.join(self.fanout, self.tmp_name)

    @property
    def final(self) -> str:
        return os.path.join(self.fanout, self.final_name)


class LooseBatch:
    """A batch-write transaction; see the module docstring for the ordering. Single-threaded."""

    def __init__(self, repo, *, counters: BatchCounters | None = None,
                 flush_method: FlushMethod | None = None, dir_sync: DirSync | None = None,
                 flush_policy: FlushPolicy | None = None,
                 writeout: bool = True, progress: Progress | None = None, expected: int | None = None,
                 stale_after: float = STALE_AFTER, lease: Lease | None = None) -> None:
        self.repo = repo
        # store/lease.py: checked before publishing and before the ref update (LockLostError: nothing more is
        # published); its token makes the ref update refuse a stale holder (RefStore.update).
        self.lease = lease
        self.counters = counters if counters is not None else BatchCounters()
        # The flush: store/flush.py's choose_flush at commit, unless a method is forced (argument or policy);
        # until then the large-batch method, so early write-out works as before.
        self.flush_policy = flush_policy or AUTO
        if flush_method is not None:
            self.flush_policy = FlushPolicy(flush_method, self.flush_policy.max_files, self.flush_policy.max_bytes)
        self.flush_method = self.flush_policy.method or default_flush_method()
        if self.flush_method is FlushMethod.SYNCFS and not durable.HAVE_SYNCFS:
            raise InvalidInputError("syncfs is not available on this platform")
        self._dir_sync_given = dir_sync
        self.dir_sync = dir_sync or dir_sync_for(self.flush_method)
        self.writeout = writeout
        self.progress = progress
        self.expected = expected
        self.batch_id = f"{_HOST_TAG}-{secrets.token_hex(4)}"
        self.state = BatchState.OPEN
        self._objects_dir = str(repo.objects.path)
        self._pending: list[_Pending] = []
        self._seen: dict[bytes, WriteResult] = {}
        # "xx" -> (fan-out dir, its O_DIRECTORY fd): opened once, no path walk per object
        self._fanouts: dict[str, tuple[str, int]] = {}
        self._created_fanouts: set[str] = set()
        self._freshened_packs: set[str] = set()
        # Early write-out for the syncfs barrier (see EARLY_FLUSH_EVERY); None: never.
        self._early_every = EARLY_FLUSH_EVERY if writeout and self.flush_method is FlushMethod.SYNCFS else None
        self._since_early = 0
        self._early_flushes = 0
        self._flusher: threading.Thread | None = None
        self._early_fd = -1
        # Bytes from which a tmp file's write-out is started as it is written (None: never).
        self._writeout_min = (None if not writeout else 0 if self.flush_method is FlushMethod.FSYNC_EACH
                              else WRITEOUT_MIN_BYTES)
        self._published = 0
        self._n = 0
        self._last_report = 0
        self._pid = os.getpid()
        self._tmp_prefix = f"{TMP_PREFIX}{self._pid}_{self.batch_id}_"   # + sequence number
        t0 = time.monotonic()
        # Opened before any write so syncfs reports writeback errors of this batch's files.
        self._fs_fd = os.open(self._objects_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        # Fan-out dirs on another filesystem (a mount inside objects/): st_dev -> the first such
        # dir's fd, opened before any write into it; the barrier syncs each filesystem.
        self._other_fs: dict[int, int] = {}
        try:
            self._fs_dev = os.fstat(self._fs_fd).st_dev
            self._fs_type = filesystem_type(self._fs_fd)
            self._bytes0 = self.counters.bytes_written
            self._marker: Path | None = leftovers.create_batch_marker(repo, self._pid, self.batch_id)
            dead = leftovers.removable(leftovers.find_batch_markers(
                repo, rule=leftovers.RULES[leftovers.Kind.BATCH_MARKER].aged(dead_after=stale_after)))
            self.counters.stale_tmp_removed += sum(len(m.files) for m in leftovers.remove(dead))
            # ONE snapshot: existence answers for the whole batch come from memory.
            self.snapshot = repo.objects.snapshot()
        except BaseException:
            os.close(self._fs_fd)
            leftovers.remove_batch_marker(getattr(self, "_marker", None))
            raise
        keep_heap_slack_if_needed()   # one deflate state per object: see store/tuning.py
        self._t_collect = time.monotonic()
        self.counters.add_time("snapshot", self._t_collect - t0)

    # -- context manager: abort on exception --------------------------------
    def __enter__(self) -> "LooseBatch":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.state is BatchState.OPEN or self.state is BatchState.FAILED:
            self.abort()

    # -- collecting objects ------------------------------------------------
    def add(self, obj_type: ObjectType | int, data: bytes, name: bytes | None = None) -> tuple[bytes, WriteResult]:
        """Queue one object; returns its id and what happened to it. (``name``, the path the object is
        written for, matters only to a pack batch's delta search: store/batch/pack.py.)"""
        if self.state is not BatchState.OPEN:
            raise StoreError(f"batch {self.batch_id} is {self.state.value}; cannot add objects")
        if type(obj_type) is not ObjectType:
            obj_type = ObjectType(obj_type)
        header = LABEL_SP[obj_type] + b"%d\0" % len(data)
        h = hashlib.sha1(header)
        h.update(data)
        oid = h.digest()
        c = self.counters
        c.bytes_in += len(data)
        if oid in self._seen:
            c.duplicates += 1
            return oid, WriteResult.DUPLICATE_IN_BATCH
        if self.snapshot.locate(oid) is Location.MISSING:   # the common case, asked once
            result = WriteResult.QUEUED
        else:
            result = self._skip_if_exists(oid)
        if result is WriteResult.QUEUED:
            self._write_tmp(oid, header, data)
            c.objects_written += 1
        else:
            c.objects_skipped += 1
        self._seen[oid] = result
        if self.progress is not None:
            self._report("write")
        return oid, result

    def add_many(self, objects: Iterable[tuple[ObjectType | int, bytes]]) -> list[tuple[bytes, WriteResult]]:
        return [self.add(t, d) for t, d in objects]

    def add_file(self, source: str | os.PathLike[str] | int, size: int,
                 obj_type: ObjectType | int = ObjectType.BLOB, *, where: str | None = None,
                 progress: Progress | None = None, name: bytes | None = None) -> tuple[bytes, WriteResult]:
        """Queue one object read from a file, holding at most one chunk of it in memory.

        ``add`` needs the whole object as bytes; for a multi-GB file that exhausts
        memory. Git needs the object id in the loose file's *name* and the id is
        the hash of the whole content, so the content is read twice, STREAM_CHUNK
        bytes at a time (``os.pread``, so a caller's fd keeps its offset):

        pass 1 (phase ``hash``)      sha1 over ``<type> <size>\\0`` + content -> oid.
                                     Known in the snapshot or earlier in this batch:
                                     skipped and freshened exactly like ``add``; no pass 2.
        pass 2 (phase ``compress``)  the same bytes again through sha1 *and*
                                     zlib.compressobj into a tmp file in the object's own
                                     fan-out dir (same naming, accounting and write-out
                                     rule as ``add``; renamed only by ``commit``).

        ``size`` is the content length the header promises (e.g. from a directory scan).
        A file that is not exactly ``size`` bytes in either pass, or whose pass-2 bytes
        hash to a different id than pass 1's, changed under us: InvalidInputError naming
        ``where`` (default: the path), its tmp file removed, nothing queued. A file replaced
        by rename between the passes cannot fool this: it is opened once (``O_NOFOLLOW``)
        and both passes read that one inode. ``progress(phase, bytes_done, size)`` is
        called at the start and end of each pass and every ~1% (at least STREAM_CHUNK).
        The content is not parsed: meant for blobs (a caller streaming another type
        validates it first, as ``write_objects`` does for ``add``).
        """
        if self.state is not BatchState.OPEN:
            raise StoreError(f"batch {self.batch_id} is {self.state.value}; cannot add objects")
        if type(obj_type) is not ObjectType:
            obj_type = ObjectType(obj_type)
        if size < 0:
            raise InvalidInputError(f"negative object size {size}", path=where)
        if isinstance(source, int):
            fd, owned = source, False
            where = where or f"<fd {source}>"
        else:
            where = where or os.fspath(source)
            try:
                fd = open_source(source)
            except OSError as err:
                raise InvalidInputError(f"cannot read file: {err.strerror}", path=where) from err
            owned = True
        try:
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InvalidInputError("not a regular file; cannot stream it twice", path=where)
            except OSError as err:
                raise InvalidInputError(f"cannot stat file: {err.strerror}", path=where) from err
            header = LABEL_SP[obj_type] + b"%d\0" % size
            h = hashlib.sha1(header)
            for chunk in stream_exactly(fd, size, where, "hash", progress):
                h.update(chunk)
            oid = h.digest()
            c = self.counters
            c.bytes_in += size
            if oid in self._seen:
                c.duplicates += 1
                return oid, WriteResult.DUPLICATE_IN_BATCH
            result = self._skip_if_exists(oid)
            if result is WriteResult.QUEUED:
                self._stream_tmp(oid, header, fd, size, where, progress)
                c.objects_written += 1
            else:
                c.objects_skipped += 1
            self._seen[oid] = result
        finally:
            if owned:
                os.close(fd)
        if self.progress is not None:
            self._report("write")
        return oid, result

    def _stream_tmp(self, oid: bytes, header: bytes, fd: int, size: int, where: str,
                    progress: Progress | None) -> None:
        """Pass 2 of ``add_file``: re-hash + compress into the tmp file; queue it only if the hash still matches."""
        pending, out = self._create_tmp(oid)
        written = 0
        started = False
        try:
            try:
                h = hashlib.sha1(header)
                z = zlib.compressobj(LOOSE_COMPRESSION)
                written += _write_all(out, z.compress(header))
                for chunk in stream_exactly(fd, size, where, "compress", progress):
                    h.update(chunk)
                    written += _write_all(out, z.compress(chunk))
                if h.digest() != oid:
                    raise InvalidInputError("file changed while it was being imported (its content no longer "
                                            "hashes to the id computed in the first pass)", path=where, oid=oid)
                written += _write_all(out, z.flush())
                fault_point("bulk.write_object")
                # writeout_each (early), same rule as _write_tmp.
                started = self._start_writeout_if_needed(out, written)
            finally:
                os.close(out)
        except BaseException as err:
            _tmp_write_failed(err, pending.tmp, oid)
        pending.writeout_started = started
        # Queued only now: a file that changed mid-pass leaves no pending entry (and no tmp file).
        self._queue(pending, written)

    def _skip_if_exists(self, oid: bytes) -> WriteResult:
        """git's check-and-freshen, answered from the batch-start snapshot (see :func:`skip_if_exists`)."""
        return skip_if_exists(self.repo, self.snapshot, oid, self.counters, self._freshened_packs)

    def _fanout_dir(self, hexid: str) -> tuple[str, int]:
        """The object's fan-out dir and its fd: created and opened on first use."""
        known = self._fanouts.get(hexid[:2])
        if known is not None:
            return known
        fanout = os.path.join(self._objects_dir, hexid[:2])
        try:
            os.mkdir(fanout, 0o755)
            self._created_fanouts.add(fanout)
        except FileExistsError:
            pass
        except OSError as err:
            raise WriteFailedError(f"cannot create object directory: {err.strerror}",
                                   errno=err.errno, path=fanout) from err
        dfd = os.open(fanout, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        known = self._fanouts[hexid[:2]] = (fanout, dfd)
        dev = os.fstat(dfd).st_dev
        if dev != self._fs_dev:
            self._other_fs.setdefault(dev, dfd)
        return known

    def _write_tmp(self, oid: bytes, header: bytes, data: bytes) -> None:
        """Compress into a tmp file in the object's own fan-out dir and queue it for the renames.

        The per-object hot path of every bulk write (one function: each call costs
        ~1% of a 10,000-object batch)."""
        payload = zlib.compress(header + data, LOOSE_COMPRESSION)
        p, fd = self._create_tmp(oid)
        try:
            try:
                n = os.write(fd, payload)
                if n < len(payload):
                    _write_all(fd, memoryview(payload)[n:])
                fault_point("bulk.write_object")
                # writeout_each (early): start write-out now so device I/O overlaps later work;
                # with the syncfs barrier only for big files (see WRITEOUT_MIN_BYTES), with the
                # per-file fsync fallback for every file (its fsyncs then find the I/O under way).
                p.writeout_started = self._start_writeout_if_needed(fd, len(payload))
            finally:
                os.close(fd)
        except BaseException as err:
            _tmp_write_failed(err, p.tmp, oid)
        self._queue(p, len(payload))

    def _create_tmp(self, oid: bytes) -> tuple[_Pending, int]:
        """Name the object's next tmp file in its own fan-out dir and create it (O_EXCL); the caller writes it."""
        hexid = oid.hex()
        fanout, dfd = self._fanout_dir(hexid)
        self._n += 1
        p = _Pending(oid, self._tmp_prefix + str(self._n), hexid[2:], fanout, False)
        try:
            return p, os.open(p.tmp_name, _TMP_FLAGS, 0o444, dir_fd=dfd)
        except OSError as err:
            raise WriteFailedError(f"cannot create temp file: {err.strerror}", errno=err.errno,
                                   path=p.tmp, oid=oid) from err

    def _queue(self, p: _Pending, written: int) -> None:
        """A complete tmp file joins the renames (only complete ones: a failed write left none)."""
        self._pending.append(p)
        self._account(written, p.writeout_started)

    def _account(self, written: int, started: bool) -> None:
        self.counters.bytes_written += written
        self.counters.durable.writeouts += started
        if self._early_every is not None:
            self._since_early += 1
            if self._since_early >= self._early_every:
                self._start_early_flush_if_needed()

    def _start_writeout_if_needed(self, fd: int, nbytes: int) -> bool:
        """Start write-out of one tmp file now (why: its flush later finds the I/O under way).

        With the syncfs barrier only big files gain from it (see WRITEOUT_MIN_BYTES); with
        the per-file fsync fallback every file does.
        """
        if self._writeout_min is not None and nbytes >= self._writeout_min:
            return durable.start_writeout(fd)
        return False

    def _start_early_flush_if_needed(self) -> None:
        """Start a background syncfs of the tmp files written so far (why: the barrier then waits only for the tail).

        Skipped while the previous one still runs and after MAX_EARLY_FLUSHES. Its own
        descriptor: the barrier's descriptor still reports every writeback error since the
        batch began.
        """
        if self._flusher is not None and self._flusher.is_alive():
            return
        if self._early_flushes >= MAX_EARLY_FLUSHES:
            self._early_every = None
            return
        self._early_flushes += 1
        self._since_early = 0
        if self._early_fd < 0:
            self._early_fd = os.open(self._objects_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # Counted here, in the batch's own thread: a syncfs call like any other.
        d = self.counters.durable
        d.flushes += 1
        d.extra["early_flushes"] = d.extra.get("early_flushes", 0) + 1
        d.extra["syncfs"] = d.extra.get("syncfs", 0) + 1
        self._flusher = threading.Thread(target=_early_flush, args=(self._early_fd,),
                                         name="packyard-early-flush", daemon=True)
        self._flusher.start()

    def _join_early_flush(self) -> None:
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None

    # -- commit: the durability order ----------------------------------------
    def commit(self, ref_updates: Sequence[RefUpdate] = ()) -> BatchResult:
        """Make every queued object durable and visible, then move the refs; report success last."""
        if self.state is not BatchState.OPEN:
            raise StoreError(f"batch {self.batch_id} is {self.state.value}; cannot commit")
        ref_updates = tuple(ref_updates)
        # "collect": from batch start to commit -- the caller's reading plus hashing, compressing, tmp writes.
        self.counters.add_time("collect", time.monotonic() - self._t_collect)
        try:
            self._check_ref_targets(ref_updates)
            self._choose_flush()
            self._step("writeout", self.writeout_each)
            fault_point("bulk.after_writeout")
            self._step("barrier_flush", self.barrier_flush)
            fault_point("bulk.after_barrier")
            check(self.lease)
            self._step("publish_renames", self.publish_renames)
            fault_point("bulk.after_renames")
            self._step("fsync_dirs", self.fsync_dirs)
            fault_point("bulk.after_fsync_dirs")
            if ref_updates:
                check(self.lease)
            self._step("update_refs", lambda: self.update_refs(ref_updates))
            fault_point("bulk.after_update_refs")
        except BaseException:
            self.state = BatchState.FAILED
            self.abort()
            raise
        self.state = BatchState.COMMITTED
        self._close()
        c = self.counters
        return BatchResult(batch_id=self.batch_id, written=len(self._pending), skipped=c.objects_skipped,
                           duplicates=c.duplicates, refs=ref_updates, counters=c.as_dict())

    def _choose_flush(self) -> None:
        """The barrier and directory step for this batch's size and filesystem (store/flush.py's rule)."""
        self.flush_method = choose_flush(len(self._pending), self.counters.bytes_written - self._bytes0,
                                         self._fs_type, self.flush_policy)
        self.dir_sync = self._dir_sync_given or dir_sync_for(self.flush_method)
        key = f"flush_{self.flush_method.value}"
        self.counters.durable.extra[key] = self.counters.durable.extra.get(key, 0) + 1

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        try:
            fn()
        finally:
            self.counters.add_time(name, time.monotonic() - t0)

    def _check_ref_targets(self, ref_updates: Sequence[RefUpdate]) -> None:
        # A ref must only ever name an object this batch wrote or that already exists.
        for u in ref_updates:
            if u.new in self._seen:
                continue
            if u.new not in self.snapshot and not self.repo.objects.has(u.new):
                raise ObjectMissingError(f"ref {u.name} would point to an object that does not exist",
                                         oid=u.new)

    def writeout_each(self) -> None:
        """Start write-out of every tmp file not started at add() (why: the barrier then waits on I/O in flight).

        With the syncfs barrier this is the barrier's own first half (syncfs starts write-out
        of every dirty file of the filesystem at once), so nothing is issued per file here.
        With the per-file fsync fallback each file was started at add() already.
        """
        if not self.writeout or self.flush_method is FlushMethod.SYNCFS:
            return
        for p in self._pending:
            if not p.writeout_started:
                fd = os.open(p.tmp, os.O_RDONLY)
                try:
                    install.writeout_each([fd], self.counters.durable)
                    p.writeout_started = durable.HAVE_WRITEOUT
                finally:
                    os.close(fd)

    def barrier_flush(self) -> None:
        """ONE durable flush of every tmp file (why: a rename must never publish bytes that could vanish)."""
        self._join_early_flush()
        if not self._pending:
            return
        try:
            if self.flush_method is FlushMethod.SYNCFS:
                self._sync_filesystems()
            else:
                for p in self._pending:
                    fd = os.open(p.tmp, os.O_RDONLY)
                    try:
                        install.barrier_flush([fd], self.counters.durable)
                    finally:
                        os.close(fd)
        except OSError as err:
            raise WriteFailedError(f"flushing the batch to disk failed: {err.strerror}", errno=err.errno,
                                   path=self._objects_dir) from err

    def _sync_filesystems(self) -> None:
        """syncfs of the objects directory's filesystem, then of each other one a fan-out dir is on."""
        install.barrier_syncfs([self._fs_fd, *self._other_fs.values()], self.counters.durable)

    def publish_renames(self) -> None:
        """Rename every tmp file to its object name, never replacing one (why: objects appear only complete)."""

        def published(n: int) -> None:
            self._published = n

        def exists(p: _Pending) -> None:
            # Another writer installed the same object meanwhile: same bytes by definition.
            _unlink_quiet(p.tmp)
            self.counters.exists_at_rename += 1

        install.publish_renames_noreplace(self._pending, dict(self._fanouts.values()), self.counters.durable,
                                          published=published, exists=exists, fault="bulk.publish_rename",
                                          progress=self.progress)

    def fsync_dirs(self) -> None:
        """Make the renames durable (why: a ref must not name an object whose directory entry a crash can lose)."""
        if not self._pending:
            return
        if self.dir_sync is DirSync.SYNCFS:
            try:
                self._sync_filesystems()
            except OSError as err:
                raise WriteFailedError(f"syncfs after renames failed: {err.strerror}", errno=err.errno,
                                       path=self._objects_dir) from err
            return
        dirs = sorted({p.fanout for p in self._pending})
        if self._created_fanouts:
            dirs.append(self._objects_dir)   # the new fan-out directories' own entries
        install.fsync_dirs(dirs, self.counters.durable)

    def update_refs(self, ref_updates: Sequence[RefUpdate]) -> None:
        """Compare-and-swap the refs (why: last, so a ref never names a non-durable object)."""
        install.update_refs(self.repo, ref_updates, self.counters.durable, token_of(self.lease))

    # -- abort ---------------------------------------------------------------
    def abort(self) -> None:
        """Remove every tmp file not yet renamed; nothing further is published."""
        if self.state is BatchState.COMMITTED or self.state is BatchState.ABORTED:
            return
        for p in self._pending[self._published:]:
            _unlink_quiet(p.tmp)
        self.state = BatchState.ABORTED
        self._close()

    def _close(self) -> None:
        self._join_early_flush()
        if self._early_fd >= 0:
            os.close(self._early_fd)
            self._early_fd = -1
        for _, dfd in self._fanouts.values():
            os.close(dfd)
        self._fanouts = {}
        self._other_fs = {}
        if self._fs_fd >= 0:
            os.close(self._fs_fd)
            self._fs_fd = -1
        leftovers.remove_batch_marker(self._marker)
        self._marker = None

    def _report(self, phase: str) -> None:
        if self.progress is None:
            return
        done = len(self._seen)
        step = max(1000, (self.expected or 0) // 100) if self.expected else 1000
        if done - self._last_report >= step or (self.expected and done == self.expected):
            self._last_report = done
            self.progress(phase, done, self.expected)

    @property
    def pending_count(self) -> int:
        return len(self._pending)


# -- streaming a file (add_file) -----------------------------------------------------

_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _early_flush(fd: int) -> None:
    """Body of the early write-out thread: syncfs, errors left to the barrier (it reports them again)."""
    try:
        durable.sync_filesystem(fd)
    except OSError:
        pass


def _write_all(fd: int, data: bytes | memoryview) -> int:
    durable.write_all(fd, data)
    return len(data)


# -- stale tmp files --------------------------------------------------------------

def _tmp_write_failed(err: BaseException, tmp: str, oid: bytes) -> NoReturn:
    """Writing a tmp object failed with ``err``: the file goes; an OSError is raised as WriteFailedError
    naming it, anything else as it is."""
    _unlink_quiet(tmp)
    if isinstance(err, OSError):
        raise WriteFailedError(f"writing temp file failed: {err.strerror}", errno=err.errno, path=tmp,
                               oid=oid) from err
    raise err


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


