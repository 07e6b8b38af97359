"""Big blobs in bounded memory: LooseBatch.add_file and import_tree's streamed path, against real git."""
from __future__ import annotations

import filecmp
import os
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from gitutil import GIT_ENV, git, make_worktree_repo, snapshot_tree
from gitutil import fsck_strict as fsck
from packyard.store import Repository
from packyard.store.batch.api import begin
from packyard.store.batch.contract import STREAM_CHUNK, WriteResult
from packyard.store.errors import InvalidInputError, LimitExceededError
from packyard.store.faults import InjectedFault, arm, disarm
from packyard.store.importtree import Identity, import_tree
from packyard.store.objects import ObjectType

WHEN = Identity(name="Imp Orter", email="imp@example.com", when=1700000000)
MiB = 1 << 20
BIG = 64 * MiB + 12345          # not a multiple of the chunk size: the last chunk is short


def tmp_files(bare: Path) -> list[Path]:
    return sorted((bare / "objects").glob("??/tmp_obj_*"))


def sparse_random_file(path: Path, size: int) -> None:
    """Random 1 MiB blocks every 4 MiB, holes (zeros) between them, a random tail."""
    with open(path, "wb") as f:
        for off in range(0, size - MiB, 4 * MiB):
            f.seek(off)
            f.write(os.urandom(MiB))
        f.seek(size - 1000)
        f.write(os.urandom(1000))
        f.truncate(size)
    assert path.stat().st_size == size


def hash_object(bare: Path, path: Path) -> str:
    return git("hash-object", "--no-filters", str(path), git_dir=bare).strip().decode()


def blob_in_tree(bare: Path, commit: bytes, name: str) -> str:
    line = git("ls-tree", commit.hex(), name, git_dir=bare).decode()
    mode, typ, oid = line.split("\t")[0].split()
    assert typ == "blob"
    return oid


def cat_file_equals(bare: Path, oid: str, original: Path, out: Path) -> bool:
    """git cat-file's bytes, streamed to a file (not held in this process), compared byte for byte."""
    with open(out, "wb") as f:
        subprocess.run(["git", "--git-dir", str(bare), "cat-file", "blob", oid], stdout=f, check=True,
                       env={**os.environ, **GIT_ENV})
    return filecmp.cmp(out, original, shallow=False)


def source_with_big_file(base: Path, size: int = BIG) -> Path:
    src = base / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("small\n")
    (src / "sub" / "b.txt").write_text("also small\n")
    sparse_random_file(src / "sub" / "big.bin", size)
    return src


@pytest.fixture
def empty_repo(tmp_path):
    git("init", "-q", "--bare", str(tmp_path / "e.git"))
    return tmp_path / "e.git"


