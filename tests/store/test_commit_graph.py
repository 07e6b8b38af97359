"""The commit-graph against git: byte-identical files (one layer and split chains with --size-multiple=4),
git commit-graph verify, the same git log -- <path> output and the same Bloom statistics in trace2."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import graphutil
from gitutil import GIT_ENV, git
from gitutil import copy_repo as _copy
from packyard.store.maintenance.serving import bloom
from packyard.store.maintenance.serving import commitgraph as cg
from packyard.store.maintenance.serving import graphwrite as gw
from packyard.store.repo import Repository

SPLIT = ["commit-graph", "write", "--reachable", "--changed-paths", "--split", "--size-multiple=4"]
PATHS = ["a.txt", "a.txt/inner", "dir", "dir/sub", "dir/sub/deep.c", "caf\u00e9.txt", "\u00e4\u00f6\u00fc",
         "many", "many/m7", "f0.txt", "x.txt", "nonexistent", "grow", "grow/f1", "grow.txt"]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return graphutil.build_history(tmp_path_factory.mktemp("graph"))


def _chain(bare: Path) -> tuple[list[str], dict[str, bytes]]:
    d = bare / "objects" / "info" / "commit-graphs"
    names = (d / "commit-graph-chain").read_text().split()
    return names, {n: (d / f"graph-{n}.graph").read_bytes() for n in names}


def _log(bare: Path, path: str, trace: Path) -> tuple[bytes, dict]:
    env = {**os.environ, **GIT_ENV, "GIT_TRACE2_PERF": str(trace)}
    if trace.exists():
        trace.unlink()
    out = subprocess.run(["git", "--git-dir", str(bare), "log", "--oneline", "--all", "--", path], env=env,
                         capture_output=True, check=True).stdout
    stats = {}
    for line in trace.read_text().splitlines():
        if "| bloom " in line and "statistics" in line:
            stats = json.loads(line.split("statistics:", 1)[1])
    return out, stats


def test_one_layer_is_byte_identical_to_gits(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    ours, result = cg.build_single(Repository.open(bare))
    git("commit-graph", "write", "--reachable", "--changed-paths", git_dir=bare)
    assert ours == (bare / "objects" / "info" / "commit-graph").read_bytes()
    layer = cg.read_layer(bare / "objects" / "info" / "commit-graph")
    assert {cg.GDA2, cg.GDO2, cg.EDGE, cg.BIDX, cg.BDAT} <= set(layer.chunks)   # every chunk kind is exercised
    assert result.filters_large == 1 and result.filters_empty >= 1


def test_corpus_layer_is_byte_identical_to_gits(tmp_path):
    bare = graphutil.corpus_repo(tmp_path, "git-v1.0.0")
    if bare is None:
        pytest.skip("corpus not present")
    ours, _ = cg.build_single(Repository.open(bare))
    git("commit-graph", "write", "--reachable", "--changed-paths", git_dir=bare)
    assert ours == (bare / "objects" / "info" / "commit-graph").read_bytes()


def test_split_chain_grows_and_merges_as_gits(template, tmp_path):
    """Rounds of new commits; each round git writes its chain in one copy and packyard in the other: the
    same layers (git's size-multiple rule), the same bytes, and git verifies ours."""
    ours = _copy(template, tmp_path / "ours.git")
    theirs = _copy(template, tmp_path / "theirs.git")
    layer_counts = []
    reused = 0
    for rnd, count in enumerate([0, 5, 1, 1, 1, 20]):
        for bare in (ours, theirs):
            if count:
                graphutil.add_commits(bare, count, start=1_700_000_000 + 1000 * rnd, tag=f"r{rnd}")
        res = gw.write_commit_graph(Repository.open(ours))
        git(*SPLIT, git_dir=theirs)
        assert _chain(ours) == _chain(theirs), f"round {rnd}"
        layer_counts.append(res.layers_after)
        reused += res.filters_reused
        git("commit-graph", "verify", git_dir=ours)
    assert 3 in layer_counts and layer_counts[-1] == 1   # grew to three layers, then merged into one
    assert reused >= 25          # merged layers' filters were taken as written, and gave git's bytes


def test_replace_writes_one_layer_as_gits_split_replace(template, tmp_path):
    ours = _copy(template, tmp_path / "ours.git")
    theirs = _copy(template, tmp_path / "theirs.git")
    for bare in (ours, theirs):
        git(*SPLIT, git_dir=bare)
        graphutil.add_commits(bare, 5)
        git(*SPLIT, git_dir=bare)
        git("update-ref", "-d", "refs/heads/side", git_dir=bare)
    gw.write_commit_graph(Repository.open(ours), gw.GraphOptions(replace=True))
    git(*SPLIT[:-2], "--split=replace", git_dir=theirs)
    assert _chain(ours) == _chain(theirs)
    assert len(_chain(ours)[0]) == 1


def test_git_log_by_path_same_output_and_same_bloom_statistics(template, tmp_path):
    ours = _copy(template, tmp_path / "ours.git")
    theirs = _copy(template, tmp_path / "theirs.git")
    for bare in (ours, theirs):
        graphutil.add_commits(bare, 4)
    gw.write_commit_graph(Repository.open(ours))
    git("commit-graph", "write", "--reachable", "--changed-paths", git_dir=theirs)
    definitely_not = 0
    for path in PATHS:
        got, got_stats = _log(ours, path, tmp_path / "t1")
        want, want_stats = _log(theirs, path, tmp_path / "t2")
        assert got == want, path
        assert got_stats == want_stats and got_stats, path
        assert got_stats["filter_not_present"] == 0, path   # every commit's filter was found and trusted
        definitely_not += got_stats["definitely_not"]
    assert definitely_not > 100


def test_stale_layers_are_kept_for_readers_then_expired(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    repo = Repository.open(bare)
    gw.write_commit_graph(repo)
    graphutil.add_commits(bare, 40)        # big enough to merge the first layer away
    first = _chain(bare)[0]
    res = gw.write_commit_graph(repo)
    d = bare / "objects" / "info" / "commit-graphs"
    assert res.layers_after == 1 and res.expired == 0
    assert (d / f"graph-{first[0]}.graph").exists()           # a reader of the old chain still finds it
    res2 = gw.expire_graphs(bare / "objects", cg.DEFAULT_EXPIRE_AFTER, now=os.stat(d).st_mtime + 7200)
    assert res2 == 1 and not (d / f"graph-{first[0]}.graph").exists()
    git("commit-graph", "verify", git_dir=bare)


def test_monolithic_graph_is_removed_once_the_chain_is_in(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    git("commit-graph", "write", "--reachable", git_dir=bare)     # git's, without Bloom filters
    res = gw.write_commit_graph(Repository.open(bare))
    assert res.layers_after == 1 and not (bare / "objects" / "info" / "commit-graph").exists()
    git("commit-graph", "verify", git_dir=bare)


def test_nothing_new_writes_nothing(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    repo = Repository.open(bare)
    gw.write_commit_graph(repo)
    before = _chain(bare)
    assert gw.write_commit_graph(repo).written is None and _chain(bare) == before


def test_murmur3_signed_chars_as_git_2_39():
    # git 2.39 reads path bytes as signed chars: a byte >= 0x80 changes the hash from the textbook one.
    assert bloom.murmur3_seeded(0, b"") == 0
    assert bloom.murmur3_seeded(0, b"Hello world!") == 0x627b0c2c   # git's t/helper test-bloom vector
    assert bloom.murmur3_seeded(0, b"The quick brown fox jumps over the lazy dog") == 0x2e4ff723
    assert bloom.murmur3_seeded(0, "\u00e9".encode()) != _textbook(0, "\u00e9".encode())


def _textbook(seed: int, data: bytes) -> int:
    import struct
    m = 0xFFFFFFFF
    h = seed
    n4 = len(data) // 4
    for (k,) in struct.iter_unpack("<I", data[:4 * n4]):
        k = (k * 0xcc9e2d51) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * 0x1b873593) & m
        h ^= k
        h = ((((h << 13) | (h >> 19)) & m) * 5 + 0xe6546b64) & m
    tail = data[4 * n4:]
    k1 = 0
    for i, b in enumerate(tail):
        k1 |= b << (8 * i)
    if tail:
        k1 = (k1 * 0xcc9e2d51) & m
        k1 = ((k1 << 15) | (k1 >> 17)) & m
        k1 = (k1 * 0x1b873593) & m
        h ^= k1
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85ebca6b) & m
    h ^= h >> 13
    h = (h * 0xc2b2ae35) & m
    h ^= h >> 16
    return h


def test_a_malformed_tree_is_a_typed_error_naming_it():
    from packyard.store.errors import CorruptObjectError
    from packyard.store.objects import ObjectType

    bad = b"\x01" * 20
    trees = {b"\x02" * 20: (ObjectType.TREE, b"100644 ok\0" + b"\x03" * 20),
             bad: (ObjectType.TREE, b"100644 truncated\0ab")}
    differ = bloom.TreeDiffer(trees.__getitem__)
    assert differ.changed(None, b"\x02" * 20) == {b"ok"}
    with pytest.raises(CorruptObjectError) as err:
        differ.changed(b"\x02" * 20, bad)
    assert err.value.oid == bad.hex()
