"""A snapshot whose listings straddle another host's loose repack, and refs replaced under a reader (issue 22).

An ObjectSnapshot lists objects/pack, then every fan-out dir. Over NFS those listings are hundreds of round
trips apart, and a loose repack on another host can move an object from loose to a new pack in between:
the snapshot then has it in neither place. Found by the two-host race (`packyard race --hosts 2 --seed 8`):
a push's strict index-pack refused a tree whose blob had been written loose by the previous push and packed
by the other host's loose repack ("did not receive expected object ... absent from the pack and the
repository"). git (`git index-pack --strict`) accepts the same pack; so must every receive path here.

The torn snapshot is built from two real snapshots around a real `git repack -d`: the packs of the one before,
the loose objects of the one after -- what a listing taken across the move sees.
"""
from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from gitutil import git
from packyard.store.batch.api import fsck_objects, write_objects
from packyard.store.errors import ObjectMissingError
from packyard.store.fsck import STRICT
from packyard.store.objdir import ObjectDirectory, ObjectSnapshot
from packyard.store.objects import ObjectType
from packyard.store.pack.indexpack import index_pack
from packyard.store.pack.unpack import unpack_objects
from packyard.store.refs import STALE_REREADS, RefStore, read_replaced_file
from packyard.store.repo import Repository


def _hash_object(git_dir: Path, data: bytes) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), "hash-object", "-w", "--stdin"], input=data,
                          capture_output=True, check=True).stdout.decode().strip()


def _loose_repack(git_dir: Path, oid: str) -> None:
    """What a loose repack does to ``oid``: a new pack holding it, then its loose file removed."""
    subprocess.run(["git", "--git-dir", str(git_dir), "pack-objects", "-q", str(git_dir / "objects/pack/pack")],
                   input=f"{oid}\n".encode(), capture_output=True, check=True)
    git("prune-packed", git_dir=git_dir)


#: The blob the incoming tree links, by the name it has there: a plain file (its type is checked) and a
#: .gitmodules (its content is read and checked too: fsck's finish reads it from the repository).
BLOBS = {"f": b"pushed by the last push\n",
         ".gitmodules": b'[submodule "x"]\n\tpath = x\n\turl = https://example.com/x.git\n'}


@pytest.fixture(params=sorted(BLOBS))
def torn(request, tmp_path, monkeypatch):
    """(repo, the incoming tree's pack bytes, the tree's raw bytes, the blob's id): the tree links a blob the
    repository has, which every snapshot taken from now on misses (the torn listing)."""
    entry, content = request.param, BLOBS[request.param]
    r = tmp_path / "r.git"
    git("init", "-q", "--bare", str(r))
    _loose_repack(r, _hash_object(r, b"first\n"))          # an old pack, kept by the loose repack below
    blob = _hash_object(r, content)                        # loose: written by the last push
    repo = Repository.open(r)
    before = repo.objects.snapshot()
    assert bytes.fromhex(blob) in before.loose_ids
    _loose_repack(r, blob)                                 # the other host's loose repack: into a new pack
    after = Repository.open(r).objects.snapshot()
    assert bytes.fromhex(blob) not in after.loose_ids and len(after.packs) == 2
    tear = ObjectSnapshot(packs=before.packs, loose_ids=after.loose_ids, loose=after.loose)

    def snapshot(self):  # type: ignore[no-untyped-def]
        return ObjectSnapshot(packs=tear.packs, loose_ids=tear.loose_ids, loose=tear.loose, objects=self)

    # the incoming tree, made in a scratch repository that has the blob too, packed alone
    s = tmp_path / "s.git"
    git("init", "-q", "--bare", str(s))
    _hash_object(s, content)
    tree = subprocess.run(["git", "--git-dir", str(s), "mktree"], input=f"100644 blob {blob}\t{entry}\n".encode(),
                          capture_output=True, check=True).stdout.decode().strip()
    pack = subprocess.run(["git", "--git-dir", str(s), "pack-objects", "--stdout"], input=f"{tree}\n".encode(),
                          capture_output=True, check=True).stdout
    raw = subprocess.run(["git", "--git-dir", str(s), "cat-file", "tree", tree], capture_output=True,
                         check=True).stdout
    g = tmp_path / "g.git"   # git's verdict on the same pack in the same repository: accepted
    shutil.copytree(r, g)
    assert subprocess.run(["git", "--git-dir", str(g), "index-pack", "--strict", "--stdin"], input=pack,
                          capture_output=True).returncode == 0
    monkeypatch.setattr(ObjectDirectory, "snapshot", snapshot)
    return Repository.open(r), pack, raw, bytes.fromhex(blob)