def traced_peak(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_big_file_streams_in_bounded_memory_and_git_agrees(tmp_path, empty_repo):
    src = source_with_big_file(tmp_path)
    big = src / "sub" / "big.bin"
    phases = []

    def progress(phase, done, total):
        phases.append((phase, done, total))

    repo = Repository.open(empty_repo)
    res, peak = traced_peak(lambda: import_tree(repo, "refs/heads/main", src, author=WHEN, progress=progress,
                                                large_file_threshold=MiB))
    # One chunk read, one chunk compressed, small objects: a few MiB, not 64.
    assert peak < 6 * STREAM_CHUNK, f"peak {peak} bytes for a {BIG}-byte file"
    assert ("hash", 0, BIG) in phases and ("hash", BIG, BIG) in phases
    assert ("compress", 0, BIG) in phases and ("compress", BIG, BIG) in phases
    assert len([p for p in phases if p[0] == "compress"]) <= 105, "progress at a modest rate"

    oid = blob_in_tree(empty_repo, res.commit, "sub/big.bin")
    assert oid == hash_object(empty_repo, big)
    fsck(empty_repo)
    assert git("cat-file", "-s", oid, git_dir=empty_repo).strip() == str(BIG).encode()
    assert cat_file_equals(empty_repo, oid, big, tmp_path / "out.bin")
    assert not tmp_files(empty_repo)
    assert repo.refs.read("refs/heads/main") == res.commit

    # Control, so the bound above can fail: the in-memory path (threshold not exceeded) on the
    # same file measures the whole file; and both paths write the same objects.
    git("init", "-q", "--bare", str(tmp_path / "ctl.git"))
    ctl = Repository.open(tmp_path / "ctl.git")
    res2, peak2 = traced_peak(lambda: import_tree(ctl, "refs/heads/main", src, author=WHEN,
                                                  large_file_threshold=BIG))
    assert peak2 >= BIG, "tracemalloc sees a whole-file read"
    assert res2.tree == res.tree and res2.commit == res.commit


@pytest.mark.parametrize("change", ["append", "same_size_overwrite", "truncate"])
def test_file_changed_between_passes_publishes_nothing(tmp_path, change):
    bare = make_worktree_repo(tmp_path / "r")
    src = source_with_big_file(tmp_path, size=5 * MiB + 7)
    big = src / "sub" / "big.bin"
    repo = Repository.open(bare)
    ref_before = repo.refs.read("refs/heads/main")
    before = snapshot_tree(bare)
    changed = []

    def another_writer(phase, done, total):
        if phase == "compress" and done == 0 and not changed:    # pass 1 is done, pass 2 not begun
            with open(big, "r+b") as f:
                if change == "append":
                    f.seek(0, os.SEEK_END)
                    f.write(b"more")
                elif change == "truncate":
                    f.truncate(3 * MiB)
                else:
                    f.seek(4 * MiB + 3)
                    byte = f.read(1)
                    f.seek(4 * MiB + 3)
                    f.write(bytes([byte[0] ^ 0xFF]))
            changed.append(phase)

    with pytest.raises(InvalidInputError, match="changed while it was being imported") as info:
        import_tree(repo, "refs/heads/main", src, author=WHEN, progress=another_writer,
                    large_file_threshold=MiB)
    assert changed, "the file was really modified between the passes"
    assert info.value.path == str(big)
    assert not tmp_files(bare), "tmp files (the big one's and the small ones') removed"
    after = snapshot_tree(bare)
    strip = lambda t: {k: v for k, v in t.items() if not k.startswith("packyard/")}  # noqa: E731
    assert strip(after) == strip(before), "nothing renamed into place, ref unchanged"
    assert repo.refs.read("refs/heads/main") == ref_before
    fsck(bare)


def test_file_replaced_by_rename_between_passes_imports_the_opened_file(tmp_path, empty_repo):
    """Both passes read the one inode opened first: a rename over the path cannot mix two files."""
    src = source_with_big_file(tmp_path, size=3 * MiB)
    big = src / "sub" / "big.bin"
    original = tmp_path / "original.bin"
    original.write_bytes(big.read_bytes())
    replaced = []

    def replace(phase, done, total):
        if phase == "compress" and done == 0 and not replaced:
            new = src / "sub" / "new.tmp"
            new.write_bytes(b"entirely different\n")
            os.rename(new, big)
            replaced.append(1)

    res = import_tree(Repository.open(empty_repo), "refs/heads/main", src, author=WHEN, progress=replace,
                      large_file_threshold=MiB)
    assert replaced
    oid = blob_in_tree(empty_repo, res.commit, "sub/big.bin")
    assert oid == hash_object(empty_repo, original)
    assert cat_file_equals(empty_repo, oid, original, tmp_path / "out.bin")
    fsck(empty_repo)


def test_small_file_grown_past_threshold_since_scan_is_refused(tmp_path):
    bare = make_worktree_repo(tmp_path / "r")
    src = source_with_big_file(tmp_path, size=2 * MiB)
    (src / "sub" / "zz.txt").write_text("small at scan time\n")   # after big.bin in tree order
    repo = Repository.open(bare)
    ref_before = repo.refs.read("refs/heads/main")

    def grow(phase, done, total):
        if phase == "compress" and done == 0:
            with open(src / "sub" / "zz.txt", "ab") as f:
                f.write(os.urandom(MiB + 1))

    with pytest.raises(InvalidInputError, match="grew") as info:
        import_tree(repo, "refs/heads/main", src, author=WHEN, progress=grow, large_file_threshold=MiB)
    assert info.value.path.endswith("zz.txt")
    assert repo.refs.read("refs/heads/main") == ref_before
    assert not tmp_files(bare)


def test_add_file_skip_duplicate_exists_and_fd(tmp_path, empty_repo):
    path = tmp_path / "f.bin"
    sparse_random_file(path, 3 * MiB + 1)
    size = path.stat().st_size
    repo = Repository.open(empty_repo)
    with begin(repo) as batch:
        oid, r1 = batch.add_file(path, size)
        assert r1 is WriteResult.QUEUED and batch.pending_count == 1
        _, r2 = batch.add_file(path, size)
        assert r2 is WriteResult.DUPLICATE_IN_BATCH
        _, r3 = batch.add(ObjectType.BLOB, path.read_bytes())
        assert r3 is WriteResult.DUPLICATE_IN_BATCH
        fd = os.open(path, os.O_RDONLY)
        try:
            os.lseek(fd, 12345, os.SEEK_SET)
            oid_fd, r4 = batch.add_file(fd, size)
            assert os.lseek(fd, 0, os.SEEK_CUR) == 12345, "pread: the caller's offset is untouched"
        finally:
            os.close(fd)
        assert oid_fd == oid and r4 is WriteResult.DUPLICATE_IN_BATCH
        assert batch.counters.objects_written == 1 and batch.counters.duplicates == 3
        assert batch.counters.bytes_written > 0
        batch.commit()
    assert oid.hex() == hash_object(empty_repo, path)
    fsck(empty_repo)

    loose = empty_repo / "objects" / oid.hex()[:2] / oid.hex()[2:]
    os.utime(loose, (1_000_000_000, 1_000_000_000))
    with begin(repo) as batch:
        _, r5 = batch.add_file(path, size)
        assert r5 is WriteResult.EXISTS_LOOSE and batch.pending_count == 0
        assert batch.counters.bytes_written == 0
        batch.commit()
    assert loose.stat().st_mtime > 1_000_000_000, "freshened like add() does"


def test_add_file_wrong_size_or_not_a_file(tmp_path, empty_repo):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(100))
    repo = Repository.open(empty_repo)
    with begin(repo) as batch:
        with pytest.raises(InvalidInputError, match="longer than the expected 99") as info:
            batch.add_file(path, 99)
        assert info.value.path == str(path)
        with pytest.raises(InvalidInputError, match="ended at byte 100"):
            batch.add_file(path, 101)
        with pytest.raises(InvalidInputError, match="not a regular file"):
            batch.add_file(tmp_path, 0)
        (tmp_path / "link").symlink_to(path)
        with pytest.raises(InvalidInputError, match="cannot read file"):
            batch.add_file(tmp_path / "link", 100)      # O_NOFOLLOW, as the directory scan does
        assert batch.pending_count == 0 and batch.counters.objects_written == 0
        oid, r = batch.add_file(path, 100)              # the batch is still usable
        assert r is WriteResult.QUEUED
        batch.commit()
    assert oid.hex() == hash_object(empty_repo, path)
    fsck(empty_repo)


