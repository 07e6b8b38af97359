"""packyard bench graph: the commit-graph and pack-refs steps of maintenance against git's, side by side.

Rows (each the best of ``--rounds`` alternating rounds, a fresh copy of the repository for each side
and round):

* ``commit-graph write``: packyard's ``write_commit_graph`` (a new split chain) vs git's
  ``commit-graph write --reachable --changed-paths --split --size-multiple=4`` (Gitaly's command; a
  first write is one layer, the same bytes as without ``--split``), with ``main`` set ``--since``
  first-parent commits back; then ``commit-graph +N``: ``main`` moved to its tip and the same two
  writes again (a new layer, or a merge, by git's size-multiple rule). The chains are compared byte
  for byte after each;
* ``pack-refs``: ``pack_refs`` vs ``git pack-refs --all`` over ``--refs`` loose refs (plus the
  corpus's), the packed-refs files compared byte for byte;
* ``git log -- <path>``: the same git command on packyard's graph and on git's (Bloom filters
  answering for every commit), outputs compared, for each of ``--path``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from packyard.workers.cli.bench import common

DEFAULT_PATHS = ("Documentation", "builtin/log.c", "t/t0000-basic.sh", "Makefile", "no/such/path")


def register(subparsers) -> None:  # type: ignore[no-untyped-def]
    p = subparsers.add_parser("graph", help="commit-graph and pack-refs vs git's",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", metavar="PATH", help="repository to copy (default: built from the corpus pack)")
    p.add_argument("--corpus", default="git-v1.0.0", help="corpus pack name (default git-v1.0.0)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; best of each (default 3)")
    p.add_argument("--refs", type=int, default=2000, help="loose refs to create for pack-refs (default 2000)")
    p.add_argument("--path", action="append", default=None, help="a path for the git log row (repeatable)")
    p.add_argument("--log-runs", type=int, default=5, help="git log runs per path and side (default 5)")
    p.add_argument("--since", type=int, default=100,
                   help="first-parent commits of main left out of the first graph write (default 100)")
    p.set_defaults(func=run)


def _timed(fn) -> float:   # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _prepare(src: Path, refs: int, work: Path) -> Path:
    base = work / "base.git"
    shutil.copytree(src, base, symlinks=True)
    # the bench refs name older commits only: the last commits of main are reached by main alone
    ids = common.git("rev-list", "--all", "--skip=2000", f"--max-count={refs}", git_dir=base).decode().split()
    lines = "".join(f"create refs/heads/bench/{i:05d} {oid}\n" for i, oid in enumerate(ids))
    common.git("update-ref", "--stdin", git_dir=base, input=lines.encode())
    for f in (base / "objects" / "info").glob("commit-graph*"):
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    return base


def run(args: argparse.Namespace) -> int:
    from packyard.store import native
    from packyard.store.maintenance.serving.commitgraph import read_chain
    from packyard.store.maintenance.serving.graphwrite import GraphOptions, write_commit_graph
    from packyard.store.packrefs import pack_refs
    from packyard.store.repo import Repository

    with tempfile.TemporaryDirectory(prefix="packyard-bench-graph-") as tmp:
        work = Path(tmp)
        src = common.bench_repo("graph", args.repo, args.corpus, work / "src.git")
        if src is None:
            return 2
        base = _prepare(src, args.refs, work)
        print(f"repository {src} ({common.describe_filesystem(work)}); "
              f"{'pure Python' if native.pure_python() else 'C where built'}; {args.rounds} rounds")
        keys = ("graph_ours", "graph_git", "more_ours", "more_git", "refs_ours", "refs_git")
        best = {k: float("inf") for k in keys}
        same_graph = same_refs = True
        tip = common.git("rev-parse", "refs/heads/main", git_dir=base).decode().strip()
        since = common.git("rev-parse", f"refs/heads/main~{args.since}", git_dir=base).decode().strip()
        split = ("commit-graph", "write", "--reachable", "--changed-paths", "--split", "--size-multiple=4")

        def chain(bare: Path) -> list[bytes]:
            return [layer.path.read_bytes() for layer in read_chain(bare / "objects")]

        for rnd in range(max(1, args.rounds)):
            ours = work / f"ours-{rnd}.git"
            theirs = work / f"theirs-{rnd}.git"
            for bare in (ours, theirs):
                shutil.copytree(base, bare, symlinks=True)
                common.git("update-ref", "refs/heads/main", since, git_dir=bare)
            def ours_write(o: Path = ours) -> None:
                write_commit_graph(Repository.open(o), GraphOptions())

            def git_write(t: Path = theirs) -> None:
                common.git(*split, git_dir=t)

            def ours_refs(o: Path = ours) -> None:
                pack_refs(Repository.open(o))

            def git_refs(t: Path = theirs) -> None:
                common.git("pack-refs", "--all", git_dir=t)

            phases: list[list[tuple[str, Callable[[], object]]]] = [
                      [("graph_ours", ours_write), ("graph_git", git_write)],
                      [("more_ours", ours_write), ("more_git", git_write)],
                      [("refs_ours", ours_refs), ("refs_git", git_refs)]]
            for n, phase in enumerate(phases):
                if n == 1:
                    for bare in (ours, theirs):
                        common.git("update-ref", "refs/heads/main", tip, git_dir=bare)
                for key, fn in (phase[::-1] if rnd % 2 else phase):
                    best[key] = min(best[key], _timed(fn))
                if n < 2:
                    same_graph &= chain(ours) == chain(theirs)
            same_refs &= (ours / "packed-refs").read_bytes() == (theirs / "packed-refs").read_bytes()
            if rnd < args.rounds - 1:
                shutil.rmtree(ours)
                shutil.rmtree(theirs)
        rows = [("commit-graph write", best["graph_ours"], best["graph_git"]),
                (f"commit-graph +main~{args.since}..main", best["more_ours"], best["more_git"]),
                (f"pack-refs ({args.refs}+ loose refs)", best["refs_ours"], best["refs_git"])]
        same_log = True
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
        for path in args.path or DEFAULT_PATHS:
            t = {"ours": float("inf"), "git": float("inf")}
            outs = {}
            for i in range(args.log_runs * 2):
                side = ("ours", "git")[(i + i // 2) % 2]
                repo = ours if side == "ours" else theirs
                t0 = time.perf_counter()
                outs[side] = subprocess.run(["git", "--git-dir", str(repo), "log", "--oneline", "--", path],
                                            env=env, capture_output=True, check=True).stdout
                t[side] = min(t[side], time.perf_counter() - t0)
            same_log &= outs["ours"] == outs["git"]
            rows.append((f"git log -- {path}"[:32], t["ours"], t["git"]))
        common.print_ratios(rows)
        print(f"graph bytes identical to git's: {same_graph}; packed-refs identical: {same_refs}; "
              f"git log output identical: {same_log}")
        return 0 if same_graph and same_refs and same_log else 1
