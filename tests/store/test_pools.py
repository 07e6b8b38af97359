"""Object pools, store level: create, fetch, link, disconnect, delete, and the pool's repack keeping what its
members reach. git is the oracle: git fsck --full in the pool and every member, rev-list --objects before and
after each step, count-objects for the sizes (every step killed at every fault point it reaches:
test_pools_faults.py)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gitutil import GIT_ENV, fsck, git
from packyard.store.errors import InvalidInputError
from packyard.store.maintenance.pool.layout import (
    ISLAND_REGEX,
    MARKER,
    fetch_key,
    member_key,
    read_marker,
    read_members,
    source_key,
)
from packyard.store.maintenance.pool.lifecycle import (
    PoolStep,
    create_pool,
    delete_pool,
    disconnect_member,
    fetch_into_pool,
    link_member,
    repack_pool,
)
from packyard.store.maintenance.repack.islands import IslandOptions
from packyard.store.maintenance.repack.options import POOL_MARKER, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository
from poolutil import commit, count_objects, make_fork, make_source, objects, pack_bytes, refs, written_first


@pytest.fixture
def network(tmp_path: Path):
    source, work = make_source(tmp_path)
    forks = [make_fork(tmp_path, source, f"fork{i}") for i in range(2)]
    return tmp_path, source, work, forks


def test_markers_agree() -> None:
    assert POOL_MARKER == MARKER


def test_a_fork_networks_life_from_create_to_delete(network) -> None:
    tmp, source, work, forks = network
    before = {r: objects(r) for r in (source, *forks)}
    sizes = {r: pack_bytes(r) for r in (source, *forks)}
    pool_dir = tmp / "pool.git"

    # create: the source's objects and its refs under its namespace
    created = create_pool(pool_dir, Repository.open(source))
    pool = Repository.open(pool_dir)
    assert created.copied is not None and created.copied.objects == len(before[source])
    key = member_key(source)
    src_refs = refs(source)
    pool_refs = refs(pool_dir)
    assert {name.replace(f"refs/virtual/{key}/", "refs/", 1): oid for name, oid in pool_refs.items()} == src_refs
    fsck(pool_dir)

    # link the source and both forks: each keeps only what the pool lacks
    for repo in (source, *forks):
        link_member(Repository.open(repo), pool)
    assert set(read_members(pool_dir)) == {source, *forks}
    for repo in (source, *forks):
        assert objects(repo) == before[repo]
        fsck(repo)
        assert (repo / "objects" / "info" / "alternates").read_text().startswith("..")
    assert count_objects(source)["in-pack"] == count_objects(source)["count"] == 0
    for fork in forks:
        own = len(set(objects(fork)) - set(before[source]))
        assert count_objects(fork)["in-pack"] == own and count_objects(fork)["count"] == 0
    assert pack_bytes(pool_dir) <= 1.05 * sizes[source] and pack_bytes(source) == 0
    assert all(pack_bytes(fork) < sizes[fork] / 3 for fork in forks)

    # linking again finds nothing to do
    assert link_member(Repository.open(forks[0]), pool).step is PoolStep.ALREADY

    # fetch: the source's new commit and ref reach the pool
    git("fetch", "-q", "origin", cwd=work)
    new = commit(work, "big.txt", "".join(f"shared line {k}\n" for k in range(300)) + "newer\n", "newer")
    git("push", "-q", "origin", "main", cwd=work)
    fetched = fetch_into_pool(pool, Repository.open(source))
    assert fetched.refs_updated == 1 and fetched.copied is not None and fetched.copied.objects == 3
    assert refs(pool_dir)[f"refs/virtual/{key}/heads/main"] == new
    assert fetch_into_pool(pool, Repository.open(source)).step is PoolStep.ALREADY

    # the pool's repack (islands and bitmaps of its own) and every member still complete
    repack_pool(pool, RepackOptions())
    for repo in (pool_dir, source, *forks):
        fsck(repo)

    # delete is refused while members link to the pool
    with pytest.raises(InvalidInputError, match="member"):
        delete_pool(pool)

    # disconnect every member: each stands alone, with every object it reaches
    for repo in (source, *forks):
        objs = objects(repo)
        disconnect_member(Repository.open(repo), pool)
        assert not (repo / "objects" / "info" / "alternates").exists()
        assert objects(repo) == objs
        fsck(repo)
    assert read_members(pool_dir) == ()
    assert disconnect_member(Repository.open(forks[0]), pool).step is PoolStep.ALREADY
    delete_pool(Repository.open(pool_dir))
    assert not pool_dir.exists() and not list(tmp.glob("pool.git.deleting-*"))


def _force_pushed_network(tmp: Path) -> tuple[Path, Path]:
    """(pool, fork): the fork linked (its copies dropped), then the source's history rewritten and fetched, so
    the old history is reachable from no pool ref, only from the fork."""
    source, work = make_source(tmp)
    fork = make_fork(tmp, source, "fork")
    pool_dir = tmp / "pool.git"
    create_pool(pool_dir, Repository.open(source))
    pool = Repository.open(pool_dir)
    link_member(Repository.open(fork), pool)
    git("checkout", "-q", "--orphan", "rewritten", cwd=work)
    commit(work, "other.txt", "a history of its own\n", "rewritten root")
    git("push", "-q", "--force", "origin", "rewritten:main", cwd=work)
    fetch_into_pool(pool, Repository.open(source))
    return pool_dir, fork


def test_pool_repack_keeps_what_only_a_member_reaches(tmp_path: Path) -> None:
    """The pool's repack expiring at once keeps what the fork reaches; the negative control (the same repack
    ignoring the members) loses it, and git fsck in the fork says so."""
    pool_dir, fork = _force_pushed_network(tmp_path / "kept")
    pool = Repository.open(pool_dir)
    # (v1 and the old main: the namespace's main moved; its tag stays: a deleted ref is kept, a moved one not)
    git("update-ref", "-d", f"refs/virtual/{member_key(tmp_path / 'kept' / 'src.git')}/tags/v1", git_dir=pool_dir)
    with pytest.raises(InvalidInputError, match="object pool"):
        repack(pool, RepackOptions(expire=0))          # a plain full repack of a pool is refused
    result = repack_pool(pool, RepackOptions(expire=0))
    assert result.counters.cruft_kept > 0
    fsck(fork)
    fsck(pool_dir)
    # ...and again: still kept, while the fork reaches it
    repack_pool(Repository.open(pool_dir), RepackOptions(expire=0))
    fsck(fork)

    c_pool, c_fork = _force_pushed_network(tmp_path / "control")
    git("update-ref", "-d", f"refs/virtual/{member_key(tmp_path / 'control' / 'src.git')}/tags/v1", git_dir=c_pool)
    bad = repack(Repository.open(c_pool), RepackOptions(expire=0, unsafe_ignore_pool_members=True))
    assert bad.counters.cruft_expired > 0
    env = {**os.environ, **GIT_ENV}
    broken = subprocess.run(["git", "--git-dir", str(c_fork), "fsck", "--full"], env=env, capture_output=True)
    assert broken.returncode != 0 and b"missing" in broken.stderr + broken.stdout


def test_link_refuses_a_repository_that_is_not_a_pool_and_a_second_pool(network) -> None:
    tmp, source, _work, forks = network
    with pytest.raises(InvalidInputError, match="not an object pool"):
        link_member(Repository.open(forks[0]), Repository.open(source))
    create_pool(tmp / "a.git", Repository.open(source))
    create_pool(tmp / "b.git", Repository.open(source))
    pool_a, pool_b = Repository.open(tmp / "a.git"), Repository.open(tmp / "b.git")
    link_member(Repository.open(forks[0]), pool_a)
    with pytest.raises(InvalidInputError, match="disconnect it first"):
        link_member(Repository.open(forks[0]), pool_b)
    with pytest.raises(InvalidInputError, match="own member|member of another pool"):
        link_member(pool_a, pool_b)
    with pytest.raises(InvalidInputError, match="has objects or refs"):
        create_pool(forks[1], Repository.open(source))


def _linked_network(tmp: Path, *, key: str | None = None) -> tuple[Path, Path, list[Path]]:
    """(pool, source, forks): the pool made from the source (under ``key``), both forks linked and fetched, so
    the pool holds three namespaces and the forks' commits are its newest."""
    source, _work = make_source(tmp)
    forks = [make_fork(tmp, source, f"fork{i}") for i in range(2)]
    pool_dir = tmp / "pool.git"
    create_pool(pool_dir, Repository.open(source), key=key)
    pool = Repository.open(pool_dir)
    for fork in forks:
        link_member(Repository.open(fork), pool)
        fetch_into_pool(pool, Repository.open(fork))
    return pool_dir, source, forks


