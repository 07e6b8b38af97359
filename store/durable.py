"""Durability primitives: the only place that talks to fsync and friends.

Each helper is one step of git's bulk-checkin ordering (git's bulk-checkin.c and
write-or-die.c, ``core.fsyncMethod=batch``): start write-out cheaply for many files, one
real flush, then renames, then fsync the directories so the renames survive. Callers go
through store/install.py (packs and their companions) or call these helpers directly
(loose objects, refs, small files).
Counters record every call so jobs and benchmarks can report them.
"""
from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass, field
from typing import Callable

from .errors import WriteFailedError

# sync_file_range(2) flags (linux/fs.h)
_SYNC_FILE_RANGE_WRITE = 2


def _load_libc() -> ctypes.CDLL | None:
    """The C library's symbols: the running process's own (dlopen(NULL), no search), else
    ctypes.util.find_library, which spawns ldconfig/gcc -- ~15 ms per process start."""
    for name in (None, "libc.so.6"):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.syncfs  # noqa: B018 - probe: a C library, not an empty handle
            return lib
        except (OSError, AttributeError):
            continue
    try:
        from ctypes.util import find_library
        return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_libc = _load_libc()
_sync_file_range = None
if hasattr(os, "sync_file_range"):  # not in CPython today, but prefer it if it appears
    _sync_file_range = os.sync_file_range  # type: ignore[attr-defined]
elif _libc is not None:
    try:
        _fn = _libc.sync_file_range
        _fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        _fn.restype = ctypes.c_int
        _sync_file_range = _fn
    except AttributeError:
        _sync_file_range = None

HAVE_WRITEOUT = _sync_file_range is not None


@dataclass
class DurabilityCounters:
    """How many durability calls a job made (reported on the job record)."""

    writeouts: int = 0       # sync_file_range(WRITE): start write-out, do not wait
    flushes: int = 0         # fsync/fdatasync of a file (or syncfs)
    dir_fsyncs: int = 0      # fsync of a directory (makes renames durable)
    renames: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {"writeouts": self.writeouts, "flushes": self.flushes,
                "dir_fsyncs": self.dir_fsyncs, "renames": self.renames, **self.extra}


def start_writeout(fd: int, counters: DurabilityCounters | None = None) -> bool:
    """Ask the kernel to start writing a file's dirty pages, without waiting.

    Returns False where the platform has no such call; the caller then relies on
    the full flush (correct, slower).
    """
    if _sync_file_range is None:
        return False
    if _libc is not None:
        rc = _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
        if rc != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
                return False
            raise OSError(err, os.strerror(err))
    else:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    if counters is not None:
        counters.writeouts += 1
    return True


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written (a short write is not an error; its error is raised)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def unlink_if_present(path: str | os.PathLike[str]) -> bool:
    """Remove ``path``; False if it was already gone (another cleaner or the writer got there first)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def flush_file(fd: int, counters: DurabilityCounters | None = None) -> None:
    """fsync one file: its data and metadata are on stable storage when this returns."""
    os.fsync(fd)
    if counters is not None:
        counters.flushes += 1


def fsync_dir(path: str | os.PathLike[str], counters: DurabilityCounters | None = None) -> None:
    """fsync a directory so the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fsync_dir_fd(fd, counters)
    finally:
        os.close(fd)


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str],
           counters: DurabilityCounters | None = None) -> None:
    """Atomic rename within one directory tree (replaces ``dst`` if present)."""
    os.replace(src, dst)
    if counters is not None:
        counters.renames += 1


