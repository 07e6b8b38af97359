"""Independent filesystem calls issued together, so their round trips overlap.

Over NFS every metadata call (a lookup, an open, a rename, an unlink, a directory listing) is a round
trip to the server, and a kernel client keeps many in flight at once, but only from many callers: one
thread making 546 unlinks waits 546 round trips. git has the same problem and the same answer for its
index (``core.preloadIndex``: lstat()s spread over threads, "very helpful on NFS"). packyard issues the
calls that do not depend on each other -- opening the idx files of a snapshot, listing the loose fan-out
directories, reading the loose objects a repack packs, moving replaced packs to ``preserved/``, deleting
packed loose objects -- through :func:`each`, at most :func:`io_threads` at once, where they are round trips:
on a filesystem other hosts share (NFS, SMB, FUSE: ``SHARED_FILESYSTEMS``, or one ``fstatfs`` cannot name).
On a local disk a call takes microseconds and threads only add their own cost (546 loose reads of a full
repack: 0.14 s in 16 threads, a few ms in one), so there the calls run one after the other.

What runs in parallel is only ever a set of calls whose order does not matter to a reader or a crash: the
durability order (flush, renames with the idx last, directory sync, refs) stays sequential where it is
spelled out (:mod:`.install`); within one replaced pack the idx still moves first.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Calls in flight at once (the workers set it from PACKYARD_IO_THREADS; 1: one after the other).
DEFAULT_IO_THREADS = 16
#: Below this many items the calls run in this thread: a pool's start costs more than it saves on a local disk.
MIN_PARALLEL_ITEMS = 4

_io_threads = DEFAULT_IO_THREADS

#: statfs(2) f_type of filesystems other hosts' clients read through their own caches, where every metadata
#: call is a round trip: NFS, SMB/CIFS (two magics), FUSE (nfsim, and network filesystems served through FUSE).
SHARED_FILESYSTEMS = frozenset({0x6969, 0xFE534D42, 0xFF534D42, 0x65735546})


_shared: dict[str, bool] = {}
#: Paths whose answer is remembered (a repository's objects/ and objects/pack; cleared when full).
SHARED_CACHE_PATHS = 1024


def is_shared(path: str) -> bool:
    """Is ``path`` on a filesystem whose metadata calls are round trips to a server (``SHARED_FILESYSTEMS``, or a
    type ``fstatfs`` cannot name)? Asked once per path per process (a mount does not change under a path);
    False, and not remembered, for a path that cannot be opened (yet): its calls will fail on their own."""
    got = _shared.get(path)
    if got is not None:
        return got
    from .flush import filesystem_type

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fs = filesystem_type(fd)
    finally:
        os.close(fd)
    if len(_shared) >= SHARED_CACHE_PATHS:
        _shared.clear()
    _shared[path] = answer = fs is None or fs in SHARED_FILESYSTEMS
    return answer


def io_threads() -> int:
    return _io_threads


def set_io_threads(n: int) -> None:
    """How many independent filesystem calls :func:`each` keeps in flight (at least 1)."""
    global _io_threads
    if n < 1:
        raise ValueError(f"io threads must be at least 1, not {n}")
    _io_threads = n


def each(fn: Callable[[T], R], items: Iterable[T], *, where: str | Path | None = None,
         threads: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, with up to ``threads`` (default :func:`io_threads`) calls in flight -- when
    ``where`` (the directory the calls go to) is on a shared filesystem (:func:`is_shared`); one after the other
    in this thread on a local one.

    Results come in the items' order. Every call runs to its end even when one raises; then the first
    exception (in the items' order) is raised, so no call is left half-way behind a caller's error
    handling. A fresh pool per call: a pool would not survive the repack's fork into search processes.
    """
    work = list(items)
    if where is not None and not is_shared(str(where)):
        return [fn(x) for x in work]
    n = min(threads or _io_threads, len(work))
    if n <= 1 or len(work) < MIN_PARALLEL_ITEMS:
        return [fn(x) for x in work]
    return _pooled([functools.partial(fn, x) for x in work], n, "io")


def _pooled(calls: list[Callable[[], R]], threads: int, kind: str) -> list[R]:
    """The calls in a fresh pool of ``threads``; their results in order once all have ended, or the first
    exception (in the calls' order)."""
    from concurrent.futures import ThreadPoolExecutor  # (only on a shared filesystem: ~5 ms of imports, logging's)

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"packyard-{kind}-{os.getpid()}") as pool:
        futures = [pool.submit(call) for call in calls]
    out: list[R] = []
    for f in futures:          # (all done: the pool's exit waited for them)
        err = f.exception()
        if err is not None:
            raise err
        out.append(f.result())
    return out


def together(*steps: Callable[[], Any], where: str | Path | None = None) -> list[Any]:
    """``[step() for step in steps]``, the steps running at once (a thread each) when ``where`` is on a shared
    filesystem (:func:`is_shared`), one after the other in this thread on a local one. For independent sets of
    calls (each usually an :func:`each` of its own) whose round trips wait on different directories' locks: one
    after the other, the second set's round trips would wait for the first set's to end.

    Results come in the steps' order. Every step runs to its end even when another raises; then the first
    exception (in the steps' order) is raised."""
    if len(steps) <= 1 or where is None or not is_shared(str(where)):
        out: list[Any] = []
        first: BaseException | None = None
        for step in steps:
            try:
                out.append(step())
            except Exception as err:   # (the others still run; KeyboardInterrupt and the like stop at once)
                first = first or err
        if first is not None:
            raise first
        return out
    return _pooled(list(steps), len(steps), "steps")


__all__ = ["DEFAULT_IO_THREADS", "SHARED_FILESYSTEMS", "each", "io_threads", "is_shared", "set_io_threads",
           "together"]
