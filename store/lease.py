"""The one lease seam: what a writer that holds a lease hands the storage, as ``lease=``.

The storage takes no lease itself (no Redis here): a caller that holds one (the workers' Redis lease,
:class:`packyard.workers.locks.Lease`) passes it to the batches (store/batch), index-pack
(``IncomingPack.commit``), repack (store/maintenance/repack/run.py, ``after_repack``) and gc, which call

* ``lease.check()`` right before each step that publishes or deletes (a rename into place, a ref update,
  the first deletion): it raises :class:`~packyard.store.errors.LockLostError` if the lease is no longer
  the caller's, and nothing is published or deleted then;
* ``lease.token`` (the lease's fencing token) for the repository's own fence (store/fence.py): a holder
  that stalled *after* its check is refused there, because a later holder recorded a higher token.

``lease=None`` (a command run by hand without ``--lock``, a test): no check and no fence.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

from . import durable
from .fence import FenceKind, fenced


class Lease(Protocol):
    """A held lease, as the storage sees it."""

    @property
    def token(self) -> int:
        """The lease's fencing token (strictly increasing per repository and lease kind)."""
        ...

    def check(self) -> None:
        """Return if the lease is still ours, else raise LockLostError (the typed lost-lease error)."""
        ...


def check(lease: Lease | None) -> None:
    """``lease.check()``, if there is a lease: call right before a step that publishes or deletes."""
    if lease is not None:
        lease.check()


def token_of(lease: Lease | None) -> int | None:
    """The fencing token the storage's fence compares (None: no lease, no fence)."""
    return None if lease is None else lease.token


def fence_of(lease: Lease | None, git_dir: str | Path, doing: str, counters: durable.DurabilityCounters | None,
             kind: FenceKind) -> AbstractContextManager[object]:
    """The repository's fence for ``lease`` (store/fence.py: a token below the recorded one is refused as
    LockLostError naming ``doing``), or nothing to enter without a lease."""
    if lease is None:
        return nullcontext()
    return fenced(Path(git_dir), lease.token, doing, counters, kind=kind)


class Joint:
    """Several leases held together, in the order they were taken (a pool's, then its member's): ``check()``
    checks every one, ``token`` is the last one's (the repository the step writes into fences with it)."""

    def __init__(self, *leases: Lease) -> None:
        if not leases:
            raise ValueError("a joint lease needs at least one lease")
        self.leases = leases

    @property
    def token(self) -> int:
        return self.leases[-1].token

    def check(self) -> None:
        for lease in self.leases:
            lease.check()


__all__ = ["Joint", "Lease", "check", "token_of", "fence_of"]
