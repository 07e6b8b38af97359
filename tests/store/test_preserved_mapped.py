"""The fixed-path files git mmaps -- ``objects/pack/multi-pack-index``, ``objects/info/commit-graph``,
``packed-refs`` -- are kept in ``objects/pack/preserved/`` when maintenance replaces them (store/maintenance/
preserved/packs.py): over NFS a reader on another host that has the old file mapped keeps a valid handle only while
its inode lives. Real files and real git: the old inode (its st_ino captured before) is still linked there
after the repack, the MIDX write, the commit-graph write and pack-refs; git verifies everything and counts
the packs as before; the links expire after the preserve time and not before; a SIGKILL between the link and
the rename leaves a repository the rerun finishes; with preserving off nothing is kept."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitutil import copy_repo, git
from packyard.store import leftovers as lo
from packyard.store.maintenance.planning.stats import preserved_packs
from packyard.store.maintenance.preserved.packs import expire_preserved, expire_preserved_mapped
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.serving.graphwrite import GraphOptions, write_commit_graph
from packyard.store.maintenance.serving.midx import MIDX_NAME, installed_stems, read_midx, remove_midx, write_midx
from packyard.store.maintenance.serving.refresh import after_repack
from packyard.store.packrefs import pack_refs
from packyard.store.repo import Repository

MAPPED = {"multi-pack-index": "objects/pack/multi-pack-index", "commit-graph": "objects/info/commit-graph",
          "packed-refs": "packed-refs"}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Four packs (one per push), a MIDX, a monolithic commit-graph and a packed-refs of more than 32 KiB (git
    mmaps it), all written by git; then one more loose ref for pack-refs to fold in."""
    base = tmp_path_factory.mktemp("mapped")
    work, bare = base / "w", base / "r.git"
    git("init", "-q", "-b", "main", str(work))
    git("init", "-q", "--bare", str(bare))
    for i in range(4):
        (work / f"f{i}").write_text(f"{i}\n" * (i + 1))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"c{i}", cwd=work)
        git("push", "-q", str(bare), "HEAD:refs/heads/main", cwd=work)
        git("repack", "-d", "-q", git_dir=bare)
    head = git("rev-parse", "HEAD", cwd=work).decode().strip()
    git("update-ref", "--stdin", git_dir=bare,
        input="".join(f"create refs/tags/t{i:05d} {head}\n" for i in range(800)).encode())
    git("pack-refs", "--all", git_dir=bare)
    git("update-ref", "refs/heads/later", head, git_dir=bare)
    git("multi-pack-index", "write", "--no-progress", git_dir=bare)
    git("commit-graph", "write", "--reachable", "--no-progress", git_dir=bare)
    assert (bare / "packed-refs").stat().st_size > 32 * 1024
    assert len(installed_stems(bare / "objects" / "pack")) == 4
    return bare


@pytest.fixture
def bare(template, tmp_path) -> Path:
    return copy_repo(template, tmp_path / "r.git")


def _inodes(bare: Path) -> dict[str, int]:
    return {name: (bare / rel).stat().st_ino for name, rel in MAPPED.items()}


def _preserved(bare: Path) -> dict[str, list[os.stat_result]]:
    """The preserved mapped files by base name: their stats."""
    out: dict[str, list[os.stat_result]] = {}
    d = bare / "objects" / "pack" / "preserved"
    for p in sorted(d.iterdir()) if d.is_dir() else []:
        m = lo.PRESERVED_MAPPED_RE.match(p.name)
        if m is not None:
            out.setdefault(m.group(1), []).append(p.stat())
    return out


def _count_objects(bare: Path) -> tuple[dict[str, str], str]:
    proc = subprocess.run(["git", "--git-dir", str(bare), "count-objects", "-v"], capture_output=True, text=True,
                          check=True)
    return dict(line.split(": ", 1) for line in proc.stdout.splitlines()), proc.stderr


def _verify(bare: Path) -> None:
    git("fsck", "--full", "--strict", "--no-progress", git_dir=bare)
    if (bare / "objects" / "pack" / MIDX_NAME).exists():
        git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
    git("commit-graph", "verify", "--no-progress", git_dir=bare)


