"""The loose files a repack deletes on a shared filesystem, kept in ``objects/pack/preserved/loose-<hex>/``
(store/maintenance/preserved/loose.py): linked as second names of the same files, fanned out by the id's first
hex digit, the directory dated when the delete ends (or removed when the delete unlinked none of them),
expired after the preserve time by the repack's and gc's expiry, and nothing of it read as an object by git.

What the links are for -- git on another NFS host reading a loose object through its map while a repack
deletes it -- is shown end to end on two nfsim hosts in tests/service/test_nfsim.py
(``test_git_on_host_b_reads_a_loose_object_a_repack_on_host_a_deletes``). On a local disk no repack links
anything (the last test).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo, write_blobs
from packyard.store import leftovers as lo
from packyard.store.maintenance.preserved.loose import (
    expire_preserved_loose,
    keep_one,
    link_loose,
    new_keep_dir,
    settle_keep,
)
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository
from packyard.workers.commands.gc import run_gc


@pytest.fixture
def bare(tmp_path) -> Path:
    g = tmp_path / "r.git"
    git("init", "-q", "--bare", str(g))
    return g


def _path_for(bare: Path):
    return lambda oid: bare / "objects" / oid.hex()[:2] / oid.hex()[2:]


def test_loose_files_are_linked_fanned_out_by_their_first_hex_digit(bare, tmp_path):
    ids = [bytes.fromhex(h) for h in write_blobs(bare, tmp_path, 40, "keep")]
    gone = bytes.fromhex("ab" * 20)                           # no such loose file: not linked, no error
    keep = new_keep_dir(bare / "objects" / "pack")
    assert lo.PRESERVED_LOOSE_RE.match(keep.name) and not keep.exists()
    linked = link_loose(keep, _path_for(bare), ids + [gone])
    assert linked == frozenset(ids)
    for oid in ids:
        h = oid.hex()
        target = keep / h[0] / h
        assert os.path.samestat(target.stat(), _path_for(bare)(oid).stat())   # a second name, not a copy
    assert sorted(p.name for p in keep.iterdir()) == sorted({oid.hex()[0] for oid in ids})
    assert keep_one(keep, _path_for(bare)(ids[0]), ids[0].hex())   # already there: kept, still True
    assert not keep_one(keep, _path_for(bare)(gone), gone.hex())
    git("fsck", "--full", "--strict", git_dir=bare)               # git reads nothing of it as objects
    assert "garbage: 1" in git("count-objects", "-v", git_dir=bare).decode()


def test_a_settled_directory_is_dated_and_one_nobody_needs_goes(bare, tmp_path):
    ids = [bytes.fromhex(h) for h in write_blobs(bare, tmp_path, 5, "settle")]
    pack_dir = bare / "objects" / "pack"
    used, unused = new_keep_dir(pack_dir), new_keep_dir(pack_dir)
    link_loose(used, _path_for(bare), ids)
    link_loose(unused, _path_for(bare), ids)
    then = time.time() - 100
    settle_keep(used, kept=True, now=then)
    assert abs(used.stat().st_mtime - then) < 1
    settle_keep(unused, kept=False)
    assert not unused.exists() and all(_path_for(bare)(oid).exists() for oid in ids)   # the live files stay


def test_expiry_removes_directories_past_the_preserve_time_and_spares_the_running_repacks(bare, tmp_path):
    ids = [bytes.fromhex(h) for h in write_blobs(bare, tmp_path, 20, "expire")]
    pack_dir = bare / "objects" / "pack"
    now = time.time()
    dirs = []
    for age in (7200, 7200, 60):
        d = new_keep_dir(pack_dir)
        link_loose(d, _path_for(bare), ids)
        settle_keep(d, kept=True, now=now - age)
        dirs.append(d)
    fenced = []
    gone = expire_preserved_loose(pack_dir, 3600, now=now, fence=lambda: fenced.append(1), spare=dirs[1].name)
    assert gone == [dirs[0].name] and len(fenced) == 1
    assert not dirs[0].exists() and dirs[1].exists() and dirs[2].exists()
    assert all(_path_for(bare)(oid).exists() for oid in ids)
    # gc expires them too, by the same rule (its own count in the job's counters)
    counters = run_gc(bare, preserve_for=3600)["counters"]
    assert counters["preserved_loose_expired"] == 1 and not dirs[1].exists() and dirs[2].exists()


def test_a_repack_on_a_local_disk_links_no_loose_file(tmp_path):
    bare = make_worktree_repo(tmp_path / "w", commits=3)
    assert list((bare / "objects").glob("[0-9a-f][0-9a-f]/*"))
    for mode in (RepackMode.LOOSE, RepackMode.FULL):
        res = repack(Repository(bare), RepackOptions(mode=mode, bitmap=False))
        assert res.counters.loose_preserved == 0
    assert not list((bare / "objects" / "pack" / "preserved").glob("loose-*"))
    assert not list((bare / "objects").glob("[0-9a-f][0-9a-f]/*"))
    git("fsck", "--full", "--strict", git_dir=bare)


def test_the_delete_keeps_a_packed_objects_file_and_drops_an_expired_ones_link(bare, tmp_path):
    """The repack's loose delete (``_unlink_loose``) with a keep directory, as on a shared filesystem: a file whose
    object lives on in a pack keeps its second name (linked ahead, or linked now if the child missed it); an
    expired object's file goes with the link made ahead, so its inode goes too (its deletion is the point)."""
    from packyard.store.maintenance.preserved.packs import LooseAhead
    from packyard.store.maintenance.repack.run import _unlink_loose

    packed, missed, expired = [bytes.fromhex(h) for h in write_blobs(bare, tmp_path, 3, "delete")]
    path_for = _path_for(bare)
    keep = LooseAhead(new_keep_dir(bare / "objects" / "pack"), path_for, frozenset({packed, missed, expired}))
    linked = link_loose(keep.keep, path_for, [packed, expired])      # the child's links: not ``missed``
    unlink = _unlink_loose(Repository(bare), {}, keep, linked, {expired})
    sizes = {oid: path_for(oid).stat().st_size for oid in (packed, missed, expired)}
    assert [unlink(oid) for oid in (packed, missed, expired)] == [
        (sizes[packed], True), (sizes[missed], True), (sizes[expired], False)]
    assert unlink(packed) is None                                     # gone already: not counted again
    held = {p.name for p in keep.keep.glob("?/*")}
    assert held == {packed.hex(), missed.hex()}
    assert all((keep.keep / h[0] / h).stat().st_nlink == 1 for h in held)
    assert not any(path_for(oid).exists() for oid in (packed, missed, expired))
