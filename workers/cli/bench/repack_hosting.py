"""Inputs of ``packyard bench repack`` that look like hosting repositories (issue 20), all built with git
from the corpus repository (``base``: git-v2.0.0 in one pack, ``refs/heads/main`` at v2.0.0).

* :func:`cruft_repo` -- ``main`` force-pushed back to 65% of its first-parent history (the rest of the
  history becomes unreachable, 48% of the objects), a topic branch deleted: every unreachable object
  young (its pack was written just now), so all go to the cruft pack.
* :func:`cruft_expire_repo` -- the same history in three packs: the reachable part, the first half of the
  unreachable part (young) and the newer half, whose pack is dated 30 days back (``os.utime``, the pack
  mtime git's and packyard's cruft logic read): those objects are past a 2-week expiry and nothing young
  reaches them.
* :func:`cruft_update_repo` -- :func:`cruft_repo` after ``git repack --cruft -d`` (so: one pack and git's
  cruft pack with its .mtimes), then ``main`` moved back again to 55%: the second full repack merges
  the old cruft pack with the newly unreachable objects (git's cruft-pack update path).
* :func:`pushes_repo` -- one pack of 90% of the first-parent history, then 30 pushes of the rest, either
  ordinary packs (``git pack-objects --revs``: every delta base inside the pack) or thin packs completed
  as a server ingests them (``pack-objects --thin --stdout | index-pack --stdin --fix-thin``: the
  missing bases appended whole).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from packyard.workers.cli.bench import common

DAY = 24 * 3600


def _git(*args: str, git_dir: Path | None = None, input: bytes | None = None) -> bytes:
    return common.git(*args, git_dir=git_dir, input=input)


def first_parent(src: Path) -> list[str]:
    """``main``'s first-parent history, oldest first."""
    return _git("rev-list", "--first-parent", "--reverse", "main", git_dir=src).decode().split()


def _pack(dest: Path, src: Path, spec: str) -> Path:
    """One ordinary pack of ``spec`` (rev-list arguments, one a line) from ``src`` into ``dest``."""
    name = _git("pack-objects", "-q", "--revs", str(dest / "objects" / "pack" / "pack"), git_dir=src,
                input=spec.encode()).decode().strip()
    return dest / "objects" / "pack" / f"pack-{name}.pack"


def _date(pack: Path, when: float) -> None:
    for suffix in (".pack", ".idx"):
        os.utime(pack.with_suffix(suffix), (when, when))


def cruft_repo(dest: Path, src: Path, share: float = 0.65) -> Path:
    """git-v2.0.0 in one pack with ``main`` force-pushed back to ``share`` of its first-parent history and a
    deleted topic branch: the unreachable rest is young."""
    if dest.exists():
        return dest
    _git("init", "-q", "--bare", str(dest))
    fp = first_parent(src)
    _pack(dest, src, "main\n")
    # A topic branch pushed and deleted (its objects are in the pack already: a ref that is gone).
    _git("update-ref", "refs/heads/topic", fp[int(len(fp) * 0.6)], git_dir=dest)
    _git("update-ref", "refs/heads/main", fp[int(len(fp) * share) - 1], git_dir=dest)   # the force push
    _git("update-ref", "-d", "refs/heads/topic", git_dir=dest)
    return dest


def cruft_expire_repo(dest: Path, src: Path, share: float = 0.65, now: float | None = None) -> Path:
    """Three packs: what ``main`` (at ``share``) reaches, the next part of the history (young), the newest
    part (dated 30 days back: past a 2-week expiry, and reached by nothing young)."""
    if dest.exists():
        return dest
    now = time.time() if now is None else now
    _git("init", "-q", "--bare", str(dest))
    fp = first_parent(src)
    cut = fp[int(len(fp) * share) - 1]
    mid = fp[(int(len(fp) * share) + len(fp)) // 2]
    _pack(dest, src, f"{cut}\n")
    _pack(dest, src, f"{mid}\n^{cut}\n")
    old = _pack(dest, src, f"main\n^{mid}\n")
    _date(old, now - 30 * DAY)
    _git("update-ref", "refs/heads/main", cut, git_dir=dest)
    return dest


def cruft_update_repo(dest: Path, src: Path, first: float = 0.65, second: float = 0.55) -> Path:
    """:func:`cruft_repo` repacked by ``git repack --cruft -d``, then ``main`` moved back to ``second``."""
    if dest.exists():
        return dest
    cruft_repo(dest, src, first)
    _git("-c", "repack.writeBitmaps=false", "repack", "--cruft", "-d", "-q", git_dir=dest)
    fp = first_parent(src)
    _git("update-ref", "refs/heads/main", fp[int(len(fp) * second) - 1], git_dir=dest)
    return dest


def pushes_repo(dest: Path, src: Path, *, thin: bool, share: float = 0.9, pushes: int = 30) -> Path:
    """One pack of ``share`` of the first-parent history, then ``pushes`` packs of the rest (ordinary
    ``pack-objects --revs`` packs, or thin packs completed by ``index-pack --fix-thin``)."""
    if dest.exists():
        return dest
    _git("init", "-q", "--bare", str(dest))
    fp = first_parent(src)
    cut = int(len(fp) * share) - 1
    _pack(dest, src, f"{fp[cut]}\n")
    prev = fp[cut]
    rest = len(fp) - 1 - cut
    for k in range(1, pushes + 1):
        tip = fp[cut + rest * k // pushes]
        spec = f"{tip}\n^{prev}\n"
        if thin:
            data = _git("pack-objects", "-q", "--revs", "--thin", "--stdout", git_dir=src, input=spec.encode())
            subprocess.run(["git", "--git-dir", str(dest), "index-pack", "--stdin", "--fix-thin"], input=data,
                           check=True, stdout=subprocess.DEVNULL)
        else:
            _pack(dest, src, spec)
        prev = tip
    _git("update-ref", "refs/heads/main", fp[-1], git_dir=dest)
    return dest


def objects_in(bare: Path) -> int:
    return len(_git("cat-file", "--batch-check", "--batch-all-objects", git_dir=bare).splitlines())


def reachable_in(bare: Path) -> int:
    return len(_git("rev-list", "--objects", "--all", git_dir=bare).splitlines())
