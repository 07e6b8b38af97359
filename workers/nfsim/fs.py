"""nfsim's filesystem: a FUSE passthrough over one backing directory that behaves like one NFS client.

Each mount is one simulated host. What it models (docs/nfs.md has the why of each):

* **attribute cache**: a path's attributes, once fetched, answer ``stat``/lookups for ``ac_attr``
  seconds (``ac_dir`` for directories) without a round trip -- another host's change is not seen
  meanwhile. Only positive entries are cached (as ``lookupcache=positive``): a name that did not exist
  is asked again each time.
* **directory-listing cache**: a directory's listing is kept with the directory's change token (mtime,
  ctime, size, nlink, inode: what an NFSv3 client compares). ``dir_revalidate="open"`` (default,
  close-to-open): each ``opendir`` fetches the directory's attributes (one round trip) and re-reads the
  listing only if the token changed -- so a change within one tick of the server's coarse clock can
  still be missed, as on NFS. ``dir_revalidate="trust"``: the listing is reused for ``ac_dir`` seconds
  without asking (a client that skips close-to-open for directories; the negative control).
* **close-to-open for files**: ``open`` always goes to the server (a deleted file is ENOENT at once).
* **ESTALE**: a read, write or fstat on a handle whose file was unlinked or replaced through another
  mount (its inode has no links left) fails with ESTALE -- NFS without silly-rename. A file unlinked
  through *this* mount while open stays readable (the client's silly-rename). A read of a file that lost the
  name it was opened by but still has a link elsewhere (a preserved/ link) is served, as an NFS server serves a
  file handle while its inode lives, and counted (``kept_reads``: the reads another link saved from ESTALE).
* **latency**: every metadata round trip (lookup, getattr, open, create, readdir, rename, unlink,
  fsync, setattr, mkdir, ...) sleeps ``latency`` seconds; reads and writes of open files do not.
* **counters**: round trips per kind, cache hits, ESTALE answers, renames and unlinks the server refused, the
  most round trips in flight at once (``max_in_flight``) (:meth:`NfsimOps.counters`), written as
  JSON to the counters file every half second, at unmount, and at once when anything stats the magic
  name ``/.nfsim-sync`` in the mount (the benchmarks' way to read exact figures).

Data reads go through the kernel's page cache (``auto_cache``: dropped when a file's mtime or size
changed at open) in big requests, so a Python daemon does not dominate the data path.

This module is the specification; ``_nfsimd.c`` is the same filesystem in C (what mounts use where it is
built: each request here costs ~0.2-0.9 ms of a core, a kernel NFS client's microseconds). A change to
one is a change to both: the tests run one workload through each and compare answers and counters.
One difference, from the FUSE API each runs on: this module runs on libfuse's high-level API (mfusepy), which
keys the kernel's inodes by *name*, so a file another host renames over a name takes over the old file's
inode here, and a reader's mapping of the old file then reads the new file's bytes. ``_nfsimd.c`` runs on the
low-level API and keys them by the file each name held, as an NFS client's inodes are the server's file
handles (the old mapping keeps reading the old file while it has a link, and is ESTALE once it has none).
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

import mfusepy

SYNC_NAME = "/.nfsim-sync"     # stat it: counters written now (ENOENT is the answer)
METADATA_KINDS = ("lookup", "getattr", "open", "create", "readdir", "rename", "unlink", "fsync",
                  "setattr", "mkdir", "rmdir", "link", "symlink", "readlink", "statfs", "access")
RENAME_NOREPLACE = 1
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2   # utimensat's markers (as mfusepy passes them: tv_sec 0)
FUSE_CAP_AUTO_INVAL_DATA = 1 << 12   # fuse_common.h

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100


def _renameat2(old: str, new: str, flags: int) -> None:
    if _libc.renameat2(_AT_FDCWD, os.fsencode(old), _AT_FDCWD, os.fsencode(new), ctypes.c_uint(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), old, None, new)


def _attrs(st: os.stat_result) -> dict[str, Any]:
    return {"st_mode": st.st_mode, "st_ino": st.st_ino, "st_nlink": st.st_nlink, "st_uid": st.st_uid,
            "st_gid": st.st_gid, "st_size": st.st_size, "st_blocks": st.st_blocks, "st_blksize": st.st_blksize,
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns,
            "st_rdev": st.st_rdev}


def _token(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What an NFSv3 client compares to decide a directory changed (no change attribute)."""
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink, st.st_ino


