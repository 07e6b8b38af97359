"""Geometric and loose repacks leave a multi-pack-index over the packs that stay; none ever names a deleted
or preserved pack (the new MIDX goes in FIRST), proved by ``git multi-pack-index verify`` and ``git fsck``
after a SIGKILL between the steps."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import repackutil as ru
from gitutil import git
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.serving.midx import (
    MIDX_NAME,
    MidxPack,
    build_midx,
    installed_stems,
    midx_status,
    read_midx,
    write_midx,
)
from packyard.store.repo import Repository


def _verify(bare: Path) -> None:
    """git's verdict: the MIDX (if any) verifies, fsck is clean, and no MIDX names a pack that is not installed."""
    pack_dir = bare / "objects" / "pack"
    if (pack_dir / MIDX_NAME).exists():
        git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
        st = midx_status(pack_dir)
        assert st.gone == (), f"the MIDX names packs that are gone: {st.gone}"
    git("fsck", "--full", "--strict", "--no-dangling", "--no-progress", git_dir=bare)


def test_geometric_repack_writes_a_midx_git_would_write(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    listing = ru.reachable_listing(bare)
    before = installed_stems(pack_dir)
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.GEOMETRIC))
    assert result.packs_deleted, "the fixture's small pushes must be rolled up"
    m = read_midx(pack_dir)
    assert m is not None and m.pack_stems == tuple(installed_stems(pack_dir))   # exactly what stays
    assert not set(result.packs_deleted) & set(m.pack_stems) and set(result.packs_written) <= set(m.pack_stems)
    assert result.counters.midx_packs == len(m.pack_stems) and m.ridx is not None
    assert len(before) > len(m.pack_stems)
    _verify(bare)
    ru.check_with_git(bare, listing, result.packs_written)
    # Every reachable object through the MIDX.
    ids = b"".join(line.split(b" ")[0] + b"\n" for line in listing.splitlines())
    out = git("-c", "core.multiPackIndex=true", "cat-file", "--batch-check", git_dir=bare, input=ids)
    assert b"missing" not in out
    # The same choices as git's own writer over the same packs with the same preferred pack.
    pref = _preferred(m)
    (pack_dir / MIDX_NAME).unlink()   # (else git keeps ours: "the correct MIDX already exists")
    git("multi-pack-index", "write", "--no-progress", f"--preferred-pack={pref}.pack", git_dir=bare)
    theirs = (pack_dir / MIDX_NAME).read_bytes()
    ours = build_midx([MidxPack.load(pack_dir, s) for s in m.pack_stems], preferred=pref, ridx=False)
    assert ours == theirs


def test_geometric_repack_writes_a_midx_bitmap_git_uses(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.GEOMETRIC))
    m = read_midx(pack_dir)
    bitmaps = sorted(p.name for p in pack_dir.glob(f"{MIDX_NAME}-*.bitmap"))
    assert bitmaps == [f"{MIDX_NAME}-{m.checksum.hex()}.bitmap"]
    assert result.counters.midx_bitmap_commits > 0
    for ref in ("refs/heads/main", "refs/heads/feature"):
        out = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", ref], capture_output=True)
        assert out.returncode == 0 and b"OK!" in out.stderr, out.stderr
    walked = git("rev-list", "--objects", "--no-object-names", "--branches", "--tags", git_dir=bare)
    env = {**os.environ, "GIT_TRACE2_PERF": str(tmp_path / "trace")}
    with_bitmap = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--objects", "--no-object-names",
                                  "--use-bitmap-index", "--branches", "--tags"], capture_output=True, env=env,
                                 check=True)
    assert sorted(with_bitmap.stdout.split()) == sorted(walked.split())
    trace = (tmp_path / "trace").read_text()
    assert "load/num_packs" in trace and "source:midx" in trace   # (the MIDX's RIDX loaded: a bitmap walk)
    # --no-bitmap: a MIDX without one.
    fresh = ru.copy(template, tmp_path / "fresh.git")
    repack(Repository.open(fresh.bare), RepackOptions(mode=RepackMode.GEOMETRIC, bitmap=False))
    assert (fresh.bare / "objects" / "pack" / MIDX_NAME).exists()
    assert not list((fresh.bare / "objects" / "pack").glob(f"{MIDX_NAME}-*.bitmap"))


def _preferred(m) -> str:
    """The pack of the first object in pseudo-pack order: the preferred one."""
    return m.pack_stems[m.pack_ids[m.ridx[0]]]


def test_loose_repack_writes_a_midx_too(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.LOOSE))
    assert result.packs_written
    m = read_midx(pack_dir)
    assert m is not None and m.pack_stems == tuple(installed_stems(pack_dir))
    _verify(bare)


