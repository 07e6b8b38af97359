"""store/backup/bundle.py against git: git reads our bundles (verify, clone --mirror), we read git's, and a
malformed bundle is refused naming the file and the offset."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gitutil import commit_blobs, git, make_worktree_repo, needs_corpus, repo_from_corpus
from packyard.store.backup.bundle import read_header, verify_bundle, write_bundle
from packyard.store.backup.run import snapshot_refs
from packyard.store.errors import BackupChainError, BundleFormatError, ObjectMissingError
from packyard.store.repo import Repository


def _repo(tmp_path: Path) -> tuple[Path, Repository]:
    bare = make_worktree_repo(tmp_path / "src", commits=4)
    c = commit_blobs(bare, tmp_path, "side", 3)
    git("tag", "light", c, git_dir=bare)            # a lightweight tag too
    git("repack", "-adq", git_dir=bare)
    return bare, Repository.open(bare)


def _refs(bare: Path) -> str:
    return git("for-each-ref", "--format=%(refname) %(objectname) %(objecttype)", git_dir=bare).decode()


def _objects_in(bundle: Path, tmp: Path) -> set[str]:
    """The ids in the bundle's pack, per git (index-pack of the bytes after the header, show-index)."""
    data = bundle.read_bytes()
    pack = tmp / "only.pack"
    pack.write_bytes(data[read_header(bundle).pack_offset:])
    git("index-pack", str(pack))
    out = git("show-index", input=pack.with_suffix(".idx").read_bytes()).decode()
    return {line.split()[1] for line in out.splitlines()}


def _reach(bare: Path, *revs: str) -> set[str]:
    if not revs:
        return set()
    return {line.split()[0] for line in git("rev-list", "--objects", *revs, git_dir=bare).decode().splitlines()}


def test_git_verifies_and_clones_our_full_bundle(tmp_path):
    bare, repo = _repo(tmp_path)
    snap = snapshot_refs(repo)
    out = write_bundle(repo, tmp_path / "full.bundle", snap.bundle_refs(), [])
    git("bundle", "verify", str(out.path), git_dir=bare)
    heads = git("bundle", "list-heads", str(out.path)).decode().split("\n")
    assert heads[0].endswith(" HEAD")   # HEAD first, as git bundle --all
    clone = tmp_path / "clone.git"
    git("clone", "-q", "--mirror", str(out.path), str(clone))
    assert _refs(clone) == _refs(bare)
    git("fsck", "--full", "--strict", git_dir=clone)
    assert out.size == out.path.stat().st_size and out.objects == len(_reach(bare, "--all"))
    assert _objects_in(out.path, tmp_path) == _reach(bare, "--all")
    assert not [p for p in out.path.parent.iterdir() if p.name.startswith("tmp_")]   # temps renamed or removed


@pytest.mark.parametrize("limit", ["edges", "exact"])
def test_incremental_bundle_holds_only_new_objects_and_git_verifies_it(tmp_path, monkeypatch, limit):
    if limit == "exact":   # the commit walk gives up at once: the prerequisites' whole reach is walked instead
        monkeypatch.setattr("packyard.store.backup.limit.COMMIT_LIMIT", 1)
    bare, repo = _repo(tmp_path)
    old = snapshot_refs(repo)
    main_old = old.refs["refs/heads/main"]
    side = commit_blobs(bare, tmp_path, "side", 2, parent=old.refs["refs/heads/side"].hex())
    new = snapshot_refs(repo)
    prereqs = sorted(set(old.refs.values()))
    out = write_bundle(repo, tmp_path / "incr.bundle", new.bundle_refs(), prereqs)
    git("bundle", "verify", str(out.path), git_dir=bare)
    header = read_header(out.path)
    # The annotated tag v1 is peeled to its commit: prerequisites are commits, as git's.
    peeled = {bytes.fromhex(git("rev-parse", f"{o.hex()}^{{commit}}", git_dir=bare).decode().strip())
              for o in prereqs}
    assert set(header.prerequisites) == peeled and len(header.prerequisites) == len(peeled)
    want = _reach(bare, "--all") - _reach(bare, *(p.hex() for p in peeled))
    assert _objects_in(out.path, tmp_path) == want and out.objects == len(want) > 0
    assert dict(header.refs)["refs/heads/side"].hex() == side and dict(header.refs)["HEAD"] == main_old
    # A repository that has the prerequisites fetches from it (git's own check that it is complete).
    other = tmp_path / "other.git"
    git("clone", "-q", "--mirror", str(write_bundle(repo, tmp_path / "f.bundle", old.bundle_refs(), []).path),
        str(other))
    git("fetch", "-q", str(out.path), "+refs/*:refs/*", git_dir=other)
    assert _refs(other) == _refs(bare)
    git("fsck", "--full", git_dir=other)


