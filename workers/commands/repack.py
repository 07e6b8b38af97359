"""repack as a plain function: the engine's repack with the maintenance lease's check and fencing token."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from packyard.store.errors import InvalidInputError
from packyard.store.lease import Lease
from packyard.store.maintenance.pool.layout import is_pool
from packyard.store.maintenance.pool.lifecycle import repack_pool
from packyard.store.maintenance.repack.islands import IslandOptions
from packyard.store.maintenance.repack.options import DEFAULT_EXPIRE_SECONDS, RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack as store_repack
from packyard.store.maintenance.serving.bitmap import BitmapOptions
from packyard.store.maintenance.serving.refresh import after_repack
from packyard.store.progress import Progress
from packyard.workers.durations import parse_duration
from packyard.workers.repos import open_repository


def parse_expire(value: str | float | int | None, default: float = DEFAULT_EXPIRE_SECONDS) -> float:
    """An age in seconds from git's spellings: ``2.weeks.ago``, ``1.hour.ago``, ``now``, ``never``, or seconds
    (workers/durations.py reads them); None or "" is ``default``."""
    if value is None or value == "":
        return default
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        try:
            return parse_duration(str(value))
        except InvalidInputError as err:
            raise InvalidInputError(f"cannot read the expiry {value!r}: {err}") from None
    if seconds < 0:
        raise InvalidInputError(f"expiry must not be negative: {value!r}")
    return seconds


def repack(repo: str | Path, *, mode: str = "full", factor: int = 2, expire: str | float | None = None,
           preserve_for: float | None = None, preserve: bool = True, no_reuse: bool = False,
           window: int | None = None, depth: int | None = None, window_memory: int | None = None,
           no_bitmap: bool = False, progress: Progress | None = None, lease: Lease | None = None,
           commit_graph: bool = True,
           pack_refs: bool = True, no_midx: bool = False, islands: list[str] | None = None,
           island_core: str | None = None, unsafe_ignore_pool_members: bool = False) -> dict[str, Any]:
    """Repack ``repo``. ``lease``: the maintenance lease (``check()`` before the first deletion, ``token``
    for the store's maintenance fence). Raises the store's typed errors; nothing is deleted then.

    ``no_reuse``: recompute every delta (``git repack -f``); ``window``, ``depth``, ``window_memory``
    (bytes per search process): the delta search's, as git names them (None: the defaults). ``no_bitmap``: a
    full repack writes no reachability bitmap (the settings choose the bitmap's lookup table and preferred
    tips, not the message). ``commit_graph`` / ``pack_refs``: afterwards write the commit-graph and pack the
    refs (the defaults; store/maintenance/serving/refresh.py).
    ``no_midx``: geometric/loose write no multi-pack-index (one naming a deleted pack is removed first).
    ``islands``: delta islands' regexes (git's ``pack.island``, ``repack -i``); a pool's repack uses its members'
    namespaces when none are given. ``island_core``: git's ``pack.islandCore``, the island written first (and
    whose refs' commits get bitmaps); in a pool, a member's namespace key.
    ``unsafe_ignore_pool_members``: repack a pool as a plain repository, pruning
    what only its members reach -- the pool race's negative control (workers/race/pool.py), never a default."""
    try:
        repack_mode = RepackMode(mode)
    except ValueError:
        raise InvalidInputError(f"unknown repack mode {mode!r}: full, geometric or loose") from None
    from packyard.workers.settings import get_settings

    settings = get_settings()
    if preserve_for is None:
        preserve_for = settings.maintenance_preserve_for
    search: dict[str, Any] = {}
    for name, value in (("window", window), ("depth", depth), ("window_memory", window_memory)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInputError(f"{name} must be a non-negative integer, not {value!r}")
            search[name] = value
    options = RepackOptions(mode=repack_mode, factor=int(factor), expire=parse_expire(expire),
                            preserve_for=float(preserve_for), preserve=preserve, reuse=not no_reuse,
                            bitmap=not no_bitmap, midx=not no_midx,
                            islands=IslandOptions(tuple(islands or ()), core=island_core)
                            if islands or island_core else None,
                            bitmap_options=BitmapOptions(lookup_table=settings.bitmap_lookup_table,
                                                         prefer_tips=settings.bitmap_prefer_tips),
                            unsafe_ignore_pool_members=unsafe_ignore_pool_members, **search)
    r = open_repository(repo)
    if island_core is not None and not islands and not is_pool(r.path):
        raise InvalidInputError("an island core (pack.islandCore) needs island regexes (--island) outside a pool")
    if is_pool(r.path) and not unsafe_ignore_pool_members:   # keeps what its members reach (store/maintenance/pool)
        result = repack_pool(r, options, progress=progress, lease=lease)
    else:
        result = store_repack(r, options, progress=progress, lease=lease)
    counters = result.as_counters()
    counters.update(after_repack(r, commit_graph=commit_graph, pack_refs_too=pack_refs,
                                 replace_graph=result.counters.cruft_expired > 0,
                                 lease=lease, graph_expire_after=float(preserve_for), walked=result.walked,
                                 preserve=options.preserve_mapped))
    return {"repo": str(r.path), "mode": repack_mode.value, "packs_written": result.packs_written,
            "cruft_pack": result.cruft_pack, "packs_deleted": result.packs_deleted,
            "nothing_to_do": result.nothing_to_do, "counters": counters}
