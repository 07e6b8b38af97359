"""The multi-pack-index: packyard's bytes against git's own ``multi-pack-index write``, git's verifier,
the durable install (a SIGKILL at each step), and the typed errors of a bad file."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import git
from packyard.store.errors import InvalidInputError, PackFormatError
from packyard.store.maintenance.serving.midx import (
    LOCK_NAME,
    MIDX_NAME,
    MidxPack,
    build_midx,
    parse_midx,
    read_midx,
    write_midx,
)
from packyard.store.pack.idxread import read_idx_tables

T0 = 1_700_000_000


def _repo_with_packs(base: Path, *, overlap: bool = True) -> tuple[Path, list[str]]:
    """A bare repository whose history is cut into 4 packs by git (with ``overlap``, the third pack repeats
    objects of the second, so the MIDX must choose a copy); each pack a different mtime."""
    work = base / "work"
    git("init", "-q", "-b", "main", str(work))
    commits = []
    for i in range(8):
        for f in range(3):
            (work / f"f{f}.txt").write_text(f"line {i} of {f}\n" * (i + f + 1))
        (work / "common").write_text("".join(f"{k}\n" for k in range(i * 10)))
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"c{i}", cwd=work)
        commits.append(git("rev-parse", "HEAD", cwd=work).decode().strip())
    bare = base / "repo.git"
    git("init", "-q", "--bare", str(bare))
    pack_dir = bare / "objects" / "pack"
    ranges = [(None, commits[1]), (commits[1], commits[3]), (commits[2] if overlap else commits[3], commits[5]),
              (commits[5], commits[7])]
    stems = []
    for k, (lo, hi) in enumerate(ranges):
        spec = f"{hi}\n" + (f"^{lo}\n" if lo else "")
        objs = git("rev-list", "--objects", "--stdin", cwd=work, input=spec.encode())
        sha = git("pack-objects", "-q", str(pack_dir / "pack"), cwd=work, input=objs).decode().strip()
        stem = f"pack-{sha}"
        stems.append(stem)
        for ext in ("pack", "idx"):
            os.utime(pack_dir / f"{stem}.{ext}", (T0 + 100 * k, T0 + 100 * k))
    git("update-ref", "refs/heads/main", commits[-1], git_dir=bare)
    return bare, stems


def _git_midx(bare: Path, *args: str) -> bytes:
    pack_dir = bare / "objects" / "pack"
    for p in pack_dir.glob(MIDX_NAME + "*"):
        p.unlink()
    git("multi-pack-index", "write", "--no-progress", *args, git_dir=bare)
    return (pack_dir / MIDX_NAME).read_bytes()


def _packs(bare: Path, stems: list[str]) -> list[MidxPack]:
    return [MidxPack.load(bare / "objects" / "pack", s) for s in stems]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> tuple[Path, list[str]]:
    return _repo_with_packs(tmp_path_factory.mktemp("midx"))


def test_bytes_identical_to_git_without_reverse_index(repo):
    bare, stems = repo
    theirs = _git_midx(bare)
    ours = build_midx(_packs(bare, stems), ridx=False)
    assert ours == theirs
    m = parse_midx(ours)
    assert m.chunk_ids == (b"PNAM", b"OIDF", b"OIDL", b"OOFF")
    # Duplicates went to the newest pack (no preferred pack without a reverse index).
    t2, t3 = (read_idx_tables(bare / "objects" / "pack" / f"{s}.idx") for s in stems[1:3])
    dup = {t2.oid(i) for i in range(t2.count)} & {t3.oid(i) for i in range(t3.count)}
    assert dup, "the fixture must share objects between packs 2 and 3"
    assert all(m.find(oid)[0] == stems[2] for oid in dup)


@pytest.mark.parametrize("which", [0, 1, 3])
def test_bytes_identical_to_git_with_preferred_pack(repo, which):
    bare, stems = repo
    theirs = _git_midx(bare, f"--preferred-pack={stems[which]}.pack")
    assert build_midx(_packs(bare, stems), preferred=stems[which], ridx=False) == theirs


def test_bytes_identical_to_git_with_reverse_index(repo):
    """git writes RIDX with --bitmap; without --preferred-pack it prefers the OLDEST pack (2.39's rule)."""
    bare, stems = repo
    theirs = _git_midx(bare, "--bitmap")
    ours = build_midx(_packs(bare, stems), ridx=True)
    assert ours == theirs
    assert parse_midx(ours).chunk_ids[-1] == b"RIDX"
    theirs = _git_midx(bare, "--bitmap", f"--preferred-pack={stems[2]}.pack")
    assert build_midx(_packs(bare, stems), preferred=stems[2], ridx=True) == theirs


def test_pseudo_pack_order_puts_the_preferred_pack_first(repo):
    bare, stems = repo
    m = parse_midx(build_midx(_packs(bare, stems), preferred=stems[3]))
    assert m.ridx is not None and sorted(m.ridx) == list(range(m.count))
    first = [_stem_of(m, pos) for pos in m.ridx]
    n_pref = sum(1 for s in first if s == stems[3])
    assert set(first[:n_pref]) == {stems[3]}
    rest = [m.pack_names.index(f"{s}.idx") for s in first[n_pref:]]
    assert rest == sorted(rest)
    # Within one pack, by offset.
    offs = [m.offsets[pos] for pos in m.ridx[:n_pref]]
    assert offs == sorted(offs)


def _stem_of(m, pos: int) -> str:
    return m.pack_names[m.pack_ids[pos]][:-4]


def test_write_installs_a_midx_git_verifies_and_uses(repo, tmp_path):
    bare, stems = repo
    pack_dir = bare / "objects" / "pack"
    for p in pack_dir.glob(MIDX_NAME + "*"):
        p.unlink()
    m = write_midx(pack_dir, stems)
    assert read_midx(pack_dir) == m
    assert sorted(p.name for p in pack_dir.iterdir() if not p.name.startswith("pack-")) == [MIDX_NAME]
    git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
    git("fsck", "--full", "--strict", "--no-progress", git_dir=bare)
    # Every object through the MIDX (git reads it first with core.multiPackIndex=true).
    ids = "".join(m.oids[20 * i:20 * i + 20].hex() + "\n" for i in range(m.count)).encode()
    out = git("-c", "core.multiPackIndex=true", "cat-file", "--batch-check", git_dir=bare, input=ids)
    assert b"missing" not in out and len(out.splitlines()) == m.count
    # The control: verify really checks our offsets (one offset changed, the trailer recomputed, fails).
    data = bytearray((pack_dir / MIDX_NAME).read_bytes())
    ooff = next(i for i in range(12, 12 + 12 * 8, 12) if data[i:i + 4] == b"OOFF")
    at = int.from_bytes(data[ooff + 4:ooff + 12], "big") + 7
    data[at] ^= 0x10
    data[-20:] = hashlib.sha1(data[:-20]).digest()
    (pack_dir / MIDX_NAME).chmod(0o644)
    (pack_dir / MIDX_NAME).write_bytes(bytes(data))
    bad = subprocess.run(["git", "--git-dir", str(bare), "multi-pack-index", "verify", "--no-progress"],
                         capture_output=True)
    assert bad.returncode != 0 and b"incorrect object offset" in bad.stderr
    m = write_midx(pack_dir, stems)
    # A MIDX naming a pack that is not installed is never written.
    with pytest.raises(InvalidInputError):
        write_midx(pack_dir, stems + ["pack-" + "0" * 40])
    assert read_midx(pack_dir) == m


def test_large_offsets_chunk_as_gits():
    """Offsets >= 2^32 (packs over 4 GiB) go to LOFF, and then every offset >= 2^31 does, as git writes."""
    from array import array

    from packyard.store.pack.idxread import IdxTables

    oids = b"".join(bytes([i]) * 20 for i in (1, 2, 3))
    t = IdxTables(count=3, oids=oids, crcs=array("I", [0, 0, 0]),
                  offsets=array("Q", [12, 0x80000000, 0x100000000]), pack_checksum=b"\0" * 20)
    m = parse_midx(build_midx([MidxPack("pack-" + "a" * 40 + ".idx", t, T0)], ridx=False))
    assert m.chunk_ids == (b"PNAM", b"OIDF", b"OIDL", b"OOFF", b"LOFF")
    assert list(m.offsets) == [12, 0x80000000, 0x100000000]
    t2 = IdxTables(count=3, oids=oids, crcs=array("I", [0, 0, 0]), offsets=array("Q", [12, 0x80000000, 0xFFFFFFFF]),
                   pack_checksum=b"\0" * 20)
    m2 = parse_midx(build_midx([MidxPack("pack-" + "a" * 40 + ".idx", t2, T0)], ridx=False))
    assert m2.chunk_ids == (b"PNAM", b"OIDF", b"OIDL", b"OOFF")   # under 2^32: no LOFF (git's rule)
    assert list(m2.offsets) == [12, 0x80000000, 0xFFFFFFFF]


def test_bad_files_are_typed_errors_naming_the_file(repo, tmp_path):
    bare, stems = repo
    data = bytearray(build_midx(_packs(bare, stems)))
    path = tmp_path / MIDX_NAME
    with pytest.raises(PackFormatError) as err:
        parse_midx(b"MIDX" + bytes(20), path)
    assert str(path) in str(err.value)
    bad = bytearray(data)
    bad[40] ^= 1
    with pytest.raises(PackFormatError, match="checksum"):
        parse_midx(bytes(bad), path)
    bad = bytearray(data)
    bad[:4] = b"MIDY"
    with pytest.raises(PackFormatError, match="signature"):
        parse_midx(bytes(bad), path)
    with pytest.raises(InvalidInputError):
        build_midx([])
    with pytest.raises(InvalidInputError, match="preferred"):
        build_midx(_packs(bare, stems), preferred="pack-" + "f" * 40)


_KILL_SCRIPT = """
import sys
from packyard.store.maintenance.serving.midx import write_midx
write_midx(sys.argv[1], sys.argv[2].split(","))
"""


@pytest.mark.parametrize("point", ["midx.midx.after_flush", "midx.midx.after_rename", "midx.midx.after_fsync_dirs"])
def test_sigkill_at_each_install_step_leaves_a_readable_repository(repo, tmp_path, point):
    import shutil

    src, stems = repo
    bare = tmp_path / "r.git"
    shutil.copytree(src, bare)
    pack_dir = bare / "objects" / "pack"
    for p in pack_dir.glob(MIDX_NAME + "*"):
        p.unlink()
    old = write_midx(pack_dir, stems[:2])   # a MIDX over two packs is there before
    env = {**os.environ, "PACKYARD_FAULT": f"{point}:kill"}
    proc = subprocess.run([sys.executable, "-c", _KILL_SCRIPT, str(pack_dir), ",".join(stems)], env=env)
    assert proc.returncode == -9
    now = read_midx(pack_dir)
    assert now is not None and now.pack_stems in (old.pack_stems, tuple(sorted(stems)))
    git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
    git("fsck", "--full", "--no-progress", git_dir=bare)
    assert not (pack_dir / LOCK_NAME).exists() or _dead_claim(pack_dir / LOCK_NAME)
    # The next write breaks the dead writer's claim and removes its temp file (the leftovers rules).
    from packyard.store.leftovers.passes import remove_stale_temp_files

    remove_stale_temp_files(pack_dir, stale_after=0)
    assert not list(pack_dir.glob("tmp_*")) and not (pack_dir / LOCK_NAME).exists()
    write_midx(pack_dir, stems)
    git("multi-pack-index", "verify", "--no-progress", git_dir=bare)


def _dead_claim(path: Path) -> bool:
    from packyard.store.lockfile import BreakVerdict, judge

    return judge(path)[0] is BreakVerdict.OWNER_DEAD


# -- the MIDX bitmap ---------------------------------------------------------------------------------

def _bitmap_for(bare: Path):
    from packyard.store.maintenance.serving.bitmap import BitmapOptions
    from packyard.store.maintenance.serving.midxbitmap import midx_bitmap
    from packyard.store.repo import Repository

    repo = Repository.open(bare)
    return lambda m: midx_bitmap(m, bare / "objects" / "pack", repo.refs.as_dict(), repo.objects.read,
                                 BitmapOptions(lookup_table=True))


@pytest.mark.parametrize("preferred", [None, 1])
def test_midx_bitmap_bytes_identical_to_gits(repo, tmp_path, preferred):
    """git 2.39 --bitmap (with pack.writeBitmapLookupTable): the same .bitmap, named by the MIDX checksum."""
    import shutil

    src, stems = repo
    bare = tmp_path / "r.git"
    shutil.copytree(src, bare, copy_function=shutil.copy2)
    pack_dir = bare / "objects" / "pack"
    for p in pack_dir.glob(MIDX_NAME + "*"):
        p.unlink()
    args = ["--bitmap"] + ([f"--preferred-pack={stems[preferred]}.pack"] if preferred is not None else [])
    git("-c", "pack.writeBitmapLookupTable=true", "multi-pack-index", "write", "--no-progress", *args, git_dir=bare)
    theirs_midx = (pack_dir / MIDX_NAME).read_bytes()
    (theirs_bitmap,) = list(pack_dir.glob(f"{MIDX_NAME}-*.bitmap"))
    theirs = theirs_bitmap.read_bytes()
    for p in pack_dir.glob(MIDX_NAME + "*"):
        p.unlink()
    m = write_midx(pack_dir, stems, preferred=None if preferred is None else stems[preferred],
                   bitmap=_bitmap_for(bare))
    assert (pack_dir / MIDX_NAME).read_bytes() == theirs_midx
    ours = pack_dir / f"{MIDX_NAME}-{m.checksum.hex()}.bitmap"
    assert ours.name == theirs_bitmap.name and ours.read_bytes() == theirs
    # git uses it: --test-bitmap checks every bitmap against a walk, verify checks the MIDX.
    out = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", "refs/heads/main"],
                         capture_output=True)
    assert out.returncode == 0 and b"OK!" in out.stderr, out.stderr
    git("multi-pack-index", "verify", "--no-progress", git_dir=bare)
