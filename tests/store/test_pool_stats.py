"""The planner's view of a fork network (store/maintenance/planning/poolstats.py), on networks made with git.

git is the oracle for "a fetch is due": the source refs (git for-each-ref outside refs/virtual/) whose value is
no ref value of the pool's (git for-each-ref in the pool). The byte figures are the pack files' sizes git's
count-objects counts from; other repositories are read only inside the given roots.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gitutil import git
from packyard.store.maintenance.planning.poolstats import PoolRole, gather_pool_stats
from packyard.store.maintenance.planning.stats import RepackHistory, gather_stats
from packyard.store.maintenance.planning.strategy import Action, MaintenancePolicy, plan_maintenance
from packyard.store.maintenance.pool.lifecycle import create_pool, fetch_into_pool, link_member
from packyard.store.repo import Repository
from poolutil import commit, make_fork, make_source, pack_bytes, refs

NOW = 2_000_000_000.0


def _behind_by_git(source: Path, pool: Path) -> int:
    kept = set(refs(pool).values())
    return sum(1 for name, oid in refs(source).items() if not name.startswith("refs/virtual/") and oid not in kept)


@pytest.fixture
def network(tmp_path: Path):
    source, work = make_source(tmp_path)
    forks = [make_fork(tmp_path, source, f"fork{i}") for i in range(2)]
    pool_dir = tmp_path / "pool.git"
    create_pool(pool_dir, Repository.open(source))
    pool = Repository.open(pool_dir)
    for repo in (source, *forks):
        link_member(Repository.open(repo), pool)
    return tmp_path, source, work, forks, pool_dir


def test_a_pool_is_behind_its_source_exactly_when_git_says_so(network) -> None:
    tmp, source, work, forks, pool_dir = network
    s = gather_pool_stats(pool_dir, roots=[tmp])
    assert s.role is PoolRole.POOL and s.members == 3 and s.members_listed == 3
    assert s.source_refs == len(refs(source)) and s.source_refs_behind == _behind_by_git(source, pool_dir) == 0
    assert s.pool_pack_bytes == pack_bytes(pool_dir)
    assert s.own_pack_bytes == sum(pack_bytes(r) for r in (source, *forks))
    expected = (3 * s.pool_pack_bytes + s.own_pack_bytes) / (s.pool_pack_bytes + s.own_pack_bytes)
    assert s.dedupe_ratio == round(expected, 3) and s.dedupe_ratio > 2   # (tiny repositories: the forks own a third)

    # the source moves on: two new commits on main and a new branch at the old tip (an object the pool has)
    commit(work, "new.txt", "new\n", "new 1")
    commit(work, "new.txt", "newer\n", "new 2")
    git("push", "-q", "origin", "main", cwd=work)
    git("branch", "old-main", "HEAD~2", git_dir=source)
    behind = gather_pool_stats(pool_dir, roots=[tmp]).source_refs_behind
    assert behind == _behind_by_git(source, pool_dir) == 1

    # a full repack is due (the pool has no bitmap yet): it runs first and the fetch is deferred; after a recent
    # one, the fetch is planned
    plan = plan_maintenance(gather_stats(pool_dir, roots=[tmp], now=NOW), MaintenancePolicy(), NOW)
    assert plan.action is Action.FULL and any("1 of the source's" in r for r in plan.deferred)
    recent = RepackHistory(last_full_repack_at=NOW - 3600, last_repack_at=NOW - 3600)
    plan = plan_maintenance(gather_stats(pool_dir, roots=[tmp], now=NOW, history=recent), MaintenancePolicy(), NOW)
    assert plan.action is Action.POOL_FETCH and "1 of the source's" in plan.reasons[0]

    fetch_into_pool(Repository.open(pool_dir), Repository.open(source))
    assert gather_pool_stats(pool_dir, roots=[tmp]).source_refs_behind == _behind_by_git(source, pool_dir) == 0


def test_other_repositories_are_read_only_inside_the_roots(network, tmp_path_factory) -> None:
    tmp, source, work, forks, pool_dir = network
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    for roots in (None, [elsewhere]):
        s = gather_pool_stats(pool_dir, roots=roots)
        assert s.role is PoolRole.POOL and s.members == 3
        assert s.source_refs_behind is None and s.members_listed == 0 and s.dedupe_ratio is None
    assert plan_maintenance(gather_stats(pool_dir), MaintenancePolicy(), 2e9).action is not Action.POOL_FETCH


def test_a_member_and_a_plain_repository(network) -> None:
    tmp, source, work, forks, pool_dir = network
    m = gather_pool_stats(forks[0], roots=[tmp])
    assert m.role is PoolRole.MEMBER and Path(m.pool) == pool_dir.resolve()
    assert m.own_pack_bytes == pack_bytes(forks[0]) and m.pool_pack_bytes == pack_bytes(pool_dir)
    assert gather_stats(forks[0], roots=[tmp]).as_dict()["pool_role"] == "member"
    plain = tmp / "plain.git"
    git("init", "-q", "--bare", str(plain))
    assert gather_pool_stats(plain, roots=[tmp]).role is PoolRole.PLAIN
