"""The one install sequence: how anything the store writes becomes visible (seed 001).

Every producer -- index-pack (:mod:`.pack.indexpack`), the pack writer (:mod:`.pack.write`,
used by repack) and bulk loose writes (:mod:`.bulk`) -- writes temp files *in the
destination filesystem* and then publishes them with these steps, in this order::

    writeout_each     start write-back of every temp file without waiting (the flush overlaps)
    barrier_flush     ONE durable flush of the temp files' data (fsync each, or one syncfs)
    publish_renames   temp name -> final name; for a pack the .idx LAST (readers find packs by it, and a
                      .bitmap through its pack: git's finish order, pack, rev, bitmap, idx)
    fsync_dirs        the renames are durable only once their directories are flushed
    advance_listing   a pack directory changed once more, a clock tick later, so that no NFS client keeps a
                      listing taken in the same tick as the renames (its change token would not move)
    update_refs       refs last: a ref may only name durably installed objects

:func:`install_pack` strings the steps together for a pack (``.pack``, ``.rev``, an optional
``.mtimes``, an optional ``.bitmap``, then ``.idx``; a ``.keep`` before all of them) with a ``fault_point()`` between
steps, named ``<prefix>.after_<step>`` so tests can SIGKILL a producer exactly there.
Loose objects use the same steps with the variants their volume needs (one ``syncfs`` for
thousands of files, renames that never replace an existing object).
"""
from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence, TypeVar

from . import durable
from .errors import WriteFailedError
from .faults import fault_point
from .progress import Progress


class InstallOutcome(enum.Enum):
    """What installing a pack did: a result, not a boolean."""

    INSTALLED = "installed"              # new pack-<checksum>.{pack,rev,idx} in objects/pack
    ALREADY_PRESENT = "already-present"  # a pack with this checksum was already installed


@dataclass(frozen=True)
class PackFiles:
    """A finished pack's temp files (in the destination filesystem) and the name they install under."""

    name: str                   # "pack-<hex checksum>"
    pack: Path
    idx: Path
    rev: Path
    mtimes: Path | None = None  # cruft packs only
    keep: Path | None = None    # a .keep to publish before the pack
    bitmap: Path | None = None  # a reachability bitmap (store/maintenance/serving/bitmap.py), renamed before the idx

    def finals(self, pack_dir: Path) -> dict[str, Path]:
        return {ext: pack_dir / f"{self.name}.{ext}" for ext in ("pack", "rev", "mtimes", "bitmap", "idx", "keep")}

    def temps(self) -> list[Path]:
        return [p for p in (self.pack, self.rev, self.mtimes, self.bitmap, self.idx, self.keep) if p is not None]


# -- the steps ---------------------------------------------------------------------------------------

def writeout_each(fds: Sequence[int], counters: durable.DurabilityCounters) -> None:
    # Start write-back of every temp file together, so the flushes below overlap instead of queueing.
    for fd in fds:
        durable.start_writeout(fd, counters)


def barrier_flush(fds: Sequence[int], counters: durable.DurabilityCounters) -> None:
    # Contents must be on stable storage before any name for them is published.
    for fd in fds:
        durable.flush_file(fd, counters)


def barrier_syncfs(fs_fds: Sequence[int], counters: durable.DurabilityCounters) -> None:
    # One syncfs per filesystem makes every temp file on it durable (data and inodes) in one call.
    for fd in fs_fds:
        durable.sync_filesystem(fd, counters)


def create_pack_dir_if_needed(pack_dir: Path, counters: durable.DurabilityCounters) -> None:
    # git creates objects/pack on demand; a new directory entry is made durable before files go in it.
    if not pack_dir.is_dir():
        pack_dir.mkdir(exist_ok=True)
        durable.fsync_dir(pack_dir.parent, counters)


def already_installed(idx_path: Path) -> bool:
    # One stat per install (not per object): a pack with this checksum is already visible to readers.
    return idx_path.exists()


def publish_keep(tmp_keep: Path, final_keep: Path) -> Path | None:
    # The .keep goes in before the pack so a concurrent repack never sees the pack unprotected;
    # link() fails if a keep already exists (someone else's: we neither overwrite nor release it).
    try:
        os.link(tmp_keep, final_keep)
    except FileExistsError:
        return None
    return final_keep


