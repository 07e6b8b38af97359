"""Repack: ``full``, ``geometric`` and ``loose``, with cruft packs and preserved packs, never losing an object.

One repack, step by step (each step timed in :attr:`RepackResult.elapsed`)::

    cleanup   temp files of dead repacks (ours by name: dead pid on this host), orphaned pack files
    snapshot  ONE listing of objects/pack and the loose objects: the only things it may delete
    plan      (repack/plan.py) full: the tips (refs, HEAD, reflogs) read after the snapshot, everything they reach
              (walk/reach.py), the unreachable rest with its ages (young -> cruft pack, old -> expired; an old
              one a young one links to stays: cruft.py, a walk only when some are old), timed as
              ``sources``, ``walk``, ``ages``, ``young`` and the rest as ``plan``;
              geometric: the smallest packs until the sizes form a progression; loose: every loose object
    write     one pack writer per new pack (store/pack/write.py), through writeplan.py: deltas whose base
              goes into the same pack copied verbatim (CRC checked; not with ``reuse=False``), the rest
              offered to the delta search (store/pack/search.py: ``window``, ``depth``,
              ``window_memory``), what it finds no delta for written whole
    install   (the lease checked) temp files -> flush -> renames (idx last) -> directory fsync
              (store/install.py)
    recheck   (before the first deletion) the tips are read again; whatever they reach that is not in a
              new pack keeps its old copy; the maintenance lease is checked (``lease.check()``)
    delete    inside the repository's maintenance fence (``lease.token``): replaced packs move to
              objects/pack/preserved/ (idx first; the MIDX replaced before them is linked there too),
              loose files of the snapshot that are now packed or expired are unlinked, preserved packs
              and files past ``preserve_for`` are removed

Packs, loose objects, quarantines and refs that appear after the snapshot are never touched.
A corrupt object (CRC, zlib, hash, delta base) or a tip naming a missing object stops the
repack before anything is deleted, with a typed error naming the object, file and offset;
temp files are removed. Fault points for SIGKILL tests, in order: ``repack.after_plan``,
``repack.after_write``, ``repack.after_writeout`` ... ``repack.after_fsync_dirs`` (the main pack),
``repack.cruft.after_*`` (the cruft pack), ``repack.before_delete``, ``repack.after_lease_check``,
``repack.midx.after_{flush,rename,fsync_dirs}`` (the new multi-pack-index, before any deletion),
``repack.after_idx_preserved``, ``repack.after_pack_preserved``, ``repack.after_loose_deleted``,
``repack.after_delete``.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable

from ... import durable, fsparallel
from ...errors import InvalidInputError
from ...faults import fault_point
from ...fence import FenceKind
from ...forked import ForkedCall
from ...lease import Lease, fence_of, token_of
from ...lease import check as check_lease
from ...leftovers.passes import remove_stale_temp_files
from ...pack.packdir import is_gone
from ...pack.write import PackWriter
from ...progress import Progress
from ...tuning import gc_paused
from ..preserved.loose import expire_preserved_loose, keep_one, new_keep_dir, settle_keep
from ..preserved.packs import (
    Ahead,
    LooseAhead,
    advance_after_moves,
    expire_preserved,
    expire_preserved_mapped,
    linked_ahead,
    retire_packs,
    start_link_ahead,
    unlink_ahead,
)
from ..serving.bitmap import BitmapOptions, read_header, write_pack_bitmap
from ..serving.midx import MIDX_NAME, installed_stems, midx_pack_names, midx_status, remove_midx, write_midx
from ..serving.midxbitmap import midx_bitmap_for
from ..walk.sources import SourceIndex
from .islands import core_first, core_refs
from .options import POOL_MARKER, RepackCounters, RepackHooks, RepackMode, RepackOptions, RepackResult
from .plan import (
    PhaseTimer,
    RepackPlan,
    file_mtime,
    geometric_split,
    plan_full,
    plan_geometric,
    plan_loose,
    recheck_tips,
    spare,
    spare_freshened,
)
from .writeplan import write_plan

#: A repack's defaults (frozen: shared by every call that passes none).
DEFAULT_OPTIONS = RepackOptions()


@gc_paused()   # hundreds of thousands of long-lived acyclic objects (ids, arrays): see store/tuning.py
def repack(repo, options: RepackOptions = DEFAULT_OPTIONS, *, progress: Progress | None = None,
           lease: Lease | None = None, hooks: RepackHooks | None = None) -> RepackResult:
    """Repack ``repo`` (see the module docstring). ``lease`` (store/lease.py): the maintenance lease, checked
    before the first deletion (LockLostError: nothing deleted); its token is checked by the store's maintenance
    fence around the deletions."""
    if options.factor < 2 and options.mode is RepackMode.GEOMETRIC:
        raise InvalidInputError(f"geometric factor must be at least 2, not {options.factor}")
    if (options.mode is RepackMode.FULL and options.keep_reached is None and not options.unsafe_ignore_pool_members
            and (Path(repo.path) / POOL_MARKER).is_file()):
        raise InvalidInputError("this repository is an object pool: a full repack must keep what its members "
                                "reach (store/maintenance/pool: repack_pool)", path=repo.path)
    hooks = hooks or RepackHooks()
    now = time.time() if options.now is None else options.now
    result = RepackResult(mode=options.mode, fence_token=token_of(lease))
    c = result.counters
    timer = PhaseTimer(result.elapsed)
    dur = durable.DurabilityCounters()
    pack_dir = Path(repo.objects.path) / "pack"
    rescans0 = repo.objects.counters.relisted_hits

    c.stale_tmp_removed = remove_stale_temp_files(pack_dir, now=now)
    timer.lap("cleanup")

    snapshot = repo.objects.snapshot()
    kept = [p for p in snapshot.packs if p.is_kept()]
    replaceable = [p for p in snapshot.packs if not p.is_kept()]
    timer.lap("snapshot")

    rolled = (geometric_split([p for p in replaceable if not p.is_cruft], options.factor)
              if options.mode is RepackMode.GEOMETRIC else [])
    # On a shared filesystem the packs it may replace are linked into preserved/ ahead, by a child process
    # (preserved.start_link_ahead); it is waited for in the delete, and killed if the repack ends before that.
    # So are the loose files a full or loose repack may delete (preserved/loose.py: git on another host maps them).
    keep = _loose_keep(repo, snapshot, options, pack_dir)
    ahead = start_link_ahead(pack_dir, [p.name for p in (replaceable if options.mode is RepackMode.FULL else rolled)],
                             options.preserve, keep)
    sources: SourceIndex | None = None
    try:
        if options.mode is RepackMode.FULL:
            # A fork's pool: its packs are read by the walk, never rewritten here (git's repack -a -d -l).
            sources = SourceIndex(snapshot, replaceable, kept, read_fresh=repo.objects.read,
                                  borrowed=snapshot.alternates)
            timer.lap("sources")
            plan = plan_full(repo, sources, replaceable, options, now, progress, timer)
        elif options.mode is RepackMode.GEOMETRIC:
            sources = SourceIndex(snapshot, rolled, kept, read_fresh=repo.objects.read)
            plan = plan_geometric(sources, rolled, snapshot)
            plan.snapshot_packs = [p for p in replaceable if not p.is_cruft]
        else:
            sources = SourceIndex(snapshot, [], kept, read_fresh=repo.objects.read)
            plan = plan_loose(repo, sources, snapshot, progress)
        # Only an expiring plan compares them (spare_freshened): no stat per pack otherwise.
        plan.mtime_at_plan = {p.name: file_mtime(p.pack_path) for p in plan.packs} if plan.expired else {}
        c.reachable = len(plan.reach) if plan.reach is not None else 0
        c.borrowed = plan.borrowed_reached
        if plan.reach is not None and plan.reach.commit_meta is not None:
            result.walked = (plan.reach.commits, plan.reach.commit_meta)
        c.cruft_kept, c.cruft_expired = len(plan.cruft), len(plan.expired)
        c.cruft_walked = plan.cruft_walked
        c.loose_prefetched = plan.prefetched
        timer.lap("plan")
        fault_point("repack.after_plan")
        if hooks.after_plan is not None:
            hooks.after_plan()

        if not plan.main and not plan.cruft and not plan.packs and not plan.loose:
            result.nothing_to_do = True
            if _wants_midx(options, pack_dir) and midx_status(pack_dir).wanted:
                _publish_midx(repo, plan, options, pack_dir, set(), dur, result.counters)
        else:
            new_names = _write_and_install(plan, sources, options, progress, result, timer, dur, pack_dir, lease)
            delete_old_packs(repo, plan, sources, options, new_names, result, now=now, lease=lease, hooks=hooks,
                             timer=timer, dur=dur, ahead=ahead, keep=keep)
        _finish_counters(result, repo, rescans0, dur)
        return result
    finally:
        if sources is not None:
            sources.release()
        if ahead is not None:
            ahead.close()   # (killed if still running: its links are a live pack's second names, left to expire)


def _write_and_install(plan: "RepackPlan", sources: SourceIndex, options: RepackOptions, progress: Progress | None,
                       result: RepackResult, timer: "PhaseTimer", dur: durable.DurabilityCounters,
                       pack_dir: Path, lease: Lease | None) -> set[str]:
    """Write the plan's new pack(s) (the main one, then the cruft one) and install each through the pack
    writer's install (store/install.py: temp files -> flush -> renames, idx last -> directory fsync), once
    the lease is checked (a lost one: LockLostError, the temp files removed, nothing new visible).
    Returns the installed packs' names; on an error nothing new stays visible but what was installed."""
    c = result.counters
    # -- write and install the new pack(s) -------------------------------------------------------
    written: list[tuple[PackWriter, list[int] | None, str]] = []
    writers: list[PackWriter] = []
    searched: dict[str, float] = {}
    try:
        main = core_first(plan.main, plan.islands) if plan.islands is not None else plan.main
        for ids, prefix, is_cruft in ((main, "repack", False), (plan.cruft, "repack.cruft", True)):
            if not ids:
                continue
            writer = PackWriter(pack_dir, len(ids), counters=dur, compression=options.compression,
                                fault_prefix=prefix)
            writers.append(writer)
            mtimes = write_plan(writer, ids, sources, c, progress=progress,
                                phase="writing cruft objects" if is_cruft else "writing objects",
                                mtime_of=plan.mtimes if is_cruft else None,
                                names=plan.cruft_names if is_cruft else plan.names, preloaded=plan.preloaded,
                                deltas=options.delta_plan(), timings=searched,
                                islands=None if is_cruft else plan.islands)
            writer.finish(mtimes=mtimes)
            if not is_cruft and plan.borrowed_reached and options.bitmap and options.mode is RepackMode.FULL:
                c.bitmap_skipped = 1   # the pack lacks closure: git disables bitmaps ("some objects are not
                # being packed"), as for a repository with alternates
            elif not is_cruft and options.bitmap and options.mode is RepackMode.FULL and plan.reach is not None:
                t0 = time.monotonic()
                n = write_pack_bitmap(writer, plan.reach, plan.tips, sources.read, _bitmap_options(options, plan),
                                      packs=sources.c_packs)
                c.bitmap_commits, c.bitmap_skipped = (n, 0) if n is not None else (0, 1)
                searched["bitmap"] = time.monotonic() - t0
            written.append((writer, mtimes, prefix))
        timer.lap("write")
        result.elapsed["search"] = searched.get("search", 0.0)   # (inside "write" until here)
        result.elapsed["bitmap"] = searched.get("bitmap", 0.0)
        result.elapsed["write"] -= result.elapsed["search"] + result.elapsed["bitmap"]
        fault_point("repack.after_write")
        check_lease(lease)   # publish nothing for a holder that lost its lease while writing
        for writer, mtimes, prefix in written:
            _outcome, files, _keep = writer.install(mtimes=mtimes)
            c.bytes_out += writer.size
            c.objects_out += writer.count
            if prefix == "repack":
                result.packs_written.append(files.name)
            else:
                result.cruft_pack = files.name
    except BaseException:
        for writer in writers:
            if not writer.installed:
                writer.abort()   # temp files go; a pack already installed stays (its objects exist twice)
        raise
    timer.lap("install")
    new_names = set(result.packs_written) | ({result.cruft_pack} if result.cruft_pack else set())
    return new_names