def test_no_midx_writes_none_and_removes_one_naming_a_doomed_pack(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    write_midx(pack_dir, installed_stems(pack_dir))   # an earlier MIDX over every pack
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.GEOMETRIC, midx=False))
    assert result.packs_deleted and result.counters.midx_removed == 1
    assert not (pack_dir / MIDX_NAME).exists()
    _verify(bare)
    fresh = ru.copy(template, tmp_path / "fresh.git")
    repack(Repository.open(fresh.bare), RepackOptions(mode=RepackMode.GEOMETRIC, midx=False))
    assert not (fresh.bare / "objects" / "pack" / MIDX_NAME).exists()


def test_full_repack_rewrites_an_existing_midx_and_writes_none_otherwise(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL))
    assert not (pack_dir / MIDX_NAME).exists()
    shapes = ru.copy(template, tmp_path / "with.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    write_midx(pack_dir, installed_stems(pack_dir))
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL))
    assert result.packs_deleted
    assert read_midx(pack_dir).pack_stems == tuple(installed_stems(pack_dir))
    _verify(bare)


def test_a_repack_with_nothing_to_roll_up_still_repairs_a_stale_midx(template, tmp_path):
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    repack(Repository.open(bare), RepackOptions(mode=RepackMode.GEOMETRIC))
    stems = installed_stems(pack_dir)
    write_midx(pack_dir, stems[:1])                   # stale: misses packs
    assert midx_status(pack_dir).missed
    result = repack(Repository.open(bare), RepackOptions(mode=RepackMode.GEOMETRIC))
    assert result.nothing_to_do
    assert midx_status(pack_dir).stale is False and read_midx(pack_dir).pack_stems == tuple(stems)
    _verify(bare)


POINTS = ["repack.after_fsync_dirs", "repack.midx.after_flush", "repack.midx.after_preserve",
          "repack.midx.after_rename", "repack.midx.after_bitmap_rename",
          "repack.midx.after_fsync_dirs", "repack.after_idx_preserved", "repack.after_pack_preserved@2",
          "repack.after_delete"]


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_between_midx_and_deletions(template, tmp_path, point):
    """An earlier MIDX names every pack (as a previous geometric repack leaves it); a geometric repack killed
    anywhere leaves a MIDX git verifies, never one naming a preserved or deleted pack; a rerun completes."""
    shapes = ru.copy(template, tmp_path / "repo.git")
    bare, pack_dir = shapes.bare, shapes.bare / "objects" / "pack"
    listing = ru.reachable_listing(bare)
    old = write_midx(pack_dir, installed_stems(pack_dir))
    old_bytes = (pack_dir / MIDX_NAME).read_bytes()
    proc = ru.repack_in_child(bare, "geometric", point)
    assert proc.returncode == -signal.SIGKILL, f"{point}: not killed there (rc {proc.returncode}): {proc.stderr}"
    _verify(bare)
    assert ru.reachable_listing(bare) == listing
    if point.startswith("repack.after_idx_preserved"):
        # The control: the OLD MIDX (naming the pack just preserved) is what git would refuse.
        assert set(old.pack_stems) - set(installed_stems(pack_dir))
        (pack_dir / MIDX_NAME).rename(pack_dir / "midx.new")
        (pack_dir / MIDX_NAME).write_bytes(old_bytes)
        bad = subprocess.run(["git", "--git-dir", str(bare), "multi-pack-index", "verify", "--no-progress"],
                             capture_output=True)
        assert bad.returncode != 0, "git must refuse a MIDX naming a preserved pack"
        (pack_dir / "midx.new").replace(pack_dir / MIDX_NAME)
    proc = ru.repack_in_child(bare, "geometric", None)
    assert proc.returncode == 0, proc.stderr
    assert not [n.name for n in pack_dir.iterdir() if n.name.startswith("tmp_") or n.name.endswith(".lock")]
    _verify(bare)
    assert ru.reachable_listing(bare) == listing
    assert midx_status(pack_dir).stale is False
    m = read_midx(pack_dir)
    assert [p.name for p in pack_dir.glob(f"{MIDX_NAME}-*.bitmap")] == [f"{MIDX_NAME}-{m.checksum.hex()}.bitmap"]
    out = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", "refs/heads/main"],
                         capture_output=True)
    assert out.returncode == 0 and b"OK!" in out.stderr, out.stderr


PACKYARD = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))"]


def test_cli_no_midx_and_default(template, tmp_path, pk):
    import json

    for flag, want in ((["--no-midx"], False), ([], True)):
        shapes = ru.copy(template, tmp_path / f"cli{len(flag)}.git")
        proc = subprocess.run([*PACKYARD, "repack", "--repo", str(shapes.bare), "--mode", "geometric", "--json",
                               "--no-bitmap", *flag], capture_output=True, text=True, env=pk.cli_env(), cwd=pk.root)
        assert proc.returncode == 0, proc.stderr
        c = json.loads(proc.stdout)["counters"]
        assert (shapes.bare / "objects" / "pack" / MIDX_NAME).exists() is want
        assert (c["midx_packs"] > 0) is want
        _verify(shapes.bare)
