"""The store read path against real git: same objects, types, sizes and bytes; lookup rules; bad input."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from gitutil import CORPUS, batch_check_all, git, make_worktree_repo, repo_from_corpus, snapshot_tree
from packyard.store import (
    CorruptObjectError,
    InvalidInputError,
    Location,
    NotARepositoryError,
    ObjectMissingError,
    PackFormatError,
    RefUpdate,
    RefUpdateError,
    Repository,
)
from packyard.store.objects import ObjectType, hash_object
from packyard.store.verify import verify_repository
from procutil import as_nobody


def read_all_headers(path) -> dict[str, tuple[str, int]]:
    repo = Repository.open(path)
    out = {}
    for oid in repo.objects.iter_ids():
        obj_type, size = repo.objects.read_header(oid)
        out[oid.hex()] = (obj_type.label.decode(), size)
    return out


def cat_file_batch(bare, oids: list[str]) -> list[tuple[str, bytes]]:
    """(type, content) for each oid per `git cat-file --batch`."""
    out = git("cat-file", "--batch", git_dir=bare, input=("\n".join(oids) + "\n").encode())
    result, pos = [], 0
    for _ in oids:
        nl = out.index(b"\n", pos)
        _oid, typ, size = out[pos:nl].split()
        start = nl + 1
        result.append((typ.decode(), out[start:start + int(size)]))
        pos = start + int(size) + 1
    return result


@pytest.fixture
def loose_repo(tmp_path):
    return make_worktree_repo(tmp_path)


@pytest.fixture
def mixed_repo(tmp_path):
    """Some objects packed by git, newer ones loose."""
    bare = make_worktree_repo(tmp_path, commits=2)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    work = tmp_path / "w2"
    git("clone", "-q", str(bare), str(work))
    (work / "new.txt").write_text("loose content\n")
    git("add", "new.txt", cwd=work)
    git("commit", "-q", "-m", "loose commit", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    return bare


def test_loose_repo_matches_git(loose_repo):
    assert read_all_headers(loose_repo) == batch_check_all(loose_repo)


def test_mixed_repo_matches_git_headers_and_bytes(mixed_repo):
    expected = batch_check_all(mixed_repo)
    assert read_all_headers(mixed_repo) == expected
    repo = Repository.open(mixed_repo)
    oids = sorted(expected)
    for oid, (typ, content) in zip(oids, cat_file_batch(mixed_repo, oids)):
        obj_type, data = repo.objects.read(bytes.fromhex(oid), verify=True)
        assert (obj_type.label.decode(), data) == (typ, content)
    # both storage kinds were really exercised
    locations = {repo.objects.locate(bytes.fromhex(o)) for o in oids}
    assert locations == {Location.LOOSE, Location.PACKED}


@pytest.mark.parametrize("name", ["git-v1.0.0", pytest.param("git-v2.0.0", marks=pytest.mark.slow)])
def test_corpus_headers_match_git(tmp_path, name):
    if not (CORPUS / f"{name}.pack").exists():
        pytest.skip(f"corpus {CORPUS} not present")
    bare = repo_from_corpus(tmp_path, name)
    assert read_all_headers(bare) == batch_check_all(bare)


def test_corpus_bytes_match_git_sample(tmp_path):
    bare = repo_from_corpus(tmp_path, "git-v1.0.0")
    expected = batch_check_all(bare)
    oids = sorted(expected)[::37]  # a spread sample, deltas and bases alike
    repo = Repository.open(bare)
    for oid, (typ, content) in zip(oids, cat_file_batch(bare, oids)):
        obj_type, data = repo.objects.read(bytes.fromhex(oid), verify=True)
        assert obj_type.label.decode() == typ and data == content


def test_verify_corpus_counts_match_git(tmp_path):
    bare = repo_from_corpus(tmp_path, "git-v1.0.0")
    report = verify_repository(bare)
    reachable = git("rev-list", "--objects", "--all", git_dir=bare).decode().splitlines()
    assert report.objects == len(reachable)
    types = batch_check_all(bare)
    counted = {"commit": 0, "tree": 0, "blob": 0, "tag": 0}
    for line in reachable:
        counted[types[line.split()[0]][0]] += 1
    assert (report.commits, report.trees, report.blobs, report.tags) == (
        counted["commit"], counted["tree"], counted["blob"], counted["tag"])
    assert report.packed_objects == len(types)


# -- lookup rules ---------------------------------------------------------------------------

def test_miss_relists_pack_directory_once_after_concurrent_repack(loose_repo):
    repo = Repository.open(loose_repo)
    oid = repo.refs.resolve("HEAD")
    assert repo.objects.locate(oid) is Location.LOOSE
    repo.objects.packs.prepare()
    before = repo.objects.packs.rescans
    # A concurrent repacker packs everything and deletes the loose files.
    git("repack", "-a", "-d", "-q", git_dir=loose_repo)
    git("prune-packed", git_dir=loose_repo)
    assert not repo.objects.loose.has(oid)
    obj_type, _ = repo.objects.read(oid)
    assert obj_type is ObjectType.COMMIT
    assert repo.objects.packs.rescans == before + 1


def test_quick_lookup_does_not_relist(loose_repo):
    repo = Repository.open(loose_repo)
    repo.objects.packs.prepare()
    before = repo.objects.packs.rescans
    missing = hash_object(ObjectType.BLOB, b"never written")
    assert repo.objects.locate(missing, quick=True) is Location.MISSING
    assert repo.objects.packs.rescans == before
    assert repo.objects.locate(missing) is Location.MISSING
    assert repo.objects.packs.rescans == before + 1


def test_new_pack_found_even_when_directory_mtime_is_unchanged(loose_repo):
    """Seed 000: a directory's stat data can miss a change; we never rely on it."""
    repo = Repository.open(loose_repo)
    pack_dir = loose_repo / "objects" / "pack"
    repo.objects.packs.prepare()
    st = os.stat(pack_dir)
    blob = git("hash-object", "--stdin", git_dir=loose_repo, input=b"packed later\n").strip().decode()
    pack_input = git("pack-objects", "-q", "--stdout", git_dir=loose_repo,
                     input=git("hash-object", "-w", "--stdin", git_dir=loose_repo, input=b"packed later\n"))
    loose_file = loose_repo / "objects" / blob[:2] / blob[2:]
    loose_file.unlink()
    git("index-pack", "--stdin", git_dir=loose_repo, input=pack_input, cwd=pack_dir)
    os.utime(pack_dir, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime as when we listed it
    assert os.stat(pack_dir).st_mtime_ns == st.st_mtime_ns
    assert repo.objects.locate(bytes.fromhex(blob)) is Location.PACKED


def test_unsafe_dir_mtime_cache_misses_a_pack_installed_in_the_same_second(loose_repo):
    """The race harness's negative control is the rejected patch for real: with the unsafe option a
    pack installed in the same second as the listing stays invisible (whole-second stat data, as
    git compares it without USE_NSEC), and the object reads as missing; the default reader finds it."""
    import time

    pack_dir = loose_repo / "objects" / "pack"
    blob = git("hash-object", "-w", "--stdin", git_dir=loose_repo, input=b"installed in the same second\n")
    oid = bytes.fromhex(blob.decode().strip())
    pack_input = git("pack-objects", "-q", "--stdout", git_dir=loose_repo, input=blob)
    loose_file = loose_repo / "objects" / blob[:2].decode() / blob[2:].strip().decode()
    loose_file.unlink()
    for _attempt in range(3):   # the three steps below must fall in one second: start right after a tick
        time.sleep(1.02 - time.time() % 1)
        (pack_dir / "touch").write_bytes(b"")   # the directory's mtime and ctime are now this second
        (pack_dir / "touch").unlink()
        unsafe = Repository.open(loose_repo, unsafe_trust_dir_mtime=True)
        safe = Repository.open(loose_repo)
        before = os.stat(pack_dir)
        unsafe.objects.packs.prepare()
        safe.objects.packs.prepare()
        git("index-pack", "--stdin", git_dir=loose_repo, input=pack_input, cwd=pack_dir)
        after = os.stat(pack_dir)
        if int(after.st_mtime) == int(before.st_mtime) and int(after.st_ctime) == int(before.st_ctime):
            break
        for f in pack_dir.glob("pack-*"):   # a second boundary fell in between: try again
            f.unlink()
    else:
        pytest.skip("could not install a pack within one second three times (machine too slow)")
    assert safe.objects.locate(oid) is Location.PACKED
    assert unsafe.objects.locate(oid) is Location.MISSING
    with pytest.raises(ObjectMissingError):
        unsafe.objects.read(oid)
    assert unsafe.objects.packs.rescans_skipped >= 2 and unsafe.objects.packs.rescans == 1
    os.utime(pack_dir, (after.st_atime + 5, after.st_mtime + 5))   # a change in a later second: seen
    assert unsafe.objects.locate(oid) is Location.PACKED


def test_snapshot_answers_from_memory(mixed_repo, tmp_path):
    repo = Repository.open(mixed_repo)
    snap = repo.objects.snapshot()
    expected = batch_check_all(mixed_repo)
    kinds = {oid: repo.objects.locate(bytes.fromhex(oid)) for oid in expected}
    moved = tmp_path / "moved-objects"
    shutil.move(str(mixed_repo / "objects"), moved)  # the filesystem can no longer answer
    try:
        for oid, where in kinds.items():
            assert snap.locate(bytes.fromhex(oid)) is where
        assert snap.locate(hash_object(ObjectType.BLOB, b"nope")) is Location.MISSING
    finally:
        shutil.move(str(moved), mixed_repo / "objects")


def test_snapshot_read_header_is_gits_for_packed_and_loose(mixed_repo):
    """ObjectSnapshot.read_header (fsck's and index-pack's existing-object type): git's type and size."""
    snap = Repository.open(mixed_repo).objects.snapshot()
    expected = batch_check_all(mixed_repo)
    kinds = {snap.locate(bytes.fromhex(oid)) for oid in expected}
    assert kinds == {Location.PACKED, Location.LOOSE}
    got = {}
    for oid in expected:
        obj_type, size = snap.read_header(bytes.fromhex(oid))
        got[oid] = (obj_type.label.decode(), size)
    assert got == expected


def test_snapshot_read_header_of_a_pack_repacked_away_uses_the_lookup_rules(mixed_repo):
    """A pack the snapshot listed (its idx opened, the pack itself not yet) is repacked away before a header is
    read from it: read_header falls back to the object directory's lookup, as read does. It raised
    FileNotFoundError, which failed a strict index-pack's link check (the existing objects' types) in the
    two-host race when the other host's repack moved the pack to preserved/."""
    repo = Repository.open(mixed_repo)
    snap = repo.objects.snapshot()
    expected = batch_check_all(mixed_repo)
    packed = [oid for oid in expected if snap.locate(bytes.fromhex(oid)) is Location.PACKED]
    assert packed
    git("repack", "-a", "-d", "-q", git_dir=mixed_repo)
    for oid in packed:
        obj_type, size = snap.read_header(bytes.fromhex(oid))
        assert (obj_type.label.decode(), size) == expected[oid]
    assert repo.objects.counters.snapshot_fallbacks == len(packed)


def test_pack_list_is_replaced_not_edited(loose_repo):
    repo = Repository.open(loose_repo)
    first = repo.objects.packs.prepare()
    git("repack", "-a", "-q", git_dir=loose_repo)
    second = repo.objects.packs.reprepare()
    assert len(first) == 0 and len(second) == 1
    assert first is not second


def test_relisting_keeps_the_packs_it_knew_unopened(loose_repo):
    """A re-listing reuses the PackFile of a pack it listed before without opening its idx: a PackFile's truth
    is its length (``old.get(name) or PackFile(...)`` opened every known idx at each re-listing, a round trip
    each over NFS, and raised FileNotFoundError out of the listing for one a repack had moved meanwhile, which
    failed a push in the two-host race)."""
    git("repack", "-a", "-q", git_dir=loose_repo)
    repo = Repository.open(loose_repo)
    (pack,) = repo.objects.packs.prepare()
    (again,) = repo.objects.packs.reprepare()
    assert again is pack and pack._index is None


# -- refs -----------------------------------------------------------------------------------

def test_refs_match_for_each_ref(mixed_repo):
    git("pack-refs", "--all", git_dir=mixed_repo)
    git("update-ref", "refs/heads/side", "HEAD~1", git_dir=mixed_repo)
    out = git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=mixed_repo).decode()
    expected = {name: bytes.fromhex(oid) for oid, name in (line.split() for line in out.splitlines())}
    assert Repository.open(mixed_repo).refs.as_dict() == expected