def test_the_torn_snapshot_misses_the_blob_and_has_finds_it(torn):
    repo, _pack, _raw, blob = torn
    snap = repo.objects.snapshot()
    assert blob not in snap                      # what the receive checks asked before
    assert snap.has(blob)                        # one fresh lookup finds it in the new pack
    assert repo.objects.counters.snapshot_misses_found == 1
    obj_type, data = snap.read(blob)             # and a read of it takes the same way
    assert obj_type is ObjectType.BLOB and data in BLOBS.values()
    assert not snap.has(bytes(20)) and repo.objects.counters.snapshot_misses_found == 1


def test_index_pack_strict_accepts_a_link_the_torn_snapshot_misses(torn, tmp_path):
    repo, pack, _raw, _blob = torn
    (tmp_path / "in.pack").write_bytes(pack)
    result = index_pack(repo, tmp_path / "in.pack", strict=True)
    assert result.idx_path.exists()
    git("fsck", "--full", "--strict", git_dir=repo.path)


def test_unpack_objects_strict_accepts_a_link_the_torn_snapshot_misses(torn):
    repo, pack, _raw, _blob = torn
    unpack_objects(repo, pack, strict=True)
    git("fsck", "--full", "--strict", git_dir=repo.path)


def test_fsck_objects_requiring_links_accepts_a_link_the_torn_snapshot_misses(torn):
    repo, _pack, raw, _blob = torn
    fsck_objects(repo, [(ObjectType.TREE, raw)], STRICT, require_links=True)
    write_objects(repo, [(ObjectType.TREE, raw)], fsck=STRICT)
    git("fsck", "--full", "--strict", git_dir=repo.path)


def test_a_link_nowhere_is_still_refused(torn):
    repo, _pack, _raw, _blob = torn
    missing = "3" * 40
    raw = b"100644 f\0" + bytes.fromhex(missing)
    with pytest.raises(ObjectMissingError) as e:
        fsck_objects(repo, [(ObjectType.TREE, raw)], STRICT, require_links=True)
    assert e.value.oid == missing


# -- refs: a file replaced through another host answers ESTALE to the handle opened before ----------------
class _StaleThenFresh:
    """``Path.read_bytes`` answering ESTALE ``n`` times for one file, then reading it (the replaced file)."""

    def __init__(self, target: Path, n: int) -> None:
        self.target, self.left, self.calls = target, n, 0
        self.real = Path.read_bytes

    def __call__(self, path: Path) -> bytes:
        if path == self.target:
            self.calls += 1
            if self.left:
                self.left -= 1
                raise OSError(errno.ESTALE, "Stale file handle", str(path))
        return self.real(path)


def test_refs_replaced_under_a_reader_are_read_again(tmp_path, monkeypatch):
    r = tmp_path / "r.git"
    git("init", "-q", "--bare", str(r))
    tree = subprocess.run(["git", "--git-dir", str(r), "mktree"], input=b"", capture_output=True,
                          check=True).stdout.decode().strip()
    tip = git("commit-tree", tree, "-m", "c", git_dir=r).decode().strip()
    git("update-ref", "refs/tags/t", tip, git_dir=r)
    git("update-ref", "refs/heads/main", tip, git_dir=r)
    git("pack-refs", "--all", git_dir=r)
    git("update-ref", "refs/heads/loose", tip, git_dir=r)
    refs = RefStore(r)
    for name in ("packed-refs", "refs/heads/loose"):
        stale = _StaleThenFresh(r / name, STALE_REREADS - 1)
        monkeypatch.setattr(Path, "read_bytes", lambda p, stale=stale: stale(p))
        assert refs.as_dict() == {"refs/heads/loose": bytes.fromhex(tip), "refs/heads/main": bytes.fromhex(tip),
                                  "refs/tags/t": bytes.fromhex(tip)}
        assert stale.calls == STALE_REREADS
    stale = _StaleThenFresh(r / "packed-refs", STALE_REREADS)   # a file that never stops being replaced
    monkeypatch.setattr(Path, "read_bytes", lambda p: stale(p))
    with pytest.raises(OSError) as e:
        read_replaced_file(r / "packed-refs")
    assert e.value.errno == errno.ESTALE and stale.calls == STALE_REREADS
