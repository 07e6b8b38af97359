"""Repack with real git as the oracle: every mode on a repository git built with every shape
(tests/repackutil.py), cruft packs git reads, delta reuse, reads and pushes racing a repack
(deterministically, through hooks), corrupt input, and preserved packs."""
from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import pytest

import repackutil as ru
from gitutil import CORPUS, git, repo_from_corpus, snapshot_tree
from packyard.store.errors import CorruptObjectError, ObjectMissingError, PackFormatError
from packyard.store.maintenance.preserved.packs import expire_preserved
from packyard.store.maintenance.repack.options import RepackHooks, RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import geometric_split, repack
from packyard.store.objects import ObjectType, from_hex, hash_object
from packyard.store.pack.idxread import read_idx_tables
from packyard.store.pack.mtimes import read_mtimes
from packyard.store.repo import Repository

FULL, GEOMETRIC, LOOSE = RepackMode.FULL, RepackMode.GEOMETRIC, RepackMode.LOOSE


def packs(bare: Path) -> list[str]:
    return sorted(p.stem for p in (bare / "objects" / "pack").glob("pack-*.idx"))


def ids_in(idx: Path) -> set[bytes]:
    t = read_idx_tables(idx)
    return {t.oid(i) for i in range(t.count)}


def loose_count(bare: Path) -> int:
    return sum(1 for d in (bare / "objects").iterdir() if len(d.name) == 2 for _ in d.iterdir())


# -- every mode, git as the oracle ------------------------------------------------------------------

def test_full_repack(shapes):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    keep_files = {p.name: p.read_bytes() for p in shapes.keep_pack.parent.glob(shapes.keep_pack.stem + ".*")}
    keep_ids = ids_in(shapes.keep_pack.with_suffix(".idx"))
    result = repack(Repository.open(bare), RepackOptions(mode=FULL))
    c = result.counters
    ru.check_with_git(bare, listing, result.packs_written + [result.cruft_pack])
    # The .keep pack and its objects are left alone.
    assert {p.name: p.read_bytes() for p in shapes.keep_pack.parent.glob(shapes.keep_pack.stem + ".*")} == keep_files
    (main,) = result.packs_written
    assert not keep_ids & ids_in(bare / "objects" / "pack" / f"{main}.idx")
    assert set(packs(bare)) == {main, result.cruft_pack, shapes.keep_pack.stem}
    assert loose_count(bare) == 0
    # Young unreachable objects (and what they need) stay readable; old ones are gone.
    for oid in shapes.young + shapes.rescued:
        assert ru.has_object(bare, oid), oid
    for oid in shapes.old:
        assert not ru.has_object(bare, oid), oid
    assert c.cruft_kept == len(shapes.young) + len(shapes.rescued)
    assert c.cruft_expired == len(shapes.old)
    assert ru.has_object(bare, shapes.detached)
    assert c.packs_merged == c.preserved_moved == len(result.packs_deleted) > 5
    assert c.deltas_reused > 0 and c.objects_out == c.reachable - len(keep_ids) + c.cruft_kept
    cruft = bare / "objects" / "pack" / f"{result.cruft_pack}.mtimes"
    assert cruft.exists() and not (bare / "objects" / "pack" / f"{main}.mtimes").exists()