def test_ref_compare_and_swap(mixed_repo):
    repo = Repository.open(mixed_repo)
    main = repo.refs.read("refs/heads/main")
    parent = bytes.fromhex(git("rev-parse", "main~1", git_dir=mixed_repo).decode().strip())
    repo.refs.update([RefUpdate("refs/heads/main", main, parent), RefUpdate("refs/heads/new", None, main)])
    assert git("rev-parse", "main", "new", git_dir=mixed_repo).decode().split() == [parent.hex(), main.hex()]
    before = snapshot_tree(mixed_repo)
    with pytest.raises(RefUpdateError, match="refs/heads/main moved"):
        # the second update is stale: nothing at all may change
        repo.refs.update([RefUpdate("refs/heads/other", None, main), RefUpdate("refs/heads/main", main, main)])
    assert snapshot_tree(mixed_repo) == before
    (mixed_repo / "refs/heads/main.lock").write_text("")
    with pytest.raises(RefUpdateError, match="locked"):
        repo.refs.update([RefUpdate("refs/heads/main", parent, main)])
    (mixed_repo / "refs/heads/main.lock").unlink()
    for bad in ["refs/heads/a..b", "refs/heads/x.lock", "HEAD", "refs/heads/sp ace", "refs/heads/.hidden"]:
        with pytest.raises(InvalidInputError):
            repo.refs.update([RefUpdate(bad, None, main)])
    subprocess.run(["git", "--git-dir", str(mixed_repo), "fsck", "--full", "--strict"], check=True)


