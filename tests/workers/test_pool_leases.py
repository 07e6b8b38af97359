"""The one lease order between a pool and its members (workers/locks.py: pool_lease_order), and the joint lease
pool jobs hold, on a real Redis."""
from __future__ import annotations

import threading
import time

import pytest

from gitutil import git
from packyard.store.errors import LockLostError
from packyard.workers.locks import LeaseKind, LockTimeout, pool_lease_order, pool_leases, try_acquire

M, R = LeaseKind.MAINTENANCE, LeaseKind.REPO


@pytest.mark.parametrize("job, call, expected", [
    ("pool repack, gc", {"member": None}, [("P", M)]),
    ("create, fetch", {"member": None, "refs": True}, [("P", M), ("P", R)]),
    ("link", {"member": "F"}, [("P", M), ("F", M)]),
    ("disconnect", {"member": "F", "ingest": True}, [("P", M), ("F", M), ("F", R)]),
])
def test_the_order_is_a_prefix_of_one_sequence(job, call, expected) -> None:
    """Every pool job takes its leases in the order pool maintenance, pool refs, member maintenance, member refs;
    a member's own repack or push holds only the member's, so no two jobs wait for each other in a circle."""
    call = dict(call)
    order = pool_lease_order("P", call.pop("member"), **call)
    assert [(p, k) for p, k in order] == expected
    rank = {("P", M): 0, ("P", R): 1, ("F", M): 2, ("F", R): 3}
    assert [rank[x] for x in order] == sorted(rank[x] for x in order)


def _repos(tmp_path):
    pool, fork = tmp_path / "pool.git", tmp_path / "fork.git"
    for r in (pool, fork):
        git("init", "-q", "--bare", str(r))
    return pool, fork


def test_the_joint_lease_checks_each_and_fences_with_the_last(redis_client, tmp_path, settings) -> None:
    pool, fork = _repos(tmp_path)
    with pool_leases(settings, pool, fork, ingest=True, client=redis_client, on_event=lambda ev: None) as joint:
        assert [lease.kind for lease in joint.leases] == [M, M, R]
        assert joint.token == joint.leases[-1].token
        joint.check()
        assert try_acquire(redis_client, pool, 10, kind=M) is None      # held for the whole block
        redis_client.delete(joint.leases[0].key)                         # the pool's lease is lost
        with pytest.raises(LockLostError):
            joint.check()
    # all released
    for path, kind in pool_lease_order(pool, fork, ingest=True):
        lease = try_acquire(redis_client, path, 10, kind=kind)
        assert lease is not None
        lease.release()


def test_a_member_job_never_holds_the_pools_lease_while_a_link_waits(redis_client, tmp_path, settings) -> None:
    """A link waits for the member's maintenance lease (its repack running) while holding the pool's; the member's
    job never asks for the pool's, so it finishes and the link goes on. With wait=0 past its turn: LockTimeout."""
    pool, fork = _repos(tmp_path)
    member_repack = try_acquire(redis_client, fork, 30, job_id="repack", kind=M)
    assert member_repack is not None
    got: list[int] = []

    def link() -> None:
        with pool_leases(settings, pool, fork, wait=30, client=redis_client, on_event=lambda ev: None) as joint:
            got.append(joint.token)

    t = threading.Thread(target=link)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:   # until the link holds the pool's lease (and waits for the member's)
        probe = try_acquire(redis_client, pool, 10, kind=M)
        if probe is None:
            break
        probe.release()
        time.sleep(0.05)
    assert not got, "the link got the member's lease while the member's repack held it"
    member_repack.release()
    t.join(30)
    assert got, "the link never got its leases"
    blocker = try_acquire(redis_client, fork, 30, job_id="repack-2", kind=M)
    with pytest.raises(LockTimeout):
        with pool_leases(settings, pool, fork, wait=0.2, client=redis_client, on_event=lambda ev: None):
            pass
    blocker.release()
