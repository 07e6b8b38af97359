"""Cruft packs of full repacks with young and old unreachable objects (store/maintenance/repack/cruft.py), git as the
oracle: the same objects in the cruft pack as ``git repack --cruft -d --cruft-expiration=2.weeks.ago`` keeps,
the C walk from the young objects and the Python specification giving the same set, and the walk skipped when
no unreachable object is old."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import repackutil as ru
from gitutil import git
from packyard.store.maintenance.repack import cruft
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.walk.reach import IMPLEMENTATION, walk
from packyard.store.maintenance.walk.sources import SourceIndex
from packyard.store.maintenance.walk.tips import read_tips
from packyard.store.objects import from_hex
from packyard.store.pack.idxread import read_idx_tables
from packyard.store.repo import Repository

DAY = 86400.0


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict:
    return ru.build_cruft(tmp_path_factory.mktemp("cruft"))


@pytest.fixture
def repo(template, tmp_path) -> Path:
    dest = tmp_path / "repo.git"
    shutil.copytree(template["bare"], dest, copy_function=shutil.copy2)
    return dest


def _ids(idx: Path) -> set[bytes]:
    t = read_idx_tables(idx)
    return {t.oids[20 * i:20 * i + 20] for i in range(t.count)}


def _cruft_ids(bare: Path) -> set[bytes]:
    packs = [p for p in (bare / "objects" / "pack").glob("pack-*.idx") if p.with_suffix(".mtimes").exists()]
    assert len(packs) == 1, packs
    return _ids(packs[0])


def test_cruft_pack_holds_what_gits_holds(repo, tmp_path):
    theirs = tmp_path / "theirs.git"
    shutil.copytree(repo, theirs, copy_function=shutil.copy2)
    git("-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q", "--cruft-expiration=2.weeks.ago",
        git_dir=theirs)
    result = repack(Repository(repo), RepackOptions(mode=RepackMode.FULL, expire=14 * DAY, preserve=False))
    ours, git_kept = _cruft_ids(repo), _cruft_ids(theirs)
    assert ours == git_kept
    assert result.counters.cruft_kept == len(git_kept) and result.counters.cruft_expired > 0
    assert {"walk", "ages", "young"} <= set(result.elapsed)
    git("fsck", "--connectivity-only", "--no-dangling", git_dir=repo)


def _plan_inputs(bare: Path):
    repo = Repository(bare)
    snapshot = repo.objects.snapshot()
    packs = [p for p in snapshot.packs if not p.is_kept()]
    sources = SourceIndex(snapshot, packs, [], read_fresh=repo.objects.read)
    reach = walk(sorted(read_tips(repo).items()), sources.read, packs=sources)
    listed = git("cat-file", "--batch-check=%(objectname)", "--batch-all-objects", git_dir=bare).decode().split()
    reachable = {line.split()[0] for line in git("rev-list", "--objects", "main", git_dir=bare).decode().splitlines()}
    unreachable = {from_hex(o): 0 for o in listed if o not in reachable}
    return sources, reach, unreachable


def test_c_walk_and_python_walk_find_the_same(template, repo):
    sources, reach, unreachable = _plan_inputs(repo)
    try:
        c = template["commits"]
        young = {from_hex(o) for o in (c[8], c[9], template["tag"], template["side"], template["broken"])}
        spec, walked = cruft.reached_from_py(young, unreachable, sources.read)
        assert walked > 0
        # what git's traversal reaches from those: c5..c8 (parents of c9), c12 and c11 (through the tag), not the
        # old blob nothing names
        assert {from_hex(c[k]) for k in (4, 5, 6, 7, 10, 11)} <= spec and from_hex(template["lone"]) not in spec
        if IMPLEMENTATION != "c":
            pytest.skip("the C walk is not built (or PACKYARD_PURE_PYTHON=1): only the specification ran")
        fast, _walked = cruft.reached_from(young, unreachable, sources.read, reach=reach, c_packs=sources.c_packs)
        assert fast == spec
    finally:
        sources.release()


def test_no_walk_when_every_unreachable_object_is_young(repo):
    """Everything unreachable younger than the expiry: all of it goes to the cruft pack without a walk (a walk
    could only save old objects), and the pack has every unreachable object."""
    _sources, _reach, unreachable = _plan_inputs(repo)
    _sources.release()
    result = repack(Repository(repo), RepackOptions(mode=RepackMode.FULL, expire=365 * DAY, preserve=False))
    assert _cruft_ids(repo) == set(unreachable)
    assert result.counters.cruft_expired == 0
    assert result.counters.cruft_walked == 0


def test_walk_counted_when_old_objects_exist(repo):
    result = repack(Repository(repo), RepackOptions(mode=RepackMode.FULL, expire=14 * DAY, preserve=False))
    assert result.counters.cruft_walked > 0


def test_names_of_packed_trees_c_and_python_agree(template, repo):
    """The names the delta search sorts a geometric repack's objects by (store/maintenance/repack/names.py): the C
    walk's and the Python specification's are the same, and they are the entry names git's trees give."""
    from packyard.store.maintenance.repack import names as nm

    _s, _r, unreachable = _plan_inputs(repo)
    _s.release()
    repo_obj = Repository(repo)
    snapshot = repo_obj.objects.snapshot()
    sources = SourceIndex(snapshot, list(snapshot.packs), [], read_fresh=repo_obj.objects.read)
    try:
        # (in pack order, as the plans give them: git writes a tree before the trees below it)
        ids = [oid for p in sources.packs for oid in (p.oids[20 * i:20 * i + 20] for i in p.order)]
        spec = nm.names_in_py(sources, ids)
        c = template["commits"]
        blob = from_hex(git("rev-parse", f"{c[9]}:dir/g10.txt", git_dir=repo).decode().strip())
        subtree = from_hex(git("rev-parse", f"{c[9]}:dir", git_dir=repo).decode().strip())
        assert spec[blob] == b"g10.txt" and spec[subtree] == b"dir"
        assert nm.names_in(sources, ids) == spec
        # only the unreachable ones (a cruft pack's): names from their trees alone
        cruft_ids = [oid for oid in ids if oid in unreachable]
        assert nm.names_in(sources, cruft_ids) == nm.names_in_py(sources, cruft_ids)
    finally:
        sources.release()