# -- repository creation --------------------------------------------------------------------

def test_init_creates_repository_git_accepts(tmp_path):
    repo = Repository.init(tmp_path / "new.git")
    oid = git("hash-object", "-w", "--stdin", git_dir=repo.path, input=b"hello\n").strip().decode()
    assert repo.objects.read(bytes.fromhex(oid)) == (ObjectType.BLOB, b"hello\n")
    git("fsck", "--full", git_dir=repo.path)
    assert git("symbolic-ref", "HEAD", git_dir=repo.path).strip() == b"refs/heads/main"
    with pytest.raises(InvalidInputError):
        (tmp_path / "junk").mkdir()
        (tmp_path / "junk" / "file").write_text("x")
        Repository.init(tmp_path / "junk")


# -- bad input ------------------------------------------------------------------------------

def test_not_a_repository(tmp_path):
    with pytest.raises(NotARepositoryError, match="does not exist") as err:
        Repository.open(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(err.value)
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotARepositoryError, match="not a git repository"):
        verify_repository(tmp_path / "plain")


def _some_blob(bare) -> str:
    return next(o for o, (t, _s) in batch_check_all(bare).items() if t == "blob")


def test_truncated_loose_object(loose_repo):
    oid = _some_blob(loose_repo)
    path = loose_repo / "objects" / oid[:2] / oid[2:]
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes()[:-6])
    before = snapshot_tree(loose_repo)
    with pytest.raises(CorruptObjectError) as err:
        verify_repository(loose_repo)
    assert str(path) in str(err.value) and "truncated" in str(err.value)
    assert snapshot_tree(loose_repo) == before