def test_incremental_with_dates_out_of_order_and_an_old_branch_is_complete(tmp_path):
    """New commits dated before the prerequisites, and a new branch at an old commit: the bundle may carry more
    than the exact set (as git's), never less -- a repository at the old state fetches it into a complete one."""
    bare, repo = _repo(tmp_path)
    old = snapshot_refs(repo)
    full = write_bundle(repo, tmp_path / "f.bundle", old.bundle_refs(), [])
    tip = old.refs["refs/heads/main"].hex()
    for i in range(3):   # committed in 2001, long before their parents (written raw: gitutil fixes git's dates)
        blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=f"skewed {i}\n".encode()).decode().strip()
        tree = git("mktree", git_dir=bare, input=f"100644 blob {blob}\tskew.txt\n".encode()).decode().strip()
        raw = (f"tree {tree}\nparent {tip}\nauthor A <a@example.com> 1000000000 +0000\n"
               f"committer A <a@example.com> 1000000000 +0000\n\nskew {i}\n").encode()
        tip = git("hash-object", "-w", "-t", "commit", "--stdin", git_dir=bare, input=raw).decode().strip()
    git("update-ref", "refs/heads/main", tip, git_dir=bare)
    git("update-ref", "refs/heads/old", "main~4", git_dir=bare)   # (an old commit the prerequisites reach)
    new = snapshot_refs(repo)
    out = write_bundle(repo, tmp_path / "i.bundle", new.bundle_refs(), sorted(set(old.refs.values())))
    got = _objects_in(out.path, tmp_path)
    want = _reach(bare, "--all") - _reach(bare, *(o.hex() for o in old.refs.values()))
    assert want <= got and len(want) >= 9
    other = tmp_path / "other.git"
    git("clone", "-q", "--mirror", str(full.path), str(other))
    git("fetch", "-q", str(out.path), "+refs/*:refs/*", git_dir=other)
    assert _refs(other) == _refs(bare)
    git("fsck", "--full", "--strict", git_dir=other)


@pytest.mark.parametrize("kind", ["full", "range"])
def test_we_read_gits_bundles(tmp_path, kind):
    bare, _repo_ = _repo(tmp_path)
    path = tmp_path / "git.bundle"
    if kind == "full":
        git("bundle", "create", "-q", str(path), "--all", git_dir=bare)
        boundary: set[str] = set()
    else:
        git("bundle", "create", "-q", str(path), "main~2..main", "side", git_dir=bare)
        boundary = {line[1:] for line in git("rev-list", "--boundary", "main~2..main", "side",
                                             git_dir=bare).decode().split() if line.startswith("-")}
    header = read_header(path)
    listed = [tuple(line.split(" ", 1)) for line in git("bundle", "list-heads", str(path)).decode().splitlines()]
    assert [(name, oid.hex()) for name, oid in header.refs] == [(n, o) for o, n in listed]
    assert {p.hex() for p in header.prerequisites} == boundary
    assert header.version == 2
    assert verify_bundle(Repository.open(bare), path) == header


def test_v3_bundle_with_sha1_capability_is_read(tmp_path):
    bare, _repo_ = _repo(tmp_path)
    path = tmp_path / "v3.bundle"
    git("bundle", "create", "-q", "--version=3", str(path), "--all", git_dir=bare)
    header = read_header(path)
    assert header.version == 3 and len(header.refs) == len(git("bundle", "list-heads", str(path)).splitlines())


def _bundle(tmp_path: Path) -> Path:
    bare, repo = _repo(tmp_path)
    return write_bundle(repo, tmp_path / "b.bundle", snapshot_refs(repo).bundle_refs(), []).path


