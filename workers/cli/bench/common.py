"""Shared helpers for benchmarks: timing, corpus location, sample repositories, ratio table."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[3]


def corpus_dir() -> Path:
    return Path(os.environ.get("PACKYARD_CORPUS") or ROOT.parent / "shared" / "corpus")


def git(*args: str, git_dir: Path | None = None, cwd: Path | None = None, input: bytes | None = None) -> bytes:
    cmd = ["git"] + (["--git-dir", str(git_dir)] if git_dir else []) + list(args)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(cmd, cwd=cwd, input=input, env=env, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE).stdout


def repo_from_pack(dest: Path, pack: Path, refs: Path | None) -> Path:
    """A bare repository holding ``pack`` indexed by git, with the tip from ``refs`` as refs/heads/main."""
    git("init", "-q", "--bare", str(dest))
    target = dest / "objects" / "pack" / "pack-sample.pack"
    shutil.copyfile(pack, target)
    git("index-pack", str(target))
    if refs is not None and refs.exists():
        sha = refs.read_text().split()[0]
        git("update-ref", "refs/heads/main", sha, git_dir=dest)
        git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=dest)
    return dest


def compile_bytecode() -> None:
    """Write packyard's .pyc files before timing a freshly started packyard process.

    An installed package has its bytecode (pip compiles it); a source checkout run with
    PYTHONDONTWRITEBYTECODE=1 would otherwise recompile ~20 modules (~30 ms) in every timed
    run -- a cost of the checkout, not of the work being compared with git.
    """
    import compileall

    for pkg in ("store", "workers"):
        compileall.compile_dir(str(ROOT / pkg), quiet=2)


def best_of(fn: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def print_ratios(rows: Sequence[tuple[str, float, float]]) -> None:
    """rows: (what, packyard seconds, git seconds)."""
    print(f"{'benchmark':32} {'packyard s':>10} {'git s':>8} {'ratio':>7}")
    for what, ours, theirs in rows:
        print(f"{what:32} {ours:10.3f} {theirs:8.3f} {ours / theirs if theirs else float('inf'):7.2f}x")
