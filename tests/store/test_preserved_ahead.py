"""Linking a repack's replaceable packs into preserved/ ahead (store/maintenance/preserved/packs.py, ``link_ahead``).

A repack on a shared filesystem links each replaceable pack's ``.pack`` and ``.rev`` into preserved/ while it writes
the new pack, so that its delete waits only for the idx links and the unlinks. What must hold: the ``.idx`` never
goes there ahead (it is the move's switch; preserved/packs.py's module doc) and no leftovers rule takes a live pack
for a half-finished move or an orphan, a move after the links ends as a move without them, a link that is gone or no
longer the live file is made again, links of packs that stay are removed, and links a failed repack left expire
without touching a live pack. Here on a local disk (the functions run the same calls one after the other there);
tests/service/test_nfsim_roundtrips.py has the repack that does it on an nfsim mount.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gitutil import commit_blobs, copy_repo, git
from packyard.store import leftovers as lo
from packyard.store.maintenance.preserved.packs import expire_preserved, link_ahead, retire_packs, unlink_ahead
from packyard.store.preserve import preserved_dir


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Four packs with their .rev (one per push), written by git."""
    base = tmp_path_factory.mktemp("ahead")
    bare = base / "r.git"
    git("init", "-q", "--bare", str(bare))
    git("config", "pack.writeReverseIndex", "true", git_dir=bare)
    parent = None
    for _ in range(4):
        parent = commit_blobs(bare, base / "scratch", "main", 3, parent)
        git("repack", "-d", "-q", git_dir=bare)    # the loose objects of this commit into one more pack
    return bare


@pytest.fixture
def bare(template, tmp_path) -> Path:
    return copy_repo(template, tmp_path / "r.git")


def _stems(bare: Path) -> list[str]:
    return sorted(p.stem for p in (bare / "objects" / "pack").glob("pack-*.idx"))


def _inodes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in d.iterdir() if p.name.startswith("pack-")}


def test_link_ahead_links_the_pack_and_its_rev_never_the_idx(bare):
    pack_dir = bare / "objects" / "pack"
    stems = _stems(bare)
    assert len(stems) == 4 and all((pack_dir / f"{s}.rev").exists() for s in stems)
    listing = git("rev-list", "--objects", "--all", git_dir=bare)

    assert sorted(link_ahead(pack_dir, stems[:3])) == stems[:3]

    live, kept = _inodes(pack_dir), _inodes(preserved_dir(pack_dir))
    assert sorted(kept) == sorted(f"{s}{e}" for s in stems[:3] for e in (".pack", ".rev"))
    assert all(kept[name] == live[name] for name in kept)          # second names of the live files
    # No rule takes a live pack for a half-finished move, an orphan or anything else to remove.
    found = [item for finder in lo.FINDERS.values() for item in finder(bare)]
    assert [item for item in found if item.verdict.removes] == []
    assert not any(item.kind in (lo.Kind.HALF_PRESERVED, lo.Kind.ORPHAN_PACK) for item in found)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert git("rev-list", "--objects", "--all", git_dir=bare) == listing


def test_a_move_after_the_links_ends_as_a_move_without_them(bare, tmp_path):
    other = copy_repo(bare, tmp_path / "other.git")
    stems = _stems(bare)
    now = time.time()
    ahead = link_ahead(bare / "objects" / "pack", stems)
    retire_packs(bare / "objects" / "pack", stems, preserve=True, now=now, ahead=ahead)
    retire_packs(other / "objects" / "pack", stems, preserve=True, now=now)

    for repo in (bare, other):
        pack_dir = repo / "objects" / "pack"
        assert not list(pack_dir.glob("pack-*"))
        kept = preserved_dir(pack_dir)
        assert sorted(p.name for p in kept.iterdir()) == sorted(
            f"{s}{e}" for s in stems for e in (".idx", ".pack", ".rev"))
        assert all(int((kept / f"{s}.idx").stat().st_mtime) == int(now) for s in stems)   # the move's time


def test_a_link_gone_or_no_longer_the_live_file_is_made_again(bare):
    pack_dir = bare / "objects" / "pack"
    stems = _stems(bare)
    before = _inodes(pack_dir)
    ahead = link_ahead(pack_dir, stems)
    kept = preserved_dir(pack_dir)
    os.unlink(kept / f"{stems[0]}.pack")                                 # gone since
    os.unlink(kept / f"{stems[1]}.rev")
    (kept / f"{stems[1]}.rev").write_bytes(b"not the live file")        # replaced since

    retire_packs(pack_dir, stems, preserve=True, ahead=ahead)

    (replaced,) = kept.glob("*.old")             # the file it replaced keeps a name of its own (a reader may map it)
    assert replaced.name.startswith(f"{stems[1]}.rev-") and replaced.read_bytes() == b"not the live file"
    replaced.unlink()
    assert _inodes(kept) == before                                       # every file of every pack, the same inodes
    assert not list(pack_dir.glob("pack-*"))


def test_unlink_ahead_removes_only_links_of_the_live_pack(bare):
    pack_dir = bare / "objects" / "pack"
    stems = _stems(bare)
    link_ahead(pack_dir, stems[:2])
    kept = preserved_dir(pack_dir)
    os.unlink(kept / f"{stems[1]}.pack")
    (kept / f"{stems[1]}.pack").write_bytes(b"an older preserved file of that name")

    assert unlink_ahead(pack_dir, stems[:2]) == 3                      # both of the first, the second's .rev
    assert [p.name for p in kept.iterdir()] == [f"{stems[1]}.pack"]
    assert len(_stems(bare)) == 4
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_links_a_failed_repack_left_expire_and_no_live_pack_goes(bare):
    pack_dir = bare / "objects" / "pack"
    stems = _stems(bare)
    listing = git("rev-list", "--objects", "--all", git_dir=bare)
    link_ahead(pack_dir, stems)
    mtime = max((pack_dir / f"{s}.pack").stat().st_mtime for s in stems)

    # Within the preserve time of the live files' own mtimes nothing expires; past it only the links go.
    assert expire_preserved(pack_dir, 3600, now=mtime + 3500) == []
    assert sorted(expire_preserved(pack_dir, 3600, now=mtime + 3700)) == stems
    assert list(preserved_dir(pack_dir).iterdir()) == []
    assert _stems(bare) == stems and all((pack_dir / f"{s}.pack").exists() for s in stems)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert git("rev-list", "--objects", "--all", git_dir=bare) == listing


def test_a_pack_without_its_idx_is_not_linked(bare):
    pack_dir = bare / "objects" / "pack"
    stems = _stems(bare)
    os.unlink(pack_dir / f"{stems[0]}.idx")          # an install killed before its idx: not a readable pack
    assert link_ahead(pack_dir, stems[:2]) == [stems[1]]
    assert not (preserved_dir(pack_dir) / f"{stems[0]}.pack").exists()
