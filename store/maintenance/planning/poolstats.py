"""A repository's place in a fork network, for the planner: a pool, a member of one, or neither; for a pool,
whether a fetch from its source is due and what its members save by sharing it.

Cheap, as the rest of the statistics: the marker and members files, ref values (``packed-refs`` and loose refs)
and pack directory listings; no object is read and nothing is walked. Other repositories (a pool's source and
members, a member's pool) are read only when they resolve inside ``roots``, the storage roots the worker layer
passes: a marker or members file can never make the planner read a repository outside them.

"A fetch is due" is decided on objects, not names: a source ref counts as behind when its value is the value of
no ref the pool keeps (in any member's namespace), so a fetch would bring objects the members' repacks could
then drop. A ref renamed, or moved to a commit the pool already has under another member, is not behind.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...errors import StoreError
from ..pool.layout import MARKER, NAMESPACE, is_pool, read_marker, read_members

#: At most this many members have their pack directories listed for the dedupe figure (a bound on the loop).
MEMBERS_LISTED = 10_000


class PoolRole(str, enum.Enum):
    PLAIN = "plain"     # neither a pool nor borrowing from one
    POOL = "pool"       # an object pool (its packyard/pool marker)
    MEMBER = "member"   # borrows from a pool through objects/info/alternates


@dataclass(frozen=True)
class PoolStats:
    role: PoolRole = PoolRole.PLAIN
    pool: str | None = None             # member: the pool it borrows from
    members: int = 0                    # pool: members its members file lists
    source: str | None = None           # pool: the repository its fetches take refs from (the marker's)
    source_refs: int = 0                # pool: the source's refs (outside refs/virtual/)
    #: pool: the source's refs whose value no ref of the pool has (None: the source was not read: outside the
    #: storage roots, gone, or no roots given)
    source_refs_behind: int | None = None
    pool_pack_bytes: int = 0            # pool: its packs; member: its pool's
    own_pack_bytes: int = 0             # member: its own packs; pool: its members' own packs, summed
    members_listed: int = 0             # pool: members whose packs were counted (inside the roots, present)

    @property
    def dedupe_ratio(self) -> float | None:
        """Pool: the disk its members would take as full copies over what they take sharing it,
        (members x pool + theirs) / (pool + theirs); None for a repository that is not a pool or has none."""
        if self.role is not PoolRole.POOL or not self.members_listed:
            return None
        shared = self.pool_pack_bytes + self.own_pack_bytes
        if shared <= 0:
            return None
        return round((self.members_listed * self.pool_pack_bytes + self.own_pack_bytes) / shared, 3)

    def as_dict(self) -> dict[str, Any]:
        if self.role is PoolRole.PLAIN:
            return {"pool_role": self.role.value}
        out: dict[str, Any] = {"pool_role": self.role.value, "pool_pack_bytes": self.pool_pack_bytes,
                               "own_pack_bytes": self.own_pack_bytes}
        if self.role is PoolRole.MEMBER:
            out["pool"] = self.pool
        else:
            out.update(pool_members=self.members, pool_source=self.source, source_refs=self.source_refs,
                       source_refs_behind=self.source_refs_behind, dedupe_ratio=self.dedupe_ratio)
        return out


def pack_bytes(git_dir: Path) -> int:
    """The bytes of ``objects/pack/*.pack`` (one listing; a pack gone meanwhile counts nothing)."""
    total = 0
    try:
        with os.scandir(git_dir / "objects" / "pack") as it:
            for entry in it:
                if entry.name.endswith(".pack"):
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        continue
    except FileNotFoundError:
        return 0
    return total


def _inside(path: Path, roots: Sequence[Path] | None) -> Path | None:
    """``path`` resolved, if it lies inside one of ``roots`` and is a directory; else None."""
    if roots is None:
        return None
    real = Path(os.path.realpath(path))
    if not real.is_dir() or not any(Path(os.path.realpath(r)) in real.parents for r in roots):
        return None
    return real


def _ref_values(git_dir: Path) -> dict[str, bytes]:
    from ...repo import Repository

    return Repository.open(git_dir).refs.as_dict()


def _first_pool(git_dir: Path, roots: Sequence[Path] | None) -> Path | None:
    """The first alternate of ``git_dir`` that is a pool's objects directory (None: none, or unreadable)."""
    from ...alternates import read_chain

    try:
        chain = read_chain(git_dir / "objects", roots=roots)
    except StoreError:
        return None
    for alt in chain.alternates:
        candidate = Path(alt.path).parent
        if (candidate / MARKER).is_file():
            return candidate
    return None


def gather_pool_stats(git_dir: Path, *, roots: Sequence[Path] | None = None) -> PoolStats:
    git_dir = Path(git_dir)
    if is_pool(git_dir):
        return _pool_stats(git_dir, roots)
    pool = _first_pool(git_dir, roots) if (git_dir / "objects" / "info" / "alternates").is_file() else None
    if pool is None:
        return PoolStats()
    return PoolStats(PoolRole.MEMBER, pool=str(pool), pool_pack_bytes=pack_bytes(pool),
                     own_pack_bytes=pack_bytes(git_dir))


def _pool_stats(git_dir: Path, roots: Sequence[Path] | None) -> PoolStats:
    try:
        marker = read_marker(git_dir)
        members = read_members(git_dir)
    except StoreError:
        return PoolStats(PoolRole.POOL, pool_pack_bytes=pack_bytes(git_dir))
    source_spelled = str(marker.get("source", "")) or None
    source = _inside(Path(source_spelled), roots) if source_spelled else None
    source_refs, behind = 0, None
    if source is not None:
        try:
            theirs = {n: v for n, v in _ref_values(source).items() if not n.startswith(NAMESPACE)}
            kept = set(_ref_values(git_dir).values())
        except (StoreError, OSError):
            theirs, kept = {}, set()
        else:
            source_refs, behind = len(theirs), sum(1 for v in theirs.values() if v not in kept)
    own, listed = 0, 0
    for member in members[:MEMBERS_LISTED]:
        real = _inside(member, roots)
        if real is not None:
            own += pack_bytes(real)
            listed += 1
    return PoolStats(PoolRole.POOL, members=len(members), source=source_spelled, source_refs=source_refs,
                     source_refs_behind=behind, pool_pack_bytes=pack_bytes(git_dir), own_pack_bytes=own,
                     members_listed=listed)


__all__ = ["MEMBERS_LISTED", "PoolRole", "PoolStats", "gather_pool_stats", "pack_bytes"]