def test_full_repack_opens_each_loose_object_once(shapes, tmp_path, monkeypatch):
    """The walk's reads of loose objects are kept for the delta search and the writer (looseread.LooseKeeper),
    and the search reads a loose blob whole when it wants its header (writeplan._loose_header): each reachable
    loose file is opened once, not two or three times (on NFS each open is round trips). The opens are logged
    to a file, so that a forked search process's count too."""
    from packyard.store import loose as loose_mod

    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    reachable_loose = {oid for oid in (line.split()[0].decode() for line in listing.splitlines())
                       if ru._loose_path(bare, oid).exists()}
    assert len(reachable_loose) > 3
    log = tmp_path / "opens.log"
    real = loose_mod.LooseObjects._read_file

    def logged(self, oid, *args, **kw):
        with open(log, "a") as f:
            f.write(oid.hex() + "\n")
        return real(self, oid, *args, **kw)

    monkeypatch.setattr(loose_mod.LooseObjects, "_read_file", logged)
    result = repack(Repository.open(bare), RepackOptions(mode=FULL))
    ru.check_with_git(bare, listing, result.packs_written + [result.cruft_pack])
    opens = log.read_text().split()
    read = [oid for oid in reachable_loose if oid in opens]   # (the rest have a packed copy too, read there)
    assert len(read) > 3
    assert {opens.count(oid) for oid in read} == {1}   # (commits and trees by the walk, blobs by the search)


def test_geometric_repack_leaves_as_many_packs_as_git(shapes, tmp_path):
    theirs = ru.copy(shapes, tmp_path / "git.git").bare
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    before = set(packs(bare))
    result = repack(Repository.open(bare), RepackOptions(mode=GEOMETRIC, factor=2))
    git("repack", "--geometric=2", "-d", "-q", git_dir=theirs)
    assert len(packs(bare)) == len(packs(theirs)) < len(before)
    ru.check_with_git(bare, listing, result.packs_written)
    assert shapes.keep_pack.with_suffix(".idx").exists()
    # No reachability walk: every object of the merged packs and every loose one is still there.
    assert loose_count(bare) == 0
    for oid in shapes.young + shapes.old + shapes.rescued:
        assert ru.has_object(bare, oid), oid
    assert set(result.packs_deleted) <= before and result.counters.packs_merged == len(result.packs_deleted)


def test_geometric_split_is_gits():
    class P:
        def __init__(self, n): self.n, self.name = n, f"pack-{n:040x}"
        def __len__(self): return self.n
    def split(sizes): return sorted(len(p) for p in geometric_split([P(n) for n in sizes], 2))
    assert split([]) == [] and split([100]) == []
    assert split([1, 2, 4, 8]) == []                       # already a progression
    assert split([1, 1, 2, 4, 32]) == [1, 1, 2, 4]         # git's example: 2, 1, 2, 4, 32 ~> 9, 32
    assert split([5, 5, 100]) == [5, 5]
    assert split([30, 31, 33]) == [30, 31, 33]             # everything joins: the rolled-up total grows


def test_loose_repack(shapes):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    loose_before = loose_count(bare)
    before = set(packs(bare))
    result = repack(Repository.open(bare), RepackOptions(mode=LOOSE))
    assert loose_before > 0 and loose_count(bare) == 0
    assert set(packs(bare)) == before | set(result.packs_written)
    ru.check_with_git(bare, listing, result.packs_written)
    for oid in shapes.young + shapes.old + shapes.rescued:
        assert ru.has_object(bare, oid), oid
    assert result.counters.loose_deleted == loose_before
    assert result.counters.loose_packed + result.counters.loose_deleted >= loose_before


# -- cruft packs: git reads packyard's ------------------------------------------------------------------