def test_a_repack_keeps_the_old_inodes_git_maps_and_expires_them_after_the_preserve_time(bare):
    before = _inodes(bare)
    refs = git("for-each-ref", git_dir=bare)
    now = time.time()
    repo = Repository.open(bare)
    result = repack(repo, RepackOptions(mode=RepackMode.GEOMETRIC, now=now))
    assert result.packs_deleted   # (packs replaced: the MIDX over them was rewritten)
    out = after_repack(repo, walked=result.walked)
    assert out["pack_refs_packed"] == 1 and out["commit_graph_commits"] == 4
    assert not (bare / MAPPED["commit-graph"]).exists()   # the chain replaced it

    kept = _preserved(bare)
    assert sorted(kept) == sorted(MAPPED)
    for name, ino in before.items():   # the very inodes readers may have mapped, still linked
        assert [st.st_ino for st in kept[name]] == [ino], name
        assert abs(kept[name][0].st_mtime - time.time()) < 60     # the time they were preserved
    assert (bare / "packed-refs").stat().st_ino != before["packed-refs"]
    assert (bare / MAPPED["multi-pack-index"]).stat().st_ino != before["multi-pack-index"]
    _verify(bare)
    assert git("for-each-ref", git_dir=bare) == refs

    # git counts the packs as before: the preserved files add nothing (preserved/ stays one garbage entry).
    counts, warnings = _count_objects(bare)
    assert counts["garbage"] == "1" and warnings == f"warning: garbage found: {bare}/objects/pack/preserved\n"
    assert counts["packs"] == str(len(list((bare / "objects" / "pack").glob("pack-*.pack"))))
    # ...and packyard's preserved packs are only packs.
    pack_dir = bare / "objects" / "pack"
    assert sorted(preserved_packs(pack_dir)) == sorted(result.packs_deleted)

    # Expiry: not before the preserve time, then all of them; the packs' expiry is unchanged.
    assert expire_preserved_mapped(pack_dir, 3600, now=time.time() + 3500) == []
    assert len(_preserved(bare)) == 3
    gone = expire_preserved_mapped(pack_dir, 3600, now=time.time() + 3601)
    assert sorted(n.split("-", 1)[0] for n in gone) == ["commit", "multi", "packed"] and _preserved(bare) == {}
    assert sorted(expire_preserved(pack_dir, 3600, now=now + 3601)) == sorted(result.packs_deleted)
    assert counts == _count_objects(bare)[0]
    _verify(bare)


def test_the_next_repack_and_gc_expire_them_with_the_packs(bare):
    from packyard.workers.commands.gc import run_gc

    now = time.time()
    repo = Repository.open(bare)
    repack(repo, RepackOptions(mode=RepackMode.GEOMETRIC, now=now))
    after_repack(repo)
    assert len(_preserved(bare)) == 3
    git("update-ref", "refs/heads/again", "main", git_dir=bare)
    git("commit-graph", "write", "--reachable", "--no-progress", git_dir=bare)   # git's monolithic file again
    midx = (bare / MAPPED["multi-pack-index"]).stat().st_ino
    # the first repack's MIDX bitmap (and reverse index), mapped by git as the MIDX is
    sides = sorted(p.name for p in (bare / "objects" / "pack").glob(f"{MIDX_NAME}-*"))
    assert sides
    res = repack(Repository.open(bare), RepackOptions(mode=RepackMode.FULL, now=now + 3601))
    # The three of the first repack expired; the MIDX this one rewrote and its side files are kept
    # (preserved "now").
    assert res.counters.preserved_mapped_expired == 3
    assert [st.st_ino for st in _preserved(bare)["multi-pack-index"]] == [midx]
    assert sorted(_preserved(bare)) == sorted(["multi-pack-index", *sides])
    after_repack(Repository.open(bare))
    assert sorted(_preserved(bare)) == sorted([*MAPPED, *sides])
    assert run_gc(bare, preserve_for=3600)["counters"]["preserved_mapped_expired"] == 0
    result = run_gc(bare, preserve_for=0)   # (the MIDX's links carry the repack's clock, an hour ahead: kept)
    assert result["counters"]["preserved_mapped_expired"] == 2
    assert sorted(_preserved(bare)) == sorted(["multi-pack-index", *sides])
    _verify(bare)


def test_preserving_off_keeps_nothing(bare):
    repo = Repository.open(bare)
    repack(repo, RepackOptions(mode=RepackMode.GEOMETRIC, preserve_for=0))
    after_repack(repo, preserve=False)
    assert _preserved(bare) == {}
    _verify(bare)
    stems = installed_stems(bare / "objects" / "pack")
    write_midx(bare / "objects" / "pack", stems, preserve=False)
    remove_midx(bare / "objects" / "pack", preserve=False)
    assert _preserved(bare) == {}