def delete_old_packs(repo, plan: "RepackPlan", sources: SourceIndex, options: RepackOptions, new_names: set[str],
                     result: RepackResult, *, now: float, lease: Lease | None, hooks: RepackHooks,
                     timer: "PhaseTimer", dur: durable.DurabilityCounters,
                     ahead: ForkedCall[Ahead] | None = None, keep: LooseAhead | None = None) -> None:
    """The delete rule: what a repack (full, geometric, loose; a full one's cruft pack included) may delete
    once its new packs are installed, and in which order. JGit's ``GC.deleteOldPacks`` and git's
    ``builtin/repack.c`` (``-d``: ``DELETE_PACK`` marks, ``write_midx_included_packs``,
    ``remove_redundant_pack``, ``prune_packed_objects``) are the models.

    **Which.** Only what the repack's ONE snapshot listed (``plan.packs``, ``plan.loose``): a pack, loose
    object, quarantine or ref that appeared after it is never touched. Of those packs, one whose name is
    among the new packs' (the same objects written again give the same name: JGit's "continue
    oldPackLoop") stays; a ``.keep`` pack was never planned (JGit's ``shouldBeKept``, git's kept list); a
    geometric repack plans only the packs it rolled up, never a cruft pack. Then, before anything goes:
    a full repack reads the tips again and spares every old copy of what a changed tip reaches that no new
    pack holds (``kept_for_recheck``); and when the plan expires objects, any pack touched since the plan
    and any expired loose file freshened within ``expire`` stay: a writer that found the object and
    freshened it instead of writing it relies on that copy (``kept_freshened``; JGit's pack expiry by mtime).

    **When.** After every new pack is installed and durable (never before: a crash in between leaves the
    objects twice, never zero times), after the before-delete hook and the maintenance-lease check
    (``lease.check()``: LockLostError, nothing deleted), and inside the repository's maintenance fence
    (``lease.token``): a holder that stalled past its lease is refused there by a later one's token.

    **Order.** FIRST the new multi-pack-index (and its bitmap) over the packs that stay -- or, with no MIDX
    wanted, the old one removed if it names a doomed pack (git's ``clear_midx_file``) -- so no MIDX ever
    names a pack that is gone; the new packs' own bitmap was installed with them, and the commit-graph is
    written after the repack (serving/refresh.py), so neither can describe what is deleted here. Then each doomed
    pack moves to ``objects/pack/preserved/`` (``options.preserve``; idx first, so a reader never finds an
    idx without its pack; on a shared filesystem its ``.pack`` and ``.rev`` were linked there while the new
    pack was written, ``ahead``, and such links of packs that stay are removed) or is removed, and the doomed
    loose files are unlinked (git's ``prune-packed``; on a shared filesystem at the same time as the pack
    moves, which wait on other directories' locks: ``fsparallel.together``; one after the other on a local
    disk). Once the packs are moved, preserved packs past ``preserve_for`` expire (JGit's ``prunePreserved``;
    never before the moves end: a pack just moved is judged by its idx's mtime, which the move sets), during
    the clock tick both directories wait for (``advance_after_moves``). Last, the bitmaps of old packs that
    stay go (git keeps one bitmap: the new pack's). Fault points: ``repack.before_delete``,
    ``repack.after_lease_check``, ``repack.midx.after_*``, ``repack.after_idx_preserved``,
    ``repack.after_pack_preserved``, ``repack.after_loose_deleted``, ``repack.after_delete``."""
    c = result.counters
    pack_dir = Path(repo.objects.path) / "pack"
    # -- which: the snapshot's packs and loose objects this repack replaced, minus what must stay -------
    if hooks.before_delete is not None:
        hooks.before_delete()
    fault_point("repack.before_delete")
    doomed_packs = [p for p in plan.packs if p.name not in new_names]
    doomed_loose = set(plan.loose)
    if options.mode is RepackMode.FULL:
        needed = recheck_tips(repo, plan, sources)
        if options.keep_reached is not None and plan.expired:   # a pool: its members' refs, read again now
            in_new = plan.reach.reached() if plan.reach is not None else set()
            cruft = set(plan.cruft)
            needed |= options.keep_reached(lambda oid: oid in in_new or oid in cruft) & plan.expired
        doomed_packs, doomed_loose = spare(needed, doomed_packs, doomed_loose, sources, c)
    doomed_packs, doomed_loose = spare_freshened(plan, doomed_packs, doomed_loose, sources, options, now, c)
    timer.lap("recheck")
    check_lease(lease)
    # A holder that stalls here, past its lease, is stopped by the maintenance fence below.
    fault_point("repack.after_lease_check")

    # -- delete, inside the maintenance fence -----------------------------------------------------
    doing = f"delete {len(doomed_packs)} packs and {len(doomed_loose)} loose objects"
    with fence_of(lease, repo.path, doing, dur, FenceKind.MAINTENANCE):
        # FIRST the new multi-pack-index: no MIDX ever names a pack deleted or preserved below.
        _publish_midx(repo, plan, options, pack_dir, {p.name for p in doomed_packs}, dur, c)
        # The packs and the loose files, each set together (no order inside one matters: :mod:`..fsparallel`),
        # and the two sets at once on a shared filesystem: the pack moves wait on the locks of objects/pack and
        # preserved/, the loose unlinks on the fan-out directories' (no order between the two matters either:
        # every object they hold is in a new pack, installed and durable before this).
        got = linked_ahead(ahead)

        def packs() -> None:
            linked = got.packs
            doomed = [p.name for p in doomed_packs]
            retire_packs(pack_dir, doomed, preserve=options.preserve, now=now, ahead=linked,
                         after_each=lambda _name: fault_point("repack.after_pack_preserved"))
            c.preserved_ahead = len(linked.intersection(doomed))
            unlink_ahead(pack_dir, sorted(linked.difference(doomed)))

            # Last for preserved/: what is past ``preserve_for`` expires (only now: a pack just moved there is
            # judged by its idx's mtime, set by the move), while the tick passes after the moves.
            def expire() -> None:
                c.preserved_expired = len(expire_preserved(pack_dir, options.preserve_for, now=now))
                c.preserved_mapped_expired = len(expire_preserved_mapped(pack_dir, options.preserve_for, now=now))
                c.preserved_loose_expired = len(expire_preserved_loose(
                    pack_dir, options.preserve_for, now=now, spare=keep.keep.name if keep is not None else None))

            fsparallel.together(lambda: advance_after_moves(pack_dir, doomed, preserve=options.preserve), expire,
                                where=pack_dir)

        def loose() -> list[tuple[int, bool] | None]:
            return fsparallel.each(_unlink_loose(repo, plan.loose_sizes, keep, got.loose, plan.expired),
                                   sorted(doomed_loose), where=repo.objects.path)

        sizes: list[tuple[int, bool] | None] = fsparallel.together(packs, loose, where=pack_dir)[1]
        for pack in doomed_packs:
            c.bytes_in += pack.size
            c.objects_in += len(pack)
            c.preserved_moved += 1 if options.preserve else 0
            c.packs_merged += 1
            result.packs_deleted.append(pack.name)
        for done in sizes:
            if done is not None:
                c.loose_deleted += 1
                c.loose_preserved += done[1]
                c.objects_in += 1
                c.bytes_in += done[0]
        if keep is not None:
            settle_keep(keep.keep, kept=c.loose_preserved > 0, now=now)
        fault_point("repack.after_loose_deleted")
        if c.bitmap_commits:   # (git uses one bitmap: a pack kept above keeps none beside the new one's)
            c.bitmaps_removed = sum(durable.unlink_if_present(p.pack_path.with_suffix(".bitmap")) for p in plan.packs
                                    if p.name not in new_names and p.name not in result.packs_deleted)
    fault_point("repack.after_delete")
    timer.lap("delete")