def test_git_gc_reads_our_cruft_mtimes(shapes):
    bare = shapes.bare
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, expire=float("inf")))
    cruft = bare / "objects" / "pack" / f"{result.cruft_pack}"
    t = read_idx_tables(cruft.with_suffix(".idx"))
    mtimes = read_mtimes(cruft.with_suffix(".mtimes"), t.count, t.pack_checksum)
    ages = {t.oid(i).hex(): time.time() - mtimes[i] for i in range(t.count)}
    for oid in shapes.young:
        assert ru.YOUNG_AGE - 120 < ages[oid] < ru.YOUNG_AGE + 120
    for oid in shapes.old:
        assert ru.OLD_AGE - 120 < ages[oid] < ru.OLD_AGE + 120
    # git's own cruft gc, expiring between the two ages: it can only tell them apart by our .mtimes.
    git("-c", "gc.cruftPacks=true", "gc", "-q", "--prune=15.days.ago", git_dir=bare)
    for oid in shapes.young:
        assert ru.has_object(bare, oid), oid
    for oid in shapes.old:
        assert not ru.has_object(bare, oid), oid
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_object_reachable_again_leaves_the_cruft_pack(shapes):
    bare = shapes.bare
    repo = Repository.open(bare)
    first = repack(repo, RepackOptions(mode=FULL))
    dangling = shapes.young[-1]   # the young commit on an old tree
    git("update-ref", "refs/heads/revived", dangling, git_dir=bare)
    second = repack(Repository.open(bare), RepackOptions(mode=FULL))
    main = bare / "objects" / "pack" / f"{second.packs_written[0]}.idx"
    main_ids = ids_in(main)
    for oid in [dangling] + shapes.rescued:
        assert from_hex(oid) in main_ids
    cruft_ids = ids_in(bare / "objects" / "pack" / f"{second.cruft_pack}.idx")
    assert not {from_hex(o) for o in [dangling] + shapes.rescued} & cruft_ids
    assert second.counters.cruft_kept == first.counters.cruft_kept - 3
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_writing_an_object_only_in_a_cruft_pack_writes_it_anew(shapes):
    from packyard.store.batch.api import write_objects
    from packyard.store.batch.contract import WriteResult

    bare = shapes.bare
    result = repack(Repository.open(bare), RepackOptions(mode=FULL))
    cruft = bare / "objects" / "pack" / f"{result.cruft_pack}.pack"
    old_mtime = cruft.stat().st_mtime
    os.utime(cruft, (old_mtime - 100, old_mtime - 100))
    data = git("cat-file", "blob", shapes.young[0], git_dir=bare)
    (oid, outcome), = write_objects(Repository.open(bare), [(ObjectType.BLOB, data)])[0]
    assert outcome is WriteResult.QUEUED and oid.hex() == shapes.young[0]
    assert ru._loose_path(bare, shapes.young[0]).exists()
    assert cruft.stat().st_mtime == old_mtime - 100, "the cruft pack was not freshened"


# -- delta reuse ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_full_repack_of_one_pack_copies_every_delta(tmp_path):
    if not (CORPUS / "git-v1.0.0.pack").exists():
        pytest.skip("corpus not available")
    bare = repo_from_corpus(tmp_path, "git-v1.0.0")
    # The pack also holds the v1.0.0 tag object, which the corpus's ref does not name: name it.
    for line in git("cat-file", "--batch-check", "--batch-all-objects", git_dir=bare).decode().splitlines():
        oid, typ, _size = line.split()
        if typ == "tag":
            git("update-ref", "refs/tags/v1.0.0", oid, git_dir=bare)
    (old,) = (bare / "objects" / "pack").glob("pack-*.pack")
    stats = git("verify-pack", "-v", str(old.with_suffix(".idx"))).decode()
    deltas = sum(int(line.split(":")[1].split()[0]) for line in stats.splitlines() if line.startswith("chain length"))
    listing = ru.reachable_listing(bare)
    old_size = old.stat().st_size
    result = repack(Repository.open(bare), RepackOptions(mode=FULL))
    ru.check_with_git(bare, listing, result.packs_written)
    assert result.cruft_pack is None, "every object of the corpus pack is reachable"
    c = result.counters
    assert c.deltas_reused == deltas and c.rewritten_whole == 0
    new = bare / "objects" / "pack" / f"{result.packs_written[0]}.pack"
    # Within 1% -- smaller here: the corpus pack stores 8,423 deltas as REF_DELTA (20-byte base ids), which
    # the copy turns into OFS_DELTA (1-3 byte distances), as git's pack-objects --delta-base-offset does.
    assert 0.95 * old_size < new.stat().st_size <= 1.01 * old_size
    assert c.bytes_in == old_size and c.objects_in == c.objects_out == 12233


# -- racing readers and pushes (deterministic: hooks) ------------------------------------------------------