def test_c_reader_of_the_search_reads_what_python_reads(repo):
    """The delta search's reads of packed objects (writeplan.py: Walker.read_packed, the C reader) give the bytes
    the Python resolver gives, for every object of every pack (deltas and whole entries); None outside them."""
    if IMPLEMENTATION != "c":
        pytest.skip("the C walk is not built (or PACKYARD_PURE_PYTHON=1)")
    from packyard.store.maintenance.walk.reach import _c

    repo_obj = Repository(repo)
    snapshot = repo_obj.objects.snapshot()
    sources = SourceIndex(snapshot, list(snapshot.packs), [], read_fresh=repo_obj.objects.read)
    try:
        reader = _c.Walker(sources.c_packs, lambda oid, want, referrer: sources.read(oid), cache_bytes=1 << 20)
        ids = [oid for p in sources.packs for oid in (p.oids[20 * i:20 * i + 20] for i in range(p.count))]
        assert ids
        for oid in ids:
            assert reader.read_packed(oid) == sources.read(oid)
        assert reader.read_packed(b"\1" * 20) is None
    finally:
        sources.release()


def test_cruft_delta_whose_base_is_reachable_takes_the_bases_name(tmp_path):
    """A cruft pack's objects are named through their delta bases (writeplan.ByBase): an unreachable old version
    of a file, a delta in git's pack of the reachable new version, goes to the search with that file's name
    hash (git's pack-objects makes the smaller version the delta: it sorts larger first)."""
    from packyard.store.maintenance.repack import writeplan as wp
    from packyard.store.maintenance.repack.options import RepackCounters
    from packyard.store.maintenance.repack.reuse import DELTA_BASE_BEHIND, find_reuse
    from packyard.store.pack.search import fast_name_hash

    work = tmp_path / "w"
    git("init", "-q", "-b", "main", str(work))
    lines = [f"line {k} of a file long enough to be a delta\n" for k in range(400)]
    (work / "notes.txt").write_text("".join(lines))
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("checkout", "-q", "-b", "side", cwd=work)
    (work / "notes.txt").write_text("".join(lines[:300] + ["a line only the side branch had\n"]))   # (smaller)
    git("commit", "-q", "-am", "side", cwd=work)
    old = from_hex(git("rev-parse", "side:notes.txt", cwd=work).decode().strip())
    git("checkout", "-q", "main", cwd=work)
    (work / "notes.txt").write_text("".join(lines + ["and one more on main\n"]))
    git("commit", "-q", "-am", "two", cwd=work)
    bare = tmp_path / "r.git"
    git("clone", "-q", "--bare", str(work), str(bare))
    git("fetch", "-q", str(work), "side:side", git_dir=bare)
    git("repack", "-a", "-d", "-q", git_dir=bare)
    git("update-ref", "-d", "refs/heads/side", git_dir=bare)
    repo = Repository(bare)
    snapshot = repo.objects.snapshot()
    sources = SourceIndex(snapshot, list(snapshot.packs), [], read_fresh=repo.objects.read)
    try:
        reach = walk(sorted(read_tips(repo).items()), sources.read, packs=sources)
        assert old not in reach.reached()
        ids = [oid for p in sources.packs for oid in (p.oids[20 * i:20 * i + 20] for i in p.order)
               if oid not in reach.reached()]
        assert old in ids
        deltas = wp.DeltaPlan()
        reuse = find_reuse(ids, sources, reuse_deltas=deltas.reuse, depth=deltas.depth)
        k = ids.index(old)
        assert reuse.kind[k] == DELTA_BASE_BEHIND   # (git's pack: the side version a delta of a reachable one)
        _found, cand = wp._search(ids, sources, reuse, wp.ByBase(lambda: reach.names), {}, deltas, None,
                                  RepackCounters())
        i = list(cand.ids).index(k)
        assert cand.hashes[i] == fast_name_hash(b"notes.txt") != 0
        # without names (git's --cruft) it would sort by size alone
        _found, bare_cand = wp._search(ids, sources, reuse, None, {}, deltas, None, RepackCounters())
        assert bare_cand.hashes[list(bare_cand.ids).index(k)] == 0
    finally:
        sources.release()
