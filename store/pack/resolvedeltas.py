"""index-pack's phase 2, resolve: every delta of the received pack resolved to its object id and type.

Depth-first from each base, holding only the current chain of inflated objects
(:meth:`Resolver.resolve_tree`). With enough work (:func:`.indexpack.resolve_work`; the caller
decides) the bases are shared out to forked worker processes (:func:`run_workers`, on the protocol of
:mod:`packyard.store.forked`) that read the quarantined pack with pread and write the object ids and types
into shared anonymous mmaps; collisions and ``--strict`` state come back over a pipe. The thin phase
(:meth:`.thinbases.ThinBases.fix_unresolved`) resolves the subtrees of appended bases with the same
resolver. See :mod:`.indexpack` for the whole pipeline.

Not :mod:`.resolve`: that module applies ONE delta, with every check git makes; this one schedules the
resolution of a whole pack's deltas in this process or across forked ones. A module of its own because
the process handling (shared maps, the control block, pipes, reaping) is a unit that needs nothing of
the stream parser or the install.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import select
import struct
import time
import zlib
from contextlib import nullcontext
from functools import partial
from typing import Any, Sequence

from ..errors import PackFormatError, StoreError
from ..forked import PipeLock, child_main, kill_and_reap, read_outcome
from ..fsck import FsckOptions, FsckState
from ..progress import Progress
from .receive import Entries, ExistingIds, Stats, make_checker, strong_digest
from .resolve import TYPE_HEADER, apply_delta_checked

# --------------------------------------------------------------------------------------
# Phase 2: resolve deltas (depth-first from each base; only the chain is held).


class Resolver:
    """Shared state for resolving; forked workers inherit it (copy-on-write + shared mmaps)."""

    def __init__(self, e: Entries, fd: int, where: str, existing: ExistingIds, fsck: FsckOptions | None,
                 nslots: int) -> None:
        self.e = e
        self.fd = fd
        self.where = where
        self.existing = existing
        self.fsck_opts = fsck
        n = len(e)
        self.n = n
        # Shared between processes: object ids, resolved types, per-worker progress, work counter.
        self.shared_oids = mmap.mmap(-1, max(20 * n, 1))
        self.shared_oids[:20 * n] = e.oids
        self.rtypes = mmap.mmap(-1, max(n, 1))
        rt = bytes(t if t < 6 else 0 for t in e.types)
        self.rtypes[:n] = rt
        self.ctl = mmap.mmap(-1, 8 * (nslots + 4))
        self.nslots = nslots
        self.skip_duplicates = False             # the parallel thin path checks duplicates afterwards
        self.progress: Progress | None = None   # in-process only; forked workers report via ctl
        self.progress_base = 0
        self.progress_total = e.deltas

    def close(self) -> None:
        for m in (self.shared_oids, self.rtypes, self.ctl):
            m.close()

    # -- control block: [0] next root index, [1] abort flag, [4+w] progress of worker w
    def _ctl_get(self, k: int) -> int:
        return struct.unpack_from("<q", self.ctl, 8 * k)[0]

    def _ctl_set(self, k: int, v: int) -> None:
        struct.pack_into("<q", self.ctl, 8 * k, v)

    def resolved_count(self) -> int:
        return sum(self._ctl_get(4 + w) for w in range(self.nslots))

    def inflate(self, i: int) -> bytes:
        e = self.e
        start = e.offsets[i] + e.hdrlens[i]
        end = e.offsets[i + 1]
        raw = os.pread(self.fd, end - start, start)
        try:
            return zlib.decompress(raw, 15, max(e.sizes[i], 1))
        except zlib.error as err:  # verified while receiving; the file changed under us
            raise PackFormatError(f"entry no longer inflates: {err}", path=self.where, offset=e.offsets[i]) from err

    def children(self, i: int, oid: bytes) -> list[int]:
        e = self.e
        kids = []
        nxt = e.next_sibling
        c = e.first_child[i]
        while c >= 0:
            kids.append(c)
            c = nxt[c]
        c = e.ref_first.get(oid, -1)
        while c >= 0:
            kids.append(c)
            c = nxt[c]
        return kids

    def resolve_tree(self, root: int, base: bytes, rtype: int, oid: bytes, stats: Stats, slot: int,
                     counted: list[int]) -> None:
        """Resolve every delta below ``root`` depth-first, keeping only the current chain in memory."""
        e = self.e
        where = self.where
        offsets = e.offsets
        rtypes = self.rtypes
        shared = self.shared_oids
        existing = self.existing
        check_existing = not existing.empty
        fsck = make_checker(self.fsck_opts, stats)
        sha1 = hashlib.sha1
        header = TYPE_HEADER[rtype]
        kids = self.children(root, oid)
        stack: list[list] = [[base, kids, 0]] if kids else []
        del base
        while stack:
            frame = stack[-1]
            base, kids, k = frame
            ch = kids[k]
            if k + 1 == len(kids):
                stack.pop()          # last child: the base is no longer needed after this one
            else:
                frame[2] = k + 1
            if rtypes[ch]:
                # Reached twice: two objects with this delta's base id (git dies here too).
                if self.skip_duplicates:
                    continue
                raise PackFormatError("REF_DELTA already resolved (duplicate base object in the pack?)",
                                      path=where, offset=offsets[ch])
            delta = self.inflate(ch)
            obj = apply_delta_checked(base, delta, path=where, offset=offsets[ch])
            del delta
            h = sha1(header)
            h.update(b"%d\0" % len(obj))
            h.update(obj)
            coid = h.digest()
            shared[20 * ch:20 * ch + 20] = coid
            rtypes[ch] = rtype
            if check_existing and coid in existing:
                stats.collisions.append((ch, strong_digest(rtype, obj)))
            if fsck is not None:
                fsck.check(rtype, obj, coid, where=where, offset=offsets[ch])
            counted[0] += 1
            if counted[0] & 255 == 0:
                self._ctl_set(4 + slot, counted[0])
                if self.progress is not None:
                    self.progress("resolving", self.progress_base + counted[0], self.progress_total)
            ckids = self.children(ch, coid)
            if ckids:
                stack.append([obj, ckids, 0])
            del obj
        self._ctl_set(4 + slot, counted[0])

    def resolve_roots(self, roots: Sequence[int], slot: int, batch: int, lock) -> Stats:
        """Take batches of roots from the shared counter until none are left (or another worker failed)."""
        stats = Stats()
        counted = [0]
        e = self.e
        while True:
            with lock if lock is not None else nullcontext():
                start = self._ctl_get(0)
                self._ctl_set(0, start + batch)
            if start >= len(roots) or self._ctl_get(1):
                break
            for r in roots[start:start + batch]:
                self.resolve_tree(r, self.inflate(r), e.types[r], bytes(self.shared_oids[20 * r:20 * r + 20]),
                                  stats, slot, counted)
        return stats


def check_no_double_resolution(res: Resolver, e: Entries, where: str, among: Sequence[int] | None = None) -> None:
    """Two workers may both resolve a delta reachable twice (duplicate base): the counts tell."""
    rt = res.rtypes
    types = e.types
    idx = range(len(types)) if among is None else among
    distinct = sum(1 for i in idx if types[i] >= 6 and rt[i])
    if res.resolved_count() > distinct:
        raise PackFormatError("a REF_DELTA was resolved twice (duplicate base object in the pack?)", path=where)


def _resolve_share(res: "Resolver", roots: list[int], slot: int, batch: int,
                   lock: Any) -> tuple[list[tuple[int, bytes]], FsckState | None]:
    """In a forked resolver: resolve this slot's share of ``roots``; what the parent merges."""
    stats = res.resolve_roots(roots, slot, batch, lock)
    return stats.collisions, stats.fsck