def test_reader_opened_before_the_repack_reads_every_object_after_it(shapes):
    bare = shapes.bare
    reader = Repository.open(bare)
    wanted = [line.split()[0].decode() for line in ru.reachable_listing(bare).splitlines()]
    reader.objects.read(from_hex(wanted[0]))           # one pack opened, the rest only listed
    result = repack(Repository.open(bare), RepackOptions(mode=FULL))
    assert result.packs_deleted
    for oid in wanted + shapes.young + shapes.rescued:
        typ, data = reader.objects.read(from_hex(oid))
        assert hash_object(typ, data).hex() == oid
    c = reader.objects.counters
    assert reader.objects.packs.rescans >= 2 and c.relisted_hits > 0, c


def test_push_while_the_repack_is_paused_before_deleting_survives(shapes, tmp_path):
    from packyard.store.pack.indexpack import index_pack
    from packyard.store.refs import RefUpdate

    bare = shapes.bare
    # A push made elsewhere: a new commit on main, as a thin-free pack.
    work = tmp_path / "work"
    git("clone", "-q", str(bare), str(work))
    (work / "pushed.txt").write_text("pushed during the repack\n" * 20)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "pushed", cwd=work)
    tip = git("rev-parse", "HEAD", cwd=work).decode().strip()
    old = git("rev-parse", "refs/heads/main", git_dir=bare).decode().strip()
    objs = git("rev-list", "--objects", f"{old}..{tip}", cwd=work)
    pack = git("pack-objects", "-q", "--stdout", cwd=work,
               input=b"\n".join(line.split(b" ")[0] for line in objs.splitlines()) + b"\n")
    (tmp_path / "push.pack").write_bytes(pack)
    pushed = {}

    def push_now():
        r = index_pack(Repository.open(bare), tmp_path / "push.pack",
                       ref_updates=[RefUpdate("refs/heads/main", from_hex(old), from_hex(tip))])
        pushed["pack"] = r.pack_name
        pushed["loose"] = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"written meanwhile\n").strip()

    result = repack(Repository.open(bare), RepackOptions(mode=FULL, expire=0.0),
                    hooks=RepackHooks(before_delete=push_now))
    assert pushed["pack"] in packs(bare) and pushed["pack"] not in result.packs_deleted
    assert ru.has_object(bare, tip) and ru.has_object(bare, pushed["loose"].decode())
    for line in objs.splitlines():
        assert ru.has_object(bare, line.split()[0].decode())
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_tips_reread_before_deleting_keep_what_they_reach(shapes):
    """A ref moved (during the repack) onto an object the plan found unreachable and old: its copy is kept."""
    bare = shapes.bare
    old_blob = shapes.old[0]

    def revive():
        tree = git("mktree", git_dir=bare, input=f"100644 blob {old_blob}\tback.txt\n".encode()).decode().strip()
        commit = git("commit-tree", tree, "-m", "revived", git_dir=bare).decode().strip()
        git("update-ref", "refs/heads/revived", commit, git_dir=bare)

    result = repack(Repository.open(bare), RepackOptions(mode=FULL), hooks=RepackHooks(before_delete=revive))
    assert result.counters.kept_for_recheck >= 1
    assert ru.has_object(bare, old_blob)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


# -- bad input: nothing deleted, the error names object, file and offset -------------------------------------

def _blob_entry(bare: Path, blob: str) -> tuple[Path, int]:
    for idx in (bare / "objects" / "pack").glob("pack-*.idx"):
        t = read_idx_tables(idx)
        for i in range(t.count):
            if t.oid(i).hex() == blob:
                return idx.with_suffix(".pack"), t.offsets[i]
    raise AssertionError(f"{blob} is not packed")


def _a_packed_blob(shapes) -> str:
    for line in git("cat-file", "--batch-check", "--batch-all-objects", git_dir=shapes.bare).decode().splitlines():
        oid, typ, size = line.split()
        if typ == "blob" and int(size) > 100 and ru.has_object(shapes.bare, oid):
            try:
                pack, _ = _blob_entry(shapes.bare, oid)
            except AssertionError:
                continue
            if pack != shapes.keep_pack and oid in ru.reachable_listing(shapes.bare).decode():
                return oid
    raise AssertionError("no packed blob")


