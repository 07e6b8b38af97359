"""The one lease seam (store/lease.py): a lost lease, handed over as ``lease=``, stops each of the four
holders -- a batch (loose and pack), index-pack, repack and gc -- before it publishes or deletes anything
(a repack checks it before installing its new pack and again before the first deletion).

The lease is a real one (workers/locks.py over the test Redis), lost by deleting its key as an expiry
would; each case then runs the same operation under a held lease, so the check cannot pass vacuously.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gitutil import batch_check_all, git, make_worktree_repo, snapshot_tree
from packyard.store import Repository
from packyard.store.batch.api import begin
from packyard.store.batch.loose import LooseBatch
from packyard.store.batch.pack import PackBatch
from packyard.store.errors import LockLostError
from packyard.store.objects import ObjectType
from packyard.store.refs import RefUpdate
from packyard.workers.locks import LeaseKind, try_acquire


def lease_of(redis_client, repo: Path, kind: LeaseKind, *, lost: bool):
    lease = try_acquire(redis_client, str(repo), ttl=30, kind=kind)
    assert lease is not None
    if lost:
        redis_client.delete(lease.key)   # what an expiry or a takeover leaves: the key no longer ours
    return lease


def packs(bare: Path) -> list[str]:
    return sorted(p.name for p in (bare / "objects" / "pack").glob("pack-*.idx"))


def refs(bare: Path) -> str:
    return git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=bare).decode()


@pytest.mark.parametrize("kind", ["loose", "pack"])
def test_lost_lease_stops_a_batch_before_publishing(tmp_path, redis_client, kind):
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    blobs = [b"lease seam %d\n" % i for i in range(6)]
    threshold = 2 if kind == "pack" else None

    def write(lease):
        with begin(Repository.open(bare), count_hint=len(blobs), pack_threshold=threshold, lease=lease) as batch:
            assert isinstance(batch, PackBatch if kind == "pack" else LooseBatch)
            oids = [batch.add(ObjectType.BLOB, b)[0] for b in blobs]
            batch.commit([RefUpdate("refs/tags/x", None, oids[0])])   # (a branch must name a commit)
        return oids

    with pytest.raises(LockLostError):
        write(lease_of(redis_client, bare, LeaseKind.REPO, lost=True))
    assert batch_check_all(bare) == {} and packs(bare) == [] and refs(bare) == ""
    held = lease_of(redis_client, bare, LeaseKind.REPO, lost=False)
    oids = write(held)
    held.release()
    assert set(batch_check_all(bare)) == {o.hex() for o in oids} and refs(bare).split()[1] == oids[0].hex()
    assert (packs(bare) != []) == (kind == "pack")


def test_lost_lease_stops_index_pack_before_publishing(tmp_path, redis_client):
    from packyard.store.pack.indexpack import IncomingPack

    src = make_worktree_repo(tmp_path / "src", commits=2, files_per_commit=3)
    tip = git("rev-parse", "main", git_dir=src).decode().strip()
    pack = tmp_path / "in.pack"
    pack.write_bytes(git("pack-objects", "--all", "--stdout", "-q", git_dir=src, input=b""))
    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    before = snapshot_tree(bare)
    update = [RefUpdate("refs/heads/main", None, bytes.fromhex(tip))]

    def index(lease):
        with IncomingPack.begin(Repository.open(bare), pack) as incoming:
            return incoming.commit(update, lease=lease)

    with pytest.raises(LockLostError):
        index(lease_of(redis_client, bare, LeaseKind.REPO, lost=True))
    assert snapshot_tree(bare) == before, "no pack installed, no ref moved, the quarantine gone"
    held = lease_of(redis_client, bare, LeaseKind.REPO, lost=False)
    index(held)
    held.release()
    assert len(packs(bare)) == 1 and refs(bare).split()[1] == tip
    git("fsck", "--full", "--strict", git_dir=bare)


def test_lost_lease_stops_repack_before_deleting(tmp_path, redis_client):
    from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
    from packyard.store.maintenance.repack.run import repack

    bare = make_worktree_repo(tmp_path / "r", commits=3, files_per_commit=3)   # every object loose
    git("repack", "-q", git_dir=bare)                                           # ... and one pack beside them
    before = snapshot_tree(bare)
    loose = [k for k in before if k.startswith("objects/") and len(k.split("/")[1]) == 2]
    assert loose and packs(bare)
    options = RepackOptions(mode=RepackMode.FULL)

    with pytest.raises(LockLostError):
        repack(Repository.open(bare), options, lease=lease_of(redis_client, bare, LeaseKind.MAINTENANCE, lost=True))
    assert snapshot_tree(bare) == before, "no pack installed, no pack, loose object or MIDX removed"
    held = lease_of(redis_client, bare, LeaseKind.MAINTENANCE, lost=False)
    result = repack(Repository.open(bare), options, lease=held)
    held.release()
    assert result.packs_deleted and not any((bare / k).exists() for k in loose)
    git("fsck", "--full", "--strict", git_dir=bare)


def test_lost_lease_stops_gc_before_deleting(tmp_path, redis_client):
    from packyard.store.batch import loose
    from packyard.workers.commands.gc import run_gc

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    fan = bare / "objects" / "ab"
    fan.mkdir()
    # A crashed batch's tmp file: its pid cannot be alive (above PID_MAX), and it is past the age rule.
    stale = fan / f"tmp_obj_4194304999_{loose._HOST_TAG}-00c0ffee_1"
    stale.write_bytes(b"x")
    old = time.time() - 2 * loose.STALE_AFTER
    os.utime(stale, (old, old))

    with pytest.raises(LockLostError):
        run_gc(bare, lease=lease_of(redis_client, bare, LeaseKind.MAINTENANCE, lost=True))
    assert stale.exists()
    held = lease_of(redis_client, bare, LeaseKind.MAINTENANCE, lost=False)
    result = run_gc(bare, lease=held)
    held.release()
    assert not stale.exists() and result["counters"]["stale_tmp_removed"] == 1