def publish_file(tmp: str | os.PathLike[str], dst: str | os.PathLike[str], data: bytes, *, mode: int = 0o444,
                 counters: DurabilityCounters | None = None, between: Callable[[], object] | None = None,
                 what: str | None = None) -> None:
    """Create ``tmp`` (O_EXCL: never another writer's), write ``data``, fsync it, call ``between`` (the
    caller's fault point between the flush and the rename), rename it onto ``dst``. On any failure ``tmp``
    is removed; an OSError is raised as WriteFailedError("writing <what> failed") naming ``tmp`` when
    ``what`` is given, as it is otherwise. The caller fsyncs the directory."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            write_all(fd, data)
            flush_file(fd, counters)
        finally:
            os.close(fd)
        if between is not None:
            between()
        rename(tmp, dst, counters)
    except BaseException as err:
        unlink_if_present(tmp)
        if what is not None and isinstance(err, OSError):
            raise WriteFailedError(f"writing {what} failed: {err.strerror}", errno=err.errno,
                                   path=tmp) from err
        raise


def write_file_durably(path: str | os.PathLike[str], data: bytes, mode: int = 0o444,
                       counters: DurabilityCounters | None = None) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory: write, fsync, rename, fsync dir."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    publish_file(os.path.join(directory, f".tmp-{os.getpid()}-{os.path.basename(path)}"), path, data,
                 mode=mode, counters=counters)
    fsync_dir(directory, counters)


# -- syncfs(2) and renameat2(RENAME_NOREPLACE): one flush for a whole batch, a publish that never replaces --
_RENAME_NOREPLACE = 1  # linux/fs.h
_AT_FDCWD = -100
_syncfs = getattr(_libc, "syncfs", None) if _libc is not None else None
if _syncfs is not None:
    _syncfs.argtypes = [ctypes.c_int]
    _syncfs.restype = ctypes.c_int
_renameat2 = getattr(_libc, "renameat2", None) if _libc is not None else None
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int

HAVE_SYNCFS = _syncfs is not None


def sync_filesystem(fd: int, counters: DurabilityCounters | None = None) -> None:
    """syncfs(2): write and wait for every dirty page and inode of ``fd``'s filesystem, then
    flush the device cache. Reports writeback errors seen since ``fd`` was opened (Linux >= 5.8),
    so open ``fd`` before writing the files it must cover."""
    if _syncfs is None:
        raise OSError(errno.ENOSYS, "syncfs not available on this platform")
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    if counters is not None:
        counters.flushes += 1
        counters.extra["syncfs"] = counters.extra.get("syncfs", 0) + 1


def rename_noreplace(src: str | bytes | os.PathLike[str], dst: str | bytes | os.PathLike[str],
                     counters: DurabilityCounters | None = None, *, dir_fd: int | None = None) -> bool:
    """Atomic rename that never replaces ``dst``; False if ``dst`` already exists.

    renameat2(RENAME_NOREPLACE) where the kernel and filesystem support it; elsewhere
    a check then rename (a racing writer of the same object id wrote the same bytes, so
    the narrow window can only replace an object with an identical, durable copy).
    With ``dir_fd`` both names are relative to that directory (no path walk per call).
    """
    at = _AT_FDCWD if dir_fd is None else dir_fd
    placed = _renameat2_noreplace(at, os.fsencode(src), os.fsencode(dst))
    if placed is not None:
        if placed and counters is not None:
            counters.renames += 1
        return placed
    try:
        os.stat(dst, dir_fd=dir_fd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        pass
    os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if counters is not None:
        counters.renames += 1
    return True


def _renameat2_noreplace(at: int, src: bytes, dst: bytes) -> bool | None:
    """renameat2(RENAME_NOREPLACE): True renamed, False ``dst`` exists, None not supported here."""
    if _renameat2 is None:
        return None
    if _renameat2(at, src, at, dst, _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    if err in (errno.EINVAL, errno.ENOSYS):
        return None
    raise OSError(err, os.strerror(err), os.fsdecode(src), None, os.fsdecode(dst))


def rename_noreplace_at(dir_fd: int, src: bytes, dst: bytes) -> bool:
    """:func:`rename_noreplace` for two names in one open directory, as bytes, uncounted:
    the per-object loop of a bulk publish (no path encoding or counting per call)."""
    placed = _renameat2_noreplace(dir_fd, src, dst)
    return rename_noreplace(src, dst, dir_fd=dir_fd) if placed is None else placed


def dirty_bytes() -> int | None:
    """Bytes of the page cache waiting for write-back, machine-wide (/proc/meminfo Dirty + Writeback):
    what a syncfs may have to write besides the caller's files. None where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total, seen = 0, 0
    for line in text.splitlines():
        if line.startswith((b"Dirty:", b"Writeback:")):
            total += int(line.split()[1]) * 1024
            seen += 1
    return total if seen == 2 else None


def fsync_dir_fd(fd: int, counters: DurabilityCounters | None = None) -> None:
    """fsync an already open directory (same as :func:`fsync_dir`, without reopening it)."""
    os.fsync(fd)
    if counters is not None:
        counters.dir_fsyncs += 1


_RENAME_EXCHANGE = 2  # linux/fs.h


def exchange(a: str | os.PathLike[str], b: str | os.PathLike[str],
             counters: DurabilityCounters | None = None) -> bool:
    """Swap two names atomically (renameat2(RENAME_EXCHANGE)): each then names what the other named, with no
    moment at which either is absent. False where the kernel or filesystem cannot (nothing changed then); the
    caller falls back to two renames. The caller fsyncs the directory."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        if counters is not None:
            counters.renames += 1
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))