def test_the_pool_repack_writes_its_sources_island_first_as_git_with_that_island_core(tmp_path: Path) -> None:
    """No core named: the pool's repack makes the source's island the core (its objects first, its tip
    bitmapped), as git's ``repack -adi`` does given ``pack.islandCore`` = the source's key; git without a core
    writes the forks' newer commits first (the control), and a core named in the options wins."""
    pool_dir, source, forks = _linked_network(tmp_path, key="upstream")
    core = {line.split()[0] for line in
            git("rev-list", "--objects", "--glob=refs/virtual/upstream/*", git_dir=pool_dir).decode().splitlines()}
    theirs = tmp_path / "theirs.git"
    git("clone", "-q", "--bare", "--mirror", "--no-local", str(pool_dir), str(theirs))
    island = f"pack.island={ISLAND_REGEX}"
    git("-c", island, "repack", "-adiq", git_dir=theirs)
    assert not written_first(theirs, core)
    git("-c", island, "-c", "pack.islandCore=upstream", "repack", "-adiq", git_dir=theirs)
    assert written_first(theirs, core)

    before = objects(pool_dir)
    result = repack_pool(Repository.open(pool_dir), RepackOptions())
    assert result.counters.bitmap_commits > 0
    assert written_first(pool_dir, core)
    assert objects(pool_dir) == before
    git("rev-list", "--test-bitmap", "refs/virtual/upstream/heads/main", git_dir=pool_dir)
    for repo in (pool_dir, source, *forks):
        fsck(repo)

    fork_key = member_key(forks[1])
    named = {line.split()[0] for line in
             git("rev-list", "--objects", f"--glob=refs/virtual/{fork_key}/*", git_dir=pool_dir).decode().splitlines()}
    repack_pool(Repository.open(pool_dir), RepackOptions(islands=IslandOptions((), core=fork_key)))
    assert written_first(pool_dir, named) and not written_first(pool_dir, core)