def test_loose_object_content_does_not_match_name(loose_repo):
    blobs = [o for o, (t, _s) in batch_check_all(loose_repo).items() if t == "blob"]
    victim, other = blobs[0], blobs[1]
    path = loose_repo / "objects" / victim[:2] / victim[2:]
    os.chmod(path, 0o644)
    shutil.copyfile(loose_repo / "objects" / other[:2] / other[2:], path)
    before = snapshot_tree(loose_repo)
    with pytest.raises(CorruptObjectError) as err:
        verify_repository(loose_repo)
    assert victim in str(err.value) and "hashes to" in str(err.value)
    assert snapshot_tree(loose_repo) == before
    with pytest.raises(CorruptObjectError):
        Repository.open(loose_repo).objects.read(bytes.fromhex(victim), verify=True)


def test_idx_with_wrong_checksum(tmp_path):
    bare = repo_from_corpus(tmp_path, "git-v1.0.0")
    idx = next((bare / "objects" / "pack").glob("*.idx"))
    os.chmod(idx, 0o644)
    data = bytearray(idx.read_bytes())
    data[-1] ^= 0xFF
    idx.write_bytes(bytes(data))
    before = snapshot_tree(bare)
    with pytest.raises(PackFormatError) as err:
        verify_repository(bare)
    assert str(idx) in str(err.value) and "checksum" in str(err.value)
    assert err.value.report.packs == 1  # the partial report travels with the error
    assert snapshot_tree(bare) == before


def test_missing_reachable_object_is_reported(loose_repo):
    tree = git("rev-parse", "HEAD^{tree}", git_dir=loose_repo).decode().strip()
    (loose_repo / "objects" / tree[:2] / tree[2:]).unlink()
    with pytest.raises(ObjectMissingError) as err:
        verify_repository(loose_repo)
    assert tree in str(err.value)


