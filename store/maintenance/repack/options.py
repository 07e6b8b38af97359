"""What a repack is asked to do and what it reports: its options, the write plan's delta options, its counters,
its result and its test hooks.

Apart from :mod:`.repack` (which runs one), so that the planner (:mod:`.repackplan`) and the writer
(:mod:`.writeplan`) read them without importing the repack that calls them.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ...pack.search import DEFAULT_DEPTH, DEFAULT_WINDOW, DEFAULT_WINDOW_MEMORY, SearchOptions
from ...pack.write import PACK_COMPRESSION
from ..preserved.packs import DEFAULT_PRESERVE_SECONDS
from ..serving.bitmap import BitmapOptions
from ..walk.parse import CommitMeta
from .islands import IslandOptions


@dataclass(frozen=True)
class DeltaPlan:
    """How a plan's deltas are made: reused (``reuse``) and/or searched (``search``; None: no search,
    everything without a reused delta is written whole). ``depth`` bounds every chain, reused ones too."""

    reuse: bool = True
    search: SearchOptions | None = SearchOptions()
    depth: int = DEFAULT_DEPTH



#: The marker of an object pool (pool/layout.py's MARKER; a test checks they agree): its full repack expires
#: objects only with its members' reach in hand.
POOL_MARKER = Path("packyard") / "pool"

#: git's gc.pruneExpire default: unreachable objects younger than this are kept (in the cruft pack).
DEFAULT_EXPIRE_SECONDS = 14 * 24 * 3600.0

class RepackMode(enum.Enum):
    FULL = "full"
    GEOMETRIC = "geometric"
    LOOSE = "loose"


@dataclass(frozen=True)
class RepackOptions:
    mode: RepackMode = RepackMode.FULL
    factor: int = 2                                  # geometric progression factor
    expire: float = DEFAULT_EXPIRE_SECONDS           # seconds: older unreachable objects are deleted
    preserve_for: float = DEFAULT_PRESERVE_SECONDS   # seconds a replaced pack stays in preserved/
    preserve: bool = True                            # False: replaced packs are unlinked at once
    compression: int = PACK_COMPRESSION              # zlib level for objects written whole
    processes: int = 2                               # the walk and the delta search fork helpers when > 1
    now: float | None = None                         # the clock (tests)
    reuse: bool = True                               # False: recompute every delta (git repack -f)
    window: int = DEFAULT_WINDOW                     # delta search window (git's --window); 0: no search
    depth: int = DEFAULT_DEPTH                       # longest delta chain, reused ones too (git's --depth)
    window_memory: int = DEFAULT_WINDOW_MEMORY       # bytes per search process (git's --window-memory); 0: no bound
    midx: bool = True                                # geometric/loose: write a multi-pack-index over what stays
    bitmap: bool = True                              # full: a reachability bitmap with the pack (bitmap.py)
    bitmap_options: BitmapOptions = BitmapOptions()  # hash cache, lookup table, pack.preferBitmapTips
    #: a pool's repack (pool/members.py): given "already reached?", the objects its members reach; they are kept
    #: as young (cruft pack, this repack's time), at the plan and again right before the delete
    keep_reached: Callable[[Callable[[bytes], bool]], set[bytes]] | None = None
    #: UNSAFE, the race harness's and the tests' negative control only: repack a pool as a plain repository
    unsafe_ignore_pool_members: bool = False
    #: delta islands (git's pack.island, ``repack -i``; islands.py): full repack, the main pack's deltas
    islands: IslandOptions | None = None

    @property
    def preserve_mapped(self) -> bool:
        """Keep the MIDX a repack replaces (a file git maps) in preserved/: ``preserve`` and a preserve time."""
        return self.preserve and self.preserve_for > 0

    def delta_plan(self) -> DeltaPlan:
        search = None if self.window <= 1 else SearchOptions(
            window=self.window, depth=self.depth, window_memory=self.window_memory, processes=self.processes,
            compression=self.compression)
        return DeltaPlan(reuse=self.reuse, search=search, depth=self.depth)


@dataclass
class RepackCounters:
    """Counters for the job record."""

    objects_in: int = 0           # objects in the packs and loose files this repack replaced
    objects_out: int = 0          # objects written (new pack + cruft pack)
    bytes_in: int = 0             # bytes of the packs and loose files replaced
    bytes_out: int = 0            # bytes of the packs written
    deltas_reused: int = 0        # delta entries copied verbatim (compressed bytes never inflated)
    entries_copied: int = 0       # whole entries copied verbatim
    rewritten_whole: int = 0      # objects written whole (loose, or delta base not in the new pack)
    packs_merged: int = 0         # packs replaced (moved to preserved/ or deleted)
    loose_packed: int = 0         # loose objects written into a new pack
    loose_deleted: int = 0        # loose files deleted
    loose_preserved: int = 0      # of them, kept alive in preserved/loose-<hex>/ for readers on other hosts (shared FS)
    reachable: int = 0            # full: objects the tips reach
    borrowed: int = 0             # full, with alternates: of them, those left in the pool (not packed here)
    cruft_kept: int = 0           # unreachable objects kept in the cruft pack (young, or reached from young)
    cruft_expired: int = 0        # unreachable objects older than the grace period: not kept
    cruft_walked: int = 0         # objects the walk from young unreachable ones went through (0: no old ones)
    kept_for_recheck: int = 0     # old copies kept because the tips read before deleting reach them
    kept_freshened: int = 0       # old copies kept because a writer freshened them during the repack
    preserved_moved: int = 0      # packs moved to preserved/
    preserved_ahead: int = 0      # of them, packs whose .pack and .rev were linked there while writing (shared FS)
    preserved_expired: int = 0    # preserved packs removed after preserve_for
    preserved_loose_expired: int = 0    # repacks' preserved loose-file directories removed after preserve_for
    preserved_mapped_expired: int = 0   # preserved old MIDXs, commit-graphs, packed-refs removed after preserve_for
    stale_tmp_removed: int = 0    # temp files of dead repacks removed
    relisted_hits: int = 0        # lookups that found an object only after re-listing objects/pack
    deltas_computed: int = 0      # new deltas the search found (and wrote)
    deltas_tried: int = 0         # delta encoder calls of the search
    delta_bytes_saved: int = 0    # object bytes minus delta bytes over the new deltas (uncompressed)
    delta_candidates: int = 0     # objects the search considered (no reused delta; tree or blob; sizes in range)
    search_skipped: int = 0       # objects left out of the search: whole in one source pack, as all around them
    deltas_dropped: int = 0       # reusable deltas not reused: they closed a cycle or passed the depth limit
    island_deltas_dropped: int = 0   # reusable deltas not reused: their base lacks an island of theirs (islands.py)
    islands: int = 0              # delta islands marked (0: none asked, or no ref in one)
    loose_prefetched: int = 0     # loose objects read together before the walk (looseread.LooseKeeper.prefetch)
    whole_settled: int = 0        # whole objects taken from the main source pack instead of another copy
    search_processes: int = 0     # processes the search ran in
    window_peak_bytes: int = 0    # most bytes one search window held (objects and block indexes)
    midx_packs: int = 0           # packs the multi-pack-index written names (0: none written)
    midx_removed: int = 0         # 1: an old multi-pack-index naming a deleted pack was removed (--no-midx)
    midx_bitmap_commits: int = 0  # commits the multi-pack-index's bitmap has a bitmap for (geometric)
    bitmap_commits: int = 0       # commits the new pack's .bitmap has a bitmap for
    bitmap_skipped: int = 0       # 1: a full repack wrote no bitmap (its pack lacks closure: .keep packs)
    bitmaps_removed: int = 0      # bitmaps of replaceable packs the repack had to keep (the new pack's is git's one)


@dataclass
class RepackResult:
    mode: RepackMode
    packs_written: list[str] = field(default_factory=list)
    cruft_pack: str | None = None
    packs_deleted: list[str] = field(default_factory=list)
    counters: RepackCounters = field(default_factory=RepackCounters)
    elapsed: dict[str, float] = field(default_factory=dict)
    fence_token: int | None = None
    durability: dict[str, int] = field(default_factory=dict)
    nothing_to_do: bool = False
    # (commit ids, what the walk read of them): the commit-graph written next takes them as read
    walked: tuple[list[bytes], CommitMeta] | None = field(default=None, repr=False, compare=False)

    def as_counters(self) -> dict[str, object]:
        """Flat counters for a job record: counts, ``elapsed_us_<phase>``, durability calls."""
        out: dict[str, object] = dict(asdict(self.counters))
        for phase, secs in self.elapsed.items():
            out[f"elapsed_us_{phase}"] = int(round(secs * 1_000_000))
        out.update({f"durability_{k}": v for k, v in self.durability.items()})
        out["packs_written"] = len(self.packs_written)
        if self.fence_token is not None:
            out["fence_token"] = self.fence_token
        return out


@dataclass
class RepackHooks:
    """Test and harness hooks: called between steps (a test pushes a pack there)."""

    after_plan: Callable[[], None] | None = None
    before_delete: Callable[[], None] | None = None


__all__ = ["POOL_MARKER", "DEFAULT_EXPIRE_SECONDS", "RepackMode", "RepackOptions", "DeltaPlan", "RepackCounters",
           "RepackResult", "RepackHooks"]
