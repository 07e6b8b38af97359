"""The commit-graph and pack-refs in maintenance: the planner's reasons (tables, and gathered from real
repositories), ``packyard repack`` writing both by default (and not with --no-commit-graph/--no-pack-refs),
git's verdicts on the result, a SIGKILL at each commit-graph install step, the leftovers' age rules."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import graphutil
from gitutil import ROOT, git
from gitutil import copy_repo as _copy
from packyard.store.leftovers.passes import remove_serving_leftovers
from packyard.store.maintenance.planning.servingstats import (
    GraphLayerInfo,
    ServingStats,
    gather_serving_stats,
    loose_refs_threshold,
    serving_reasons,
)
from packyard.store.maintenance.planning.stats import RepoStats
from packyard.store.maintenance.planning.strategy import Action, MaintenancePolicy, plan_maintenance
from packyard.store.maintenance.serving import commitgraph as cg
from packyard.store.maintenance.serving import graphwrite as gw
from packyard.store.packrefs import HEADER, pack_refs
from packyard.store.repo import Repository
from packyard.workers.commands.repack import repack as repack_command

GOOD = GraphLayerInfo(100, True, True)


@pytest.mark.parametrize("packed_bytes, threshold", [
    (0, 16), (100, 16), (5_000, 27), (10_000, 32), (1_000_000, 65), (100_000_000, 98)])
def test_loose_ref_threshold_is_gitalys(packed_bytes, threshold):
    assert loose_refs_threshold(packed_bytes) == threshold


@pytest.mark.parametrize("stats, graph_words, refs_due", [
    (ServingStats(True, tips_checked=1), ["commit-graph missing"], False),
    (ServingStats(True), [], False),                               # no branch: nothing to graph
    (ServingStats(True, graph_monolithic=True, tips_checked=1), ["missing (only git's non-split"], False),
    (ServingStats(True, (GOOD,)), [], False),
    (ServingStats(True, (GOOD, GraphLayerInfo(3, False, True))), ["lacks generation data"], False),
    (ServingStats(True, (GraphLayerInfo(3, True, False),)), ["lacks changed-path Bloom filters"], False),
    (ServingStats(True, (GOOD,), tips_checked=5, tips_missing=2), ["2 of 5 branch tip(s) not in it"], False),
    (ServingStats(True, (GOOD,), graph_unreadable="graph-x.graph: bad signature"), ["unreadable"], False),
    (ServingStats(True, (GOOD,), loose_refs=16), [], False),
    (ServingStats(True, (GOOD,), loose_refs=17), [], True),
    (ServingStats(True, (GOOD,), loose_refs=32, packed_refs_bytes=10_000), [], False),
    (ServingStats(True, (GOOD,), loose_refs=33, packed_refs_bytes=10_000), [], True),
    (ServingStats(False, loose_refs=10_000), [], False),          # not gathered: no opinion
])
def test_serving_reasons_table(stats, graph_words, refs_due):
    graph, refs = serving_reasons(stats)
    assert len(graph) == len(graph_words)
    for reason, words in zip(graph, graph_words):
        assert words in reason
    assert bool(refs) is refs_due
    assert serving_reasons(stats, commit_graph=False, pack_refs=False) == ([], [])


def test_plan_adds_the_reasons_or_plans_a_loose_repack_for_them():
    policy = MaintenancePolicy()
    quiet = RepoStats(path="/r", gathered_at=1e9)
    assert plan_maintenance(quiet, policy, 1e9).action is Action.NOTHING
    missing = RepoStats(path="/r", gathered_at=1e9, serving=ServingStats(True, tips_checked=1, loose_refs=40))
    plan = plan_maintenance(missing, policy, 1e9)
    assert plan.action is Action.LOOSE and plan.param("mode") == "loose"
    assert any("commit-graph missing" in r for r in plan.reasons)
    assert any("40 loose refs > 16" in r for r in plan.reasons)
    off = MaintenancePolicy(commit_graph=False, pack_refs=False)
    assert plan_maintenance(missing, off, 1e9).action is Action.NOTHING
    busy = RepoStats(path="/r", gathered_at=1e9, loose_sampled=100)
    assert plan_maintenance(busy, off, 1e9).param("commit_graph") is False   # the queued job is told
    assert plan_maintenance(busy, off, 1e9).param("pack_refs") is False
    assert plan_maintenance(busy, policy, 1e9).param("commit_graph") is None
    loose = RepoStats(path="/r", gathered_at=1e9, loose_sampled=100, serving=ServingStats(True, tips_checked=3))
    plan = plan_maintenance(loose, policy, 1e9)
    assert plan.action is Action.LOOSE and plan.reasons[0].startswith("~1,600 loose objects")
    assert "also: commit-graph missing" in plan.reasons


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return graphutil.build_history(tmp_path_factory.mktemp("serving"), big=False)


def test_gathered_reasons_follow_the_repository(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    graph, _ = serving_reasons(gather_serving_stats(bare))
    assert graph == ["commit-graph missing"]
    git("commit-graph", "write", "--reachable", "--split", git_dir=bare)          # git's, no Bloom filters
    graph, _ = serving_reasons(gather_serving_stats(bare))
    assert graph == ["commit-graph lacks changed-path Bloom filters (BIDX/BDAT)"]
    gw.write_commit_graph(Repository.open(bare))
    assert serving_reasons(gather_serving_stats(bare)) == ([], [])
    graphutil.add_commits(bare, 1, "refs/heads/x")
    graph, _ = serving_reasons(gather_serving_stats(bare))
    assert len(graph) == 1 and "1 of 5 branch tip(s)" in graph[0]
    head = git("rev-parse", "main", git_dir=bare).decode().strip()
    for i in range(20):
        git("update-ref", f"refs/heads/many/{i}", head, git_dir=bare)
    _, refs = serving_reasons(gather_serving_stats(bare))
    assert refs and refs[0].startswith("2")      # 20 new + the clone's loose refs > 16
    pack_refs(Repository.open(bare))
    assert serving_reasons(gather_serving_stats(bare))[1] == []


def _packyard(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "packyard"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_packyard_repack_leaves_graph_and_packed_refs_git_accepts(template, tmp_path):
    ours = _copy(template, tmp_path / "ours.git")
    theirs = _copy(template, tmp_path / "theirs.git")
    proc = _packyard("repack", "--repo", str(ours), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "commit-graph: layer of" in proc.stderr and "pack-refs:" in proc.stderr
    git("repack", "-adq", git_dir=theirs)
    git("commit-graph", "write", "--reachable", "--changed-paths", git_dir=theirs)
    git("pack-refs", "--all", git_dir=theirs)
    git("commit-graph", "verify", git_dir=ours)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=ours)
    assert (ours / "packed-refs").read_bytes() == (theirs / "packed-refs").read_bytes()
    assert (ours / "packed-refs").read_bytes().startswith(HEADER)
    chain = cg.read_chain(ours / "objects")
    assert len(chain) == 1
    assert chain[0].path.read_bytes() == (theirs / "objects" / "info" / "commit-graph").read_bytes()
    for path in ("dir/sub", "a.txt", "x.txt"):
        assert git("log", "--oneline", "--all", "--", path, git_dir=ours) == \
            git("log", "--oneline", "--all", "--", path, git_dir=theirs)
    # nothing new: the chain stays, nothing to pack
    proc = _packyard("repack", "--repo", str(ours), "--no-progress", "--json")
    assert proc.returncode == 0, proc.stderr
    assert cg.read_chain(ours / "objects")[0].checksum == chain[0].checksum


def test_no_commit_graph_and_no_pack_refs_skip_both(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    loose_before = sorted(p.name for p in (bare / "refs" / "heads").iterdir())
    proc = _packyard("repack", "--repo", str(bare), "--no-progress", "--no-commit-graph", "--no-pack-refs")
    assert proc.returncode == 0, proc.stderr
    assert not (bare / "objects" / "info" / "commit-graphs").exists()
    assert sorted(p.name for p in (bare / "refs" / "heads").iterdir()) == loose_before


def test_expiring_unreachable_objects_rewrites_the_graph_whole(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    repack_command(bare, mode="full")
    git("update-ref", "refs/heads/doomed", "main", git_dir=bare)
    graphutil.add_commits(bare, 3, "refs/heads/doomed")
    repack_command(bare, mode="loose")
    assert len(cg.read_chain(bare / "objects")) == 2
    git("update-ref", "-d", "refs/heads/doomed", git_dir=bare)
    shutil.rmtree(bare / "logs", ignore_errors=True)
    out = repack_command(bare, mode="full", expire="now")
    assert out["counters"]["cruft_expired"] > 0 and out["counters"]["commit_graph_replaced"]
    assert len(cg.read_chain(bare / "objects")) == 1
    git("commit-graph", "verify", git_dir=bare)     # no layer names a commit that is gone
    git("fsck", "--full", "--no-dangling", git_dir=bare)


CHILD = """
import sys
from packyard.store.maintenance.serving.graphwrite import write_commit_graph
from packyard.store.repo import Repository
write_commit_graph(Repository.open(sys.argv[1]))
"""


@pytest.mark.parametrize("point", ["commitgraph.after_flush", "commitgraph.after_graph_rename",
                                   "commitgraph.after_chain_flush", "commitgraph.after_chain_rename",
                                   "commitgraph.after_fsync_dirs"])
def test_sigkill_at_each_commit_graph_step_leaves_a_graph_git_reads(template, tmp_path, point):
    bare = _copy(template, tmp_path / "repo.git")
    gw.write_commit_graph(Repository.open(bare))            # an old chain to replace
    old = cg.read_chain(bare / "objects")
    graphutil.add_commits(bare, 2)
    env = {**os.environ, "PACKYARD_FAULT": f"{point}:kill"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(bare)], env=env, cwd=ROOT, capture_output=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    chain = cg.read_chain(bare / "objects")
    assert [L.checksum for L in chain[:1]] == [old[0].checksum]    # old, or old + the new layer
    git("commit-graph", "verify", git_dir=bare)
    log = git("log", "--oneline", "--", "grow.txt", git_dir=bare)
    assert len(log.splitlines()) == 2
    removed = remove_serving_leftovers(bare)                # the dead writer's claim (and temp) go
    assert removed >= 1
    res = gw.write_commit_graph(Repository.open(bare))
    assert not res.written or res.layers_after == 2
    d = bare / "objects" / "info" / "commit-graphs"
    assert not [p for p in d.iterdir() if p.name.startswith("tmp_") or p.name.endswith(".lock")]
    git("commit-graph", "verify", git_dir=bare)


def test_live_claims_are_kept_and_git_style_ones_age_out(template, tmp_path):
    from packyard.store import lockfile

    bare = _copy(template, tmp_path / "repo.git")
    claim = lockfile.acquire(bare / "packed-refs.lock", "packed-refs")
    git_lock = bare / "objects" / "info" / "commit-graphs" / "commit-graph-chain.lock"
    git_lock.parent.mkdir(parents=True)
    git_lock.write_bytes(b"")                              # git's: no owner record
    assert remove_serving_leftovers(bare) == 0
    assert remove_serving_leftovers(bare, stale_after=0.0) == 1 and not git_lock.exists()
    assert (bare / "packed-refs.lock").exists()            # ours, alive: never
    lockfile.release(claim)


def test_a_held_chain_or_packed_refs_lock_leaves_the_repack_standing(template, tmp_path):
    from packyard.store import lockfile
    from packyard.store.maintenance.serving.refresh import after_repack

    bare = _copy(template, tmp_path / "repo.git")
    d = bare / "objects" / "info" / "commit-graphs"
    d.mkdir(parents=True)
    held = [lockfile.acquire(d / "commit-graph-chain.lock", "chain"), lockfile.acquire(bare / "packed-refs.lock", "pr")]
    out = after_repack(Repository.open(bare))
    assert "is locked by another writer" in out["commit_graph_busy"] and "pack_refs_busy" in out
    assert not (d / "commit-graph-chain").exists()
    for claim in held:
        lockfile.release(claim)
    out = after_repack(Repository.open(bare))
    assert out["commit_graph_written"] and out["pack_refs_total"] > 0 and "pack_refs_busy" not in out