def test_stale_ref_lock_from_a_dead_writer_is_broken(mixed_repo):
    repo = Repository.open(mixed_repo)
    main = repo.refs.read("refs/heads/main")
    parent = bytes.fromhex(git("rev-parse", "main~1", git_dir=mixed_repo).decode().strip())
    lock = mixed_repo / "refs/heads/main.lock"
    lock.write_text("")
    with pytest.raises(RefUpdateError, match="locked"):  # a live writer's lock is respected
        repo.refs.update([RefUpdate("refs/heads/main", main, parent)])
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))  # left by a writer that died an hour ago
    repo.refs.update([RefUpdate("refs/heads/main", main, parent)])
    assert repo.refs.read("refs/heads/main") == parent and not lock.exists()
    assert repo.refs.stale_locks_removed == 1


def test_fencing_token_is_enforced_by_the_ref_store(mixed_repo):
    """The storage refuses a stale lease holder: a token older than one that already moved refs here."""
    from packyard.store.errors import LockLostError

    repo = Repository.open(mixed_repo)
    main = repo.refs.read("refs/heads/main")
    parent = bytes.fromhex(git("rev-parse", "main~1", git_dir=mixed_repo).decode().strip())
    assert repo.refs.fence_token() == 0
    repo.refs.update([RefUpdate("refs/heads/a", None, main)], fence_token=5)
    repo.refs.update([RefUpdate("refs/heads/b", None, main)], fence_token=7)
    repo.refs.update([RefUpdate("refs/heads/b", main, parent)], fence_token=7)     # same holder again: fine
    assert repo.refs.fence_token() == 7
    assert (mixed_repo / "packyard" / "fence").read_text() == "7\n"
    before = snapshot_tree(mixed_repo)
    with pytest.raises(LockLostError, match="stale fencing token 6.*token 7"):
        repo.refs.update([RefUpdate("refs/heads/a", main, parent), RefUpdate("refs/heads/c", None, main)],
                         fence_token=6)
    assert snapshot_tree(mixed_repo) == before, "a refused update changes nothing, leaves no lock"
    repo.refs.update([RefUpdate("refs/heads/c", None, main)])    # no token (operator command): not checked
    assert repo.refs.fence_token() == 7
    # A live writer's fence lock is respected; a dead one's (an hour old) is broken once.
    lock = mixed_repo / "packyard" / "fence.lock"
    lock.write_text("")
    with pytest.raises(RefUpdateError, match="fencing token is locked"):
        repo.refs.update([RefUpdate("refs/heads/d", None, main)], fence_token=8)
    import threading
    threading.Timer(0.3, lock.unlink).start()           # a writer that holds it briefly: waited for
    repo.refs.update([RefUpdate("refs/heads/d0", None, main)], fence_token=8)
    lock.write_text("")
    old = lock.stat().st_mtime - 3600
    os.utime(lock, (old, old))
    repo.refs.update([RefUpdate("refs/heads/d", None, main)], fence_token=8)
    assert repo.refs.fence_token() == 8 and not lock.exists()
    (mixed_repo / "packyard" / "fence").chmod(0o644)
    (mixed_repo / "packyard" / "fence").write_text("garbage\n")
    with pytest.raises(CorruptObjectError, match="fencing-token file"):
        repo.refs.update([RefUpdate("refs/heads/e", None, main)], fence_token=9)
    assert not lock.exists()
    subprocess.run(["git", "--git-dir", str(mixed_repo), "fsck", "--full", "--strict"], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as another user")
def test_unreadable_repository_path():
    """A repository behind a directory the caller may not enter is reported as not accessible.

    root reads everything, so the check runs as nobody -- in a forked child of this process
    (already imported, so it does not need to reach the interpreter or the checkout, which may
    themselves live under a 0700 directory such as /root). A second repository beside the locked
    one is opened by the same child: the failure is the locked directory's, not the test's."""
    base = Path(tempfile.mkdtemp(prefix="pky-unreadable-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        locked, open_ = base / "locked", base / "open"
        make_worktree_repo(locked)
        make_worktree_repo(open_)
        os.chmod(locked, 0o700)

        def try_both() -> str:
            Repository.open(open_ / "repo.git")
            try:
                Repository.open(locked / "repo.git")
                return "opened the locked one"
            except NotARepositoryError as err:
                return str(err)

        said = as_nobody(try_both)
        assert "not accessible" in said and str(locked) in said, said
    finally:
        os.chmod(base / "locked", 0o755)
        shutil.rmtree(base, ignore_errors=True)
