"""The read path after the pack refactor: one entry reader and resolver, one delta-base cache per
process, and the lookup rules when a repack moves packs away (snapshot fallback, preserved/)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gitutil import CORPUS, GIT_ENV, batch_check_all, git, make_worktree_repo, repo_from_corpus
from packyard.store import Location, ObjectMissingError, Repository
from packyard.store.objects import from_hex
from packyard.store.pack import cache as cache_mod


@pytest.fixture
def packed_repo(tmp_path):
    bare = make_worktree_repo(tmp_path, commits=6, files_per_commit=4)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    git("prune-packed", git_dir=bare)
    return bare


def test_snapshot_read_falls_back_when_its_pack_was_repacked_away(packed_repo):
    repo = Repository.open(packed_repo)
    snap = repo.objects.snapshot()          # idx opened; the pack's bytes not yet read
    oid = repo.refs.resolve("HEAD")
    (old_pack,) = list(snap.packs)
    # A concurrent repack: a new pack with everything, the old one deleted.
    git("repack", "-a", "-d", "-f", "-q", "--window=0", git_dir=packed_repo)
    assert not old_pack.pack_path.exists()
    obj_type, data = snap.read(oid)
    assert data.startswith(b"tree ")
    assert repo.objects.counters.snapshot_fallbacks == 1


def test_vanished_pack_is_dropped_and_preserved_dir_searched_before_missing(packed_repo):
    repo = Repository.open(packed_repo)
    oid = repo.refs.resolve("HEAD")
    repo.objects.packs.prepare()            # listed, not opened
    pack_dir = packed_repo / "objects" / "pack"
    preserved = pack_dir / "preserved"
    preserved.mkdir()
    # A repack replaced the pack and preserved it (the object is unreachable now: no new pack has it).
    for f in pack_dir.glob("pack-*"):
        shutil.move(str(f), preserved / f.name)
    assert repo.objects.read(oid)[1].startswith(b"tree ")
    c = repo.objects.counters
    assert c.packs_vanished == 1 and c.preserved_hits == 1
    # Existence checks never answer from preserved/: a writer must write it anew.
    assert repo.objects.locate(oid) is Location.MISSING
    assert repo.objects.read_header(oid)[1] > 0
    for f in preserved.iterdir():
        f.unlink()
    with pytest.raises(ObjectMissingError, match="preserved packs searched"):
        repo.objects.read(oid)


def test_delta_base_cache_is_one_per_process_and_bounded(tmp_path, monkeypatch):
    if not (CORPUS / "git-v1.0.0.pack").exists():
        pytest.skip("corpus not available")
    small = cache_mod.DeltaBaseCache(limit=2 << 20)
    monkeypatch.setattr(cache_mod, "BASE_CACHE", small)
    import packyard.store.pack.resolve as resolve_mod
    monkeypatch.setattr(resolve_mod, "BASE_CACHE", small)
    a = repo_from_corpus(tmp_path / "a", "git-v1.0.0")
    b = make_worktree_repo(tmp_path / "b", commits=3)
    git("repack", "-a", "-d", "-q", git_dir=b)
    total = 0
    for bare in (a, b):
        repo = Repository.open(bare)
        for hexid, (_typ, size) in batch_check_all(bare).items():
            repo.objects.read(from_hex(hexid))
            total += size
        assert small.used <= small.limit
    assert total > 2 * small.limit, "the reads needed more than the bound"
    packs = {key[0] for key in small._items}
    assert len(packs) == 2, "one cache holds entries of both repositories' packs"


def test_idx_naming_a_64_bit_offset_without_the_table_is_refused(packed_repo):
    """An offset with its high bit set points into the 64-bit offset table; without that table the idx is
    refused, naming the file and the offset table's position (the idx checksum itself is valid)."""
    import hashlib

    from packyard.store.errors import PackFormatError
    from packyard.store.pack.idxread import read_idx_tables

    (idx,) = (packed_repo / "objects" / "pack").glob("*.idx")
    data = bytearray(idx.read_bytes())
    n = read_idx_tables(idx).count
    off_at = 8 + 1024 + 24 * n
    data[off_at + 4 * (n - 1)] |= 0x80                 # the last entry's offset: "64-bit table, #k"
    data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
    with pytest.raises(PackFormatError) as err:
        read_idx_tables(idx, bytes(data))
    assert err.value.offset == off_at and str(idx) in str(err.value)


