"""packyard bench graph: the commit-graph and pack-refs steps of maintenance against git's, side by side.

Rows (each the best of ``--rounds`` alternating rounds, a fresh copy of the repository for each side
and round):

* ``commit-graph write``: packyard's ``write_commit_graph`` (a new split chain) vs
  ``git commit-graph write --reachable --changed-paths``; the two files are compared byte for byte;
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
    p.set_defaults(func=run)


def _timed(fn) -> float:   # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _prepare(src: Path, refs: int, work: Path) -> Path:
    base = work / "base.git"
    shutil.copytree(src, base, symlinks=True)
    ids = common.git("rev-list", "--all", f"--max-count={refs}", git_dir=base).decode().split()
    lines = "".join(f"create refs/heads/bench/{i:05d} {oid}\n" for i, oid in enumerate(ids))
    common.git("update-ref", "--stdin", git_dir=base, input=lines.encode())
    for f in (base / "objects" / "info").glob("commit-graph*"):
        shutil.rmtree(f) if f.is_dir() else f.unlink()
    return base


def run(args: argparse.Namespace) -> int:
    from packyard.store import native
    from packyard.store.maintenance.commitgraph import GraphOptions, read_chain, write_commit_graph
    from packyard.store.packrefs import pack_refs
    from packyard.store.repo import Repository

    with tempfile.TemporaryDirectory(prefix="packyard-bench-graph-") as tmp:
        work = Path(tmp)
        if args.repo:
            src = Path(args.repo)
        else:
            corpus = common.corpus_dir()
            pack = corpus / f"{args.corpus}.pack"
            if not pack.exists():
                print(f"packyard bench graph: no corpus pack {pack}; pass --repo")
                return 2
            src = common.repo_from_pack(work / "src.git", pack, corpus / f"{args.corpus}.refs")
        base = _prepare(src, args.refs, work)
        print(f"repository {src} ({common.describe_filesystem(work)}); "
              f"{'pure Python' if native.pure_python() else 'C where built'}; {args.rounds} rounds")
        best = {"graph_ours": float("inf"), "graph_git": float("inf"), "refs_ours": float("inf"),
                "refs_git": float("inf")}
        same_graph = same_refs = True
        for rnd in range(max(1, args.rounds)):
            ours = work / f"ours-{rnd}.git"
            theirs = work / f"theirs-{rnd}.git"
            shutil.copytree(base, ours, symlinks=True)
            shutil.copytree(base, theirs, symlinks=True)
            steps = [("graph_ours", lambda o=ours: write_commit_graph(Repository.open(o), GraphOptions())),
                     ("graph_git", lambda t=theirs: common.git("commit-graph", "write", "--reachable",
                                                               "--changed-paths", git_dir=t)),
                     ("refs_ours", lambda o=ours: pack_refs(Repository.open(o))),
                     ("refs_git", lambda t=theirs: common.git("pack-refs", "--all", git_dir=t))]
            if rnd % 2:
                steps = [steps[1], steps[0], steps[3], steps[2]]
            for key, fn in steps:
                best[key] = min(best[key], _timed(fn))
            layer = read_chain(ours / "objects")[0].path.read_bytes()
            same_graph &= layer == (theirs / "objects" / "info" / "commit-graph").read_bytes()
            same_refs &= (ours / "packed-refs").read_bytes() == (theirs / "packed-refs").read_bytes()
            if rnd < args.rounds - 1:
                shutil.rmtree(ours)
                shutil.rmtree(theirs)
        rows = [("commit-graph write", best["graph_ours"], best["graph_git"]),
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
