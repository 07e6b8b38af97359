"""store.lockfile and store.fence: claim files that name their owner; the repository's fencing token."""
from __future__ import annotations

import os
import time

import pytest

from packyard.store import fence, lockfile
from packyard.store.errors import LockContendedError, LockLostError
from packyard.store.owner import Owner, current_owner, read_owner
from procutil import dead_pid as _dead_pid


def _claim_of(path, owner: Owner, age: float = 0.0) -> None:
    path.write_bytes(owner.encode())
    if age:
        t = time.time() - age
        os.utime(path, (t, t))


def test_claim_names_its_owner_and_a_live_claim_is_respected(tmp_path):
    lock = tmp_path / "x.lock"
    claim = lockfile.acquire(lock, "thing x")
    assert read_owner(lock).pid == os.getpid() and claim.broken == ()
    with pytest.raises(LockContendedError, match=rf"thing x is locked by another writer \(pid {os.getpid()}"):
        lockfile.acquire(lock, "thing x", wait=0.2)
    lockfile.release(claim)
    assert not lock.exists()
    lockfile.release(claim)   # twice is fine


def test_dead_owners_claim_is_broken_at_once_and_an_unknown_one_only_when_old(tmp_path):
    me = current_owner()
    lock = tmp_path / "ref.lock"
    _claim_of(lock, Owner(pid=_dead_pid(), host=me.host, boot=me.boot, start=1))
    claim = lockfile.acquire(lock, "ref")       # no waiting: the owner is provably dead
    assert claim.broken == (lockfile.BreakVerdict.OWNER_DEAD,) and read_owner(lock).pid == os.getpid()
    lockfile.release(claim)
    elsewhere = Owner(pid=1, host="another-host", created=time.time())
    _claim_of(lock, elsewhere)
    with pytest.raises(LockContendedError, match="pid 1 on another-host"):
        lockfile.acquire(lock, "ref", stale_after=600)
    _claim_of(lock, elsewhere, age=700)
    assert lockfile.acquire(lock, "ref", stale_after=600).broken == (lockfile.BreakVerdict.AGED_OUT,)
    lockfile.release(lock)
    lock.write_bytes(b"")                         # git's own lock (no record): the age rule only
    with pytest.raises(LockContendedError):
        lockfile.acquire(lock, "ref", stale_after=600)
    assert lockfile.judge(lock, stale_after=600)[0] is lockfile.BreakVerdict.TOO_YOUNG


def test_breaking_never_removes_a_claim_other_than_the_one_judged(tmp_path, monkeypatch):
    """Two waiters judge the same dead claim; the first breaks it and a live process claims it
    anew before the second renames: the second must give the fresh claim back."""
    me = current_owner()
    lock = tmp_path / "fence.lock"
    _claim_of(lock, Owner(pid=_dead_pid(), host=me.host, boot=me.boot, start=1))
    real_judge = lockfile.judge

    def judge_then_lose_the_race(path, **kw):
        verdict = real_judge(path, **kw)
        os.unlink(path)                       # the other waiter broke it ...
        _claim_of(lock, me)                   # ... and a live owner (us, here) claimed it again
        return verdict

    monkeypatch.setattr(lockfile, "judge", judge_then_lose_the_race)
    assert lockfile.break_if_dead(lock) is lockfile.BreakVerdict.OWNER_ALIVE
    assert read_owner(lock) == me and [p.name for p in tmp_path.iterdir()] == ["fence.lock"]


def test_fence_records_the_highest_token_and_refuses_older_ones(tmp_path):
    assert fence.recorded_token(tmp_path) == 0
    with fence.fenced(tmp_path, 5, "delete 2 packs") as before:
        assert before == 0 and (tmp_path / "packyard" / "fence.lock").exists()
    assert fence.recorded_token(tmp_path) == 5 and not (tmp_path / "packyard" / "fence.lock").exists()
    with fence.fenced(tmp_path, 5, "again"):
        pass
    with pytest.raises(LockLostError, match="stale fencing token 4.*token 5.*refusing to delete 1 pack"):
        with fence.fenced(tmp_path, 4, "delete 1 pack"):
            raise AssertionError("the block must not run")
    assert fence.recorded_token(tmp_path) == 5 and not (tmp_path / "packyard" / "fence.lock").exists()


def test_maintenance_fence_is_independent_of_the_refs_fence(tmp_path):
    """Pushes moving refs under later repository-lease tokens must not make a running repack's
    deletions look stale: each lease kind has its own token sequence and its own fence file."""
    with fence.fenced(tmp_path, 40, "update refs/heads/main"):
        pass
    with fence.fenced(tmp_path, 3, "delete 2 packs", kind=fence.FenceKind.MAINTENANCE):
        pass
    assert fence.recorded_token(tmp_path) == 40
    assert fence.recorded_token(tmp_path, fence.FenceKind.MAINTENANCE) == 3
    with pytest.raises(LockLostError):
        with fence.fenced(tmp_path, 2, "delete 1 pack", kind=fence.FenceKind.MAINTENANCE):
            pass