def test_corrupt_zlib_in_a_packed_object_aborts_before_deleting(shapes):
    bare = shapes.bare
    blob = _a_packed_blob(shapes)
    pack, offset = _blob_entry(bare, blob)
    raw = bytearray(pack.read_bytes())
    for k in range(offset + 6, offset + 12):
        raw[k] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(raw))
    before = snapshot_tree(bare)
    with pytest.raises(PackFormatError) as info:
        repack(Repository.open(bare), RepackOptions(mode=FULL))
    err = info.value
    assert err.oid == blob and err.path == str(pack) and err.offset == offset, str(err)
    assert snapshot_tree(bare) == before


def test_object_with_the_wrong_content_aborts_before_deleting(shapes):
    bare = shapes.bare
    # A reachable loose blob whose file holds another object's bytes.
    victim = next(oid for oid in (line.split()[0].decode() for line in ru.reachable_listing(bare).splitlines())
                  if ru._loose_path(bare, oid).exists() and
                  git("cat-file", "-t", oid, git_dir=bare).strip() == b"blob")
    path = ru._loose_path(bare, victim)
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 5\0wrong"[:12]))
    before = snapshot_tree(bare)
    with pytest.raises(CorruptObjectError) as info:
        repack(Repository.open(bare), RepackOptions(mode=FULL))
    assert info.value.oid == victim and str(path) in str(info.value)
    assert snapshot_tree(bare) == before


def test_missing_delta_base_aborts_before_deleting(shapes, tmp_path):
    from packbuild import entry_header, varint
    from packyard.store.pack.idxwrite import build_index

    bare = shapes.bare
    content = b"a blob stored only as a delta on a base nobody has\n"
    blob = hash_object(ObjectType.BLOB, content)
    missing_base = hash_object(ObjectType.BLOB, b"the base that is not there\n")
    delta = varint(27) + varint(len(content)) + bytes([len(content)]) + content
    entry = entry_header(7, len(delta)) + missing_base + zlib.compress(delta)
    body = b"PACK" + struct.pack(">II", 2, 1) + entry
    import hashlib
    checksum = hashlib.sha1(body).digest()
    idx, rev = build_index(blob, [12], [zlib.crc32(entry)], checksum)
    name = f"pack-{checksum.hex()}"
    pdir = bare / "objects" / "pack"
    (pdir / f"{name}.pack").write_bytes(body + checksum)
    (pdir / f"{name}.idx").write_bytes(idx)
    tree = git("mktree", "--missing", git_dir=bare, input=f"100644 blob {blob.hex()}\tf\n".encode()).decode().strip()
    commit = git("commit-tree", tree, "-m", "points at the broken blob", git_dir=bare).decode().strip()
    git("update-ref", "refs/heads/broken", commit, git_dir=bare)
    before = snapshot_tree(bare)
    with pytest.raises(PackFormatError) as info:
        repack(Repository.open(bare), RepackOptions(mode=FULL))
    err = info.value
    assert err.oid == blob.hex() and err.path == str(pdir / f"{name}.pack") and err.offset == 12, str(err)
    assert snapshot_tree(bare) == before


def test_ref_naming_a_missing_object_aborts_before_deleting(shapes):
    bare = shapes.bare
    ghost = "1" * 40
    (bare / "refs" / "heads" / "ghost").write_text(ghost + "\n")
    before = snapshot_tree(bare)
    with pytest.raises(ObjectMissingError) as info:
        repack(Repository.open(bare), RepackOptions(mode=FULL))
    assert info.value.oid == ghost and "refs/heads/ghost" in str(info.value)
    assert snapshot_tree(bare) == before


# -- preserved packs -------------------------------------------------------------------------------------------

