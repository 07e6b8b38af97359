"""store/backup/retention.py: the rule as a table, then applied to a real backup directory (manifest first, then
files; the remaining chain still restores)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from gitutil import commit_blobs, git, make_worktree_repo
from packyard.store.backup.manifest import BackupEntry, Manifest, load_manifest
from packyard.store.backup.restore import restore_repository
from packyard.store.backup.retention import ORPHAN_AFTER, apply_retention, plan_retention
from packyard.store.backup.run import backup_repository, snapshot_refs, verify_backup
from packyard.store.errors import InvalidInputError
from packyard.store.repo import Repository


def E(eid: str, chain: str | None = None, parent: str | None = None, verified: bool = False) -> BackupEntry:
    """An entry: full when ``chain`` is None (its own chain), else an incremental of ``chain`` on ``parent``."""
    return BackupEntry(id=eid, kind="full" if chain is None else "incremental", chain=chain or eid, parent=parent,
                       file=f"{eid}.bundle", sha256="0" * 64, size=1, objects=1, refs={}, head=None,
                       checksum="0" * 40, created=0.0, verified=verified)


@dataclass(frozen=True)
class Case:
    id: str
    entries: tuple[BackupEntry, ...]
    keep_full: int
    expire: tuple[str, ...]
    reason: str   # a phrase the plan's reasons must contain


CASES = [
    Case("empty", (), 1, (), ""),
    Case("one chain", (E("a"), E("a1", "a", "a"), E("a2", "a", "a1")), 1, (), "among the newest 1"),
    Case("older chain, newer full not verified", (E("a"), E("a1", "a", "a"), E("b")), 1, (),
         "no newer full backup is verified"),
    Case("older chain, newer full verified", (E("a"), E("a1", "a", "a"), E("b", verified=True)), 1, ("a", "a1"),
         "is verified"),
    Case("keep 2 of 3, middle verified", (E("a"), E("b", verified=True), E("c")), 2, ("a",), "expired"),
    Case("keep 2 of 3, none verified", (E("a"), E("b"), E("c")), 2, (), "no newer full backup"),
    Case("only the oldest verified", (E("a", verified=True), E("b")), 1, (), "no newer full backup"),
    Case("a verified incremental is not a verified full", (E("a"), E("b"), E("b1", "b", "b", verified=True)), 1, (),
         "no newer full backup"),
    Case("keep more than there are", (E("a"), E("b", verified=True)), 5, (), "among the newest 5"),
    Case("two old chains go at once", (E("a"), E("a1", "a", "a"), E("b"), E("c", verified=True)), 1,
         ("a", "a1", "b"), "expired"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_retention_table(case):
    m = Manifest(case.entries)
    plan = plan_retention(m, case.keep_full)
    assert plan.expire == case.expire
    assert set(plan.keep) | set(plan.expire) == {e.id for e in case.entries}
    assert not set(plan.keep) & set(plan.expire)
    assert len(plan.reasons) == len(m.chains())
    assert not case.reason or any(case.reason in r for r in plan.reasons), plan.reasons


def test_retention_keeps_at_least_one():
    with pytest.raises(InvalidInputError):
        plan_retention(Manifest((E("a"),)), 0)


def test_apply_rewrites_the_manifest_then_removes_files_and_old_orphans(tmp_path):
    bare = make_worktree_repo(tmp_path / "src", commits=2)
    repo = Repository.open(bare)
    bdir = tmp_path / "b"
    a = backup_repository(repo, bdir, snapshot_refs(repo))
    tip = commit_blobs(bare, tmp_path, "x", 2)
    a1 = backup_repository(repo, bdir, snapshot_refs(repo))
    b = backup_repository(repo, bdir, snapshot_refs(repo), full=True)
    commit_blobs(bare, tmp_path, "x", 1, parent=tip)
    b1 = backup_repository(repo, bdir, snapshot_refs(repo))
    old_orphan, new_orphan = bdir / "20000101T000000Z-00000000.bundle", bdir / "20000101T000000Z-11111111.bundle"
    old_orphan.write_bytes(b"x")
    new_orphan.write_bytes(b"x")
    os.utime(old_orphan, (time.time() - ORPHAN_AFTER - 5,) * 2)
    assert plan_retention(load_manifest(bdir), 1).expire == ()          # b not verified yet: a's chain stays
    verify_backup(bdir, b.id)
    plan = plan_retention(load_manifest(bdir), 1)
    assert plan.expire == (a.id, a1.id) and plan.keep == (b.id, b1.id)
    removed = apply_retention(bdir, plan)
    assert sorted(p.name for p in removed) == sorted([a.file, a1.file, old_orphan.name])
    assert [e.id for e in load_manifest(bdir).entries] == [b.id, b1.id]
    assert new_orphan.exists() and not (bdir / a.file).exists()
    target = tmp_path / "r.git"
    restore_repository(bdir, target)
    assert git("for-each-ref", git_dir=target) == git("for-each-ref", git_dir=bare)
