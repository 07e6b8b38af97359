"""Which durable flush a loose batch uses: the one policy (issue 22, goal 6; issue 17's small push).

A batch's barrier must make its own tmp files durable before any is renamed (store/batch/loose.py), and
its ``fsync_dirs`` step must make the renames durable before a ref moves. Two honest ways exist:

``FSYNC_EACH``  write-out started for every tmp file (``sync_file_range(WRITE)``, so the device
                works on all of them at once), then ``fsync`` of each file, and after the
                renames ``fsync`` of each touched fan-out directory (and of ``objects/`` if the
                batch created a fan-out directory). Cost: the batch's own files, one device flush
                per call; what other processes hold dirty on the filesystem is not written.
``SYNCFS``      one ``syncfs(2)`` as the barrier and one more after the renames. Cost: two
                calls whatever the batch size, but each writes back *everything* the filesystem
                holds dirty -- a neighbour streaming gigabytes to the same filesystem makes a
                ten-object push wait for its writeback.

(git's ``core.fsyncMethod=batch`` -- write-out per file, then one ``fsync`` of a cookie file -- is
not offered: it is durable on ext4's single journal in data=ordered mode only, see store/batch/loose.py.)

Measured on this machine's ext4 (virtio disk with a write-back cache, `packyard bench loose
--noisy-neighbour`, docs/nfs.md): quiet, one syncfs beats N fsyncs already at ten files (each
fsync ends in a device cache flush, ~5-10 ms here); under a streaming neighbour the syncfs of a
small batch waits for the neighbour's write-back while the per-file flushes do not. Hence
:func:`choose_flush`: per file only for a small batch while much else is dirty.
"""
from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass

from . import durable
from .errors import InvalidInputError


class FlushMethod(enum.Enum):
    SYNCFS = "syncfs"          # one syncfs(2) barrier (Linux); the renames: one more syncfs
    FSYNC_EACH = "fsync_each"  # write-out of every tmp file, fsync each; the renames: fsync each dir


class DirSync(enum.Enum):
    EACH = "each"      # fsync every touched fan-out directory (+ objects/ if a fan-out dir was created)
    SYNCFS = "syncfs"  # one syncfs(2) covers every directory entry


#: Defaults of the policy (Settings: PACKYARD_FLUSH_EACH_MAX_FILES / _MAX_BYTES / _MIN_DIRTY).
FSYNC_EACH_MAX_FILES = 16
FSYNC_EACH_MAX_BYTES = 4 << 20
#: Per-file flushes only while at least this much data waits for write-back (/proc/meminfo Dirty +
#: Writeback): below it a syncfs has little besides the batch to write and its two calls beat N
#: fsyncs (each one a device cache flush: ~5-10 ms on this machine's virtio disk).
FSYNC_EACH_MIN_DIRTY = 16 << 20

#: statfs(2) f_type of filesystems whose syncfs does not reach the storage: FUSE forwards fsync and
#: fsyncdir to its server (FUSE_FSYNC, FUSE_FSYNCDIR) but syncfs only to servers that implement
#: FUSE_SYNCFS (virtiofs); nfsim (mfusepy) does not, so there syncfs makes nothing durable.
FUSE_SUPER_MAGIC = 0x65735546
NO_SYNCFS_FILESYSTEMS = frozenset({FUSE_SUPER_MAGIC})


@dataclass(frozen=True)
class FlushPolicy:
    """The server's choice (workers: PACKYARD_FLUSH_METHOD, PACKYARD_FLUSH_EACH_MAX_FILES,
    PACKYARD_FLUSH_EACH_MAX_BYTES). ``method`` None: :func:`choose_flush` decides per batch."""

    method: FlushMethod | None = None
    max_files: int = FSYNC_EACH_MAX_FILES
    max_bytes: int = FSYNC_EACH_MAX_BYTES
    min_dirty: int = FSYNC_EACH_MIN_DIRTY


AUTO = FlushPolicy()


