"""What the loose batch (:mod:`.loose`) and the pack batch (:mod:`.pack`) share: their result, counter and
state types, the :class:`Batch` protocol both satisfy (so a caller of :func:`.api.begin` need not know which
it got), and the rules both follow the same way -- git's check-and-freshen from one batch-start snapshot
(:func:`skip_if_exists`) and reading an input file exactly once per pass (:func:`open_source`,
:func:`stream_exactly`).
"""
from __future__ import annotations

import enum
import errno
import os
from dataclasses import dataclass, field
from types import TracebackType
from typing import Iterable, Iterator, Protocol, Sequence

from .. import durable
from ..errors import InvalidInputError
from ..objdir import Location, ObjectSnapshot
from ..objects import ObjectType
from ..progress import Progress
from ..refs import RefUpdate

#: ``add_file`` reads (and hashes, and compresses) a file this many bytes at a time.
STREAM_CHUNK = 1 << 20
# "<type> " by type code (a tuple index: hashing an enum member runs Python code). There is no type 0:
# every index is a checked type (ObjectType() in LooseBatch, _TYPE_CODES in PackBatch).
LABEL_SP: tuple[bytes, ...] = (b"",) + tuple(ObjectType(code).label + b" " for code in range(1, 5))


class WriteResult(enum.Enum):
    """What ``LooseBatch.add`` did with an object."""

    QUEUED = "queued"                        # tmp file written; renamed into place on commit
    EXISTS_LOOSE = "exists_loose"            # in the snapshot as a loose file (freshened)
    EXISTS_PACKED = "exists_packed"          # in the snapshot in a pack (pack freshened)
    EXISTS_ALTERNATE = "exists_alternate"    # only in an alternate (the pool), freshened there
    DUPLICATE_IN_BATCH = "duplicate_in_batch"  # added earlier in this batch


class BatchState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class BatchCounters:
    """Counters for the job record; pass the same instance to several batches to sum them."""

    objects_written: int = 0
    objects_skipped: int = 0       # existed already (loose or packed) -- freshened, not written
    skipped_loose: int = 0
    skipped_packed: int = 0
    skipped_alternate: int = 0     # of them, found only in an alternate (the pool): freshened there
    duplicates: int = 0            # same object added twice in one batch
    exists_at_rename: int = 0      # appeared between snapshot and rename (another writer)
    bytes_in: int = 0              # uncompressed object bytes offered
    bytes_written: int = 0         # compressed bytes written to tmp files
    freshened_packs: int = 0
    stale_tmp_removed: int = 0
    durable: durable.DurabilityCounters = field(default_factory=durable.DurabilityCounters)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # Which way the batch was written: "loose" files here, or "pack" (store/batch/pack.py), with its figures.
    write_path: str = "loose"
    pack_bytes: int = 0
    deltas_computed: int = 0
    deltas_tried: int = 0
    delta_bytes_saved: int = 0

    def add_time(self, phase: str, seconds: float) -> None:
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + seconds

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "objects_written", "objects_skipped", "skipped_loose", "skipped_packed", "skipped_alternate", "duplicates",
            "exists_at_rename", "bytes_in", "bytes_written", "freshened_packs", "stale_tmp_removed")}
        if self.write_path == "pack":
            d.update(pack_bytes=self.pack_bytes, deltas_computed=self.deltas_computed, deltas_tried=self.deltas_tried,
                     delta_bytes_saved=self.delta_bytes_saved)
        d.update(self.durable.as_dict())
        d["elapsed"] = {k: round(v, 6) for k, v in self.phase_seconds.items()}
        d["write_path"] = self.write_path
        return d


@dataclass(frozen=True)
class BatchResult:
    batch_id: str
    written: int
    skipped: int
    duplicates: int
    refs: tuple[RefUpdate, ...]
    counters: dict


class Batch(Protocol):
    """A batch-write transaction, loose or pack: add objects, then ``commit`` publishes them durably and
    moves the refs last (``abort``, or leaving the ``with`` block by an exception: nothing published)."""

    repo: object
    counters: BatchCounters
    state: BatchState
    batch_id: str
    progress: Progress | None
    snapshot: ObjectSnapshot   # the one snapshot taken as the batch began: "exists?" answers for the whole batch

    def __enter__(self) -> Batch: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def add(self, obj_type: ObjectType | int, data: bytes, name: bytes | None = None) -> tuple[bytes, WriteResult]:
        ...

    def add_many(self, objects: Iterable[tuple[ObjectType | int, bytes]]) -> list[tuple[bytes, WriteResult]]: ...

    def add_file(self, source: str | os.PathLike[str] | int, size: int,
                 obj_type: ObjectType | int = ObjectType.BLOB, *, where: str | None = None,
                 progress: Progress | None = None, name: bytes | None = None) -> tuple[bytes, WriteResult]: ...

    def commit(self, ref_updates: Sequence[RefUpdate] = ()) -> BatchResult: ...

    def abort(self) -> None: ...

    @property
    def pending_count(self) -> int: ...


