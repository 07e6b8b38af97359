"""Statistics gathered cheaply, checked against what git says about repositories git built."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gitutil import git
from packyard.store.errors import NotARepositoryError, PackFormatError
from packyard.store.leftovers.passes import remove_stale_temp_files
from packyard.store.maintenance.planning import stats as st
from packyard.store.maintenance.preserved.packs import expire_preserved


def blobs(bare: Path, tmp: Path, count: int, tag: str) -> list[str]:
    """Write ``count`` new loose blobs with git; their ids."""
    src = tmp / f"blobs-{tag}"
    src.mkdir()
    paths = []
    for i in range(count):
        p = src / f"{i}"
        p.write_text(f"{tag} blob {i}\n")
        paths.append(str(p))
    out = git("hash-object", "-w", "--stdin-paths", git_dir=bare, input="\n".join(paths).encode() + b"\n")
    return out.decode().split()


def commit_on(bare: Path, tmp: Path, name: str, files: int = 3, parent: str | None = None) -> str:
    """A commit of ``files`` new blobs (all loose), on refs/heads/<name>."""
    ids = blobs(bare, tmp, files, name)
    entries = "".join(f"100644 blob {oid}\tf{i}.txt\n" for i, oid in enumerate(ids))
    tree = git("mktree", git_dir=bare, input=entries.encode()).decode().strip()
    args = ["commit-tree", tree, "-m", name] + (["-p", parent] if parent else [])
    commit = git(*args, git_dir=bare).decode().strip()
    git("update-ref", f"refs/heads/{name}", commit, git_dir=bare)
    return commit


def idx_counts_by_git(bare: Path) -> dict[str, int]:
    out = {}
    for idx in (bare / "objects" / "pack").glob("pack-*.idx"):
        lines = git("show-index", input=idx.read_bytes()).splitlines()
        out[idx.stem] = len(lines)
    return out


def test_packs_counts_and_sizes_match_git(bare, tmp_path):
    tip = None
    for n in range(4):  # four pushes, each its own pack (git repack without -a packs only loose objects)
        tip = commit_on(bare, tmp_path, f"b{n}", files=3 + n, parent=tip)
        git("repack", "-q", "-d", git_dir=bare)
    loose = blobs(bare, tmp_path, 40, "loose")
    s = st.gather_stats(bare)
    assert {p.name: p.objects for p in s.packs} == idx_counts_by_git(bare)
    assert len(s.packs) == 4 and s.packed_objects == sum(idx_counts_by_git(bare).values())
    for p in s.packs:
        assert p.pack_bytes == (bare / "objects" / "pack" / f"{p.name}.pack").stat().st_size
        assert not p.keep and not p.cruft
    # The estimate is the sampled directories' real count, scaled by 256/16.
    sampled = sum(1 for oid in loose if oid[:2] in st.SAMPLE_FANOUTS)
    assert s.loose_sampled == sampled and s.loose_estimate == sampled * 16
    count = dict(line.split(": ") for line in git("count-objects", "-v", git_dir=bare).decode().splitlines())
    assert int(count["count"]) == 40 and int(count["packs"]) == 4


def test_loose_estimate_is_close_on_many_objects(bare, tmp_path):
    blobs(bare, tmp_path, 4096, "many")
    s = st.gather_stats(bare)
    assert 4096 * 0.7 <= s.loose_estimate <= 4096 * 1.3, s.loose_estimate


def test_idx_v1_and_v2_counts(bare, tmp_path):
    commit_on(bare, tmp_path, "main", files=7)
    pack = git("pack-objects", "--all", "-q", "--stdout", git_dir=bare, input=b"")
    for version in (1, 2):
        dest = tmp_path / f"v{version}.pack"
        dest.write_bytes(pack)
        git("index-pack", f"--index-version={version}", str(dest))
        assert st.idx_object_count(dest.with_suffix(".idx")) == 9  # 7 blobs, a tree, a commit


def test_corrupt_idx_names_the_file(bare, tmp_path):
    commit_on(bare, tmp_path, "main")
    git("repack", "-q", "-a", "-d", git_dir=bare)
    (idx,) = (bare / "objects" / "pack").glob("*.idx")
    idx.chmod(0o644)
    idx.write_bytes(idx.read_bytes()[:100])
    with pytest.raises(PackFormatError) as info:
        st.gather_stats(bare)
    assert str(idx) in str(info.value)


def test_keep_and_cruft_packs(bare, tmp_path):
    main = commit_on(bare, tmp_path, "main")
    git("repack", "-q", "-d", git_dir=bare)
    (kept,) = (bare / "objects" / "pack").glob("*.idx")
    kept.with_suffix(".keep").write_text("pinned\n")
    commit_on(bare, tmp_path, "side", parent=main)
    # Unreachable objects with known ages become a cruft pack that records them (.mtimes).
    old = blobs(bare, tmp_path, 3, "unreachable")
    ages = [time.time() - d * 86400 for d in (20, 10, 1)]
    for oid, at in zip(old, ages):
        os.utime(bare / "objects" / oid[:2] / oid[2:], (at, at))
    git("update-ref", "-d", "refs/heads/side", git_dir=bare)  # side's objects become unreachable too
    git("repack", "-q", "-d", "--cruft", "--cruft-expiration=never", git_dir=bare)
    s = st.gather_stats(bare)
    by_kind = {(p.keep, p.cruft) for p in s.packs}
    assert (True, False) in by_kind and (False, True) in by_kind
    (cruft,) = [p for p in s.packs if p.cruft]
    assert cruft.cruft_oldest == pytest.approx(int(ages[0]), abs=1)
    assert s.keep_packs == 1 and s.cruft_packs == 1
    assert all(not p.repackable for p in s.packs if p.keep or p.cruft)
    assert (bare / "objects" / "pack" / f"{cruft.name}.mtimes").is_file()


def test_leftovers_are_counted_by_their_age_rules(bare, tmp_path):
    objects = bare / "objects"
    now = time.time()

    def aged(path: Path, seconds: float, content: bytes = b"x") -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        os.utime(path, (now - seconds, now - seconds))
        return path

    aged(objects / "00" / "tmp_obj_foreign_old", 15 * 86400)       # not ours, past git's expiry
    aged(objects / "11" / "tmp_obj_foreign_young", 86400)          # not ours, too young
    aged(objects / "pack" / "tmp_pack_old", 15 * 86400)
    aged(objects / "pack" / "tmp_pack_young", 3600)
    q_old = objects / "incoming-old"
    aged(q_old / "tmp_pack_x", 7200)
    os.utime(q_old, (now - 7200, now - 7200))
    aged(objects / "incoming-live" / "tmp_pack_y", 10)
    preserved = objects / "pack" / "preserved"
    aged(preserved / "pack-1111111111111111111111111111111111111111.pack", 0)
    aged(preserved / "pack-1111111111111111111111111111111111111111.idx", 0)
    s = st.gather_stats(bare, now=now)
    assert (s.stale_tmp_objects, s.stale_pack_temps, s.stale_quarantines) == (1, 1, 1)
    assert len(s.preserved_at) == 1 and abs(s.preserved_at[0] - now) < 60
    assert s.packs == ()  # preserved packs are not installed packs


def test_gathering_lists_only_what_it_samples(bare, tmp_path, monkeypatch):
    """No full walk: the fan-out directories outside the sample are never listed."""
    commit_on(bare, tmp_path, "main")
    git("repack", "-q", "-d", git_dir=bare)
    blobs(bare, tmp_path, 600, "spread")   # loose objects in (nearly) every fan-out directory
    listed: list[str] = []
    real = os.scandir

    def spy(path="."):
        listed.append(os.path.relpath(os.fspath(path), bare))
        return real(path)

    monkeypatch.setattr(os, "scandir", spy)
    st.gather_stats(bare)
    fanouts = {p.split("/")[1] for p in listed if p.startswith("objects/") and len(p) == 10}
    assert fanouts <= set(st.SAMPLE_FANOUTS), fanouts
    # objects/pack is listed by Repository.open's containment check (symlinks leading out), once for every
    # statistic of the packs and the MIDX, once by the leftovers finder (with preserved/, for its tmp_ nudges);
    # objects/ by the containment check and the quarantine finder; preserved/ once more for its packs' ages.
    # refs/ is walked once (its directories) for the loose-ref count and the branch tips (servingstats.py)
    assert listed.count("objects/pack") <= 3, listed
    assert listed.count("objects") <= 2, listed
    assert listed.count("objects/pack/preserved") <= 2, listed
    ref_dirs = [p for p in listed if p == "refs" or p.startswith("refs/")]
    assert len(ref_dirs) == len(set(ref_dirs)) <= 4, ref_dirs
    assert len(listed) - len(ref_dirs) <= 7 + len(st.SAMPLE_FANOUTS), listed


def test_not_a_repository(tmp_path):
    with pytest.raises(NotARepositoryError):
        st.gather_stats(tmp_path / "absent.git")


def test_gc_leftovers_remove_only_expired(bare, tmp_path):
    main = commit_on(bare, tmp_path, "main")
    git("repack", "-q", "-a", "-d", git_dir=bare)
    pack_dir = bare / "objects" / "pack"
    now = time.time()
    old = pack_dir / "tmp_pack_dead"
    old.write_bytes(b"junk")
    os.utime(old, (now - 15 * 86400, now - 15 * 86400))
    young = pack_dir / "tmp_idx_live"
    young.write_bytes(b"junk")
    preserved = pack_dir / "preserved"
    preserved.mkdir()
    for suffix in (".pack", ".idx", ".rev"):
        (preserved / f"pack-{'2' * 40}{suffix}").write_bytes(b"old")
    fenced = []
    # git's own temp file (no owner in its name) goes at git's prune age; a young one stays
    assert remove_stale_temp_files(pack_dir, fence=lambda: fenced.append(1)) == 1
    assert young.exists() and not old.exists() and fenced == [1]
    assert expire_preserved(pack_dir, 3600, fence=lambda: fenced.append(2)) == []   # just preserved: kept
    assert expire_preserved(pack_dir, 3600, now=now + 3601, fence=lambda: fenced.append(2)) == [f"pack-{'2' * 40}"]
    assert fenced == [1, 2]
    assert list(preserved.iterdir()) == []
    git("fsck", "--full", git_dir=bare)
    assert git("rev-parse", "main", git_dir=bare).decode().strip() == main