def publish_renames(pairs: Sequence[tuple[Path, Path]], counters: durable.DurabilityCounters,
                    fault_prefix: str) -> None:
    # pack, then rev (and mtimes), then idx LAST: readers discover packs by their idx, so everything
    # it needs exists first. Before the idx is in, a failure takes the orphans back out.
    done: list[Path] = []
    try:
        for src, dst in pairs:
            durable.rename(src, dst, counters)
            done.append(dst)
            if dst.suffix == ".pack":
                fault_point(f"{fault_prefix}.after_pack_rename")
            elif dst.suffix == ".bitmap":
                fault_point(f"{fault_prefix}.after_bitmap_rename")
    except BaseException:
        if not any(p.suffix == ".idx" for p in done):
            for p in done:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        raise


class _LooseRename(Protocol):
    oid: bytes
    fanout: str
    tmp_name: str
    final_name: str

    @property
    def tmp(self) -> str: ...


_R = TypeVar("_R", bound=_LooseRename)   # the caller's own item type, handed back to ``exists``


def publish_renames_noreplace(items: Sequence[_R], dir_fds: dict[str, int],
                              counters: durable.DurabilityCounters, *, published: Callable[[int], None],
                              exists: Callable[[_R], None], fault: str,
                              progress: Progress | None = None) -> int:
    # Loose objects: each temp file renamed to its object name and never over an existing object
    # (another writer's copy has the same bytes by definition, and is already durable).
    rename_at = durable.rename_noreplace_at
    total = len(items)
    renamed = 0
    try:
        for i, p in enumerate(items):
            fault_point(fault)
            try:
                placed = rename_at(dir_fds[p.fanout], p.tmp_name.encode(), p.final_name.encode())
            except OSError as err:
                raise WriteFailedError(f"renaming temp file into place failed: {err.strerror}",
                                       errno=err.errno, path=p.tmp, oid=p.oid) from err
            if placed:
                renamed += 1
            else:
                exists(p)
            published(i + 1)
            if progress is not None and (i + 1) % 1000 == 0:
                progress("publish", i + 1, total)
    finally:
        counters.renames += renamed
    return renamed


def fsync_dirs(dirs: Iterable[Path | str], counters: durable.DurabilityCounters) -> None:
    # The renames are only durable once the directory holding the new names is flushed.
    for d in dirs:
        durable.fsync_dir(d, counters)


#: One tick of the server's file-timestamp clock, and then some: Linux stamps mtimes from a coarse clock
#: (one jiffy, 1-10 ms on ext4/XFS). A server with coarser timestamps (1 s) is not covered by this wait.
LISTING_TICK = 0.012


def advance_listing(pack_dir: Path, *more: Path) -> None:
    """Change ``pack_dir`` (and each of ``more``) once more, a clock tick after the renames (create and remove an
    empty temp file in each).

    Why: an NFS client revalidates a directory listing on ``opendir`` by the directory's change token
    (mtime, ctime, size, nlink). Renames within one tick of the server's timestamp clock leave mtime and
    ctime as they were, so a reader on another host that listed ``objects/pack`` during that tick keeps a
    listing without the new pack, for as long as nothing else changes the directory -- and its one
    re-listing on a miss (the lookup rule) reads the same stale listing. A repack that then deletes the
    loose objects it packed, or a push whose ref names the new pack's objects, makes that reader lose a
    read (nfsim's race across two hosts found it: tests/service/test_nfsim.py). One more change a tick
    later moves the token, so the next ``opendir`` anywhere reads the directory afresh. The temp file has
    a pack writer's temp name (the leftovers table's rule removes it if this process dies in between).
    Several directories wait for one tick together, and their changes are made at once (:mod:`.fsparallel`).

    Only where other hosts' clients cache listings: a network or FUSE mount (or a filesystem fstatfs
    cannot name). On a local filesystem the kernel's directory cache is coherent, and the wait would
    only delay every push. (A writer on the NFS server's own disk is not covered: mount the export.)"""
    import time

    from .fsparallel import is_shared, together
    from .owner import this_host_tag

    if not is_shared(str(pack_dir)):
        return
    # (imported only here: ~2 ms of imports, random's among them, that a push to a local disk need not pay)
    import secrets

    time.sleep(LISTING_TICK)

    def change(directory: Path) -> None:
        tmp = Path(directory) / f"tmp_pack_{os.getpid()}_{this_host_tag()}-{secrets.token_hex(4)}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))
            os.unlink(tmp)
        except OSError:    # only a hint to other hosts' caches: the pack is installed and durable already
            durable.unlink_if_present(tmp)

    together(*(functools.partial(change, d) for d in (pack_dir, *more)), where=pack_dir)


