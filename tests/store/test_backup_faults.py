"""Backups and restores SIGKILLed at each step (``PACKYARD_FAULT=<point>:kill`` in a subprocess): no manifest entry
ever names a partial bundle, no half-restored repository is ever visible, and what is left is a leftover the
table knows."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitutil import commit_blobs, git, make_worktree_repo
from packyard.store.backup.manifest import load_manifest
from packyard.store.backup.restore import restore_repository
from packyard.store.backup.retention import plan_retention
from packyard.store.backup.run import backup_repository, check_entry_file, snapshot_refs, verify_backup
from packyard.store.leftovers import Verdict, find_backup_temps, find_restore_temps, removable, remove
from packyard.store.repo import Repository

_SCRIPT = """
import sys
from pathlib import Path
from packyard.store.repo import Repository
what = sys.argv[1]
if what == "backup":
    from packyard.store.backup.run import backup_repository, snapshot_refs
    repo = Repository.open(sys.argv[2])
    backup_repository(repo, Path(sys.argv[3]), snapshot_refs(repo))
elif what == "restore":
    from packyard.store.backup.restore import restore_repository
    restore_repository(Path(sys.argv[2]), Path(sys.argv[3]), force=True)
else:
    from packyard.store.backup.manifest import load_manifest
    from packyard.store.backup.retention import apply_retention, plan_retention
    apply_retention(Path(sys.argv[2]), plan_retention(load_manifest(Path(sys.argv[2])), 1))
"""


def _run(point: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PACKYARD_FAULT": f"{point}:kill"}
    return subprocess.run([sys.executable, "-c", _SCRIPT, *args], env=env, capture_output=True)


@pytest.fixture
def chain(tmp_path):
    bare = make_worktree_repo(tmp_path / "src", commits=3)
    repo = Repository.open(bare)
    bdir = tmp_path / "backups"
    first = backup_repository(repo, bdir, snapshot_refs(repo))
    commit_blobs(bare, tmp_path, "new", 4)
    return bare, bdir, first


def _entries_are_whole(bdir: Path) -> list[str]:
    m = load_manifest(bdir)
    for e in m.entries:
        check_entry_file(bdir, e)   # present, SHA-256 as recorded
        git("bundle", "list-heads", str(bdir / e.file))
    return [e.id for e in m.entries]


@pytest.mark.parametrize("point, recorded", [
    ("backup.bundle.after_walk", False),
    ("backup.bundle.after_flush", False),
    ("backup.bundle.after_rename", False),
    ("backup.after_bundle", False),
    ("backup.after_manifest", True),
])
def test_a_killed_backup_leaves_no_entry_for_a_partial_bundle(chain, point, recorded):
    bare, bdir, first = chain
    proc = _run(point, "backup", str(bare), str(bdir))
    assert proc.returncode == -9, proc.stderr.decode()
    ids = _entries_are_whole(bdir)
    assert ids[0] == first.id and len(ids) == (2 if recorded else 1)
    temps = find_backup_temps(bdir)   # the writer's temp file and/or owner record, its owner dead
    assert bool(temps) == (point in ("backup.bundle.after_flush", "backup.bundle.after_rename"))
    assert all(t.verdict is Verdict.REMOVE_DEAD_OWNER for t in temps)
    # The next backup removes them first, builds on what the manifest holds, and the chain restores to the
    # repository as it is now.
    repo = Repository.open(bare)
    backup_repository(repo, bdir, snapshot_refs(repo))
    assert not find_backup_temps(bdir) and not [p for p in bdir.iterdir() if p.name.startswith(("tmp_", ".tmp"))]
    target = bdir.parent / "r.git"
    restore_repository(bdir, target)
    assert git("for-each-ref", git_dir=target) == git("for-each-ref", git_dir=bare)
    git("fsck", "--full", "--strict", git_dir=target)


@pytest.mark.parametrize("point", ["index_pack.after_quarantine_removed", "restore.before_rename"])
def test_a_killed_restore_leaves_no_half_visible_repository(chain, point, tmp_path):
    bare, bdir, first = chain
    repo = Repository.open(bare)
    backup_repository(repo, bdir, snapshot_refs(repo))
    target = tmp_path / "restored" / "r.git"
    proc = _run(point, "restore", str(bdir), str(target))
    assert proc.returncode == -9, proc.stderr.decode()
    assert not target.exists()
    (left,) = find_restore_temps(target)
    assert left.verdict is Verdict.KEEP_YOUNG   # a live restore's would look the same: only its age lets it go
    # Over an existing repository (force): the old one stays whole until the new one is complete.
    restore_repository(bdir, target, upto=first.id)
    old_refs = git("for-each-ref", git_dir=target)
    proc = _run(point, "restore", str(bdir), str(target))
    assert proc.returncode == -9
    assert git("for-each-ref", git_dir=target) == old_refs
    git("fsck", "--full", git_dir=target)
    restore_repository(bdir, target, force=True)
    assert git("for-each-ref", git_dir=target) == git("for-each-ref", git_dir=bare)
    later = find_restore_temps(target, now=time.time() + 2 * 3600)   # both killed restores' temp siblings
    assert len(later) == 2 and len(remove(removable(later))) == 2 and not find_restore_temps(target)


def test_a_killed_retention_pass_leaves_no_entry_naming_a_removed_file(chain):
    bare, bdir, first = chain
    repo = Repository.open(bare)
    second = backup_repository(repo, bdir, snapshot_refs(repo), full=True)
    verify_backup(bdir, second.id)
    assert plan_retention(load_manifest(bdir), 1).expire == (first.id,)
    proc = _run("backup.retention.after_manifest", "retention", str(bdir))
    assert proc.returncode == -9
    assert _entries_are_whole(bdir) == [second.id]
    assert (bdir / first.file).exists()   # an orphan now: the next pass removes it once old
