"""index-pack: turn an incoming packfile into an installed pack (+ idx + rev) in a repository.

Pipeline (each phase timed in :attr:`IndexPackResult.elapsed`), run in order by
:class:`IncomingPack`: ``begin`` does phases 1-5, ``commit`` phases 6-7.

1. **receive** (:mod:`.receive`) — the source (path or stream) is read ONCE, in
   chunks, and written into ``objects/incoming-<random>/tmp_pack_*`` while it is
   parsed: header, object count, each entry's type/size header, the bounds of each
   zlib stream (inflated to verify; non-delta objects are hashed), CRC32 per
   entry, the trailing SHA-1. Nothing is allocated from a declared size: a
   zlib stream is inflated with ``max_length = declared size + 1`` (large
   objects in bounded chunks), so a 2^60-byte header costs nothing.
2. **resolve** (:mod:`.resolvedeltas`) — OFS_DELTA and REF_DELTA children are
   resolved depth-first from each base, holding only the current chain of
   inflated objects. The bases are shared out to forked worker processes (one
   per core) which read the quarantined pack with pread and write the object ids
   and types into a shared anonymous mmap; they report collisions/strict links
   over a pipe.
3. **thin** (``fix_thin``; :mod:`.thinbases`) —
   REF_DELTA bases missing from the pack are read from the repository, appended
   as full objects (zlib level 1, in the order ``git index-pack --fix-thin``
   uses), the header count and trailer are rewritten; the appended bases'
   subtrees are resolved by phase 2's resolver. For many unresolved deltas all
   bases are appended at once and their subtrees resolved on all cores, then
   checked to be exactly git's order (else redone sequentially, as git does).
   A delta reached twice (duplicate base object) is refused, as git refuses it.
4. **check** (:meth:`IncomingPack._check_collisions` and ``_check_links``, here) —
   collision check: an incoming object whose id already exists must have the
   same content. Existence comes from ONE :meth:`ObjectDirectory.snapshot` taken
   before the pack is read (held by :class:`.receive.ExistingIds`): no
   per-object stat/open/readdir (seed 000_9777a3acf68a3210.txt). With
   ``strict``, objects linked from incoming commits/trees/tags must exist.
5. **index** — ``.idx`` v2 and ``.rev`` written (:mod:`.idxwrite`), byte-identical to git's.
6. **install** — see :meth:`IncomingPack.commit` for the durability order (:mod:`..install`).
7. **refs** — optional all-or-nothing compare-and-swap ref updates.

Any failure before install raises a typed :class:`StoreError` naming the
entry offset, removes the quarantine and leaves the repository unchanged.

Phases 1-3 are modules of their own: the stream parser (with the entry table it
fills), the delta resolver (with its forked workers) and the thin bases. This
module keeps the orchestration -- :class:`IncomingPack`, which runs them, phases
4-7 and the choice to fork (:func:`resolve_work`, :data:`FORK_MIN_DELTAS`) -- with
:class:`IndexPackResult` and :func:`index_pack`.
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
import zlib
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, ContextManager, Sequence

from .. import durable
from ..errors import (
    CollisionError,
    InvalidInputError,
    ObjectMissingError,
    PackFormatError,
    WriteFailedError,
)
from ..faults import fault_point
from ..fsck import STRICT, FsckChecker, FsckOptions, FsckState
from ..fsck.linkset import select20, sort_unique20
from ..install import InstallOutcome, PackFiles, install_pack, update_refs
from ..lease import Lease, token_of
from ..lease import check as check_lease
from ..objects import ObjectType
from ..owner import with_owner
from ..refs import RefUpdate
from .idxwrite import DEFAULT_OFF32_LIMIT, write_index
from .quarantine import create_quarantine
from .receive import (
    Entries,
    ExistingIds,
    Receiver,
    Stats,
    open_source,
    source_label,
    strong_digest,
)
from .resolvedeltas import Resolver, check_no_double_resolution, run_workers
from .thinbases import ThinBases

if TYPE_CHECKING:
    from ..objdir import ObjectSnapshot

from ..progress import Progress

#: Forking resolver processes costs ~5 ms; resolving in-process costs ~8 us per delta plus ~0.7 ns per byte it
#: produces (applied and hashed). Measured on 2 cores (packs of git v1.0.0 with 169 to 3,556 deltas, and bench
#: pool's thin push: 1,962 deltas of git.git's Makefile, 100 MB of results), forking pays from about 20 ms of
#: in-process work: :func:`resolve_work`, in deltas of small objects, at least this many.
FORK_MIN_DELTAS = 2000
#: a delta counts once, plus once per this many bytes its header says it produces
DELTA_WORK_BYTES = 12_000


def resolve_work(entries: Entries) -> int:
    """The work of resolving ``entries``' deltas, in deltas of small objects (compared with FORK_MIN_DELTAS):
    a pack of 1,000 deltas of 100 kB blobs is worth forking, one of 1,000 small tree deltas is not."""
    return entries.deltas + entries.result_bytes // DELTA_WORK_BYTES


@dataclass(frozen=True)
class IndexPackResult:
    outcome: InstallOutcome
    pack_name: str            # "pack-<hex checksum>"
    checksum: str             # hex pack checksum (trailer)
    pack_path: Path
    idx_path: Path
    rev_path: Path
    keep_path: Path | None    # the .keep this call created (release with release_keep)
    objects: int
    deltas: int
    bytes: int                # size of the installed pack file
    received_bytes: int       # bytes read from the source
    thin_bases_added: int
    collisions_checked: int   # incoming objects that already existed (content compared)
    large_offsets: int        # idx entries in the 64-bit offset table
    workers: int              # resolver processes used (1 = in-process)
    thin_workers: int = 1     # processes that resolved the deltas on appended thin bases
    elapsed: dict[str, float] = field(default_factory=dict)
    peak_rss: int = 0         # bytes: max over this process and its resolver processes
    peak_rss_workers: int = 0
    refs_updated: tuple[str, ...] = ()
    durability: dict[str, int] = field(default_factory=dict)

    def as_counters(self) -> dict[str, object]:
        """Flat counters for a job record."""
        out: dict[str, object] = {
            "objects": self.objects, "deltas": self.deltas, "bytes": self.bytes,
            "received_bytes": self.received_bytes, "thin_bases_added": self.thin_bases_added,
            "collisions_checked": self.collisions_checked, "workers": self.workers,
            "thin_workers": self.thin_workers,
            "peak_rss": self.peak_rss, "peak_rss_workers": self.peak_rss_workers,
            "outcome": self.outcome.value, "pack": self.pack_name,
        }
        for phase, secs in self.elapsed.items():
            out[f"elapsed_{phase}"] = round(secs, 4)
        for key, val in self.durability.items():
            out[f"durability_{key}"] = val
        return out


# --------------------------------------------------------------------------------------
# The incoming pack: begin (receive → index in quarantine), commit (install), abort.


class IncomingPack:
    """A pack received, verified and indexed inside ``objects/incoming-*``, not yet installed.

    ``begin`` does phases 1-5; :meth:`commit` installs (and updates refs);
    :meth:`abort` removes the quarantine. Used as a context manager, leaving
    the block without ``commit`` aborts.
    """

    # Set by begin(); declared here so the class says what an incoming pack holds.
    keep_message: str | None
    elapsed: dict[str, float]
    counters: durable.DurabilityCounters
    pack_dir: Path
    snapshot: ObjectSnapshot
    fd_pack: int              # -1 once closed

    def __init__(self) -> None:  # use begin()
        self.repo: Any = None
        self.quarantine: Path | None = None
        self.committed = False
        self.result: IndexPackResult | None = None

    # -------------------------------------------------------------------------------
    @classmethod
    def begin(cls, repo, source, *, fix_thin: bool = False, strict: bool = False,
              fsck: FsckOptions | None = None, keep_message: str | None = None, max_pack_bytes: int | None = None,
              processes: int | None = None, progress: Progress | None = None,
              off32_limit: int = DEFAULT_OFF32_LIMIT) -> "IncomingPack":
        self = cls()
        self.repo = repo
        self.keep_message = keep_message
        self.elapsed = {}
        self.counters = durable.DurabilityCounters()
        objects_dir = Path(repo.objects.path)
        self.pack_dir = objects_dir / "pack"
        t0 = time.monotonic()
        # One snapshot of what exists, before the pack is read: every existence question is answered from it.
        snapshot = repo.objects.snapshot()
        existing = ExistingIds(snapshot)
        self.snapshot = snapshot
        self.quarantine = create_quarantine(objects_dir)
        self._writing = self.quarantine   # the file being written: what a full disk's error names
        try:
            opts = None
            if strict or fsck is not None:
                # index-pack's FSCK_OPTIONS_MISSING_GITMODULES: a .gitmodules blob absent everywhere is
                # printed by git, not refused (the links check refuses a missing object anyway).
                opts = replace(fsck or STRICT, missing_gitmodules_is_error=False)
            self._build(source, existing, fix_thin=fix_thin, strict=opts, max_pack_bytes=max_pack_bytes,
                        processes=processes, progress=progress, off32_limit=off32_limit, t0=t0)
        except OSError as err:
            # Reading the source already raised InvalidInputError: this is our own writing (ENOSPC, EFBIG, EIO).
            self.abort()
            raise WriteFailedError(f"writing the incoming pack failed: {err.strerror}", errno=err.errno,
                                   path=self._writing) from err
        except BaseException:
            self.abort()
            raise
        return self

    def _build(self, source, existing: ExistingIds, *, fix_thin, strict, max_pack_bytes, processes,
               progress, off32_limit, t0) -> None:
        q = self.quarantine
        self.strict = strict is not None
        self.fsck_opts: FsckOptions | None = strict
        fd_pack, tmp_pack = tempfile.mkstemp(prefix="tmp_pack_", dir=q)
        self.tmp_pack = self._writing = Path(tmp_pack)
        self.fd_pack = fd_pack
        stream, close_stream = open_source(source)
        # Errors name the input (offsets are offsets in it), not the quarantine file that is removed.
        self.label = label = source_label(source)
        try:
            rx = Receiver(stream, fd_pack, label, max_pack_bytes=max_pack_bytes, existing=existing,
                           fsck=strict, progress=progress)
            try:
                entries, trailer_off, checksum = rx.run()
            except zlib.error as err:
                raise PackFormatError(f"corrupt zlib stream: {err}", path=label,
                                      offset=rx.boff + rx.bpos) from err
        finally:
            if close_stream:
                stream.close()
        self.received_bytes = rx.total
        stats_all = [rx.stats]
        t1 = time.monotonic()
        self.elapsed["receive"] = t1 - t0

        # ---- resolve
        n = len(entries)
        nproc = processes if processes is not None else len(os.sched_getaffinity(0))
        nproc = max(1, nproc)
        res = Resolver(entries, fd_pack, label, existing, strict, nslots=max(nproc, 1))
        entries.oids = bytearray()  # the shared map holds them now
        self.peak_rss_workers = 0
        self.workers = 1
        self.thin_workers = 1
        try:
            if entries.deltas:
                shared = res.shared_oids
                roots = [i for i in range(n) if entries.types[i] < 6 and
                         (entries.first_child[i] >= 0 or shared[20 * i:20 * i + 20] in entries.ref_first)]
                if nproc > 1 and resolve_work(entries) >= FORK_MIN_DELTAS and len(roots) > 1:
                    # Big trees first so the last batches are small ones.
                    roots.sort(key=lambda r: -self._direct_children(entries, r, shared))
                    outs, self.peak_rss_workers = run_workers(res, roots, nproc, progress, entries.deltas)
                    stats_all.extend(outs)
                    self.workers = nproc
                    check_no_double_resolution(res, entries, label)
                else:
                    res.progress = progress
                    stats_all.append(res.resolve_roots(roots, 0, len(roots) or 1, None))
                    res.progress = None
            t2 = time.monotonic()
            self.elapsed["resolve"] = t2 - t1

            # ---- thin bases
            oids = bytearray(res.shared_oids) if n else bytearray()
            rtypes = bytearray(res.rtypes) if n else bytearray()
            unresolved = [i for i in range(n) if not rtypes[i]]
            thin = ThinBases(self.fd_pack, label, self.snapshot, self.fsck_opts)
            thin_added = 0
            if unresolved:
                thin_added = thin.fix_unresolved(entries, res, oids, rtypes, unresolved, fix_thin, existing,
                                                 stats_all, trailer_off, progress, nproc,
                                                 fork=len(unresolved) >= FORK_MIN_DELTAS)
                self.peak_rss_workers = max(self.peak_rss_workers, thin.peak_rss_workers)
                self.thin_workers = thin.workers
            if progress is not None and entries.deltas:
                progress("resolving", entries.deltas, entries.deltas)
        finally:
            res.close()
        if thin_added:
            checksum = thin.rewrite_header_and_trailer(len(entries))
        # The delta graph is no longer needed: free it before the checks and the index.
        entries.ref_first = {}
        entries.first_child = entries.next_sibling = entries.sizes = None  # type: ignore[assignment]
        t3 = time.monotonic()
        self.elapsed["thin"] = t3 - t2

        # ---- checks: collisions and (strict) connectivity, against the snapshot
        self.collisions_checked = self._check_collisions(stats_all, entries, oids, rtypes)
        nobj = len(entries)
        fsck = None
        if strict is not None:
            fsck = self._check_links(strict, stats_all, oids, rtypes, nobj, existing)
        t4 = time.monotonic()
        self.elapsed["check"] = t4 - t3

        # ---- index
        offsets = entries.offsets[:nobj]
        fd_idx, tmp_idx = tempfile.mkstemp(prefix="tmp_idx_", dir=self.quarantine)
        self._writing = Path(tmp_idx)
        fd_rev, tmp_rev = tempfile.mkstemp(prefix="tmp_rev_", dir=self.quarantine)
        with open(fd_idx, "wb", buffering=1 << 16) as f_idx, open(fd_rev, "wb", buffering=1 << 16) as f_rev:
            info = write_index(f_idx, f_rev, oids, offsets, entries.crcs, checksum, off32_limit=off32_limit)
            os.fchmod(f_idx.fileno(), 0o444)
            os.fchmod(f_rev.fileno(), 0o444)
        self.tmp_idx, self.tmp_rev = Path(tmp_idx), Path(tmp_rev)
        self.oids = oids
        if fsck is not None:
            self._finish_fsck(fsck, tmp_pack=self.tmp_pack, tmp_idx=self.tmp_idx)
        self.large_offsets = info.large_offsets
        self.checksum = checksum
        self.pack_name = f"pack-{checksum.hex()}"
        self.tmp_keep = None
        if self.keep_message is not None:
            # git ignores a .keep's content: packyard's owner record first, the message after it.
            self.tmp_keep = self._write_tmp("tmp_keep_", with_owner(self.keep_message), mode=0o644)
        os.fchmod(self.fd_pack, 0o444)
        self.objects = nobj
        self.deltas = entries.deltas
        self.thin_bases_added = thin_added
        self.pack_bytes = os.fstat(self.fd_pack).st_size
        self.elapsed["index"] = time.monotonic() - t4

    @staticmethod
    def _direct_children(e: Entries, i: int, oids) -> int:
        k = 0
        c = e.first_child[i]
        while c >= 0:
            k += 1
            c = e.next_sibling[c]
        c = e.ref_first.get(oids[20 * i:20 * i + 20], -1)
        while c >= 0:
            k += 1
            c = e.next_sibling[c]
        return k

    def _write_tmp(self, prefix: str, data: bytes, mode: int = 0o444) -> Path:
        fd, path = tempfile.mkstemp(prefix=prefix, dir=self.quarantine)
        self._writing = Path(path)
        try:
            durable.write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return Path(path)

    # -- checks ------------------------------------------------------------------
    def _check_collisions(self, stats_all: list[Stats], e: Entries, oids: bytearray, rtypes: bytearray) -> int:
        checked = 0
        for st in stats_all:
            for i, digest in st.collisions:
                oid = bytes(oids[20 * i:20 * i + 20])
                have_type, have = self._read_existing(oid)
                if strong_digest(int(have_type), have) != digest or rtypes[i] != int(have_type):
                    raise CollisionError("incoming object has the id of an existing object but different "
                                         "content (possible SHA-1 collision)", oid=oid, path=self.label,
                                         offset=e.offsets[i])
                checked += 1
        return checked

    def _read_existing(self, oid: bytes) -> tuple[ObjectType, bytes]:
        # Read what the repository stores under ``oid`` without checking it hashes to its name: a
        # different content under the same name is exactly what the collision check must report.
        for snap in (self.snapshot, *self.snapshot.alternates):   # (this repository's copy, else the pool's)
            found = snap.packs.find(oid)
            if found is not None:
                return found[0].read_at(found[1])
            if oid in snap.loose_ids:
                return snap.loose.read(oid, verify=False)
        if self.snapshot.objects is not None:   # found by a fresh lookup (ExistingIds.learn): read as found
            return self.snapshot.objects.read(oid)
        return self.snapshot.loose.read(oid, verify=False)

    def _check_links(self, opts: FsckOptions, stats_all: list[Stats], oids: bytearray, rtypes: bytearray, n: int,
                     existing: ExistingIds) -> FsckChecker:
        """--strict: every link names an object of the type it claims, in the pack or the repository.

        Memory: the links are packed ids (store/fsck/linkset.py); the resolvers' states are merged into
        the largest one (each freed once merged), and the incoming objects of each type are struck off
        that type's links in one merge walk; what is left links to the repository, to nothing, or to
        an object of another type."""
        states = [st.fsck for st in stats_all if st.fsck is not None]
        for st in stats_all:
            st.fsck = None
        states.sort(key=lambda fs: -sum(len(v) for v in fs.links.values()))
        state = states[0] if states else FsckState()
        for other in states[1:]:
            state.merge(other)
        del states
        checker = FsckChecker(opts, state)
        links = state.links
        ob = memoryview(oids)[:20 * n]       # no copy: 3.3 MB for git.git
        try:
            for t, type_links in links.items():
                type_links.discard_packed(sort_unique20(select20(ob, rtypes, t)))
        finally:
            ob.release()                      # oids may be resized later (thin bases)
        repo_type = self._existing_type(existing)

        def incoming_or_repo_type(oid: bytes) -> int | None:
            got = repo_type(oid)
            if got is not None:
                return got
            k = oids.find(oid, 0, 20 * n)   # only for a link the repository does not have: an error either way
            while k >= 0:
                if k % 20 == 0:
                    return int(rtypes[k // 20])
                k = oids.find(oid, k + 1, 20 * n)
            return None
        checker.check_links(lambda oid: None, incoming_or_repo_type, where=self.label)
        return checker

    def _existing_type(self, existing: ExistingIds) -> Callable[[bytes], int | None]:
        snap = self.snapshot

        def existing_type(oid: bytes) -> int | None:
            if oid not in existing:
                existing.learn((oid,))   # a miss is looked up afresh (ObjectSnapshot.has) before it is "absent"
                if oid not in existing:
                    return None
            return int(snap.read_header(oid)[0])
        return existing_type

    def _finish_fsck(self, checker: FsckChecker, *, tmp_pack: Path, tmp_idx: Path) -> None:
        """fsck_finish: .gitmodules blobs not checked while resolving, read from the quarantined pack
        (now indexed) or the repository."""
        if not checker.state.has_queued_checks():
            return
        from .packdir import PackFile
        pf = PackFile(tmp_idx)
        pf.pack_path = tmp_pack
        snap = self.snapshot
        try:
            def read(oid: bytes) -> tuple[int, bytes] | None:
                off = pf.find_offset(oid)
                if off is not None:
                    t, data = pf.read_at(off)
                    return int(t), data
                if snap.has(oid):
                    t, data = snap.read(oid)
                    return int(t), data
                return None
            checker.finish_gitmodules(read, where=self.label)
        finally:
            pf.close()

    def contains(self, oid: bytes) -> bool:
        """Is ``oid`` one of the incoming objects?"""
        oids = self.oids
        k = oids.find(oid)
        while k >= 0:
            if k % 20 == 0:
                return True
            k = oids.find(oid, k + 1)
        return False

    def object_directory(self) -> Path:
        """The quarantine as an object directory git reads (a pre-receive hook's ``GIT_OBJECT_DIRECTORY`` and
        ``GIT_QUARANTINE_PATH``, as git's tmp_objdir is): ``pack/pack-<checksum>.{pack,idx,rev}`` beside the
        ``tmp_*`` files, hard links to them, made on the first call. Nothing is copied, and the links go with
        the quarantine (:meth:`remove_quarantine`); the installed pack is the ``tmp_*`` files renamed."""
        if self.quarantine is None or self.committed:
            raise InvalidInputError("the incoming pack has no quarantine any more (committed or aborted)")
        view = self.quarantine / "pack"
        if not view.is_dir():
            staging = Path(tempfile.mkdtemp(prefix="tmp_view_", dir=self.quarantine))
            try:
                for tmp, ext in ((self.tmp_pack, "pack"), (self.tmp_idx, "idx"), (self.tmp_rev, "rev")):
                    self._writing = staging / f"{self.pack_name}.{ext}"
                    os.link(tmp, self._writing)
                os.rename(staging, view)    # all three names or none: git never sees an .idx without its .pack
            except OSError as err:
                shutil.rmtree(staging, ignore_errors=True)
                raise WriteFailedError(f"cannot link the quarantined pack for git: {err.strerror}",
                                       errno=err.errno, path=self._writing) from err
        return self.quarantine

    # -- install -----------------------------------------------------------------
    def commit(self, ref_updates: Sequence[RefUpdate] = (), *, peak_rss_hint: int = 0,
               lease: Lease | None = None) -> IndexPackResult:
        """Install the pack, then update refs: the durability order of store/install.py.

        ``lease`` (store/lease.py): checked before the install and before the ref update (LockLostError:
        nothing published, the quarantine stays for the caller to remove); its token is checked by the
        storage at the ref update (RefStore.update refuses a token older than one that already moved refs here)."""
        if self.committed:
            raise InvalidInputError("incoming pack already committed")
        ref_updates = list(ref_updates)
        self._check_ref_targets(ref_updates)
        check_lease(lease)   # publish only while the lease is still ours
        t0 = time.monotonic()
        files = PackFiles(name=self.pack_name, pack=self.tmp_pack, idx=self.tmp_idx, rev=self.tmp_rev,
                          keep=self.tmp_keep)
        outcome, keep_path = install_pack(files, self.pack_dir, self.counters, fault_prefix="index_pack",
                                          open_fds=[self.fd_pack])
        final = files.finals(self.pack_dir)
        self.remove_quarantine()
        fault_point("index_pack.after_quarantine_removed")
        self.committed = True
        t1 = time.monotonic()
        self.elapsed["install"] = t1 - t0
        if ref_updates:
            check_lease(lease)
        update_refs(self.repo, ref_updates, self.counters, token_of(lease))
        fault_point("index_pack.after_refs")
        self.elapsed["refs"] = time.monotonic() - t1
        peak_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.result = IndexPackResult(
            outcome=outcome, pack_name=self.pack_name, checksum=self.checksum.hex(),
            pack_path=final["pack"], idx_path=final["idx"], rev_path=final["rev"], keep_path=keep_path,
            objects=self.objects, deltas=self.deltas, bytes=self.pack_bytes, received_bytes=self.received_bytes,
            thin_bases_added=self.thin_bases_added, collisions_checked=self.collisions_checked,
            large_offsets=self.large_offsets, workers=self.workers, thin_workers=self.thin_workers,
            elapsed=dict(self.elapsed),
            peak_rss=max(peak_self, self.peak_rss_workers, peak_rss_hint), peak_rss_workers=self.peak_rss_workers,
            refs_updated=tuple(u.name for u in ref_updates), durability=self.counters.as_dict())
        return self.result

    def _check_ref_targets(self, updates: list[RefUpdate]) -> None:
        """A ref may only name an object that is in this pack or already in the repository."""
        for u in updates:
            if not isinstance(u, RefUpdate):
                raise InvalidInputError(f"ref update must be a RefUpdate, not {type(u).__name__}")
            if len(u.new) != 20:
                raise InvalidInputError(f"ref update for {u.name}: new value must be a 20-byte id")
            if not self.contains(u.new) and u.new not in self.snapshot:
                raise ObjectMissingError(f"ref update for {u.name} names an object that is neither in the pack "
                                         f"nor in the repository", oid=u.new)

    def remove_quarantine(self) -> None:
        """Close the pack fd and delete objects/incoming-* with whatever is left in it."""
        fd = getattr(self, "fd_pack", -1)
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
            self.fd_pack = -1
        if self.quarantine is not None:
            shutil.rmtree(self.quarantine, ignore_errors=True)
            self.quarantine = None

    def abort(self) -> None:
        if not self.committed:
            self.remove_quarantine()

    def __enter__(self) -> "IncomingPack":
        return self

    def __exit__(self, *exc) -> None:
        self.abort()


# --------------------------------------------------------------------------------------

def index_pack(repo, source: BinaryIO | str | os.PathLike[str], *, fix_thin: bool = False, strict: bool = False,
               fsck: FsckOptions | None = None, keep_message: str | None = None, ref_updates: Sequence[RefUpdate] = (),
               max_pack_bytes: int | None = None, processes: int | None = None,
               progress: Progress | None = None,
               install_guard: Callable[[], ContextManager] | None = None,
               off32_limit: int = DEFAULT_OFF32_LIMIT) -> IndexPackResult:
    """Receive, verify, index and install a pack; then apply ``ref_updates`` (all or nothing).

    ``install_guard`` (e.g. a repository lock) is entered around install + ref updates only,
    so the long receive/resolve phases run without holding it.
    """
    with IncomingPack.begin(repo, source, fix_thin=fix_thin, strict=strict, fsck=fsck, keep_message=keep_message,
                            max_pack_bytes=max_pack_bytes, processes=processes, progress=progress,
                            off32_limit=off32_limit) as incoming:
        with (install_guard() if install_guard is not None else nullcontext()):
            return incoming.commit(ref_updates)