def run_workers(res: Resolver, roots: list[int], nproc: int, progress: Progress | None,
                 total_deltas: int, progress_base: int = 0) -> tuple[list[Stats], int]:
    """Fork ``nproc`` workers over ``roots``; returns their stats and the max RSS among them (bytes)."""
    lock = PipeLock()
    batch = max(1, min(32, len(roots) // (nproc * 64) or 1))
    children: dict[int, tuple[int, int]] = {}   # pid -> (read fd, slot)
    results: dict[int, bytearray] = {}
    peak = 0
    try:
        for slot in range(nproc):
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # ---- child: never returns (store/forked.py's protocol)
                os.close(rfd)
                child_main(wfd, partial(_resolve_share, res, roots, slot, batch, lock),
                           on_failure=partial(res._ctl_set, 1, 1))   # tells the siblings to stop
            os.close(wfd)
            children[pid] = (rfd, slot)
            results[pid] = bytearray()
        open_fds = {rfd: pid for pid, (rfd, _slot) in children.items()}
        last = 0.0
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [], 0.1)
            for rfd in ready:
                chunk = os.read(rfd, 1 << 20)
                if chunk:
                    results[open_fds[rfd]] += chunk
                else:
                    os.close(rfd)
                    del open_fds[rfd]
            now = time.monotonic()
            if progress is not None and now - last >= 0.1:
                last = now
                progress("resolving", progress_base + res.resolved_count(), total_deltas)
        outs: list[Stats] = []
        errors: list[StoreError] = []
        crashes: list[str] = []
        for pid in list(children):
            _pid, status, rusage = os.wait4(pid, 0)
            del children[pid]
            peak = max(peak, rusage.ru_maxrss * 1024)
            out = read_outcome(bytes(results[pid]), status)
            if out.error is not None:
                errors.append(out.error)
            elif out.crash is not None:
                crashes.append(out.crash)
            else:
                st = Stats()
                st.collisions, st.fsck = out.value
                outs.append(st)
        if errors:
            raise min(errors, key=lambda err: err.offset if err.offset is not None else 1 << 62)
        if crashes:
            raise StoreError(f"delta resolver process failed: {crashes[0]}", path=res.where)
        return outs, peak
    finally:
        for pid, (rfd, _slot) in children.items():
            kill_and_reap(pid)
            try:
                os.close(rfd)
            except OSError:
                pass
        lock.close()
