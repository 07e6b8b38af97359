"""The commit-graph write after a repack reads the packs installed now, not the repository's older listing.

Right after ``store.maintenance.repack`` the Repository's pack snapshot still names the packs the repack
replaced (moved to ``preserved/``); the graph write (``after_repack``) lists ``objects/pack`` afresh, so its
C loops read the new pack. git verifies the graph.
"""
from __future__ import annotations

import os
import subprocess

import graphutil
from gitutil import copy_repo, git
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.maintenance.serving.refresh import after_repack
from packyard.store.repo import Repository

ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}


def test_graph_write_after_repack_lists_the_installed_packs(tmp_path):
    env = {**os.environ, **ENV}
    work, bare = tmp_path / "w", tmp_path / "r.git"
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=env)
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, env=env)
    for i in range(4):   # four packs, one per push
        (work / f"f{i}").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(work), "add", "."], check=True, env=env)
        subprocess.run(["git", "-C", str(work), "commit", "-qm", str(i)], check=True, env=env)
        subprocess.run(["git", "-C", str(work), "push", "-q", str(bare), "HEAD:refs/heads/main"], check=True, env=env)
        git("repack", "-d", "-q", git_dir=bare)
    repo = Repository.open(bare)
    before = {p.name for p in repo.objects.packs.prepare()}
    assert len(before) == 4
    repack(repo, RepackOptions(mode=RepackMode.FULL))
    assert {p.name for p in repo.objects.packs.prepare()} == before   # (the snapshot the repack left)
    out = after_repack(repo, pack_refs_too=False)
    assert out["commit_graph_commits"] == 4 and out["commit_graph_filters_computed"] == 4
    installed = {p.stem for p in (bare / "objects" / "pack").glob("pack-*.pack")}
    assert len(installed) == 1 and not installed & before
    assert {p.name for p in repo.objects.packs.prepare()} == installed, "the graph write read the replaced packs"
    git("commit-graph", "verify", git_dir=bare)


def test_graph_from_the_repacks_walk_is_the_graph_read_from_the_objects(tmp_path):
    """The commits the repack's walk read (RepackResult.walked) are taken as read: the same chain, byte for
    byte, as the graph write that reads every commit itself; git verifies it; a history with odd commits
    (the walk and the graph read a parent line after the author line differently) is read where it must be."""
    template = graphutil.build_history(tmp_path / "t")
    odd = git("hash-object", "-w", "--literally", "-t", "commit", "--stdin", git_dir=template,
              input=git("cat-file", "commit", "refs/heads/main", git_dir=template).replace(
                  b"\nauthor ", b"\nauthor x <x@x> 1 +0000\nparent " +
                  git("rev-parse", "refs/heads/main~1", git_dir=template).strip() + b"\nauthor ", 1)).strip()
    git("update-ref", "refs/heads/odd", odd.decode(), git_dir=template)
    chains = []
    for use_walk in (True, False):
        bare = copy_repo(template, tmp_path / f"r{use_walk}.git")
        repo = Repository.open(bare)
        result = repack(repo, RepackOptions(mode=RepackMode.FULL))
        assert result.walked is not None and len(result.walked[0]) > 20
        out = after_repack(repo, pack_refs_too=False, walked=result.walked if use_walk else None)
        total = out["commit_graph_commits"]
        if use_walk:   # every commit but the odd one taken as the walk read it
            assert out["commit_graph_commits_from_walk"] == total - 1
        else:
            assert out["commit_graph_commits_from_walk"] == 0
        git("commit-graph", "verify", git_dir=bare)
        d = bare / "objects" / "info" / "commit-graphs"
        chains.append([(d / f"graph-{n}.graph").read_bytes() for n in (d / "commit-graph-chain").read_text().split()])
    assert chains[0] == chains[1]
