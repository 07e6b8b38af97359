"""SIGKILL a repack at every step (fault points, in a child process): the repository stays readable and
git fsck passes; a rerun completes and removes what the dead run left (temp files, half-moved packs)."""
from __future__ import annotations

import signal

import pytest

import repackutil as ru
from gitutil import git

FULL_POINTS = [
    "repack.after_plan", "repack.after_write",
    "repack.after_writeout", "repack.after_flush", "repack.after_pack_rename", "repack.after_renames",
    "repack.after_fsync_dirs",
    "repack.cruft.after_flush", "repack.cruft.after_pack_rename", "repack.cruft.after_renames",
    "repack.before_delete", "repack.after_pack_linked", "repack.after_idx_preserved",
    "repack.after_pack_preserved@3",
    "repack.after_loose_deleted", "repack.after_delete",
]


def _leftovers(bare) -> list[str]:
    pack_dir = bare / "objects" / "pack"
    names = {p.name for p in pack_dir.iterdir()}
    tmp = [n for n in names if n.startswith("tmp_")]
    orphans = [n for n in names if n.startswith("pack-") and not n.endswith((".idx", ".keep"))
               and f"{n.rsplit('.', 1)[0]}.idx" not in names]
    return tmp + orphans


@pytest.mark.slow
@pytest.mark.parametrize("point", FULL_POINTS)
def test_sigkill_during_a_full_repack(template, tmp_path, point):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    proc = ru.repack_in_child(bare, "full", point)
    assert proc.returncode == -signal.SIGKILL, f"{point}: not killed there (rc {proc.returncode}): {proc.stderr}"
    # Readable: git sees every reachable object, and the young unreachable ones.
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing
    for oid in shapes.young + shapes.rescued:
        assert ru.has_object(bare, oid), (point, oid)
    # A rerun completes and removes what the dead run left behind.
    proc = ru.repack_in_child(bare, "full", None)
    assert proc.returncode == 0, proc.stderr
    assert _leftovers(bare) == [], point
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing
    for oid in shapes.young + shapes.rescued:
        assert ru.has_object(bare, oid), (point, oid)
    for oid in shapes.old:
        assert not ru.has_object(bare, oid), (point, oid)


@pytest.mark.slow
@pytest.mark.parametrize("mode, point", [("geometric", "repack.after_pack_rename"),
                                         ("geometric", "repack.before_delete"),
                                         ("geometric", "repack.after_pack_preserved"),
                                         ("loose", "repack.after_renames"), ("loose", "repack.after_delete")])
def test_sigkill_during_geometric_and_loose_repacks(template, tmp_path, mode, point):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    proc = ru.repack_in_child(bare, mode, point)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.repack_in_child(bare, mode, None).returncode == 0
    assert _leftovers(bare) == []
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing
    for oid in shapes.young + shapes.old + shapes.rescued:
        assert ru.has_object(bare, oid), (point, oid)


@pytest.mark.parametrize("mode", ["full", "geometric"])
@pytest.mark.parametrize("point", ["repack.after_pack_linked", "repack.after_idx_preserved"])
def test_a_pack_moving_to_preserved_is_whole_in_one_directory_at_every_step(template, tmp_path, mode, point):
    """Stopped between the steps of a pack's move to preserved/ (link its .pack and .rev; move its idx): that
    pack is whole -- idx and pack -- in objects/pack or in preserved/, so a reader on another host that lists
    both then still finds it (the old order, idx first, left neither whole: the two-host race lost reads).
    Every object stays readable by a new reader and by git; a rerun finishes the move and leaves nothing."""
    from packyard.store import faults
    from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
    from packyard.store.maintenance.repack.run import repack
    from packyard.store.repo import Repository

    shapes = ru.copy(template, tmp_path / "repo.git")
    bare = shapes.bare
    pack_dir = bare / "objects" / "pack"
    before = {p.stem for p in pack_dir.glob("pack-*.idx")}
    faults.arm(point, "raise", at=1)
    try:
        with pytest.raises(faults.InjectedFault):
            repack(Repository.open(bare), RepackOptions(mode=RepackMode(mode)))
    finally:
        faults.disarm(point)
    preserved = pack_dir / "preserved"
    for stem in before:
        whole_here = all((pack_dir / f"{stem}{ext}").exists() for ext in (".idx", ".pack"))
        whole_there = all((preserved / f"{stem}{ext}").exists() for ext in (".idx", ".pack"))
        assert whole_here or whole_there, (point, stem, sorted(p.name for p in pack_dir.rglob(f"{stem}.*")))
    reader = Repository.open(bare)
    for line in ru.reachable_listing(bare).splitlines():
        reader.objects.read(bytes.fromhex(line.split()[0].decode()), verify=True)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.repack_in_child(bare, mode, None).returncode == 0
    assert _leftovers(bare) == []
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


# -- the cruft walk from young objects (store/maintenance/repack/cruft.py), names for the cruft pack's search -------

CRUFT_POINTS = ["repack.after_plan", "repack.after_write", "repack.cruft.after_pack_rename", "repack.before_delete",
                "repack.after_pack_preserved@2", "repack.after_delete"]


@pytest.fixture(scope="module")
def cruft_template(tmp_path_factory):
    """ru.build_cruft's repository, and what git's own cruft repack keeps of it (every object id after
    ``git repack --cruft -d --cruft-expiration=2.weeks.ago`` on a copy, but the expired loose blob git's repack
    leaves to ``git prune``)."""
    import shutil

    base = tmp_path_factory.mktemp("crash-cruft")
    t = ru.build_cruft(base)
    theirs = base / "theirs.git"
    shutil.copytree(t["bare"], theirs, copy_function=shutil.copy2)
    git("-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q", "--cruft-expiration=2.weeks.ago",
        git_dir=theirs)
    # (git repack leaves an expired loose object to git prune; packyard's full repack deletes it)
    assert t["lone"] in _all_ids(theirs) and t["lone"] not in _cruft_of(theirs)
    t["kept"] = _all_ids(theirs) - {t["lone"]}
    return t


def _cruft_of(bare) -> str:
    idx = [p for p in (bare / "objects" / "pack").glob("*.idx") if p.with_suffix(".mtimes").exists()]
    return git("show-index", input=idx[0].read_bytes()).decode()


def _all_ids(bare) -> set[str]:
    return set(git("cat-file", "--batch-check=%(objectname)", "--batch-all-objects", git_dir=bare).decode().split())


@pytest.mark.slow
@pytest.mark.parametrize("point", CRUFT_POINTS)
def test_sigkill_during_a_full_repack_with_old_and_young_unreachable_objects(cruft_template, tmp_path, point):
    import shutil

    bare = tmp_path / "repo.git"
    shutil.copytree(cruft_template["bare"], bare, copy_function=shutil.copy2)
    kept = cruft_template["kept"]
    proc = ru.repack_in_child(bare, "full", point)
    assert proc.returncode == -signal.SIGKILL, f"{point}: not killed there (rc {proc.returncode}): {proc.stderr}"
    # Nothing git keeps is gone (the reachable objects, the young ones and the old ones they reach).
    assert kept <= _all_ids(bare), point
    git("fsck", "--connectivity-only", "--no-dangling", git_dir=bare)
    proc = ru.repack_in_child(bare, "full", None)
    assert proc.returncode == 0, proc.stderr
    assert _leftovers(bare) == [], point
    assert _all_ids(bare) == kept, point
    git("fsck", "--connectivity-only", "--no-dangling", git_dir=bare)