def update_refs(repo, updates: Sequence, counters: durable.DurabilityCounters,
                fence_token: int | None = None) -> None:
    # Last: a ref may only name objects that are durably installed (all-or-nothing compare-and-swap).
    if updates:
        repo.refs.update(updates, counters, fence_token=fence_token)


# -- a pack, start to finish --------------------------------------------------------------------------

def install_pack(files: PackFiles, pack_dir: Path, counters: durable.DurabilityCounters, *,
                 fault_prefix: str, open_fds: Sequence[int] = ()) -> tuple[InstallOutcome, Path | None]:
    """Publish a finished pack: flush, keep, renames (idx last), directory fsync.

    ``open_fds``: descriptors of temp files the producer still holds (flushed through them);
    the other temp files are opened here. Returns the outcome and the ``.keep`` published
    (None if none was asked for, or one already existed). A failure after the keep went in
    removes it again; temp files are the caller's to remove (it owns their directory).
    """
    final = files.finals(pack_dir)
    held = list(open_fds)
    fds = held + [os.open(p, os.O_RDONLY) for p in files.temps() if not _held(p, held)]
    try:
        try:
            writeout_each(fds, counters)
            fault_point(f"{fault_prefix}.after_writeout")
            barrier_flush(fds, counters)
        except OSError as err:
            raise WriteFailedError(f"flushing the new pack to disk failed: {err.strerror}", errno=err.errno,
                                   path=files.pack) from err
        fault_point(f"{fault_prefix}.after_flush")
    finally:
        for fd in fds[len(held):]:
            os.close(fd)
    create_pack_dir_if_needed(pack_dir, counters)
    outcome = InstallOutcome.ALREADY_PRESENT if already_installed(final["idx"]) else InstallOutcome.INSTALLED
    keep_path = publish_keep(files.keep, final["keep"]) if files.keep is not None else None
    fault_point(f"{fault_prefix}.after_keep")
    try:
        if outcome is InstallOutcome.INSTALLED:
            pairs = [(files.pack, final["pack"]), (files.rev, final["rev"])]
            if files.mtimes is not None:
                pairs.append((files.mtimes, final["mtimes"]))
            if files.bitmap is not None:
                pairs.append((files.bitmap, final["bitmap"]))
            pairs.append((files.idx, final["idx"]))
            publish_renames(pairs, counters, fault_prefix)
            fault_point(f"{fault_prefix}.after_renames")
        elif files.bitmap is not None and not final["bitmap"].exists():
            # The same pack was there without a bitmap: its pack and idx are installed, so it may go in now.
            publish_renames([(files.bitmap, final["bitmap"])], counters, fault_prefix)
            fault_point(f"{fault_prefix}.after_renames")
        fsync_dirs([pack_dir], counters)
        fault_point(f"{fault_prefix}.after_fsync_dirs")
        if outcome is InstallOutcome.INSTALLED:
            advance_listing(pack_dir)
    except BaseException:
        if keep_path is not None:
            try:
                os.unlink(keep_path)
            except FileNotFoundError:
                pass
        raise
    return outcome, keep_path


def _held(path: Path, fds: Sequence[int]) -> bool:
    """Is ``path`` one of the open descriptors ``fds`` (same inode)?"""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return any((st.st_dev, st.st_ino) == (s.st_dev, s.st_ino) for s in map(os.fstat, fds))


__all__ = ["InstallOutcome", "PackFiles", "install_pack", "writeout_each", "barrier_flush", "barrier_syncfs",
           "create_pack_dir_if_needed", "already_installed", "publish_keep", "publish_renames",
           "publish_renames_noreplace", "fsync_dirs", "advance_listing", "update_refs"]