def _bitmap_options(options: RepackOptions, plan: RepackPlan) -> BitmapOptions:
    """The bitmap's options, with the core island's refs among the preferred tips (git marks their commits
    NEEDS_BITMAP under pack.islandCore)."""
    if options.islands is None or options.islands.core is None or plan.islands is None or not plan.islands.core_mask:
        return options.bitmap_options
    core = tuple(core_refs(plan.tips, options.islands))
    return dataclasses.replace(options.bitmap_options, prefer_tips=options.bitmap_options.prefer_tips + core)


def _wants_midx(options: RepackOptions, pack_dir: Path) -> bool:
    return options.midx and (options.mode is not RepackMode.FULL or (pack_dir / MIDX_NAME).exists())


def _publish_midx(repo, plan: "RepackPlan", options: RepackOptions, pack_dir: Path, doomed: set[str],
                  dur: durable.DurabilityCounters, c: RepackCounters) -> None:
    """Before any pack is deleted or preserved: the new multi-pack-index over every installed pack that stays
    (geometric, loose; a full repack rewrites one that exists), with its bitmap for a geometric repack (unless
    ``bitmap=False``). Without one (``midx=False``), an old MIDX naming a doomed pack is removed first (git's
    ``clear_midx_file``)."""
    if not _wants_midx(options, pack_dir):
        named = midx_pack_names(pack_dir)
        if named is not None and (doomed & set(named) or not named):
            c.midx_removed = int(remove_midx(pack_dir, dur, preserve=options.preserve_mapped, now=options.now))
        return
    staying = [s for s in installed_stems(pack_dir) if s not in doomed]
    if not staying:
        c.midx_removed = int(remove_midx(pack_dir, dur, preserve=options.preserve_mapped, now=options.now))
        return
    preferred = None
    if options.mode is RepackMode.GEOMETRIC:   # git: the largest pack of the progression that stays
        rolled = {p.name for p in plan.packs}
        active = [p for p in plan.snapshot_packs if p.name not in rolled and p.name in staying]
        if active:
            preferred = max(active, key=lambda p: (len(p), p.name)).name
    bitmap = None
    if options.bitmap and options.mode is RepackMode.GEOMETRIC:
        def bitmap(m):   # (refs read now: git's repack takes its refs snapshot for the MIDX bitmap too)
            data = midx_bitmap_for(repo, m, options.bitmap_options, processes=options.processes)
            c.midx_bitmap_commits = read_header(data).entries if data is not None else 0
            return data
    c.midx_packs = len(write_midx(pack_dir, staying, preferred=preferred, counters=dur, fault_prefix="repack",
                                  bitmap=bitmap, preserve=options.preserve_mapped,
                                  now=options.now).pack_names)