def test_fault_while_streaming_removes_tmp(tmp_path, empty_repo):
    src = source_with_big_file(tmp_path, size=2 * MiB)
    repo = Repository.open(empty_repo)
    arm("bulk.write_object", "raise", at=2)   # 1st: a.txt (inline add), 2nd: the streamed big.bin
    try:
        with pytest.raises(InjectedFault):
            import_tree(repo, "refs/heads/main", src, author=WHEN, large_file_threshold=MiB)
    finally:
        disarm("bulk.write_object")
    assert not tmp_files(empty_repo)
    assert not list((empty_repo / "objects").glob("??/*"))
    assert repo.refs.read("refs/heads/main") is None


def test_tar_member_over_limit_refused_before_writing(tmp_path):
    bare = make_worktree_repo(tmp_path / "r")
    src = source_with_big_file(tmp_path, size=3 * MiB)
    archive = tmp_path / "src.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=".")
    repo = Repository.open(bare)
    ref_before = repo.refs.read("refs/heads/main")
    before = snapshot_tree(bare)
    with pytest.raises(LimitExceededError, match="max_tar_member_bytes") as info:
        import_tree(repo, "refs/heads/main", archive, author=WHEN, max_tar_member_bytes=2 * MiB)
    assert info.value.path.endswith("sub/big.bin")
    assert snapshot_tree(bare) == before and repo.refs.read("refs/heads/main") == ref_before

    # Under the limit the member is read into memory (tar members are never streamed), threshold or not.
    res = import_tree(repo, "refs/heads/main", archive, author=WHEN, max_tar_member_bytes=4 * MiB,
                      large_file_threshold=MiB)
    assert blob_in_tree(bare, res.commit, "sub/big.bin") == hash_object(bare, src / "sub" / "big.bin")
    fsck(bare)