def choose_flush(files: int, nbytes: int, fs_type: int | None, policy: FlushPolicy = AUTO, *,
                 dirty: int | None = None, have_syncfs: bool | None = None) -> FlushMethod:
    """The flush method for one batch of ``files`` tmp files holding ``nbytes`` bytes on a
    filesystem of statfs type ``fs_type`` (None: unknown), while ``dirty`` bytes of the machine's
    page cache wait for write-back (None: read /proc/meminfo now; unknown counts as a lot).

    The rule, in order:

    1. ``policy.method`` set (the server forced one): that method; SYNCFS where syncfs does not
       exist or does not reach the storage (FUSE) is refused with InvalidInputError, never
       silently weakened.
    2. No syncfs on this platform, or a filesystem whose syncfs does not reach the storage
       (FUSE: :data:`NO_SYNCFS_FILESYSTEMS`): FSYNC_EACH -- the only durable choice there.
    3. A small batch (at most ``policy.max_files`` files and ``policy.max_bytes`` bytes) while
       others' dirty data is waiting (at least ``policy.min_dirty`` bytes): FSYNC_EACH -- its flush
       costs what its own files cost, not what the filesystem holds dirty.
    4. Otherwise SYNCFS: two calls for the whole batch -- cheaper than N fsyncs when little else is
       dirty, and than thousands of fsyncs even when a neighbour's dirty data comes along.
    """
    syncfs_ok = durable.HAVE_SYNCFS if have_syncfs is None else have_syncfs
    reaches = syncfs_ok and fs_type not in NO_SYNCFS_FILESYSTEMS
    if policy.method is not None:
        if policy.method is FlushMethod.SYNCFS and not reaches:
            why = "not available on this platform" if not syncfs_ok else \
                f"not passed to the storage by this filesystem (statfs type {fs_type:#x})"
            raise InvalidInputError(f"flush method syncfs is {why}; use fsync_each or auto")
        return policy.method
    if not reaches:
        return FlushMethod.FSYNC_EACH
    if files <= policy.max_files and nbytes <= policy.max_bytes:
        if policy.min_dirty <= 0:
            return FlushMethod.FSYNC_EACH
        waiting = durable.dirty_bytes() if dirty is None else dirty
        if waiting is None or waiting >= policy.min_dirty:
            return FlushMethod.FSYNC_EACH
    return FlushMethod.SYNCFS


def dir_sync_for(method: FlushMethod) -> DirSync:
    """The directory step that goes with a flush method (one syncfs, or an fsync per directory)."""
    return DirSync.SYNCFS if method is FlushMethod.SYNCFS else DirSync.EACH


class _Statfs(ctypes.Structure):
    # struct statfs (Linux, 64-bit and 32-bit alike start with the word-sized f_type); the rest is
    # room for the kernel to write into.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


def filesystem_type(fd: int) -> int | None:
    """fstatfs(2)'s f_type of ``fd``'s filesystem (e.g. 0xEF53 ext4, 0x65735546 FUSE); None if unknown."""
    libc = durable._libc
    fn = getattr(libc, "fstatfs", None) if libc is not None else None
    if fn is None:
        return None
    buf = _Statfs()
    if fn(fd, ctypes.byref(buf)) != 0:
        return None
    return int(buf.f_type) & 0xFFFFFFFF


def parse_method(value: str) -> FlushMethod | None:
    """A setting's value: ``auto`` (None) or a method's name; anything else is an InvalidInputError."""
    if value in ("", "auto"):
        return None
    try:
        return FlushMethod(value)
    except ValueError:
        raise InvalidInputError(f"flush method must be auto, fsync_each or syncfs, not {value!r}") from None


__all__ = ["FlushMethod", "DirSync", "FlushPolicy", "AUTO", "choose_flush", "dir_sync_for", "filesystem_type",
           "parse_method", "FSYNC_EACH_MAX_FILES", "FSYNC_EACH_MAX_BYTES", "FSYNC_EACH_MIN_DIRTY", "FUSE_SUPER_MAGIC"]