# -- the existence rule ---------------------------------------------------------------------------

def skip_if_exists(repo, snapshot, oid: bytes, counters: BatchCounters, freshened_packs: set[str]) -> WriteResult:
    """git's check-and-freshen, answered from a batch-start snapshot (loose and pack batches alike).

    An object the snapshot knows is not written, but its file (or pack) gets
    mtime=now so a concurrent prune's grace period keeps it. If the touch finds
    the file gone (pruned or repacked since the snapshot), look once more
    (ObjectDirectory.freshen re-lists packs) and write it if it is really gone.
    ``freshened_packs``: names of packs this batch touched already (once each).
    """
    where = snapshot.locate(oid)
    if where is Location.MISSING:
        return WriteResult.QUEUED
    if where is Location.ALTERNATE:
        pass   # only in the pool: freshened there below (git's check_and_freshen_nonlocal), or written here
    elif where is Location.LOOSE:
        if repo.objects.loose.freshen(oid):
            counters.skipped_loose += 1
            return WriteResult.EXISTS_LOOSE
    else:
        found = snapshot.packs.find_not_cruft(oid)
        if found is None:
            # Only in a cruft pack: write it anew rather than touch the cruft pack (as git does), so
            # the next full repack sees a fresh copy and the cruft entry can age out.
            return WriteResult.QUEUED
        pack, _ = found
        if pack.name in freshened_packs:
            counters.skipped_packed += 1
            return WriteResult.EXISTS_PACKED
        if pack.freshen():
            freshened_packs.add(pack.name)
            counters.freshened_packs += 1
            counters.skipped_packed += 1
            return WriteResult.EXISTS_PACKED
    again = repo.objects.freshen(oid)
    if again is Location.LOOSE:
        counters.skipped_loose += 1
        return WriteResult.EXISTS_LOOSE
    if again is Location.PACKED:
        counters.skipped_packed += 1
        return WriteResult.EXISTS_PACKED
    if again is Location.ALTERNATE:
        counters.skipped_alternate += 1
        return WriteResult.EXISTS_ALTERNATE
    return WriteResult.QUEUED


# -- reading an input file ------------------------------------------------------------------------

_SOURCE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
_O_NOATIME = getattr(os, "O_NOATIME", 0)


def open_source(path: str | os.PathLike[str]) -> int:
    """Open an input file for reading: never through a symlink, and without touching its atime.

    The first read of a freshly written file (a checkout, ``tar -x``) makes the kernel update
    its atime under relatime: one inode write per file (measured ~20 us each on ext4), and an
    import should not change its input anyway (``tar --atime-preserve=system`` and ``rsync
    --open-noatime`` do the same). O_NOATIME is refused with EPERM for a file the caller does
    not own; that file is then opened plainly.
    """
    if _O_NOATIME:
        try:
            return os.open(path, _SOURCE_FLAGS | _O_NOATIME)
        except PermissionError as err:
            if err.errno != errno.EPERM:
                raise
    return os.open(path, _SOURCE_FLAGS)


def stream_exactly(fd: int, size: int, where: str, phase: str, progress: Progress | None) -> Iterator[bytes]:
    """Yield the file's bytes [0, size) in STREAM_CHUNK pieces; raise if it is not exactly ``size`` long.

    ``os.pread``: no shared file offset, so each pass starts at 0 whoever else holds the fd.
    Read errors are the *input's* fault: InvalidInputError naming ``where``.
    """
    step = max(STREAM_CHUNK, size // 100)
    last = 0
    if progress is not None:
        progress(phase, 0, size)
    off = 0
    try:
        while off < size:
            chunk = os.pread(fd, min(STREAM_CHUNK, size - off), off)
            if not chunk:
                raise InvalidInputError(f"file changed while it was being imported: it ended at byte {off}, "
                                        f"expected {size} bytes", path=where, offset=off)
            off += len(chunk)
            yield chunk
            if progress is not None and off - last >= step and off < size:
                last = off
                progress(phase, off, size)
        if os.pread(fd, 1, size):
            raise InvalidInputError(f"file changed while it was being imported: it is longer than the "
                                    f"expected {size} bytes", path=where, offset=size)
    except OSError as err:
        raise InvalidInputError(f"cannot read file: {err.strerror}", path=where, offset=off) from err
    if progress is not None:
        progress(phase, size, size)