@dataclass
class _Handle:
    fd: int
    path: str
    dev: int
    ino: int


@dataclass
class _Listing:
    fetched: float
    token: tuple[int, int, int, int, int]
    entries: list[tuple[str, int, int]]   # name, file type bits, inode (use_ino: a 0 inode hides the entry)


class NfsimOps(mfusepy.Operations):
    """One simulated NFS client over ``backing`` (see the module doc)."""

    use_ns = True

    def __init__(self, backing: str, *, ac_attr: float = 3.0, ac_dir: float = 3.0, latency: float = 0.001,
                 dir_revalidate: str = "open", counters_path: str | None = None, trace_path: str | None = None) -> None:
        if dir_revalidate not in ("open", "trust"):
            raise ValueError(f"dir_revalidate must be 'open' or 'trust', not {dir_revalidate!r}")
        self.root = os.path.realpath(backing)
        self.ac_attr, self.ac_dir, self.latency = ac_attr, ac_dir, latency
        self.dir_revalidate = dir_revalidate
        self.counters_path = counters_path
        # One line per round trip ("kind path"), line-buffered: where a workload's round trips go.
        self._trace = open(trace_path, "a", buffering=1) if trace_path else None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._attr: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lists: dict[str, _Listing] = {}
        self._files: dict[int, _Handle] = {}
        # open directories: (path, change token, entries; None until the first readdir fetches them)
        self._dirs: dict[int, tuple[str, tuple[int, int, int, int, int], list[tuple[str, int, int]] | None]] = {}
        self._next_fh = 1
        self._silly: set[tuple[int, int]] = set()   # inodes this mount unlinked while it had them open
        self._count: dict[str, int] = dict.fromkeys(METADATA_KINDS, 0)
        self._count.update(attr_hits=0, readdir_hits=0, estale=0, kept_reads=0, reads=0, writes=0, read_bytes=0,
                           written_bytes=0, failed_renames=0, failed_unlinks=0, max_in_flight=0)
        self._in_flight = 0
        self._oversleep = 0.0
        self._slept = 0.0
        self._dirty = True
        self._stop = threading.Event()

    # -- bookkeeping -------------------------------------------------------
    def _b(self, path: str) -> str:
        return self.root + path

    def _rt(self, kind: str, path: str, share: float = 1.0) -> None:
        """One round trip to the server about ``path``: counted (and traced), and it costs ``latency``
        (``share`` of it now: an operation that also waits for its reply after the server acted sleeps the
        rest itself)."""
        with self._lock:
            if self._trace is not None:
                self._trace.write(f"{kind} {path}\n")
            self._count[kind] += 1
            self._slept += self.latency
            self._dirty = True
            self._in_flight += 1
            if self._in_flight > self._count["max_in_flight"]:
                self._count["max_in_flight"] = self._in_flight
        try:
            self._sleep(self.latency * share)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _sleep(self, s: float) -> None:
        """Sleep ``s`` seconds on average: less by how much longer than asked a sleep takes here (the machine's
        wake-up latency, ~0.3 ms on a 1 ms sleep in a small VM; a moving average), so a round trip costs the
        latency asked for, not 1.3 times it."""
        if s <= 0:
            return
        with self._lock:
            ask = s - self._oversleep
        if ask <= 0:
            return
        t0 = time.monotonic()
        time.sleep(ask)
        over = max(0.0, time.monotonic() - t0 - ask)
        with self._lock:
            self._oversleep = min(s / 2, 0.9 * self._oversleep + 0.1 * over)

    def _bump(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._count[kind] += n
            self._dirty = True

    def counters(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self._count)
            out["metadata_calls"] = sum(self._count[k] for k in METADATA_KINDS)
            out["latency_s"] = round(self._slept, 6)
            self._dirty = False
        return out

    def write_counters(self) -> None:
        """The counters as JSON into the counters file (a temp file renamed over it), one writer at a time: the
        half-second writer and a stat of the sync name would otherwise write the same temp file together."""
        if not self.counters_path:
            return
        with self._write_lock:
            data = json.dumps(self.counters(), sort_keys=True)
            tmp = f"{self.counters_path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(data)
            os.replace(tmp, self.counters_path)

    def _writer(self) -> None:
        while not self._stop.wait(0.5):
            if self._dirty:
                self.write_counters()

    def _forget(self, path: str) -> None:
        """This mount changed ``path``: its own caches for it and its parent are dropped (post-op attrs)."""
        parent = os.path.dirname(path) or "/"
        with self._lock:
            self._attr.pop(path, None)
            self._attr.pop(parent, None)
            self._lists.pop(parent, None)
            self._lists.pop(path, None)

    def _changed(self, path: str) -> None:
        """This mount changed ``path`` and the server's reply carried its post-op attributes (NFSv3's SETATTR,
        MKDIR, LINK, SYMLINK replies do; RENAME's and REMOVE's do not): :meth:`_forget`, then those attributes
        are cached, so the getattr libfuse makes after the call is answered here, as a kernel client needs no
        LOOKUP after such a reply."""
        self._forget(path)
        try:
            self._remember(path, os.lstat(self._b(path)))
        except OSError:
            pass

    def _remember(self, path: str, st: os.stat_result) -> dict[str, Any]:
        a = _attrs(st)
        with self._lock:
            self._attr[path] = (time.monotonic(), a)
        return a

    def _cached(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._attr.get(path)
        if hit is None:
            return None
        at, a = hit
        hold = self.ac_dir if stat.S_ISDIR(a["st_mode"]) else self.ac_attr
        if time.monotonic() - at >= hold:
            return None
        self._bump("attr_hits")
        return a

    def _stale(self, h: _Handle) -> os.stat_result:
        """fstat of the handle's file; ESTALE if its inode was removed through another mount (and this client
        forgets the attributes it cached for the name: they described that inode)."""
        st = os.fstat(h.fd)
        if st.st_nlink == 0 and (h.dev, h.ino) not in self._silly:
            self._bump("estale")
            if self._trace is not None:
                with self._lock:
                    self._trace.write(f"estale {h.path}\n")
            self._gone(h.path, h.ino)
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), h.path)
        return st

    def _kept_read(self, h: _Handle, st: os.stat_result) -> None:
        """A read of a file that has a link but no longer the name it was opened by (removed or replaced, through
        any mount): an NFS server serves it through the file handle; without that other link (a preserved/ link)
        it would be ESTALE. Counted as ``kept_reads``."""
        if st.st_nlink == 0:
            return
        try:
            now = os.lstat(self._b(h.path))
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return
        except OSError:
            pass
        self._bump("kept_reads")

    def _gone(self, path: str, ino: int | None = None) -> None:
        """The server said ``path`` (or the inode ``ino`` it named) is gone: drop the name's cached attributes,
        and the parent directory's, so the next ``stat`` asks the server. A Linux NFS client does the same: an
        open whose revalidation finds the file gone (ESTALE, then ENOENT on the fresh lookup) drops the dentry
        and marks the directory for revalidation (``nfs_mark_dir_for_revalidate``). Without it ``lstat`` kept
        answering "exists" from the attribute cache while every ``open`` said ENOENT, and git, which retries an
        lstat/open mismatch only three times, read a ref another host had just pruned as broken (docs/nfs.md)."""
        parent = os.path.dirname(path) or "/"
        with self._lock:
            hit = self._attr.get(path)
            if hit is not None and (ino is None or hit[1]["st_ino"] == ino):
                del self._attr[path]
            self._attr.pop(parent, None)

    def _open_inodes(self) -> set[tuple[int, int]]:
        with self._lock:
            return {(h.dev, h.ino) for h in self._files.values()}

    def _will_remove(self, path: str) -> None:
        """Silly-rename: a file this mount has open stays readable here after this mount removes it."""
        try:
            st = os.lstat(self._b(path))
        except OSError:
            return
        if (st.st_dev, st.st_ino) in self._open_inodes():
            with self._lock:
                self._silly.add((st.st_dev, st.st_ino))

    def _add_handle(self, fd: int, path: str) -> int:
        st = os.fstat(fd)
        self._remember(path, st)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._files[fh] = _Handle(fd, path, st.st_dev, st.st_ino)
        return fh

    # -- lifecycle ---------------------------------------------------------
    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        if conn_info is not None:
            # No GETATTR upcall before every read (the kernel's auto_inval_data): the page cache is
            # revalidated at open (auto_cache), as an NFS client's close-to-open does.
            conn_info.want &= ~FUSE_CAP_AUTO_INVAL_DATA
        threading.Thread(target=self._writer, name="nfsim-counters", daemon=True).start()

    def destroy(self, path: str) -> None:
        self._stop.set()
        self.write_counters()

    # -- attributes --------------------------------------------------------
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:  # type: ignore[override]
        if fh is not None and fh in self._files:
            h = self._files[fh]
            a = self._cached(h.path)
            if a is not None and a["st_ino"] == h.ino:
                return a
            self._rt("getattr", h.path)
            return self._remember(h.path, self._stale(h))
        if path is None:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))   # (a node libfuse no longer has a name for)
        if path == SYNC_NAME:
            self.write_counters()
            raise OSError(errno.ENOENT, "nfsim counters written")
        a = self._cached(path)
        if a is not None:
            return a
        self._rt("lookup", path)
        return self._remember(path, os.lstat(self._b(path)))

    def access(self, path: str, amode: int) -> int:
        self._rt("access", path)
        if not os.access(self._b(path), amode):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._rt("setattr", path)
        os.chmod(self._b(path), mode)
        self._changed(path)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._rt("setattr", path)
        os.lchown(self._b(path), uid, gid)
        self._changed(path)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._rt("setattr", path)
        if times is None:
            os.utime(self._b(path), follow_symlinks=False)
        else:
            os.utime(self._b(path), ns=self._times(path, times), follow_symlinks=False)
        self._changed(path)
        return 0

    def _times(self, path: str, times: tuple[int, int]) -> tuple[int, int]:
        """libfuse hands ``utimensat``'s markers through as times (tv_sec 0, tv_nsec UTIME_NOW or UTIME_OMIT, which
        mfusepy reads as nanoseconds): "now" is the server's clock (NFS's SET_TO_SERVER_TIME), "omit" the time the
        file has. Taken literally, every ``os.utime(path)`` -- packyard's freshen, ``touch`` -- set 1970-01-01."""
        if UTIME_NOW not in times and UTIME_OMIT not in times:
            return times
        now = time.time_ns()
        st = os.lstat(self._b(path)) if UTIME_OMIT in times else None
        kept = (st.st_atime_ns, st.st_mtime_ns) if st is not None else (0, 0)
        return (now if times[0] == UTIME_NOW else kept[0] if times[0] == UTIME_OMIT else times[0],
                now if times[1] == UTIME_NOW else kept[1] if times[1] == UTIME_OMIT else times[1])

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._rt("setattr", path)
        if fh is not None and fh in self._files:
            h = self._files[fh]
            self._stale(h)
            os.ftruncate(h.fd, length)
            self._changed(h.path)
        else:
            os.truncate(self._b(path), length)
            self._changed(path)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self._rt("statfs", path)
        sv = os.statvfs(self._b(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}

    # -- names ---------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        self._rt("mkdir", path)
        os.mkdir(self._b(path), mode)
        self._changed(path)
        return 0

    def rmdir(self, path: str) -> int:
        self._rt("rmdir", path)
        os.rmdir(self._b(path))
        self._forget(path)
        return 0

    def unlink(self, path: str) -> int:
        self._rt("unlink", path)
        self._will_remove(path)
        try:
            os.unlink(self._b(path))
        except OSError:
            self._bump("failed_unlinks")
            raise
        self._forget(path)
        return 0

    def rename2(self, old: str, new: str, flags: int) -> int:
        self._rt("rename", old)
        if not flags & RENAME_NOREPLACE:
            self._will_remove(new)
        try:
            if flags:
                _renameat2(self._b(old), self._b(new), flags)
            else:
                os.rename(self._b(old), self._b(new))
        except OSError:
            self._bump("failed_renames")
            raise
        self._forget(old)
        self._forget(new)
        return 0

    def rename(self, old: str, new: str) -> int:
        return self.rename2(old, new, 0)

    def link(self, target: str, source: str) -> int:
        self._rt("link", target)
        os.link(self._b(source), self._b(target))
        self._changed(source)
        self._changed(target)
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._rt("symlink", target)
        os.symlink(source, self._b(target))
        self._changed(target)
        return 0

    def readlink(self, path: str) -> str:
        self._rt("readlink", path)
        return os.readlink(self._b(path))

    # -- directories ---------------------------------------------------------
    def _fetch_listing(self, path: str, token: tuple[int, int, int, int, int]) -> _Listing:
        """One READDIRPLUS round trip: the names, and each entry's attributes into the attribute cache (what
        a Linux NFSv3 client asks for when a listing is followed by stats of its entries)."""
        self._rt("readdir", path)
        here = os.stat(self._b(path))
        parent = os.stat(self._b(os.path.dirname(path) if path != "/" else path))
        entries: list[tuple[str, int, int]] = [(".", stat.S_IFDIR, here.st_ino), ("..", stat.S_IFDIR, parent.st_ino)]
        attrs: list[tuple[str, dict[str, Any]]] = []
        prefix = path.rstrip("/") + "/"
        with os.scandir(self._b(path)) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue   # (gone since the server listed it)
                entries.append((e.name, stat.S_IFMT(st.st_mode), st.st_ino))
                attrs.append((prefix + e.name, _attrs(st)))
        now = time.monotonic()
        listing = _Listing(now, token, entries)
        with self._lock:
            self._lists[path] = listing
            for name, a in attrs:
                self._attr[name] = (now, a)
        return listing

    def opendir(self, path: str) -> int:
        """Close-to-open for a directory: its attributes, fresh (one round trip), decide whether the cached
        listing still holds; a changed one is fetched by the first :meth:`readdir`, as an NFS client reads a
        directory's entries only when asked for them (an open for ``fsync`` or ``fstatfs`` reads none)."""
        with self._lock:
            cached = self._lists.get(path)
        entries: list[tuple[str, int, int]] | None = None
        if self.dir_revalidate == "trust" and cached is not None and time.monotonic() - cached.fetched < self.ac_dir:
            self._bump("readdir_hits")
            tok, entries = cached.token, cached.entries
        else:
            self._rt("getattr", path)    # close-to-open: the directory's attributes, fresh
            st = os.stat(self._b(path))
            self._remember(path, st)
            tok = _token(st)
            if cached is not None and cached.token == tok:
                self._bump("readdir_hits")
                entries = cached.entries
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._dirs[fh] = (path, tok, entries)
        return fh

    def readdir(self, path: str, fh: int) -> list:  # type: ignore[override]
        where, tok, entries = self._dirs.get(fh, (path, (0, 0, 0, 0, 0), []))
        if entries is None:
            entries = self._fetch_listing(where, tok).entries
            with self._lock:
                self._dirs[fh] = (where, tok, entries)
        return [(name, {"st_mode": kind, "st_ino": ino}, 0) for name, kind, ino in entries]

    def releasedir(self, path: str, fh: int) -> int:
        with self._lock:
            self._dirs.pop(fh, None)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._rt("fsync", path)
        fd = os.open(self._b(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    # -- files ---------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:  # type: ignore[override]
        self._rt("open", path, 0.5)      # close-to-open: always asks the server; half the trip there...
        try:
            fd = os.open(self._b(path), flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY) | os.O_CLOEXEC)
        except FileNotFoundError:
            self._gone(path)   # deleted through another host: this client's cached "it exists" goes too
            raise
        if flags & os.O_TRUNC:
            self._forget(path)
        fh = self._add_handle(fd, path)
        self._sleep(self.latency / 2)   # ...and half back: another host can delete the file meanwhile
        return fh

    def create(self, path: str, mode: int, fi: Any = None) -> int:  # type: ignore[override]
        self._rt("create", path)
        flags = (fi if isinstance(fi, int) else os.O_WRONLY) | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(self._b(path), flags, mode)
        self._forget(path)
        return self._add_handle(fd, path)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        h = self._files[fh]
        self._kept_read(h, self._stale(h))
        data = os.pread(h.fd, size, offset)
        with self._lock:
            self._count["reads"] += 1
            self._count["read_bytes"] += len(data)
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        h = self._files[fh]
        self._stale(h)
        n = os.pwrite(h.fd, data, offset)
        self._remember(h.path, os.fstat(h.fd))   # the reply's post-op attributes: no extra round trip
        with self._lock:
            self._count["writes"] += 1
            self._count["written_bytes"] += n
        return n

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._rt("fsync", path)
        h = self._files[fh]
        self._stale(h)
        (os.fdatasync if datasync else os.fsync)(h.fd)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            h = self._files.pop(fh, None)
        if h is not None:
            os.close(h.fd)
        return 0


class NfsimFUSE(mfusepy.FUSE):
    """mfusepy's FUSE, passing rename's flags (RENAME_NOREPLACE) through instead of dropping them."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        ops: NfsimOps = self.operations
        return ops.rename2(old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags)


def serve(backing: str, mountpoint: str, *, ac_attr: float, ac_dir: float, latency: float,
          dir_revalidate: str = "open", counters_path: str | None = None, fsname: str = "nfsim",
          trace_path: str | None = None) -> None:
    """Mount and serve until unmounted (foreground, multithreaded)."""
    ops = NfsimOps(backing, ac_attr=ac_attr, ac_dir=ac_dir, latency=latency, dir_revalidate=dir_revalidate,
                   counters_path=counters_path, trace_path=trace_path)
    # The kernel keeps positive names (entry_timeout: an NFS client's dcache, revalidated within its attribute
    # cache time) so a path walk is not one Python upcall per component; never negative ones, and no
    # attributes (every stat and open asks this client, whose caches above decide: close-to-open stays exact).
    # Data pages stay in its page cache (auto_cache drops them when mtime/size changed at open;
    # init_with_config turns off auto_inval_data: no GETATTR upcall before every read). No flush handler: the
    # kernel stops sending FLUSH at each close (writes reach the backing file at once).
    hold = min(ac_attr, ac_dir)
    NfsimFUSE(ops, mountpoint, foreground=True, nothreads=False, fsname=fsname, subtype="nfsim",
              attr_timeout=0, entry_timeout=hold, negative_timeout=0, ac_attr_timeout=0, auto_cache=True,
              use_ino=True, hard_remove=True, max_threads=64, max_idle_threads=64)
