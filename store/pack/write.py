"""The pack writer: every pack packyard produces (repacks, and imports written as one pack).

A :class:`PackWriter` streams pack v2 entries into ``objects/pack/tmp_pack_<pid>_<host>-<rand>``
(the destination filesystem, so the renames are atomic), computing the trailer's SHA-1 as it
writes. Beside its temp files lies ``tmp_owner_<same tag>``: the writer's owner record (pid, host,
job id: :mod:`packyard.store.owner`), so whoever cleans up after a dead writer knows whose they
were (``packyard janitor`` asks the job records). Three ways in:

* :meth:`PackWriter.write_whole` -- an object stored whole (zlib at git's default pack level);
  :meth:`PackWriter.write_whole_stream` the same from a file read a piece at a time;
* :meth:`PackWriter.copy_entry` -- an entry copied **verbatim** from another pack (raw
  compressed bytes, never inflated): its CRC32 is checked against the source idx while it is
  copied (a corrupt source entry is refused, not propagated); a delta whose base is already
  in this pack is rewritten as OFS_DELTA pointing at the base's new offset (REF_DELTA becomes
  OFS_DELTA), its compressed instructions copied unchanged;
* :meth:`PackWriter.write_delta` / :meth:`PackWriter.write_compressed_delta` -- a delta computed
  by the caller (the delta search, :mod:`.search`): stored as OFS_DELTA against a base already
  written (deflated here, or by the search's workers).

:meth:`PackWriter.finish` writes the trailer, then ``.idx`` v2 and ``.rev`` (and ``.mtimes``
for a cruft pack) with the index writer of :mod:`.idxwrite`; :meth:`PackWriter.install`
publishes them through :func:`packyard.store.install.install_pack` (temp names -> one flush ->
renames, idx last -> directory fsync), with ``<prefix>.after_<step>`` fault points.
A pack that is not a repository's (a git bundle: store/backup/bundle.py) is written with a ``header``
before it (not part of the pack's offsets or SHA-1), finished with ``index=False`` (no idx, no rev) and
published as one file by :meth:`PackWriter.publish_as` (flush, rename, directory fsync).
Any write error (a full disk) is :class:`WriteFailedError` naming the temp file, after the temp
files are removed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
import struct
import zlib
from array import array
from pathlib import Path
from typing import AbstractSet, Iterable, Sequence

from .. import durable
from ..errors import InvalidInputError, PackFormatError, WriteFailedError
from ..faults import fault_point
from ..install import InstallOutcome, PackFiles, install_pack
from ..objects import OFS_DELTA, REF_DELTA
from ..owner import current_owner, this_host_tag
from .entries import EntryHeader
from .format import PACK_SIGNATURE, encode_entry_header
from .idxwrite import write_index

#: git's default pack.compression (core.compression unset: zlib's default level).
PACK_COMPRESSION = zlib.Z_DEFAULT_COMPRESSION
WRITE_BUFFER = 1 << 20

#: Temp files of the writer: tmp_<kind>_<pid>_<host tag>-<random>; git's own are tmp_pack_XXXXXX.
TMP_RE = re.compile(r"^tmp_(pack|idx|rev|mtimes|bitmap|keep|owner|midx)_(\d+)_([0-9a-f]{4})-([0-9a-f]{8})$")
OWNER_PREFIX = "tmp_owner_"   # the owner record of the temp files with the same tag


def ofs_encoding(rel: int) -> bytes:
    """git's OFS_DELTA distance encoding (big-endian base 128, "minus one" per continuation byte)."""
    out = bytearray([rel & 0x7F])
    rel >>= 7
    while rel:
        rel -= 1
        out.append(0x80 | (rel & 0x7F))
        rel >>= 7
    out.reverse()
    return bytes(out)


def tmp_owner_tag(name: str) -> tuple[int, str] | None:
    """(pid, host tag) of a writer temp file's name, or None if packyard's writer did not name it."""
    m = TMP_RE.match(name)
    return (int(m.group(2)), m.group(3)) if m else None


