"""LooseBatch against real git: the objects it writes, what it skips, its durability counts, cleanup."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitutil import ROOT, batch_check_all, edit_commit, fsck, git, make_worktree_repo, snapshot_tree
from packyard.store import RefUpdate, RefUpdateError, Repository, leftovers
from packyard.store.batch import loose as bulk
from packyard.store.batch.api import begin, write_objects
from packyard.store.batch.contract import BatchCounters, WriteResult
from packyard.store.batch.loose import DirSync, FlushMethod
from packyard.store.errors import InvalidInputError, ObjectMissingError, StoreError
from packyard.store.faults import InjectedFault, arm, disarm
from packyard.store.objects import ObjectType, hash_object
from packyard.workers.commands.gc import remove_dead_batches
from procutil import dead_pid as _dead_pid


def tmp_files(bare: Path) -> list[Path]:
    return sorted(p for p in (bare / "objects").glob("??/tmp_obj_*"))


@pytest.fixture
def empty_repo(tmp_path):
    git("init", "-q", "--bare", str(tmp_path / "e.git"))
    return tmp_path / "e.git"


def blobs(n: int, tag: str = "x") -> list[bytes]:
    return [f"{tag} blob {i}\n".encode() * (1 + i % 5) for i in range(n)]


def test_batch_writes_objects_git_reads_back(empty_repo):
    repo = Repository.open(empty_repo)
    data = blobs(300)
    with begin(repo) as batch:
        results = [batch.add(ObjectType.BLOB, d) for d in data]
        assert tmp_files(empty_repo), "tmp files live in the fan-out dirs until commit"
        assert not batch_check_all(empty_repo), "nothing is visible before commit"
        res = batch.commit()
    assert all(r is WriteResult.QUEUED for _, r in results)
    assert res.written == 300
    got = batch_check_all(empty_repo)
    assert got == {oid.hex(): ("blob", len(d)) for (oid, _), d in zip(results, data)}
    out = git("cat-file", "-p", results[7][0].hex(), git_dir=empty_repo)
    assert out == data[7]
    assert tmp_files(empty_repo) == []
    assert not list((empty_repo / "packyard" / "batches").iterdir()), "batch marker removed"
    fsck(empty_repo)


@pytest.mark.parametrize("n", [300, 2_000, 9_000])
def test_flush_count_is_constant_plus_dirs(empty_repo, n):
    """Flush calls per batch do not grow with the object count: the barrier, one syncfs for the
    renames, and at most MAX_EARLY_FLUSHES background write-out calls while objects are added."""
    repo = Repository.open(empty_repo)
    with begin(repo) as batch:
        for d in blobs(n):
            batch.add(ObjectType.BLOB, d)
        res = batch.commit()
    c = res.counters
    if bulk.default_flush_method() is FlushMethod.SYNCFS:
        early = c.get("early_flushes", 0)
        if n < bulk.EARLY_FLUSH_EVERY:
            assert early == 0, c
        else:
            assert 1 <= early <= bulk.MAX_EARLY_FLUSHES, c
        assert c["flushes"] == 2 + early, c
        assert c["syncfs"] == c["flushes"], c
        assert c["dir_fsyncs"] == 0
    assert c["renames"] == n
    assert c["objects_written"] == n
    assert len(batch_check_all(empty_repo)) == n
    assert tmp_files(empty_repo) == []


def test_early_flush_cap_is_per_batch_even_with_shared_counters(empty_repo, monkeypatch):
    """Counters may be shared to sum several batches; each batch still gets its own early flushes."""
    if bulk.default_flush_method() is not FlushMethod.SYNCFS:
        pytest.skip("no syncfs on this platform")
    monkeypatch.setattr(bulk, "EARLY_FLUSH_EVERY", 100)
    monkeypatch.setattr(bulk, "MAX_EARLY_FLUSHES", 2)
    repo = Repository.open(empty_repo)
    counters = BatchCounters()
    per_batch = []
    for tag in ("a", "b"):
        before = counters.durable.extra.get("early_flushes", 0)
        with begin(repo, counters=counters) as batch:
            for d in blobs(600, tag):
                batch.add(ObjectType.BLOB, d)
            batch.commit()
        per_batch.append(counters.durable.extra["early_flushes"] - before)
    assert all(1 <= n <= 2 for n in per_batch), per_batch
    assert len(batch_check_all(empty_repo)) == 1200
    fsck(empty_repo)


def test_fanout_dir_on_another_filesystem_is_synced_too(empty_repo):
    """A fan-out directory that is a mount point (another filesystem) gets its own syncfs at the
    barrier and after the renames: syncfs of objects/ alone would not cover its files."""
    if bulk.default_flush_method() is not FlushMethod.SYNCFS:
        pytest.skip("no syncfs on this platform")
    data = blobs(40)
    prefix = hash_object(ObjectType.BLOB, data[0]).hex()[:2]
    mnt = empty_repo / "objects" / prefix
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()})")
    try:
        assert os.stat(mnt).st_dev != os.stat(empty_repo / "objects").st_dev
        repo = Repository.open(empty_repo)
        with begin(repo) as batch:
            oids = [batch.add(ObjectType.BLOB, d)[0] for d in data]
            res = batch.commit()
        # two filesystems: barrier x2 + after-renames x2 (no early flushes for 40 objects)
        assert res.counters["syncfs"] == 4, res.counters
        assert (mnt / oids[0].hex()[2:]).exists()
        assert set(batch_check_all(empty_repo)) == {o.hex() for o in oids}
        fsck(empty_repo)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_portable_fallback_fsyncs_each_file_and_each_dir(empty_repo):
    repo = Repository.open(empty_repo)
    data = blobs(50)
    counters = BatchCounters()
    with begin(repo, counters=counters, flush_method=FlushMethod.FSYNC_EACH) as batch:
        oids = [batch.add(ObjectType.BLOB, d)[0] for d in data]
        res = batch.commit()
    fanouts = {o.hex()[:2] for o in oids}
    assert res.counters["flushes"] == 50
    assert res.counters["writeouts"] == (50 if bulk.durable.HAVE_WRITEOUT else 0)
    # every touched fan-out dir, plus objects/ because the fan-out dirs were created by this batch
    assert res.counters["dir_fsyncs"] == len(fanouts) + 1
    assert len(batch_check_all(empty_repo)) == 50
    fsck(empty_repo)


def test_syncfs_barrier_with_per_dir_fsync(empty_repo):
    repo = Repository.open(empty_repo)
    if not bulk.durable.HAVE_SYNCFS:
        pytest.skip("no syncfs on this platform")
    with begin(repo, dir_sync=DirSync.EACH) as batch:
        oids = [batch.add(ObjectType.BLOB, d)[0] for d in blobs(40)]
        res = batch.commit()
    assert res.counters["flushes"] == 1
    assert res.counters["dir_fsyncs"] == len({o.hex()[:2] for o in oids}) + 1
    fsck(empty_repo)


def test_existing_objects_skipped_from_snapshot_and_freshened(tmp_path):
    bare = make_worktree_repo(tmp_path)
    git("repack", "-q", "-d", git_dir=bare)   # pack everything...
    git("prune-packed", git_dir=bare)
    git("update-ref", "refs/heads/x", git("rev-parse", "main", git_dir=bare).strip().decode(), git_dir=bare)
    repo = Repository.open(bare)
    packed_oid = bytes.fromhex(git("rev-parse", "main:README", git_dir=bare).strip().decode())
    obj_type, packed_data = repo.objects.read(packed_oid)
    loose_data = b"a loose one\n"
    loose_hex = git("hash-object", "-w", "--stdin", git_dir=bare, input=loose_data).strip().decode()
    loose_path = bare / "objects" / loose_hex[:2] / loose_hex[2:]
    pack_path = next((bare / "objects" / "pack").glob("*.pack"))
    old = time.time() - 3 * 24 * 3600
    os.utime(loose_path, (old, old))
    os.utime(pack_path, (old, old))
    with begin(repo) as batch:
        r1 = batch.add(ObjectType.BLOB, loose_data)
        r2 = batch.add(ObjectType.BLOB, packed_data)
        r3 = batch.add(ObjectType.BLOB, b"brand new\n")
        r4 = batch.add(ObjectType.BLOB, b"brand new\n")
        res = batch.commit()
    assert [r[1] for r in (r1, r2, r3, r4)] == [WriteResult.EXISTS_LOOSE, WriteResult.EXISTS_PACKED,
                                                 WriteResult.QUEUED, WriteResult.DUPLICATE_IN_BATCH]
    assert r1[0].hex() == loose_hex and r2[0] == packed_oid
    assert loose_path.stat().st_mtime > time.time() - 60, "loose object freshened"
    assert pack_path.stat().st_mtime > time.time() - 60, "pack freshened"
    assert res.written == 1 and res.skipped == 2 and res.duplicates == 1
    fsck(bare)


def test_object_pruned_after_snapshot_is_written_not_trusted(tmp_path, empty_repo):
    """check-and-freshen: the snapshot says LOOSE, a prune removed it meanwhile -> write it."""
    repo = Repository.open(empty_repo)
    data = b"about to be pruned\n"
    hexid = git("hash-object", "-w", "--stdin", git_dir=empty_repo, input=data).strip().decode()
    path = empty_repo / "objects" / hexid[:2] / hexid[2:]
    with begin(repo) as batch:
        path.unlink()                      # a concurrent prune, after the snapshot
        oid, result = batch.add(ObjectType.BLOB, data)
        batch.commit()
    assert result is WriteResult.QUEUED
    assert path.is_file()
    assert git("cat-file", "blob", hexid, git_dir=empty_repo) == data


def test_no_per_object_lookup_object_written_meanwhile_is_not_replaced(empty_repo):
    """Objects that appear after the snapshot are not looked up; the rename refuses to replace them."""
    repo = Repository.open(empty_repo)
    data = b"raced in by another writer\n"
    with begin(repo) as batch:
        hexid = git("hash-object", "-w", "--stdin", git_dir=empty_repo, input=data).strip().decode()
        path = empty_repo / "objects" / hexid[:2] / hexid[2:]
        inode = path.stat().st_ino
        oid, result = batch.add(ObjectType.BLOB, data)
        assert result is WriteResult.QUEUED           # answered from the snapshot, no filesystem lookup
        res = batch.commit()
    assert res.counters["exists_at_rename"] == 1
    assert path.stat().st_ino == inode, "existing object file never replaced"
    assert tmp_files(empty_repo) == []
    fsck(empty_repo)


def test_abort_and_exception_remove_tmp_files(empty_repo):
    repo = Repository.open(empty_repo)
    before = snapshot_tree(empty_repo)
    batch = begin(repo)
    for d in blobs(20):
        batch.add(ObjectType.BLOB, d)
    assert len(tmp_files(empty_repo)) == 20
    batch.abort()
    assert tmp_files(empty_repo) == []
    with pytest.raises(RuntimeError):
        with begin(repo) as batch:
            for d in blobs(20, "y"):
                batch.add(ObjectType.BLOB, d)
            raise RuntimeError("caller failed")
    assert tmp_files(empty_repo) == []
    assert batch_check_all(empty_repo) == {}
    after = snapshot_tree(empty_repo)
    assert after == before
    with pytest.raises(StoreError):
        batch.add(ObjectType.BLOB, b"too late")


@pytest.mark.parametrize("point", ["bulk.after_writeout", "bulk.after_barrier"])
def test_failure_before_renames_publishes_nothing(empty_repo, point):
    repo = Repository.open(empty_repo)
    arm(point, "raise")
    try:
        with pytest.raises(InjectedFault):
            with begin(repo) as batch:
                for d in blobs(10):
                    batch.add(ObjectType.BLOB, d)
                batch.commit()
    finally:
        disarm(point)
    assert batch_check_all(empty_repo) == {}
    assert tmp_files(empty_repo) == []


def test_ref_updated_last_and_cas_failure_leaves_ref(tmp_path):
    bare = make_worktree_repo(tmp_path)
    repo = Repository.open(bare)
    main = repo.refs.read("refs/heads/main")
    tree_hex = git("rev-parse", "main^{tree}", git_dir=bare).strip().decode()
    commit = (f"tree {tree_hex}\nparent {main.hex()}\nauthor A <a@x> 1700000000 +0000\n"
              f"committer A <a@x> 1700000000 +0000\n\nbulk\n").encode()
    # CAS failure: expected old value is wrong
    with pytest.raises(RefUpdateError):
        with begin(repo) as batch:
            new, _ = batch.add(ObjectType.COMMIT, commit)
            batch.commit([RefUpdate("refs/heads/main", b"\x01" * 20, new)])
    assert repo.refs.read("refs/heads/main") == main
    assert git("cat-file", "-t", new.hex(), git_dir=bare) == b"commit\n", "object stays, unreferenced"
    assert not (bare / "refs" / "heads" / "main.lock").exists()
    fsck(bare)
    # success path
    with begin(repo) as batch:
        new, _ = batch.add(ObjectType.COMMIT, commit + b"again\n")
        res = batch.commit([RefUpdate("refs/heads/main", main, new)])
    assert git("rev-parse", "main", git_dir=bare).strip().decode() == new.hex()
    assert res.refs[0].new == new
    fsck(bare)


def test_ref_to_missing_object_refused(empty_repo):
    repo = Repository.open(empty_repo)
    with pytest.raises(ObjectMissingError):
        with begin(repo) as batch:
            batch.add(ObjectType.BLOB, b"x")
            batch.commit([RefUpdate("refs/heads/main", None, b"\x02" * 20)])
    assert repo.refs.read("refs/heads/main") is None
    assert batch_check_all(empty_repo) == {}


def test_write_objects_validates_then_writes(tmp_path):
    bare = make_worktree_repo(tmp_path)
    repo = Repository.open(bare)
    main = repo.refs.read("refs/heads/main")
    blob = b"from the frontend\n"
    tree, commit, commit_id = edit_commit(main.hex(), "file.txt", blob, "A <a@x>", "web edit")
    results, res = write_objects(repo, [("blob", blob), ("tree", tree), (ObjectType.COMMIT, commit)],
                                 ref_updates=[RefUpdate("refs/heads/main", main, commit_id)])
    assert [r for _, r in results] == [WriteResult.QUEUED] * 3
    assert git("rev-parse", "main", git_dir=bare).strip().decode() == commit_id.hex()
    fsck(bare)
    before = snapshot_tree(bare)
    with pytest.raises(InvalidInputError):
        write_objects(repo, [("blob", b"ok"), ("tree", b"100644 no-nul-or-id")])
    with pytest.raises(InvalidInputError):
        write_objects(repo, [("commit", b"tree nothex\n\n")])
    with pytest.raises(InvalidInputError):
        write_objects(repo, [("bogus", b"")])
    assert snapshot_tree(bare) == before


def test_stale_tmp_of_dead_batch_removed_by_next_batch_never_live_ones(empty_repo):
    repo = Repository.open(empty_repo)
    # A live batch in another process: holds tmp files, waits for us.
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; sys.path.insert(0, %r)\n"
            "from packyard.store import Repository\nfrom packyard.store.batch.api import begin\n"
            "from packyard.store.objects import ObjectType\n"
            "b = begin(Repository.open(%r))\n"
            "for i in range(30): b.add(ObjectType.BLOB, b'live %%d' %% i)\n"
            "print('ready', flush=True); sys.stdin.readline(); b.commit(); print('done', flush=True)\n")
            % (str(ROOT), str(empty_repo))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10      # writer threads may still be creating them
        while len(tmp_files(empty_repo)) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        live = tmp_files(empty_repo)
        assert len(live) == 30
        # A dead batch: marker + tmp files (one complete, one truncated, one empty) from a dead pid.
        pid = _dead_pid()
        batch_id = f"{bulk._HOST_TAG}-deadbeef"
        (empty_repo / "packyard" / "batches" / f"{pid}_{batch_id}").write_bytes(b"")
        fan = empty_repo / "objects" / "ab"
        fan.mkdir(exist_ok=True)
        complete = bulk.zlib.compress(b"blob 5\0hello")
        for n, content in enumerate([complete, complete[:5], b""], 1):
            (fan / f"tmp_obj_{pid}_{batch_id}_{n}").write_bytes(content)
        # Default age: too young to remove.
        assert dead_batch_files_removed(repo) == 0
        assert dead_batch_files_removed(repo, stale_after=0) == 3
        assert tmp_files(empty_repo) == live, "the live batch's files are untouched"
        # gc's full scan with age 0 also spares the live batch
        assert remove_dead_batches(repo, stale_after=0)["stale_tmp_removed"] == 0
        assert tmp_files(empty_repo) == live
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
    finally:
        child.kill()
        child.wait()
    assert tmp_files(empty_repo) == []
    assert len(batch_check_all(empty_repo)) == 30
    fsck(empty_repo)


def dead_batch_files_removed(repo, stale_after=None) -> int:
    """What a beginning batch removes: the tmp objects of batches whose marker the table says is dead."""
    rule = leftovers.RULES[leftovers.Kind.BATCH_MARKER].aged(dead_after=stale_after)
    dead = leftovers.removable(leftovers.find_batch_markers(repo, rule=rule))
    return sum(len(m.files) for m in leftovers.remove(dead))


def should_remove_tmp(name: str, age: float) -> bool:
    verdict = leftovers.loose_tmp_verdict(name, age)
    return verdict is not None and verdict.removes


def test_should_remove_tmp_rules():
    me = os.getpid()
    ours = f"tmp_obj_{me}_{bulk._HOST_TAG}-0123abcd_1"
    assert not should_remove_tmp(ours, 10_000)                    # live pid
    dead = f"tmp_obj_{_dead_pid()}_{bulk._HOST_TAG}-0123abcd_1"
    assert should_remove_tmp(dead, leftovers.RULES[leftovers.Kind.LOOSE_TMP].dead_after + 1)
    assert not should_remove_tmp(dead, 5)                          # too young
    other_host = f"tmp_obj_1_{'0000' if bulk._HOST_TAG != '0000' else '1111'}-0123abcd_1"
    assert not should_remove_tmp(other_host, leftovers.RULES[leftovers.Kind.LOOSE_TMP].dead_after + 1)  # prune expiry
    assert should_remove_tmp(other_host, leftovers.PRUNE_EXPIRE + 1)
    assert not should_remove_tmp("tmp_obj_AbC123", 3600)            # git's own: prune expiry
    assert not should_remove_tmp("0123456789abcdef0123456789abcdef012345", 1e9)  # an object


def test_truncated_or_empty_tmp_never_becomes_an_object(empty_repo):
    """A crashed batch's partial tmp file is never renamed; the rerun writes a fresh complete copy."""
    repo = Repository.open(empty_repo)
    data = b"object whose tmp was cut short\n"
    oid = hash_object(ObjectType.BLOB, data)
    fan = empty_repo / "objects" / oid.hex()[:2]
    fan.mkdir()
    pid = _dead_pid()
    batch_id = f"{bulk._HOST_TAG}-0badc0de"
    (empty_repo / "packyard" / "batches").mkdir(parents=True)
    (empty_repo / "packyard" / "batches" / f"{pid}_{batch_id}").write_bytes(b"")
    full = bulk.zlib.compress(b"blob %d\0" % len(data) + data)
    (fan / f"tmp_obj_{pid}_{batch_id}_1").write_bytes(full[: len(full) // 2])
    (fan / f"tmp_obj_{pid}_{batch_id}_2").write_bytes(b"")
    with begin(repo, stale_after=0) as batch:
        assert batch.add(ObjectType.BLOB, data)[1] is WriteResult.QUEUED
        batch.commit()
    assert batch.counters.stale_tmp_removed == 2
    assert tmp_files(empty_repo) == []
    assert git("cat-file", "blob", oid.hex(), git_dir=empty_repo) == data
    fsck(empty_repo)


def test_progress_reported(empty_repo):
    repo = Repository.open(empty_repo)
    seen = []
    with begin(repo, progress=lambda *a: seen.append(a), expected=2500) as batch:
        for d in blobs(2500):
            batch.add(ObjectType.BLOB, d)
        batch.commit()
    phases = {s[0] for s in seen}
    assert "write" in phases and "publish" in phases
    assert ("write", 2500, 2500) in seen
    assert len(seen) < 20, "modest rate"


def test_fence_checked_before_publishing(empty_repo):
    """A lost repo lease (fence raises LockLostError) stops the batch before any rename or ref update."""
    from packyard.store.errors import LockLostError
    repo = Repository.open(empty_repo)
    calls = []

    class LostLease:   # store/lease.py's Protocol: a lease that is no longer ours
        token = 1

        def check(self):
            calls.append(len(tmp_files(empty_repo)))
            raise LockLostError("lease expired", path=str(empty_repo))

    with pytest.raises(LockLostError):
        with begin(repo, lease=LostLease()) as batch:
            for d in blobs(30):
                batch.add(ObjectType.BLOB, d)
            batch.commit()
    assert calls == [30], "checked once, after the barrier, with every tmp file still unpublished"
    assert batch_check_all(empty_repo) == {} and tmp_files(empty_repo) == []


def test_gc_paused_restores_the_collector_even_on_error():
    import gc

    from packyard.store.tuning import gc_paused
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled(), "an inner pause must not re-enable an outer one"
            raise ValueError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled(), "a collector the caller had disabled stays disabled"
    finally:
        gc.enable()


@pytest.mark.parametrize("have_renameat2", [True, False])
def test_rename_never_replaces_an_existing_object(tmp_path, monkeypatch, have_renameat2):
    """renameat2(RENAME_NOREPLACE), and the check-then-rename fallback used where it is missing
    (old kernels, NFS): a name that exists is left alone and reported, anything else is renamed."""
    from packyard.store import durable
    if not have_renameat2:
        monkeypatch.setattr(durable, "_renameat2", None)
    d = tmp_path / "fan"
    d.mkdir()
    (d / "tmp_a").write_bytes(b"new")
    (d / "tmp_b").write_bytes(b"other")
    (d / "obj").write_bytes(b"existing")
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert durable.rename_noreplace_at(dfd, b"tmp_a", b"obj") is False
        assert (d / "obj").read_bytes() == b"existing" and (d / "tmp_a").exists()
        assert durable.rename_noreplace_at(dfd, b"tmp_b", b"fresh") is True
        assert (d / "fresh").read_bytes() == b"other" and not (d / "tmp_b").exists()
        with pytest.raises(FileNotFoundError):
            durable.rename_noreplace_at(dfd, b"missing", b"whatever")
    finally:
        os.close(dfd)
