"""The pack writer (store/pack/write.py) against git: packs git verifies and indexes to the same ids,
verbatim copies with their CRC checked, REF_DELTA turned into OFS_DELTA, and the .mtimes git writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo
from packbuild import ofs_bytes
from packyard.store.errors import PackFormatError
from packyard.store.install import InstallOutcome
from packyard.store.objects import OFS_DELTA, REF_DELTA, ObjectType, hash_object
from packyard.store.pack.entries import read_header
from packyard.store.pack.idxread import read_idx_tables
from packyard.store.pack.mtimes import read_mtimes
from packyard.store.pack.packdir import PackFile
from packyard.store.pack.write import PackWriter, ofs_encoding
from packyard.store.repo import Repository


def test_ofs_encoding_is_gits():
    for rel in (1, 127, 128, 16511, 16512, 2**20, 2**35 + 7):
        assert ofs_encoding(rel) == ofs_bytes(rel)


def test_whole_objects_git_verifies_and_indexes_alike(tmp_path):
    repo = Repository.init(tmp_path / "r.git")
    objects = [(ObjectType.BLOB, b"blob %d\n" % i * (i + 1)) for i in range(50)]
    w = PackWriter(repo.objects.path / "pack", len(objects))
    for typ, data in objects:
        w.write_whole(hash_object(typ, data), typ, data)
    outcome, files, _ = w.install()
    assert outcome is InstallOutcome.INSTALLED
    idx = repo.objects.path / "pack" / f"{files.name}.idx"
    assert git("verify-pack", "-v", str(idx)).decode().rstrip().endswith(": ok")
    # git index-pack of our .pack names the same pack and writes the same idx.
    (tmp_path / "copy.pack").write_bytes(idx.with_suffix(".pack").read_bytes())
    out = git("index-pack", "-o", str(tmp_path / "copy.idx"), str(tmp_path / "copy.pack")).decode().strip()
    assert f"pack-{out}" == files.name
    assert (tmp_path / "copy.idx").read_bytes() == idx.read_bytes()
    assert not [p for p in (repo.objects.path / "pack").iterdir() if p.name.startswith("tmp_")]
    # the idx order it hands on (a bitmap's name-hash cache and commit positions are in it): git's idx order
    from array import array

    order = array("I")
    order.frombytes(w.index_order)
    in_pack = [hash_object(typ, data) for typ, data in objects]
    listed = [line.split()[1] for line in git("show-index", input=idx.read_bytes()).decode().splitlines()]
    assert [in_pack[i].hex() for i in order] == listed


def _ref_delta_pack(tmp_path) -> Path:
    """A pack git wrote with REF_DELTA entries (no --delta-base-offset)."""
    bare = make_worktree_repo(tmp_path / "src", commits=6, files_per_commit=3)
    revs = git("rev-list", "--objects", "--all", git_dir=bare)
    ids = b"\n".join(line.split(b" ")[0] for line in revs.splitlines()) + b"\n"
    name = git("pack-objects", "-q", str(tmp_path / "ref"), git_dir=bare, input=ids).decode().strip()
    return tmp_path / f"ref-{name}.idx"


def test_copied_entries_turn_ref_deltas_into_ofs_deltas(tmp_path):
    src = PackFile(_ref_delta_pack(tmp_path))
    t = src.tables()
    order = t.pack_order()
    buf = src.buffer()
    ends = {order[k]: (t.offsets[order[k + 1]] if k + 1 < t.count else src.end) for k in range(t.count)}
    headers = {i: read_header(buf, t.offsets[i], end=src.end, path=src.pack_path) for i in range(t.count)}
    assert any(h.type == REF_DELTA for h in headers.values()), "git wrote REF deltas"
    repo = Repository.init(tmp_path / "r.git")
    w = PackWriter(repo.objects.path / "pack", t.count)
    new_off: dict[bytes, int] = {}
    by_offset = {t.offsets[i]: t.oid(i) for i in range(t.count)}
    for i in order:
        h = headers[i]
        base = None
        if h.is_delta:
            base = new_off[h.base if h.type == REF_DELTA else by_offset[h.base]]
        new_off[t.oid(i)] = w.copy_entry(t.oid(i), buf, h, ends[i], t.crcs[i], path=src.pack_path, base_offset=base)
    _, files, _ = w.install()
    new = PackFile(repo.objects.path / "pack" / f"{files.name}.idx")
    nbuf = new.buffer()
    types = {read_header(nbuf, off, end=new.end, path="x").type for off in new_off.values()}
    assert REF_DELTA not in types and OFS_DELTA in types
    assert git("verify-pack", "-v", str(new.idx_path)).decode().rstrip().endswith(": ok")
    for i in range(t.count):
        assert new.read(t.oid(i), verify=True) == src.read(t.oid(i), verify=True)


def test_copy_refuses_an_entry_whose_crc_does_not_match(tmp_path):
    src = PackFile(_ref_delta_pack(tmp_path))
    t = src.tables()
    i = t.pack_order()[0]
    h = read_header(src.buffer(), t.offsets[i], end=src.end, path=src.pack_path)
    repo = Repository.init(tmp_path / "r.git")
    w = PackWriter(repo.objects.path / "pack", 1)
    end = t.offsets[t.pack_order()[1]]
    with pytest.raises(PackFormatError, match="CRC32") as info:
        w.copy_entry(t.oid(i), src.buffer(), h, end, t.crcs[i] ^ 1, path=src.pack_path)
    assert info.value.oid == t.oid(i).hex() and info.value.offset == t.offsets[i]
    assert info.value.path == str(src.pack_path)
    assert w.written == 0
    w.abort()
    assert not list((repo.objects.path / "pack").iterdir())


def test_mtimes_match_the_layout_git_writes(tmp_path):
    """git's own cruft pack's .mtimes reads back with our reader; ours is the same layout (12-byte header,
    4 bytes per object in idx order, pack checksum, file checksum) with the times we gave."""
    bare = make_worktree_repo(tmp_path / "g", commits=2)
    for i in range(4):
        git("hash-object", "-w", "--stdin", git_dir=bare, input=b"dangling %d\n" % i)
    git("repack", "--cruft", "-d", "-q", git_dir=bare)
    (theirs,) = list((bare / "objects" / "pack").glob("*.mtimes"))
    t = read_idx_tables(theirs.with_suffix(".idx"))
    times = read_mtimes(theirs, t.count, t.pack_checksum)
    assert len(times) == t.count >= 4 and all(x > 1_600_000_000 for x in times)

    repo = Repository.init(tmp_path / "r.git")
    objs = [(ObjectType.BLOB, b"cruft %d\n" % i) for i in range(5)]
    w = PackWriter(repo.objects.path / "pack", len(objs))
    for typ, data in objs:
        w.write_whole(hash_object(typ, data), typ, data)
    mtimes = [1_700_000_000 + i for i in range(5)]
    _, files, _ = w.install(mtimes=mtimes)
    ours = repo.objects.path / "pack" / f"{files.name}.mtimes"
    t2 = read_idx_tables(ours.with_suffix(".idx"))
    got = read_mtimes(ours, t2.count, t2.pack_checksum)
    want = {hash_object(typ, data): m for (typ, data), m in zip(objs, mtimes)}
    assert [got[i] for i in range(t2.count)] == [want[t2.oid(i)] for i in range(t2.count)]
    assert ours.stat().st_size == 12 + 4 * 5 + 40
    git("fsck", "--full", git_dir=repo.path)