def _checked_crc(raw: memoryview, source_crc: int, oid: bytes, path: object, start: int) -> int:
    """The CRC32 of a source entry about to be copied verbatim; PackFormatError naming the object, the
    source pack and the offset when it is not its idx's (nothing is copied then)."""
    crc = zlib.crc32(raw)
    if crc != source_crc:
        raise PackFormatError(f"entry's CRC32 {crc:08x} differs from its idx's {source_crc:08x} "
                              f"(corrupt pack entry; not copied)", oid=oid, path=path, offset=start)
    return crc


class PackWriter:
    """One pack being written; see the module docstring. Not thread-safe; one writer per pack."""

    def __init__(self, pack_dir: Path, count: int, *, counters: durable.DurabilityCounters | None = None,
                 compression: int = PACK_COMPRESSION, fault_prefix: str = "pack_write", header: bytes = b"") -> None:
        """``header``: bytes written before the pack in the same file (a bundle's header); the pack's offsets
        and trailer SHA-1 start after it."""
        if count < 0 or count >= 1 << 32:
            raise InvalidInputError(f"a pack holds 0 to 2^32-1 objects, not {count}")
        self.pack_dir = Path(pack_dir)
        self.count = count
        self.counters = counters if counters is not None else durable.DurabilityCounters()
        self.compression = compression
        self.fault_prefix = fault_prefix
        self._tag = f"{os.getpid()}_{this_host_tag()}-{secrets.token_hex(4)}"
        self.tmp_pack = self.pack_dir / f"tmp_pack_{self._tag}"
        self._temps: list[Path] = []
        self.offsets = array("Q")
        self.crcs = array("I")
        self.oids = bytearray()
        self.index_order = b""      # after finish(): the idx's order (IndexWriteInfo.order)
        self.deltas = 0
        self.bytes_copied = 0
        self.finished: PackFiles | None = None
        self.installed = False
        self.unindexed = False      # finished with index=False (published by publish_as)
        self._sha = hashlib.sha1()
        self._buf = bytearray()
        self._pos = 0
        self._fd = self._create(self.tmp_pack)
        self.tmp_owner = self._write_owner_record()
        self.header_size = len(header)
        if header:
            try:
                durable.write_all(self._fd, header)
            except OSError as err:
                self.abort()
                raise WriteFailedError(f"writing the new pack failed: {err.strerror}", errno=err.errno,
                                       path=self.tmp_pack) from err
        self._append(PACK_SIGNATURE + struct.pack(">II", 2, count))

    # -- files --------------------------------------------------------------------------------
    def _create(self, path: Path, mode: int = 0o444) -> int:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except OSError as err:
            self.abort()
            raise WriteFailedError(f"cannot create a temp file for the new pack: {err.strerror}", errno=err.errno,
                                   path=path) from err
        self._temps.append(path)
        return fd

    def _write_owner_record(self) -> Path:
        """``tmp_owner_<tag>``: who writes these temp files (why: a janitor judges them by their job)."""
        path = self.pack_dir / f"{OWNER_PREFIX}{self._tag}"
        fd = self._create(path, 0o644)
        try:
            os.write(fd, current_owner().encode())
        except OSError as err:
            self.abort()
            raise WriteFailedError(f"cannot write the pack writer's owner record: {err.strerror}", errno=err.errno,
                                   path=path) from err
        finally:
            os.close(fd)
        return path

    def _append(self, data) -> None:
        self._buf += data
        self._pos += len(data)
        if len(self._buf) >= WRITE_BUFFER:
            self._flush_buffer()

    def _flush_buffer(self) -> None:
        if not self._buf:
            return
        self._sha.update(self._buf)
        view = memoryview(self._buf)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as err:
            view.release()
            self.abort()
            raise WriteFailedError(f"writing the new pack failed: {err.strerror}", errno=err.errno,
                                   path=self.tmp_pack) from err
        view.release()
        self._buf = bytearray()

    @property
    def written(self) -> int:
        """Objects written so far."""
        return len(self.offsets)

    @property
    def position(self) -> int:
        """The offset the next entry will start at."""
        return self._pos

    def _record(self, oid: bytes, offset: int, crc: int) -> int:
        if len(self.offsets) >= self.count:
            raise InvalidInputError(f"pack was declared with {self.count} objects; one more was added")
        self.offsets.append(offset)
        self.crcs.append(crc & 0xFFFFFFFF)
        self.oids += oid
        return offset

    # -- entries ------------------------------------------------------------------------------
    def write_whole(self, oid: bytes, type_num: int, data: bytes) -> int:
        """Store an object whole; returns its offset in this pack."""
        offset = self._pos
        header = encode_entry_header(type_num, len(data))
        body = zlib.compress(data, self.compression)
        crc = zlib.crc32(body, zlib.crc32(header))
        self._append(header)
        self._append(body)
        return self._record(oid, offset, crc)

    def write_compressed_whole(self, oid: bytes, type_num: int, size: int, body: bytes) -> int:
        """Store an object whole that is already deflated (``body``: one zlib stream of its ``size`` bytes,
        from the delta search's workers)."""
        offset = self._pos
        header = encode_entry_header(type_num, size)
        crc = zlib.crc32(body, zlib.crc32(header))
        self._append(header)
        self._append(body)
        return self._record(oid, offset, crc)

    def write_whole_stream(self, oid: bytes, type_num: int, size: int, chunks: Iterable[bytes]) -> int:
        """Store an object whole from ``chunks`` (exactly ``size`` bytes in all: a big file read a piece at
        a time, never whole in memory); returns its offset. An exception from ``chunks`` leaves a partial
        entry: the caller aborts the pack."""
        offset = self._pos
        header = encode_entry_header(type_num, size)
        z = zlib.compressobj(self.compression)
        crc = zlib.crc32(header)
        self._append(header)
        got = 0
        for chunk in chunks:
            got += len(chunk)
            body = z.compress(chunk)
            if body:
                crc = zlib.crc32(body, crc)
                self._append(body)
        if got != size:
            raise InvalidInputError(f"object {oid.hex()} was declared with {size} bytes but {got} came")
        body = z.flush()
        crc = zlib.crc32(body, crc)
        self._append(body)
        return self._record(oid, offset, crc)

    def write_delta(self, oid: bytes, base_offset: int, delta: bytes) -> int:
        """Store ``delta`` (git delta instructions against the object at ``base_offset`` in this pack)."""
        return self.write_compressed_delta(oid, base_offset, len(delta), zlib.compress(delta, self.compression))

    def write_compressed_delta(self, oid: bytes, base_offset: int, size: int, body: bytes) -> int:
        """Store a delta already deflated (``body``: one zlib stream of ``size`` bytes of delta instructions), as
        the delta search hands them over: its workers compress while they search."""
        offset = self._pos
        if not 0 < offset - base_offset <= offset:
            raise InvalidInputError(f"delta base offset {base_offset} does not precede offset {offset}")
        header = encode_entry_header(OFS_DELTA, size) + ofs_encoding(offset - base_offset)
        crc = zlib.crc32(body, zlib.crc32(header))
        self._append(header)
        self._append(body)
        self.deltas += 1
        return self._record(oid, offset, crc)

    def copy_raw(self, oid: bytes, view: memoryview, start: int, end: int, source_crc: int, *, path: object) -> int:
        """Copy a whole (non-delta) entry ``view[start:end]`` as it is, after checking its CRC32 (see copy_entry)."""
        raw = view[start:end]
        crc = _checked_crc(raw, source_crc, oid, path, start)
        offset = self._pos
        self._append(raw)
        self.bytes_copied += end - start
        return self._record(oid, offset, crc)

    def copy_delta(self, oid: bytes, view: memoryview, start: int, data_start: int, end: int, source_crc: int,
                   size: int, base_offset: int, *, path: object) -> int:
        """Copy the delta entry ``view[start:end]`` (its instructions start at ``data_start``, ``size`` bytes
        inflated) as OFS_DELTA against ``base_offset`` in this pack, without inflating it; CRC32 checked."""
        raw = view[start:end]
        _checked_crc(raw, source_crc, oid, path, start)   # (the new entry has a new header: its own CRC below)
        offset = self._pos
        if not 0 < offset - base_offset <= offset:
            raise InvalidInputError(f"a delta is copied only after its base (object {oid.hex()})")
        header = encode_entry_header(OFS_DELTA, size) + ofs_encoding(offset - base_offset)
        body = view[data_start:end]
        self._append(header)
        self._append(body)
        self.deltas += 1
        self.bytes_copied += end - start
        return self._record(oid, offset, zlib.crc32(body, zlib.crc32(header)))

    def append_copies(self, entries: bytes, offsets: bytes, crcs: bytes, oids: bytes, *, deltas: int,
                      copied: int) -> None:
        """Append entries a C loop copied as :meth:`copy_raw` / :meth:`copy_delta` do (a repack's write plan:
        ``_walk.Packs.copy_entries``), starting at :attr:`position`: their bytes, and per entry its offset
        (native 'Q'), CRC32 (native 'I') and id, in order; ``deltas`` of them are deltas, ``copied`` source
        bytes were read."""
        new = array("Q")
        new.frombytes(offsets)
        m = len(new)
        if len(crcs) != 4 * m or len(oids) != 20 * m:
            raise InvalidInputError(f"copied entries disagree: {m} offsets, {len(crcs)} CRC bytes, "
                                    f"{len(oids)} id bytes")
        if len(self.offsets) + m > self.count:
            raise InvalidInputError(f"pack was declared with {self.count} objects; {m} more would pass it")
        if m and new[0] != self._pos:
            raise InvalidInputError(f"copied entries start at {new[0]}, the pack is at {self._pos}")
        self._append(entries)
        self.offsets.extend(new)
        self.crcs.frombytes(crcs)
        self.oids += oids
        self.deltas += deltas
        self.bytes_copied += copied

    def copy_entry(self, oid: bytes, buf, header: EntryHeader, end: int, source_crc: int, *,
                   path: object, base_offset: int | None = None) -> int:
        """Copy the entry ``buf[header.offset:end]`` of another pack without inflating it.

        The source bytes must match ``source_crc`` (its idx's CRC32): else PackFormatError naming
        the object, the source pack and the offset, and nothing is written. A delta entry needs
        ``base_offset``, where its base already is in *this* pack: it is stored as OFS_DELTA.
        """
        with memoryview(buf) as view:
            if header.type == OFS_DELTA or header.type == REF_DELTA:
                if base_offset is None:
                    raise InvalidInputError(f"a delta is copied only after its base (object {oid.hex()})")
                return self.copy_delta(oid, view, header.offset, header.data_offset, end, source_crc, header.size,
                                       base_offset, path=path)
            return self.copy_raw(oid, view, header.offset, end, source_crc, path=path)

    # -- finishing ----------------------------------------------------------------------------
    def finish(self, *, mtimes: Sequence[int] | None = None, keep: bytes | None = None,
               index: bool = True) -> PackFiles:
        """Trailer, then idx/rev (and .mtimes, and a .keep's content) as temp files; returns them.
        ``index=False``: the trailer only (a pack that is published as one file: :meth:`publish_as`)."""
        if self.finished is not None:
            return self.finished
        if len(self.offsets) != self.count:
            self.abort()
            raise InvalidInputError(f"pack declared {self.count} objects but {len(self.offsets)} were written")
        self._flush_buffer()
        checksum = self._sha.digest()
        current = self.tmp_pack
        try:
            os.write(self._fd, checksum)
            self._pos += len(checksum)
            if not index:
                self.checksum = checksum
                self.name = f"pack-{checksum.hex()}"
                self.finished = PackFiles(name=self.name, pack=self.tmp_pack, idx=self.tmp_pack, rev=self.tmp_pack)
                self.unindexed = True
                return self.finished
            idx = self.pack_dir / f"tmp_idx_{self._tag}"
            rev = self.pack_dir / f"tmp_rev_{self._tag}"
            mt = self.pack_dir / f"tmp_mtimes_{self._tag}" if mtimes is not None else None
            current = idx
            with self._open(idx) as f_idx, self._open(rev) as f_rev, \
                    (self._open(mt) if mt is not None else open(os.devnull, "wb")) as f_mt:
                info = write_index(f_idx, f_rev, self.oids, self.offsets, self.crcs, checksum,
                                   mtimes_out=f_mt if mt is not None else None, mtimes=mtimes)
            self.index_order = info.order
            kp = None
            if keep is not None:
                kp = current = self.pack_dir / f"tmp_keep_{self._tag}"
                with self._open(kp, 0o644) as f_keep:
                    f_keep.write(keep)
        except OSError as err:
            self.abort()
            raise WriteFailedError(f"writing the new pack failed: {err.strerror}", errno=err.errno,
                                   path=current) from err
        self.checksum = checksum
        self.name = f"pack-{checksum.hex()}"
        self.finished = PackFiles(name=self.name, pack=self.tmp_pack, idx=idx, rev=rev, mtimes=mt, keep=kp)
        return self.finished

    def attach_bitmap(self, data: bytes) -> Path:
        """After finish(): ``data`` (a ``.bitmap`` for this pack) as ``tmp_bitmap_<tag>``, installed with the pack
        (renamed after the rev, before the idx)."""
        if self.finished is None:
            raise InvalidInputError("a bitmap is attached to a finished pack")
        path = self.pack_dir / f"tmp_bitmap_{self._tag}"
        try:
            with self._open(path) as f:
                f.write(data)
        except OSError as err:
            self.abort()
            raise WriteFailedError(f"writing the new pack's bitmap failed: {err.strerror}", errno=err.errno,
                                   path=path) from err
        self.finished = dataclasses.replace(self.finished, bitmap=path)
        return path

    def _open(self, path: Path, mode: int = 0o444):
        fd = self._create(path, mode)
        return open(fd, "wb", buffering=1 << 16)

    def install(self, *, keep: bytes | None = None, mtimes: Sequence[int] | None = None
                ) -> tuple[InstallOutcome, PackFiles, Path | None]:
        """finish() if needed, then publish: flush, (keep,) renames with the idx last, directory fsync."""
        files = self.finish(mtimes=mtimes, keep=keep)
        try:
            outcome, keep_path = install_pack(files, self.pack_dir, self.counters, fault_prefix=self.fault_prefix,
                                              open_fds=[self._fd])
        except BaseException:
            self.abort()
            raise
        self._close_fd()
        # What was not renamed: the owner record, a linked keep, or every file when the same pack was there
        # already. The renamed ones are not asked for again (on NFS each would be a LOOKUP answering ENOENT).
        renamed = {p for p in files.temps() if p != files.keep} if outcome is InstallOutcome.INSTALLED else set()
        self._remove_temps(skip=renamed)
        self._temps = []
        self.installed = True
        return outcome, files, keep_path

    def publish_as(self, dest: Path, *, counters: durable.DurabilityCounters | None = None) -> None:
        """After ``finish(index=False)``: the temp file (header and pack) flushed, renamed onto ``dest`` (in the
        same directory) and the directory fsynced; the owner record removed. Fault points
        ``<fault_prefix>.after_flush`` (flushed, not renamed) and ``<fault_prefix>.after_rename`` (renamed,
        directory not yet fsynced). An error before the rename: every temp file removed, nothing at ``dest`` from this
        writer; after it (the directory's fsync): the other temp files removed, ``dest`` stays."""
        if self.finished is None or not self.unindexed:
            raise InvalidInputError("publish_as() publishes a pack finished with index=False")
        dest = Path(dest)
        if dest.parent.resolve() != self.pack_dir.resolve():
            raise InvalidInputError("a pack is published in the directory it was written in", path=dest)
        counters = counters if counters is not None else self.counters
        try:
            durable.flush_file(self._fd, counters)
            self._close_fd()
            fault_point(f"{self.fault_prefix}.after_flush")
            durable.rename(self.tmp_pack, dest, counters)
            self._temps.remove(self.tmp_pack)
            fault_point(f"{self.fault_prefix}.after_rename")
            durable.fsync_dir(self.pack_dir, counters)
        except OSError as err:
            self.abort()
            raise WriteFailedError(f"publishing the new pack failed: {err.strerror}", errno=err.errno,
                                   path=self.tmp_pack) from err
        except BaseException:
            self.abort()
            raise
        self._remove_temps()
        self._temps = []
        self.installed = True

    @property
    def size(self) -> int:
        """Bytes in the pack (after finish(): including the trailer)."""
        return self._pos

    def _close_fd(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def _remove_temps(self, skip: AbstractSet[Path] = frozenset()) -> None:
        for p in self._temps:
            if p in skip:
                continue
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def abort(self) -> None:
        """Remove every temp file; nothing is published."""
        self._close_fd()
        self._remove_temps()
        self._temps = []

    def __enter__(self) -> "PackWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.installed:
            self.abort()


__all__ = ["PackWriter", "PACK_COMPRESSION", "ofs_encoding", "tmp_owner_tag", "TMP_RE", "OWNER_PREFIX"]
