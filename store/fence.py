"""The repository's fence: the highest lease fencing token that has changed it.

A worker's repository lease (Redis, workers/locks.py) carries a fencing token that only
grows. A holder can pass its own lease check and then stall past its TTL while a later
holder (larger token) changes the repository; when the stalled one resumes, its lease
check is behind it. So the storage itself keeps ``packyard/fence`` — the highest token
that has moved refs or deleted objects here — and every fenced change runs inside
:func:`fenced`: under ``packyard/fence.lock`` a token below the recorded one is refused
(LockLostError, nothing changed) and a higher one is recorded durably before the change.

The fence also survives the lease service: after a Redis restart the token counter is
seeded from this file, so new leases never get tokens at or below it.
"""
from __future__ import annotations

import enum
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from . import durable, lockfile
from .errors import CorruptObjectError, LockLostError

FENCE_FILE = "packyard/fence"


class FenceKind(enum.Enum):
    """Which lease's tokens a fence compares: each lease kind has its own token sequence.

    Ref updates run under the repository lease (ingestion, bulk writes); deletions of packs and
    loose objects run under the maintenance lease (repack, prune, gc). Keeping them apart means
    a long repack is not refused just because pushes moved refs meanwhile.
    """

    REFS = "packyard/fence"
    MAINTENANCE = "packyard/maintenance-fence"

    @property
    def file(self) -> str:
        return self.value

#: Held for milliseconds by the one other writer that can want it (a stale lease holder):
#: wait for it briefly rather than failing a legitimate job.
FENCE_LOCK_WAIT = 2.0


def recorded_token(git_dir: str | Path, kind: FenceKind = FenceKind.REFS) -> int:
    """The highest fencing token of ``kind`` that has changed this repository (0: none yet)."""
    path = Path(git_dir) / kind.file
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    try:
        return int(text)
    except ValueError as err:
        raise CorruptObjectError(f"fencing-token file holds {text[:40]!r}, not a number", path=path) from err


@contextmanager
def fenced(git_dir: str | Path, token: int, doing: str, counters: durable.DurabilityCounters | None = None,
           *, kind: FenceKind = FenceKind.REFS, wait: float = FENCE_LOCK_WAIT) -> Iterator[int]:
    """Run the block as a change made under lease ``token``; refuse a stale token.

    ``doing`` names the change for the error ("update refs/heads/main", "delete 3 packs").
    Yields the token recorded before the block.
    """
    git_dir = Path(git_dir)
    fence = git_dir / kind.file
    fence.parent.mkdir(exist_ok=True)
    lock = lockfile.acquire(fence.with_name(fence.name + ".lock"), "the fencing token", wait=wait)
    try:
        recorded = recorded_token(git_dir, kind)
        if token < recorded:
            raise LockLostError(f"stale fencing token {token}: this repository was already changed under "
                                f"token {recorded} (a later lease holder); refusing to {doing}", path=fence)
        if token > recorded:
            durable.write_file_durably(fence, b"%d\n" % token, counters=counters)
        yield recorded
    finally:
        lockfile.release(lock)