def test_find_offset_agrees_with_the_idx_tables_for_hits_and_misses(tmp_path):
    """find_offset answers a miss from the fan-out table when no id starts with that byte: for every first byte
    (a pack this small leaves most buckets empty), an absent id is None and every present id has its offset."""
    from packyard.store.pack.packdir import PackFile

    bare = tmp_path / "r.git"
    git("init", "-q", "--bare", str(bare))
    oids = git("hash-object", "-w", "--stdin-paths", git_dir=bare,
               input="\n".join(str(_write(tmp_path / f"f{k}", f"blob {k}\n")) for k in range(20)).encode())
    assert len(oids.split()) == 20
    git("pack-objects", "-q", str(bare / "objects" / "pack" / "pack"), git_dir=bare, input=oids)
    (idx,) = (bare / "objects" / "pack").glob("*.idx")
    pack = PackFile(idx)
    tables = pack.tables()
    present = {tables.oid(i): tables.offsets[i] for i in range(tables.count)}
    assert {pack.find_offset(oid) for oid in present} == set(present.values())
    assert all(pack.find_offset(oid) == off for oid, off in present.items())
    firsts = {oid[0] for oid in present}
    assert len(firsts) < 256          # some buckets are empty: the fan-out answers those
    for b in range(256):
        probe = bytes([b]) + b"\xff" * 19
        assert probe in present or pack.find_offset(probe) is None
        probe = bytes([b]) + b"\x00" * 19
        assert probe in present or pack.find_offset(probe) is None
    pack.close()


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("version", ["2", "2-large", "1"])
def test_idx_reader_agrees_with_the_tables_and_git(tmp_path, version):
    """open_idx: a v2 idx (with 64-bit offsets too) is searched here, a v1 idx through dulwich; both give
    every id's offset, the entries in id order and git's checksums, and None for an id not there."""
    from packyard.store.pack.idxread import DulwichIdx, IdxV2, open_idx, read_idx_tables

    bare = make_worktree_repo(tmp_path, commits=3, files_per_commit=3)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    (pack,) = (bare / "objects" / "pack").glob("*.pack")
    extra = {"2": ["--index-version=2"], "2-large": ["--index-version=2,0"], "1": ["--index-version=1"]}[version]
    idx = tmp_path / "x.idx"
    git("index-pack", *extra, "-o", str(idx), str(pack))
    index = open_idx(idx)
    assert isinstance(index, DulwichIdx if version == "1" else IdxV2)
    expected = {line.split()[1]: int(line.split()[0]) for line in    # git's reading: "<offset> <id> ..."
                git("show-index", input=idx.read_bytes()).decode().splitlines()}
    if version != "1":
        tables = read_idx_tables(idx)
        assert expected == {tables.oid(i).hex(): tables.offsets[i] for i in range(tables.count)}
    entries = list(index.iterentries())
    assert [(sha.hex(), off) for sha, off, _crc in entries] == sorted(expected.items())
    assert len(index) == len(expected)
    assert all(index.find(bytes.fromhex(h)) == off for h, off in expected.items())
    for _ in range(200):
        probe = os.urandom(20)
        assert probe.hex() in expected or index.find(probe) is None
    if version != "1":   # the C search and its Python specification: hits, misses beside each id, short ids
        probes = [bytes.fromhex(h) for h in expected]
        probes += [bytes([*oid[:19], (oid[19] + d) % 256]) for oid in probes for d in (1, 255)]
        probes += [b"\0" * 20, b"\xff" * 20, probes[0][:19], probes[0] + b"\0", os.urandom(20)]
        assert [index.find(o) for o in probes] == [index.find_py(o) for o in probes]
    data = idx.read_bytes()
    assert index.get_stored_checksum() == index.calculate_checksum() == data[-20:]
    assert index.get_pack_checksum() == pack.read_bytes()[-20:]
    index.close()


def test_truncated_idx_is_a_format_error(tmp_path):
    from packyard.store.errors import PackFormatError
    from packyard.store.pack.idxread import open_idx

    bare = make_worktree_repo(tmp_path, commits=2, files_per_commit=2)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    (idx,) = (bare / "objects" / "pack").glob("*.idx")
    cut = tmp_path / "cut.idx"
    for size in (0, 3, 8 + 1024, len(idx.read_bytes()) - 41):
        cut.write_bytes(idx.read_bytes()[:size])
        with pytest.raises(PackFormatError):
            open_idx(cut)


def test_an_idx_whose_fan_out_decreases_is_refused_as_git_refuses_it(tmp_path):
    """git's check_packed_git_idx says "non-monotonic index"; so does the reader, naming the entry (the C
    search then never sees a bucket outside the id table). Checked with git on the same file."""
    import struct

    from packyard.store.errors import PackFormatError
    from packyard.store.pack.idxread import open_idx

    bare = make_worktree_repo(tmp_path, commits=2, files_per_commit=2)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    (idx,) = (bare / "objects" / "pack").glob("*.idx")
    data = bytearray(idx.read_bytes())
    fan = struct.unpack_from(">256I", data, 8)
    b = next(i for i in range(255) if fan[i] > 0)
    struct.pack_into(">I", data, 8 + 4 * b, fan[255] + 5)   # a bucket past the table, and a decrease after it
    idx.chmod(0o644)
    idx.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match="non-monotonic") as err:
        open_idx(idx)
    assert err.value.offset == 8 + 4 * (b + 1)
    env = {**os.environ, **GIT_ENV}
    out = subprocess.run(["git", "--git-dir", str(bare), "cat-file", "--batch-all-objects", "--batch-check"],
                         env=env, capture_output=True)
    assert b"non-monotonic index" in out.stderr