def test_a_pool_keeps_its_sources_key(tmp_path: Path) -> None:
    """The key a pool was made with is in its marker: a fetch from the source that names none writes that
    namespace again, making the pool again with another key is refused, and a marker written before the key
    was kept falls back to the source's default key."""
    pool_dir, source, _forks = _linked_network(tmp_path, key="upstream")
    assert json.loads((pool_dir / MARKER).read_text())["key"] == "upstream"
    assert source_key(read_marker(pool_dir)) == "upstream"
    assert fetch_key(pool_dir, source) == "upstream"
    assert fetch_key(pool_dir, source, "other") == "other"
    assert fetch_key(pool_dir, _forks[0]) == member_key(_forks[0])
    names = set(refs(pool_dir))
    assert fetch_into_pool(Repository.open(pool_dir), Repository.open(source)).step is PoolStep.ALREADY
    assert set(refs(pool_dir)) == names and not any(member_key(source) in n for n in names)
    with pytest.raises(InvalidInputError, match="made with the key 'upstream'"):
        create_pool(pool_dir, Repository.open(source), key="another")
    assert create_pool(pool_dir, Repository.open(source)).step is PoolStep.ALREADY

    marker = json.loads((pool_dir / MARKER).read_text())
    del marker["key"]
    (pool_dir / MARKER).chmod(0o644)
    (pool_dir / MARKER).write_text(json.dumps(marker))
    assert source_key(read_marker(pool_dir)) == member_key(source)
    assert source_key({}) is None
    with pytest.raises(InvalidInputError, match="key"):
        source_key({"key": "../x"})