def test_replaced_packs_are_preserved_then_expired(shapes):
    bare = shapes.bare
    now = time.time()
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, preserve_for=3600, now=now))
    preserved = bare / "objects" / "pack" / "preserved"
    names = sorted(p.stem for p in preserved.glob("*.idx"))
    assert names == sorted(result.packs_deleted)
    assert expire_preserved(bare / "objects" / "pack", 3600, now=now + 3599) == []
    assert sorted(expire_preserved(bare / "objects" / "pack", 3600, now=now + 3601)) == names
    assert not any(preserved.iterdir())
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_unsafe_delete_unlinks_at_once(shapes):
    bare = shapes.bare
    result = repack(Repository.open(bare), RepackOptions(mode=FULL, preserve=False))
    assert result.counters.preserved_moved == 0 and result.packs_deleted
    assert not (bare / "objects" / "pack" / "preserved").exists()
    for name in result.packs_deleted:
        assert not list((bare / "objects" / "pack").glob(f"{name}.*"))


# -- the walk on two processes (two threads in C) and in C gives the single Python walk's lists -----------

def _lists(r):
    return r.commits, r.tags, r.trees, r.blobs, r.names, r.seen


def test_forked_and_c_walks_give_the_same_order_as_one_python_process(shapes, monkeypatch):
    from packyard.store.maintenance.walk import reach as walk_mod
    from packyard.store.maintenance.walk.sources import SourceIndex
    from packyard.store.maintenance.walk.tips import read_tips

    repo = Repository.open(shapes.bare)
    snap = repo.objects.snapshot()
    sources = SourceIndex(snap, [p for p in snap.packs if not p.is_kept()], [p for p in snap.packs if p.is_kept()],
                          read_fresh=repo.objects.read)
    tips = sorted(read_tips(repo).items())
    one = walk_mod.walk(tips, sources.read, processes=1)           # pure Python (no packs given)
    c_walk = walk_mod.IMPLEMENTATION == "c"
    if c_walk:
        assert _lists(walk_mod.walk(tips, sources.read, processes=1, packs=sources)) == _lists(one)
    monkeypatch.setattr(walk_mod, "FORK_MIN_COMMITS", 1)
    for share in (0.0, 0.2, 0.5, 0.8):
        monkeypatch.setattr(walk_mod, "FORK_SHARE", share)
        two = walk_mod.walk(tips, sources.read, processes=2)
        assert _lists(two) == _lists(one)
        if c_walk:
            assert _lists(walk_mod.walk(tips, sources.read, processes=2, packs=sources)) == _lists(one)
    listed = {line.split()[0].decode() for line in ru.reachable_listing(shapes.bare).splitlines()}
    assert {o.hex() for o, _t in one.in_order()} == listed
    sources.release()


def test_corrupt_tree_met_by_the_forked_walk_is_reported(shapes, monkeypatch):
    from packyard.store.maintenance.walk import reach as walk_mod

    bare = shapes.bare
    monkeypatch.setattr(walk_mod, "FORK_MIN_COMMITS", 1)
    monkeypatch.setattr(walk_mod, "FORK_SHARE", 0.0)   # every commit's tree is walked by the child
    # A root tree that is only loose (a commit written loose, on a branch), overwritten with another object's bytes.
    blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"only loose\n").decode().strip()
    tree = git("mktree", git_dir=bare, input=f"100644 blob {blob}\tf\n".encode()).decode().strip()
    commit = git("commit-tree", tree, "-m", "loose", git_dir=bare).decode().strip()
    git("update-ref", "refs/heads/loose-only", commit, git_dir=bare)
    path = ru._loose_path(bare, tree)
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"tree 0\0"))
    before = snapshot_tree(bare)
    with pytest.raises(CorruptObjectError) as info:
        repack(Repository.open(bare), RepackOptions(mode=FULL))
    assert info.value.oid == tree and "hash" in str(info.value), str(info.value)
    assert snapshot_tree(bare) == before