def _finish_counters(result: RepackResult, repo, rescans0: int, dur: durable.DurabilityCounters) -> None:
    result.counters.relisted_hits = repo.objects.counters.relisted_hits - rescans0
    result.durability = dur.as_dict()


def _loose_keep(repo, snapshot, options: RepackOptions, pack_dir: Path) -> LooseAhead | None:
    """Where a full or loose repack keeps the loose files it deletes (:mod:`.preservedloose`): on a shared
    filesystem, when it preserves what it replaces; else None."""
    if (options.mode is RepackMode.GEOMETRIC or not options.preserve or not snapshot.loose_ids
            or not fsparallel.is_shared(str(pack_dir))):
        return None
    return LooseAhead(new_keep_dir(pack_dir), repo.objects.loose.path_for, snapshot.loose_ids)


def _unlink_loose(repo, sizes: dict[bytes, int], keep: LooseAhead | None, linked: frozenset[bytes],
                  expired: set[bytes]) -> Callable[[bytes], tuple[int, bool] | None]:
    """A loose object's delete for :func:`delete_old_packs`: its file's size (from ``sizes``, what the plan read,
    else a stat: over NFS a round trip, and the attribute cache has expired by now) and whether a second name
    keeps it alive in ``keep``; None if it was gone.

    Kept (:mod:`.preservedloose`): every file whose object lives on in a pack, linked ahead (``linked``) or here
    before the unlink. Not an ``expired`` one: its deletion is the point (git's ``prune``), so a link made ahead
    goes too, after the file."""
    path_for = repo.objects.loose.path_for

    def unlink(oid: bytes) -> tuple[int, bool] | None:
        path = path_for(oid)
        dropped = keep is not None and oid in expired
        try:
            size = sizes.get(oid)
            if size is None:
                size = os.stat(path).st_size
            kept = keep is not None and not dropped and (oid in linked or keep_one(keep.keep, path, oid.hex()))
            os.unlink(path)
        except OSError as err:
            if is_gone(err):
                return None
            raise
        if keep is not None and dropped and oid in linked:
            durable.unlink_if_present(keep.keep / oid.hex()[0] / oid.hex())
        return size, kept
    return unlink


__all__ = ["repack",
           "write_plan", "geometric_split", "remove_stale_temp_files", "delete_old_packs"]