def _rewrite(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


@pytest.mark.parametrize("damage, offset_of", [
    ("signature", lambda data: 0),
    ("bad hex", lambda data: data.index(b"\n") + 1),
    ("no end", lambda data: None),
    ("long line", lambda data: data.index(b"\n") + 1),
])
def test_a_corrupt_header_names_the_file_and_offset(tmp_path, damage, offset_of):
    path = _bundle(tmp_path)
    data = path.read_bytes()
    first = data.index(b"\n") + 1
    if damage == "signature":
        new = b"# v9 git bundle\n" + data[first:]
    elif damage == "bad hex":
        new = data[:first] + b"zz" + data[first + 2:]
    elif damage == "no end":
        new = data[:first] + b"a" * 40 + b" refs/heads/x\n"
    else:
        new = data[:first] + b"a" * 40 + b" refs/heads/" + b"x" * (70 << 10) + b"\n\n" + data[first:]
    _rewrite(path, new)
    with pytest.raises(BundleFormatError) as err:
        verify_bundle(None, path)
    assert str(path) in str(err.value)
    want = offset_of(new)
    if want is not None:
        assert err.value.offset == want
    else:
        assert err.value.offset == len(new)


def test_a_truncated_or_flipped_pack_is_refused_naming_the_offset(tmp_path):
    path = _bundle(tmp_path)
    data = path.read_bytes()
    start = read_header(path).pack_offset
    _rewrite(path, data[:-7])
    with pytest.raises(BundleFormatError) as err:
        verify_bundle(None, path)
    assert str(path) in str(err.value) and err.value.offset is not None and err.value.offset >= start
    flipped = bytearray(data)
    flipped[start + 40] ^= 0xFF
    _rewrite(path, bytes(flipped))
    with pytest.raises(BundleFormatError, match="trailer") as err:
        verify_bundle(None, path)
    assert err.value.offset == len(data) - 20
    _rewrite(path, data[:start] + b"JUNK" + data[start + 4:])
    with pytest.raises(BundleFormatError, match="no pack") as err:
        verify_bundle(None, path)
    assert err.value.offset == start


def test_missing_prerequisite_is_named(tmp_path):
    bare, repo = _repo(tmp_path)
    empty = Repository.init(tmp_path / "empty.git")
    old = snapshot_refs(repo)
    commit_blobs(bare, tmp_path, "side", 1, parent=old.refs["refs/heads/side"].hex())
    out = write_bundle(repo, tmp_path / "i.bundle", snapshot_refs(repo).bundle_refs(), list(old.refs.values()))
    with pytest.raises(BackupChainError, match="prerequisite") as err:
        verify_bundle(empty, out.path)
    assert str(out.path) in str(err.value)


def test_missing_object_is_a_typed_error_and_leaves_no_file(tmp_path):
    bare = make_worktree_repo(tmp_path / "src", commits=2)   # loose objects
    repo = Repository.open(bare)
    blob = git("rev-parse", "main:README", git_dir=bare).decode().strip()
    (bare / "objects" / blob[:2] / blob[2:]).unlink()
    dest_dir = tmp_path / "out"
    dest_dir.mkdir()
    with pytest.raises(ObjectMissingError) as err:
        write_bundle(Repository.open(bare), dest_dir / "x.bundle", snapshot_refs(repo).bundle_refs(), [])
    assert blob in str(err.value)
    assert list(dest_dir.iterdir()) == []


@needs_corpus("git-v1.0.0")
def test_corpus_bundle_matches_git_size_and_clones(tmp_path):
    bare = repo_from_corpus(tmp_path, "git-v1.0.0")
    repo = Repository.open(bare)
    ours = write_bundle(repo, tmp_path / "ours.bundle", snapshot_refs(repo).bundle_refs(), [])
    theirs = tmp_path / "git.bundle"
    git("bundle", "create", "-q", str(theirs), "--all", git_dir=bare)
    assert ours.size <= 1.05 * theirs.stat().st_size
    git("bundle", "verify", "-q", str(ours.path), git_dir=bare)
    clone = tmp_path / "c.git"
    git("clone", "-q", "--mirror", str(ours.path), str(clone))
    assert _refs(clone) == _refs(bare)
    shutil.rmtree(clone)