def test_the_worker_command_passes_the_preserve_option_on(bare, tmp_path):
    from packyard.workers.commands.repack import repack as repack_command

    other = copy_repo(bare, tmp_path / "other.git")
    repack_command(str(bare), mode="geometric", preserve_for=0)
    assert _preserved(bare) == {}
    repack_command(str(other), mode="geometric", preserve_for=600)
    assert sorted(_preserved(other)) == sorted(MAPPED)
    _verify(bare)
    _verify(other)


def test_each_writer_alone_keeps_what_it_replaced(bare):
    pack_dir = bare / "objects" / "pack"
    before = _inodes(bare)
    stems = installed_stems(pack_dir)
    m = write_midx(pack_dir, stems[:2])
    assert [st.st_ino for st in _preserved(bare)["multi-pack-index"]] == [before["multi-pack-index"]]
    second = (pack_dir / MIDX_NAME).stat().st_ino
    remove_midx(pack_dir)   # removing it keeps it too
    assert sorted(st.st_ino for st in _preserved(bare)["multi-pack-index"]) == sorted(
        [before["multi-pack-index"], second])
    assert read_midx(pack_dir) is None and m.pack_stems == tuple(stems[:2])
    write_commit_graph(Repository.open(bare), GraphOptions())
    assert [st.st_ino for st in _preserved(bare)["commit-graph"]] == [before["commit-graph"]]
    pack_refs(Repository.open(bare))
    assert [st.st_ino for st in _preserved(bare)["packed-refs"]] == [before["packed-refs"]]
    # Nothing to replace: nothing kept (a second commit-graph write finds no monolithic file).
    write_commit_graph(Repository.open(bare), GraphOptions(replace=True))
    assert len(_preserved(bare)["commit-graph"]) == 1
    _verify(bare)


_KILL = """
import sys
from pathlib import Path
from packyard.store.maintenance.serving.midx import installed_stems, write_midx
from packyard.store.packrefs import pack_refs
from packyard.store.repo import Repository
bare = Path(sys.argv[1])
if sys.argv[2] == "midx":
    write_midx(bare / "objects" / "pack", installed_stems(bare / "objects" / "pack")[:2])
else:
    pack_refs(Repository.open(bare))
"""


@pytest.mark.parametrize("what,point", [("midx", "midx.midx.after_preserve"),
                                        ("packed-refs", "packrefs.after_preserve")])
def test_a_sigkill_between_the_link_and_the_rename_is_harmless_and_the_rerun_finishes(bare, what, point):
    name = "multi-pack-index" if what == "midx" else "packed-refs"
    before = _inodes(bare)[name]
    refs = git("for-each-ref", git_dir=bare)
    proc = subprocess.run([sys.executable, "-c", _KILL, str(bare), what],
                          env={**os.environ, "PACKYARD_FAULT": f"{point}:kill"})
    assert proc.returncode == -9
    # The file is still in place (the rename never happened), a second link of it in preserved/.
    assert (bare / MAPPED[name]).stat().st_ino == before
    assert [st.st_ino for st in _preserved(bare)[name]] == [before]
    _verify(bare)
    assert git("for-each-ref", git_dir=bare) == refs
    # The rerun (after the leftovers pass breaks the dead writer's claim) installs; both links are the old inode.
    from packyard.store.leftovers.passes import remove_serving_leftovers, remove_stale_temp_files

    remove_stale_temp_files(bare / "objects" / "pack", stale_after=0)
    remove_serving_leftovers(bare, stale_after=0)
    proc = subprocess.run([sys.executable, "-c", _KILL, str(bare), what], env=dict(os.environ))
    assert proc.returncode == 0
    assert (bare / MAPPED[name]).stat().st_ino != before
    assert [st.st_ino for st in _preserved(bare)[name]] == [before, before]
    _verify(bare)
    assert git("for-each-ref", git_dir=bare) == refs
    assert len(expire_preserved_mapped(bare / "objects" / "pack", 3600, now=time.time() + 3601)) == 2


