"""store/backup/run.py and restore.py: a chain of backups restores to the same refs and checksum (git's
for-each-ref, Gitaly's rule over git's show-ref, git fsck --strict), and a damaged chain is refused naming the
file."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from backuputil import gitaly_checksum_by_git
from gitutil import commit_blobs, git, make_worktree_repo
from packyard.store.backup.manifest import load_manifest
from packyard.store.backup.restore import restore_repository
from packyard.store.backup.run import backup_repository, snapshot_refs, verify_backup
from packyard.store.errors import BackupChainError, BackupChecksumError, InvalidInputError
from packyard.store.repo import Repository


def _refs(bare: Path) -> str:
    return git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=bare).decode()


def _chain(tmp_path: Path, incrementals: int = 2):
    """A repository made by git and a backup directory with a full backup and ``incrementals`` more, each after
    new commits (and one after a branch is deleted)."""
    bare = make_worktree_repo(tmp_path / "src", commits=3)
    repo = Repository.open(bare)
    bdir = tmp_path / "backups" / "r1"
    entries = [backup_repository(repo, bdir, snapshot_refs(repo))]
    parent = None
    for i in range(incrementals):
        parent = commit_blobs(bare, tmp_path, "topic", 3, parent=parent)
        git("tag", f"t{i}", parent, git_dir=bare)
        if i == 1:
            git("update-ref", "-d", "refs/tags/t0", git_dir=bare)
        entries.append(backup_repository(repo, bdir, snapshot_refs(repo)))
    return bare, repo, bdir, entries


def test_full_and_two_incrementals_restore_to_the_same_repository(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path)
    assert [e.kind for e in entries] == ["full", "incremental", "incremental"]
    assert entries[2].parent == entries[1].id and entries[2].chain == entries[0].id
    assert entries[2].objects < entries[0].objects
    assert entries[-1].checksum == gitaly_checksum_by_git(bare)
    for e in entries:
        git("bundle", "verify", "-q", str(bdir / e.file), git_dir=bare)
    target = tmp_path / "restored" / "r1.git"
    result = restore_repository(bdir, target)
    assert _refs(target) == _refs(bare)
    assert result.checksum == gitaly_checksum_by_git(target) == gitaly_checksum_by_git(bare)
    assert result.entry == entries[-1].id and result.objects == sum(e.objects for e in entries)
    assert (target / "HEAD").read_text() == "ref: refs/heads/main\n"
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=target)
    assert [p.name for p in target.parent.iterdir()] == ["r1.git"]   # no temp sibling left


def test_restore_upto_an_earlier_entry(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path)
    target = tmp_path / "r.git"
    result = restore_repository(bdir, target, upto=entries[1].id)
    assert result.refs == entries[1].refs and "refs/tags/t0" in _refs(target)
    assert result.checksum == entries[1].checksum
    git("fsck", "--full", "--strict", git_dir=target)


def test_a_flipped_byte_is_caught_naming_the_file_before_anything_is_built(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path)
    path = bdir / entries[1].file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    target = tmp_path / "r.git"
    with pytest.raises(BackupChecksumError) as err:
        restore_repository(bdir, target)
    assert str(path) in str(err.value) and err.value.expected == entries[1].sha256
    assert not target.exists() and not list(tmp_path.glob(".r.git*"))
    with pytest.raises(BackupChecksumError):
        verify_backup(bdir, entries[1].id)
    assert not load_manifest(bdir).get(entries[1].id).verified


def test_a_missing_middle_file_is_refused_naming_it(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path)
    (bdir / entries[1].file).unlink()
    with pytest.raises(BackupChainError) as err:
        restore_repository(bdir, tmp_path / "r.git")
    assert entries[1].file in str(err.value) and "missing" in str(err.value)
    assert not (tmp_path / "r.git").exists()


def test_a_gap_in_the_manifest_is_refused_naming_the_entry_after_it(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path)
    raw = json.loads((bdir / "manifest.json").read_text())
    raw["entries"] = [e for e in raw["entries"] if e["id"] != entries[1].id]
    (bdir / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BackupChainError, match="gap") as err:
        restore_repository(bdir, tmp_path / "r.git")
    assert entries[2].file in str(err.value)


def test_bad_manifest_json_names_the_file(tmp_path):
    bdir = tmp_path / "b"
    bdir.mkdir()
    (bdir / "manifest.json").write_text("{not json")
    with pytest.raises(BackupChainError) as err:
        load_manifest(bdir)
    assert str(bdir / "manifest.json") in str(err.value)
    assert load_manifest(tmp_path / "absent").entries == ()


def test_verify_marks_the_entry_and_an_existing_target_needs_force(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path, incrementals=1)
    done = verify_backup(bdir, entries[1].id)
    assert done.verified and load_manifest(bdir).get(entries[1].id).verified
    assert not load_manifest(bdir).get(entries[0].id).verified
    target = tmp_path / "t.git"
    git("init", "-q", "--bare", str(target))
    git("commit-tree", "-m", "x", git("write-tree", git_dir=target).decode().strip(), git_dir=target)
    before = _refs(target)
    with pytest.raises(InvalidInputError, match="not empty"):
        restore_repository(bdir, target)
    assert _refs(target) == before
    restore_repository(bdir, target, force=True)
    assert _refs(target) == _refs(bare)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".t.git")) == []
    git("fsck", "--full", git_dir=target)


def test_a_new_full_backup_starts_a_new_chain(tmp_path):
    bare, repo, bdir, entries = _chain(tmp_path, incrementals=1)
    full = backup_repository(repo, bdir, snapshot_refs(repo), full=True)
    after = backup_repository(repo, bdir, snapshot_refs(repo))
    m = load_manifest(bdir)
    assert [len(c) for c in m.chains()] == [2, 2] and after.chain == full.id
    # Nothing changed: only the annotated tag v1 is sent again (prerequisites are commits, as git's: a tag
    # object is not reachable from its commit).
    assert after.objects == 1
    target = tmp_path / "r.git"
    restore_repository(bdir, target)
    assert _refs(target) == _refs(bare)


def test_detached_head_round_trips(tmp_path):
    bare = make_worktree_repo(tmp_path / "src", commits=2)
    older = git("rev-parse", "main~1", git_dir=bare).decode().strip()
    git("update-ref", "--no-deref", "HEAD", older, git_dir=bare)
    repo = Repository.open(bare)
    snap = snapshot_refs(repo)
    assert snap.head is None and "HEAD" in snap.refs
    bdir = tmp_path / "b"
    backup_repository(repo, bdir, snap)
    target = tmp_path / "r.git"
    restore_repository(bdir, target)
    assert git("rev-parse", "HEAD", git_dir=target) == git("rev-parse", "HEAD", git_dir=bare)
    assert gitaly_checksum_by_git(target) == gitaly_checksum_by_git(bare)


def test_a_pool_member_backs_up_and_restores_without_the_pool(tmp_path):
    pool = make_worktree_repo(tmp_path / "pool", commits=3)
    git("repack", "-adq", git_dir=pool)
    member = tmp_path / "member.git"
    git("clone", "-q", "--bare", "--shared", str(pool), str(member))
    assert (member / "objects" / "info" / "alternates").is_file()
    own = commit_blobs(member, tmp_path, "own", 2, parent=git("rev-parse", "main", git_dir=member).decode().strip())
    repo = Repository.open(member)
    bdir = tmp_path / "b"
    full = backup_repository(repo, bdir, snapshot_refs(repo))
    assert full.objects == len(git("rev-list", "--objects", "--all", git_dir=member).splitlines())
    commit_blobs(member, tmp_path, "own", 1, parent=own)
    assert backup_repository(repo, bdir, snapshot_refs(repo)).kind == "incremental"
    want_refs, want_sum = _refs(member), gitaly_checksum_by_git(member)
    shutil.move(str(pool), str(tmp_path / "pool-gone"))   # the pool is gone
    target = tmp_path / "restored.git"
    restore_repository(bdir, target)
    assert not (target / "objects" / "info" / "alternates").exists()
    assert _refs(target) == want_refs and gitaly_checksum_by_git(target) == want_sum
    git("fsck", "--full", "--strict", git_dir=target)


def test_an_empty_repository_backs_up_and_restores(tmp_path):
    bare = tmp_path / "e.git"
    git("init", "-q", "--bare", "-b", "trunk", str(bare))
    repo = Repository.open(bare)
    bdir = tmp_path / "b"
    first = backup_repository(repo, bdir, snapshot_refs(repo))
    assert first.objects == 0 and first.refs == {} and first.head == "refs/heads/trunk"
    target = tmp_path / "r.git"
    result = restore_repository(bdir, target)
    assert result.refs == {} and result.checksum == gitaly_checksum_by_git(bare) == "0" * 40
    assert (target / "HEAD").read_text() == "ref: refs/heads/trunk\n"
    git("fsck", "--full", git_dir=target)


def test_a_repack_during_the_backup_does_not_change_what_it_records(tmp_path):
    """packyard's full repack (loose objects packed and deleted, no preserved copies) runs between the backup's
    walk and its write: the bundle still holds the snapshot's objects, read from wherever they are now."""
    from packyard.store import faults
    from packyard.store.maintenance.repack.options import RepackOptions
    from packyard.store.maintenance.repack.run import repack

    bare = make_worktree_repo(tmp_path / "src", commits=3)   # every object loose
    repo = Repository.open(bare)
    snap = snapshot_refs(repo)
    commit_blobs(bare, tmp_path, "pushed", 2)                 # a push after the snapshot
    faults.arm_call("backup.bundle.after_walk",
                    lambda: repack(Repository.open(bare), RepackOptions(preserve=False, expire=0.0)))
    try:
        entry = backup_repository(repo, tmp_path / "b", snap)
    finally:
        faults.disarm("backup.bundle.after_walk")
    assert not list((bare / "objects").glob("??/*"))          # the repack did run: no loose object is left
    assert entry.refs == {k: v.hex() for k, v in snap.refs.items()} and "refs/heads/pushed" not in entry.refs
    target = tmp_path / "r.git"
    restore_repository(tmp_path / "b", target)
    assert {k: v.hex() for k, v in snapshot_refs(Repository.open(target)).refs.items()} == entry.refs
    git("fsck", "--full", "--strict", git_dir=target)


def test_an_object_gone_since_the_snapshot_is_a_typed_error_and_nothing_is_recorded(tmp_path):
    from packyard.store.errors import ObjectMissingError

    bare, repo, bdir, entries = _chain(tmp_path, incrementals=1)
    snap = snapshot_refs(repo)
    gone = snap.refs["refs/heads/topic"].hex()
    git("update-ref", "-d", "refs/heads/topic", git_dir=bare)
    git("tag", "-d", "t0", git_dir=bare)
    git("reflog", "expire", "--expire=now", "--all", git_dir=bare)
    git("gc", "-q", "--prune=now", git_dir=bare)
    before = sorted(p.name for p in bdir.iterdir())
    with pytest.raises(ObjectMissingError) as err:
        backup_repository(Repository.open(bare), bdir, snap, full=True)
    assert gone in str(err.value)
    assert sorted(p.name for p in bdir.iterdir()) == before
    assert [e.id for e in load_manifest(bdir).entries] == [e.id for e in entries]
