"""The repack's plans: what one repack writes, and what it may delete, decided from one snapshot.

:mod:`.repack` runs the steps (snapshot, plan, write, install, recheck, delete). This module is the plan
step and the recheck's arithmetic, apart because it only decides -- it reads the snapshot's sources and the
tips, never writes, deletes or takes a lock:

* :func:`plan_full` -- everything the tips reach into the new pack; the unreachable rest into the cruft
  pack (young, or linked from a young one) or expired;
* :func:`geometric_split`, :func:`plan_geometric` -- the smallest packs until the sizes form a progression;
* :func:`plan_loose` -- every loose object not already in a pack;
* :func:`recheck_tips`, :func:`spare`, :func:`spare_freshened` -- right before deleting: the old copies
  kept for tips that moved since the plan, and for copies a writer freshened instead of writing.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from ...errors import ObjectMissingError, StoreError
from ...objdir import Location
from ...objects import ObjectType
from ...pack.packdir import PackFile
from ...progress import Progress
from ...tuning import release_free_heap
from ..walk.parse import parse_tree_entries
from ..walk.reach import Reachable, walk
from ..walk.sources import SourceIndex
from ..walk.tips import read_tips
from .cruft import reached_from
from .looseread import LooseKeeper
from .names import names_in
from .options import RepackCounters, RepackOptions
from .writeplan import ByBase, Names

if TYPE_CHECKING:
    from .islands import IslandMarks

#: A loose repack keeps up to this many bytes of the loose objects it read while planning (not read again).
PRELOAD_BYTES = 256 << 20


@dataclass
class RepackPlan:
    main: list[bytes] = field(default_factory=list)         # ids for the new pack, in write order
    cruft: list[bytes] = field(default_factory=list)        # ids for the cruft pack
    mtimes: dict[bytes, int] = field(default_factory=dict)  # cruft id -> mtime
    packs: list[PackFile] = field(default_factory=list)     # packs this repack replaces
    loose: set[bytes] = field(default_factory=set)          # loose ids this repack deletes
    expired: set[bytes] = field(default_factory=set)        # unreachable ids not kept anywhere
    reach: Reachable | None = None
    tips: dict[str, bytes] = field(default_factory=dict)
    names: Names | None = None                              # id -> the name it is reached by (delta search order)
    cruft_names: Names | None = None                        # the same for the cruft pack (names.py)
    preloaded: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)   # read (and checked) while planning
    prefetched: int = 0                              # loose objects read together before the walk
    loose_sizes: dict[bytes, int] = field(default_factory=dict)   # their files' sizes
    mtime_at_plan: dict[str, float] = field(default_factory=dict)  # pack name -> mtime when planned
    snapshot_packs: list[PackFile] = field(default_factory=list)    # geometric: the progression's packs
    cruft_walked: int = 0                                   # objects the walk from young unreachable ones visited
    borrowed_reached: int = 0                               # reachable objects left in an alternate (the pool)
    islands: "IslandMarks | None" = None                    # delta islands' marks (options.islands): main pack only


class PhaseTimer:
    def __init__(self, elapsed: dict[str, float]) -> None:
        self.elapsed = elapsed
        self.t = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.elapsed[phase] = self.elapsed.get(phase, 0.0) + now - self.t
        self.t = now


def file_mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


# -- plans --------------------------------------------------------------------------------------------

def plan_full(repo, sources: SourceIndex, replaceable: list[PackFile], options: RepackOptions, now: float,
               progress: Progress | None, timer: "PhaseTimer") -> RepackPlan:
    """Everything reachable into the new pack; the unreachable rest into the cruft pack or expired.
    Phases (``timer``): ``prefetch`` (the loose objects, read together: looseread.py), ``walk`` (from the
    tips), ``ages`` (every unreachable copy's age), ``young`` (the old objects young ones link to: cruft.py),
    then ``plan`` for the rest (the cruft pack's order)."""
    tips = read_tips(repo)
    preloaded: dict[bytes, tuple[int, bytes]] = {}
    keeper = LooseKeeper(sources, preloaded, PRELOAD_BYTES // 4)
    prefetched = keeper.prefetch()
    timer.lap("prefetch")
    reach = walk(sorted(tips.items()), keeper.read, progress=progress, processes=options.processes, packs=sources)
    timer.lap("walk")
    plan = RepackPlan(reach=reach, tips=tips, packs=list(replaceable), loose=set(sources.loose_ids),
                 names=lambda: reach.names, preloaded=preloaded,   # (names built only if the search runs)
                 prefetched=prefetched, loose_sizes=keeper.file_sizes)
    plan.main = sources.present(reach.ids())
    if options.islands is not None:   # (delta islands: every reachable object's marks, from the island refs)
        from .islands import compute_marks

        plan.islands = compute_marks(tips, options.islands, reach, keeper.read, packs=sources,
                                     processes=options.processes)
        timer.lap("islands")
    if sources.alternates:   # (a fork: what it reaches that only its pool holds stays there)
        plan.borrowed_reached = len(reach) - len(plan.main)
    seen = reach.reached()
    # Every unreachable copy with its age: a loose file's mtime, a pack's, or a cruft pack's own record.
    ages: dict[bytes, int] = {}
    kept = sources.kept_ids
    for p, unreached in zip(sources.packs, sources.unreached(seen)):   # (positions neither reached nor kept)
        pack_mtime = int(file_mtime(p.pack.pack_path))
        oids = p.oids
        for i in unreached:
            oid = oids[20 * i:20 * i + 20]
            t = p.mtimes[i] if p.mtimes is not None else pack_mtime
            if t > ages.get(oid, -1):
                ages[oid] = t
    for oid in sources.loose_ids:
        if oid in seen or oid in kept:
            continue
        t = int(file_mtime(repo.objects.loose.path_for(oid)))
        if t > ages.get(oid, -1):
            ages[oid] = t
    members_keep: set[bytes] = set()
    if options.keep_reached is not None and ages:   # a pool: what its members reach stays, as if young
        members_keep = {oid for oid in options.keep_reached(lambda oid: oid in seen) if oid in ages}
        for oid in members_keep:
            ages[oid] = max(ages[oid], int(now))   # (its cruft mtime: this repack's time)
    cutoff = now - options.expire
    keep = {oid for oid, t in ages.items() if t >= cutoff} | members_keep
    timer.lap("ages")
    young = _in_source_order(keep, sources)   # (pack order: the walk below reads them as git wrote them)
    rescued: set[bytes] = set()
    if keep and len(keep) < len(ages):   # (all young, or all old: no old object for a young one to save)
        # The main walk's pages of the packs and its freed caches go back first: otherwise the walk below
        # adds its own on top of them (cruft-expire: peak 183 -> 148 MiB; git's `repack --cruft -d` 150).
        sources.drop_pages()
        release_free_heap()
        rescued, plan.cruft_walked = reached_from(keep, ages, sources.read, reach=reach, c_packs=sources.c_packs,
                                                  order=young)
        keep |= rescued
    reach.drop_index()   # (membership in bulk is done; the rare recheck of changed tips rebuilds it)
    sources.drop_pages()  # (the commits and trees the walks read: the writer faults in what it copies)
    release_free_heap()   # (the walkers' seen sets and caches: the search and the writer need their own)
    timer.lap("young")
    plan.cruft = _in_source_order(keep, sources) if rescued else young
    plan.cruft_names = ByBase(lambda: reach.names)   # (through their bases: writeplan.ByBase; if the search runs)
    plan.mtimes = {oid: ages[oid] for oid in keep}
    plan.expired = set(ages) - keep
    return plan


def _in_source_order(ids: set[bytes], sources: SourceIndex) -> list[bytes]:
    """``ids`` in the order their copies lie in the sources (packs in snapshot order, then loose by id).

    Each id's copy is the one ``sources.packed`` names (an id in two packs is listed once, where that copy
    lies); sorted by (pack, offset), which is the order of a pass over every pack in pack order, without
    the pass (cruft-expire: 39,000 ids of 164,000 entries, 0.33 s -> 0.06 s)."""
    if not ids:
        return []   # (the common case: no young unreachable object)
    placed: list[tuple[int, int, bytes]] = []
    rest: list[bytes] = []
    packed, pack_no, packs = sources.packed, sources.pack_no, sources.packs
    for oid in ids:
        gid = packed(oid)
        if gid is None:
            rest.append(oid)
            continue
        k = pack_no[gid]
        p = packs[k]
        placed.append((k, p.offsets[gid - p.base], oid))
    placed.sort()
    out = [oid for _k, _off, oid in placed]
    out.extend(sorted(rest))
    return out


def geometric_split(packs: Iterable[PackFile], factor: int) -> list[PackFile]:
    """The packs to roll up so that object counts form a geometric progression (git's split_pack_geometry).

    Sorted by object count; from the largest down, the packs already in progression (each at least
    ``factor`` times the one below it) stay; the rest is rolled up, and then every pack that is
    smaller than ``factor`` times the rolled-up total joins it too.
    """
    packs = sorted(packs, key=lambda p: (len(p), p.name))
    n = len(packs)
    if not n:
        return []
    i = n - 1
    while i > 0:
        if len(packs[i]) < factor * len(packs[i - 1]):
            break
        i -= 1
    split = i + 1 if i else 0
    total = sum(len(p) for p in packs[:split])
    for k in range(split, n):
        if len(packs[k]) < factor * total:
            split += 1
            total += len(packs[k])
        else:
            break
    return packs[:split]


def plan_geometric(sources: SourceIndex, rolled: list[PackFile], snapshot) -> RepackPlan:
    """Every object of the rolled-up packs (each pack in pack order, dedup) that no pack staying behind holds
    (as git's ``pack-objects --stdin-packs`` leaves out the excluded packs' objects), and every unpacked
    loose object."""
    plan = RepackPlan(packs=list(rolled))
    rolled_names = {p.name for p in rolled}
    # Packs that stay (not cruft: a cruft copy may expire; kept packs' objects are not in the sources).
    staying = [p for p in snapshot.packs if p.name not in rolled_names and not p.is_cruft]
    ids: list[bytes] = []
    for p in sources.packs:
        oids = p.oids
        for i in p.order:
            oid = oids[20 * i:20 * i + 20]
            if sources.packed(oid) == p.base + i and not any(s.find_offset(oid) is not None for s in staying):
                ids.append(oid)
    ids.extend(_unpacked_loose(sources, snapshot))
    plan.main = ids
    plan.loose = set(sources.loose_ids)
    plan.names = lambda: names_in(sources, ids)   # (no walk named them; only if the search runs)
    return plan


def _unpacked_loose(sources: SourceIndex, snapshot) -> list[bytes]:
    """Loose objects not in a replaceable pack nor in any non-cruft pack (git's ``--unpacked``) nor in an alternate
    (git's ``--local``: the pool has it), by id."""
    out = []
    for oid in sorted(sources.loose_ids):
        if sources.packed(oid) is None and snapshot.packs.find_not_cruft(oid) is None and not any(
                alt.locate(oid) is not Location.MISSING for alt in snapshot.alternates):
            out.append(oid)
    return out


def plan_loose(repo, sources: SourceIndex, snapshot, progress: Progress | None) -> RepackPlan:
    """Every loose object not already in a pack, commits first, then tags, trees, blobs (by id within a type).

    Each loose file is read once, here (checked against its name): the delta search and the writer take
    the objects from ``preloaded`` (up to PRELOAD_BYTES of them), and the loose trees' entries give the
    objects below them their names, so that the search's order puts versions of one file together.
    """
    plan = RepackPlan(loose=set(sources.loose_ids))
    by_type: dict[int, list[bytes]] = {1: [], 4: [], 2: [], 3: []}
    loose = repo.objects.loose
    held = 0
    trees: list[tuple[bytes, bytes]] = []
    for oid in _unpacked_loose(sources, snapshot):
        try:
            typ, data = loose.read(oid, verify=True)
        except ObjectMissingError:
            plan.loose.discard(oid)   # gone since the snapshot: someone else's business
            continue
        by_type[int(typ)].append(oid)
        if typ == ObjectType.TREE:
            trees.append((oid, data))
        if held + len(data) <= PRELOAD_BYTES:
            plan.preloaded[oid] = (int(typ), data)
            held += len(data)
    plan.main = [oid for t in (1, 4, 2, 3) for oid in by_type[t]]
    plan.names = names_below(trees, plan.preloaded.keys() | set(plan.main))
    return plan


def names_below(trees: list[tuple[bytes, bytes]], wanted) -> dict[bytes, bytes]:
    """{object id: entry name} for every entry of ``trees`` whose id is in ``wanted`` (a tree with a
    malformed entry names nothing: the write checks it anyway)."""
    names: dict[bytes, bytes] = {}
    for oid, data in trees:
        try:
            entries = parse_tree_entries(data, oid)
        except StoreError:
            continue
        for _mode, name, eid in entries:
            if eid in wanted and eid not in names:
                names[eid] = name
    return names


# -- before deleting ----------------------------------------------------------------------------------

def recheck_tips(repo, plan: RepackPlan, sources: SourceIndex) -> set[bytes]:
    """Tips read again right before deleting: the objects they reach that no new pack holds."""
    tips = read_tips(repo)
    changed = [(name, oid) for name, oid in sorted(tips.items()) if plan.tips.get(name) != oid]
    if not changed:
        return set()
    in_new = plan.reach.reached() if plan.reach is not None else set()
    cruft = set(plan.cruft)
    reach = walk(changed, sources.read, known=lambda oid: oid in in_new or oid in cruft)
    return {oid for oid, _t in reach.in_order() if oid in plan.expired}


def spare(needed: set[bytes], packs: list[PackFile], loose: set[bytes], sources: SourceIndex,
           c: RepackCounters) -> tuple[list[PackFile], set[bytes]]:
    """Keep every old copy of the ``needed`` objects (their pack, or their loose file)."""
    if not needed:
        return packs, loose
    keep_packs: set[str] = set()
    for oid in needed:
        gid = sources.packed(oid)
        if gid is not None:
            keep_packs.add(sources.entry(gid)[0].pack.name)
        # Every other copy too (another pack may hold it): keep any replaceable pack that has it.
        for p in sources.packs:
            if p.pack.name not in keep_packs and p.pack.find_offset(oid) is not None:
                keep_packs.add(p.pack.name)
    spared_loose = loose & needed
    c.kept_for_recheck += len(keep_packs) + len(spared_loose)
    return [p for p in packs if p.name not in keep_packs], loose - spared_loose


def spare_freshened(plan: RepackPlan, packs: list[PackFile], loose: set[bytes], sources: SourceIndex,
                     options: RepackOptions, now: float, c: RepackCounters) -> tuple[list[PackFile], set[bytes]]:
    """A writer that found an expired object and freshened its copy (instead of writing it) is relying on
    that copy: keep packs touched since the plan that hold expired objects, and freshened loose files."""
    if not plan.expired:
        return packs, loose
    cutoff = now - options.expire
    keep_packs = set()
    for p in packs:
        if file_mtime(p.pack_path) != plan.mtime_at_plan.get(p.name, 0.0):
            keep_packs.add(p.name)
    spared = set()
    for oid in loose & plan.expired:
        if file_mtime(Path(sources.snapshot.loose.path_for(oid))) >= cutoff:
            spared.add(oid)
    if keep_packs or spared:
        c.kept_freshened += len(keep_packs) + len(spared)
    return [p for p in packs if p.name not in keep_packs], loose - spared
