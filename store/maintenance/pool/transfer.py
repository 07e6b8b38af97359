"""The one copy between a repository and its pool: what some tips reach that the destination lacks.

``fetch`` copies a member's new objects into the pool (tips: the member's refs; source: the member; destination:
the pool); ``disconnect`` copies back into a member what it reaches only through the pool (tips: the member's
refs; source: the pool; destination: the member). Both are one walk and one pack, the way a repack is:

1. the destination's own snapshot is taken first (an object it holds is never copied; one that arrives after
   is copied again, harmlessly: two copies, never zero);
2. a :class:`~..sources.SourceIndex` over the source's packs, with the destination's packs ``borrowed`` (read by
   the walk as fast as the source's, never written);
3. the walk from the tips (:func:`~..walk.walk`): a missing object is an ObjectMissingError naming the ref that
   reaches it, before anything is written;
4. the one pack writer (:func:`~..writeplan.write_plan`: deltas whose base is copied too are reused verbatim,
   CRC-checked; the others searched again) and the one install sequence (``<prefix>.after_*`` fault points);
   the pack is complete on its own (no delta on a base it lacks).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ... import durable
from ...errors import ObjectMissingError
from ...lease import Lease
from ...lease import check as check_lease
from ...objects import ObjectType
from ...pack.write import PackWriter
from ...progress import Progress
from ..repack.options import DeltaPlan, RepackCounters
from ..repack.writeplan import write_plan
from ..walk.reach import walk
from ..walk.sources import SourceIndex


@dataclass
class TransferResult:
    objects: int = 0                  # objects copied (the new pack's)
    reachable: int = 0                # objects the tips reach
    pack: str | None = None           # the pack installed in the destination, if any
    bytes: int = 0
    elapsed: dict[str, float] = field(default_factory=dict)
    durability: dict[str, int] = field(default_factory=dict)


def copy_missing(tips: Mapping[str, bytes], source, dest, *, progress: Progress | None = None,
                 lease: Lease | None = None, processes: int = 2, fault_prefix: str = "pool.copy") -> TransferResult:
    """Copy into ``dest`` (a Repository) every object ``tips`` reach that ``dest`` does not hold itself, reading
    them from ``source`` (a Repository: its own objects and its alternates'). ``lease``: checked before the
    pack is published (LockLostError: nothing installed)."""
    result = TransferResult()
    t0 = time.monotonic()
    have = dataclasses.replace(dest.objects.snapshot(), alternates=())   # what dest holds itself
    snap = source.objects.snapshot()

    def read_fresh(oid: bytes) -> tuple[ObjectType, bytes]:
        try:
            return source.objects.read(oid)
        except ObjectMissingError:
            return dest.objects.read(oid)

    sources = SourceIndex(snap, list(snap.packs), [], read_fresh=read_fresh, borrowed=(have,))
    writer: PackWriter | None = None
    dur = durable.DurabilityCounters()
    try:
        reach = walk(sorted(tips.items()), sources.read, progress=progress, processes=processes, packs=sources)
        result.reachable = len(reach)
        ids = sources.present(reach.ids())
        result.elapsed["walk"] = time.monotonic() - t0
        if not ids:
            return result
        pack_dir = Path(dest.objects.path) / "pack"
        writer = PackWriter(pack_dir, len(ids), counters=dur, fault_prefix=fault_prefix)
        write_plan(writer, ids, sources, RepackCounters(), progress=progress, phase="copying objects",
                   names=lambda: reach.names, deltas=DeltaPlan())
        writer.finish()
        result.elapsed["write"] = time.monotonic() - t0 - result.elapsed["walk"]
        check_lease(lease)   # (publish nothing for a holder that lost its lease while writing)
        _outcome, files, _keep = writer.install()
        result.pack, result.objects, result.bytes = files.name, writer.count, writer.size
    except BaseException:
        if writer is not None and not writer.installed:
            writer.abort()
        raise
    finally:
        sources.release()
        result.durability = dur.as_dict()
    return result


__all__ = ["TransferResult", "copy_missing"]