def test_a_new_midx_keeps_the_old_midx_bitmap_and_reverse_index_git_maps(bare):
    """git's MIDX bitmap (``multi-pack-index-<checksum>.bitmap``, and its ``.rev`` where git writes one) is mapped
    by upload-pack as the MIDX is; a new MIDX removes it (git's clear_midx_files_ext), so it is kept in
    preserved/ first. With preserving off it is removed outright."""
    pack_dir = bare / "objects" / "pack"
    git("multi-pack-index", "write", "--bitmap", "--no-progress", git_dir=bare)
    sides = {p.name: p.stat().st_ino for p in pack_dir.glob(f"{MIDX_NAME}-*") if p.suffix in (".bitmap", ".rev")}
    assert any(name.endswith(".bitmap") for name in sides)
    stems = installed_stems(pack_dir)
    write_midx(pack_dir, stems[:3])      # another MIDX: another checksum, the old side files go
    assert not any((pack_dir / name).exists() for name in sides)
    kept = _preserved(bare)
    for name, ino in sides.items():
        assert [st.st_ino for st in kept.get(name, [])] == [ino], name
    git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
    git("fsck", "--full", "--strict", "--no-progress", git_dir=bare)
    counts, _ = _count_objects(bare)
    assert counts["garbage"] == "1"
    # they expire with the rest, after the preserve time
    later = time.time() + 3601
    assert sorted(n.rsplit("-", 1)[0] for n in expire_preserved_mapped(pack_dir, now=later)) == \
        sorted([*sides, MIDX_NAME])
    assert _preserved(bare) == {}

    # preserving off: the next MIDX's change removes the side files and keeps nothing
    git("multi-pack-index", "write", "--bitmap", "--no-progress", git_dir=bare)
    write_midx(pack_dir, stems[:2], preserve=False)
    assert _preserved(bare) == {}


def test_a_pack_preserved_again_under_its_name_keeps_the_older_preserved_files_inodes(tmp_path):
    """A pack is preserved, written again (same name, same bytes, new files: a repack wrote the same pack) and
    preserved again. Its older preserved files may be mapped by a reader on another host, so the second move
    does not end their inodes: each (``.idx``, ``.pack``, ``.bitmap``) keeps a ``<name>-<hex>.old`` link, which
    expires after the preserve time as the other mapped files do."""
    from packyard.store.preserve import preserve_pack

    bare = tmp_path / "r.git"
    work = tmp_path / "w"
    git("init", "-q", "-b", "main", str(work))
    (work / "f").write_text("one\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "c", cwd=work)
    git("clone", "-q", "--bare", str(work), str(bare))
    git("repack", "-a", "-d", "-q", "--write-bitmap-index", git_dir=bare)
    pack_dir = bare / "objects" / "pack"
    (stem,) = installed_stems(pack_dir)
    exts = (".idx", ".pack", ".bitmap")
    copies = tmp_path / "copies"
    copies.mkdir()
    for e in exts:
        (copies / f"{stem}{e}").write_bytes((pack_dir / f"{stem}{e}").read_bytes())
    kept = pack_dir / "preserved"
    assert preserve_pack(pack_dir, stem) == 3
    fds = {e: os.open(kept / f"{stem}{e}", os.O_RDONLY) for e in exts}     # a reader maps the preserved pack
    try:
        for e in exts:                                                      # the same pack, written again
            (pack_dir / f"{stem}{e}").write_bytes((copies / f"{stem}{e}").read_bytes())
        git("fsck", "--full", "--strict", git_dir=bare)
        assert preserve_pack(pack_dir, stem) == 3
        assert all(os.fstat(fd).st_nlink == 1 for fd in fds.values())       # still linked: the .old names
        old = sorted(p.name for p in kept.glob("*.old"))
        assert [n.rsplit("-", 1)[0] for n in old] == sorted(f"{stem}{e}" for e in exts)
        assert all(os.fstat(fds[e]).st_ino != (kept / f"{stem}{e}").stat().st_ino for e in exts)
        found = lo.find_preserved_mapped(bare)
        assert sorted(f.path.name for f in found) == old and not lo.removable(found)
        assert list(preserved_packs(pack_dir)) == [stem]                     # one preserved pack, not a second
        assert sorted(expire_preserved_mapped(pack_dir, 3600, now=time.time() + 3601)) == old
        assert all(os.fstat(fd).st_nlink == 0 for fd in fds.values())       # gone after the preserve time
    finally:
        for fd in fds.values():
            os.close(fd)
    assert not list(pack_dir.glob(f"{stem}.*"))
