"""After a repack: leave the repository ready to serve -- the commit-graph written, the loose refs packed.

:func:`after_repack` is the one call the repack job makes once the new packs are installed and the old
ones deleted (so the graph describes only installed objects). The commit-graph extends its split chain,
or is rewritten whole (``replace``) when the repack deleted unreachable objects (no layer may keep
naming a commit that is gone); then ``pack-refs``. Both check the maintenance lease first and run inside
the maintenance fence, like the repack's deletions.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ... import durable
from ...errors import LockContendedError
from ...fence import FenceKind
from ...lease import Lease, fence_of, token_of
from ...lease import check as check_lease
from ...packrefs import pack_refs
from ..walk.parse import CommitMeta
from .commitgraph import DEFAULT_EXPIRE_AFTER, commits_from_walk
from .graphwrite import GraphOptions, write_commit_graph


def after_repack(repo, *, commit_graph: bool = True, pack_refs_too: bool = True, replace_graph: bool = False,
                 lease: Lease | None = None, graph_expire_after: float = DEFAULT_EXPIRE_AFTER,
                 walked: tuple[Sequence[bytes], CommitMeta] | None = None, preserve: bool = True) -> dict[str, Any]:
    """Write the commit-graph and pack the refs (each optional); returns counters for the job record.
    ``lease`` (store/lease.py): the repack's maintenance lease, checked before each write, its token fencing it.
    ``walked``: the repack's :attr:`~.repack.RepackResult.walked` (the commits its walk read: the graph
    write takes them as read instead of reading every commit again). ``preserve``: a monolithic commit-graph
    removed and the packed-refs replaced are kept in ``objects/pack/preserved/`` for the preserve time (git
    mmaps both: store/maintenance/preserved/packs.py); False: not kept."""
    out: dict[str, Any] = {}
    dur = durable.DurabilityCounters()
    if commit_graph:
        check_lease(lease)
        t0 = time.monotonic()
        try:
            with fence_of(lease, repo.path, "write the commit-graph", dur, FenceKind.MAINTENANCE):
                known = commits_from_walk(*walked) if walked is not None else None
                res = write_commit_graph(repo, GraphOptions(replace=replace_graph, expire_after=graph_expire_after,
                                                            preserve=preserve),
                                         dur, known=known)
            out.update(res.as_counters())
        except LockContendedError as err:
            # Another writer (git's commit-graph write, say) holds the chain: the repack stands; next time.
            out["commit_graph_busy"] = str(err)
        out["elapsed_us_commit_graph"] = int((time.monotonic() - t0) * 1_000_000)
    if pack_refs_too:
        check_lease(lease)
        t0 = time.monotonic()
        try:
            out.update(pack_refs(repo, fence_token=token_of(lease), counters=dur, preserve=preserve).as_counters())
        except LockContendedError as err:
            out["pack_refs_busy"] = str(err)   # git holds packed-refs.lock (a deletion): next time
        out["elapsed_us_pack_refs"] = int((time.monotonic() - t0) * 1_000_000)
    out.update({f"durability_serving_{k}": v for k, v in dur.as_dict().items()})
    return out


__all__ = ["after_repack"]
