"""A repository built by git with every shape a repack must handle, and the git-oracle checks after one.

Shapes: linear history and a merge, annotated tags (of a commit, of a tag, of a tree, of a blob),
a gitlink (submodule entry), packed-refs plus loose refs, a detached HEAD reaching a commit no
ref reaches, many small pushes kept as packs and others exploded into loose objects, a pack
protected by a ``.keep``, and unreachable objects older and younger than the grace period (loose
and packed), one young unreachable commit whose tree is old.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gitutil import git

DAY = 86400.0
OLD_AGE = 30 * DAY     # older than the default grace period (2 weeks)
YOUNG_AGE = 1 * DAY


@dataclass
class Shapes:
    bare: Path
    keep_pack: Path                         # the .keep-protected pack's .pack
    young: list[str] = field(default_factory=list)   # unreachable, younger than the grace period
    old: list[str] = field(default_factory=list)     # unreachable, older than the grace period
    rescued: list[str] = field(default_factory=list)  # old unreachable, but reached from a young one
    detached: str = ""                      # the commit only HEAD reaches


def _commit(work: Path, name: str, content: str, msg: str, when: int) -> str:
    (work / name).parent.mkdir(parents=True, exist_ok=True)
    (work / name).write_text(content)
    env = {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    git("add", "-A", cwd=work)
    _git_env(["commit", "-q", "-m", msg], cwd=work, env=env)
    return git("rev-parse", "HEAD", cwd=work).decode().strip()


def _git_env(args: list[str], cwd: Path, env: dict[str, str]) -> bytes:
    from gitutil import GIT_ENV

    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV, **env}, capture_output=True)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def _loose_path(bare: Path, oid: str) -> Path:
    return bare / "objects" / oid[:2] / oid[2:]


def build(base: Path) -> Shapes:
    work = base / "work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(work))
    t = 1_700_000_000
    # Linear history with files in subdirectories (versions of one file: deltas in git's packs).
    body = "".join(f"line {i} of a file that changes a little each time\n" for i in range(200))
    for i in range(12):
        _commit(work, "src/file.txt", body + f"revision {i}\n", f"linear {i}", t + 60 * i)
        _commit(work, f"docs/page{i % 3}.txt", f"page {i}\n" * 40, f"docs {i}", t + 60 * i + 30)
    # A side branch merged back (a merge commit).
    git("checkout", "-q", "-b", "feature", cwd=work)
    _commit(work, "feature/a.txt", "feature a\n" * 30, "feature 1", t + 2000)
    _commit(work, "feature/b.txt", "feature b\n" * 30, "feature 2", t + 2100)
    git("checkout", "-q", "main", cwd=work)
    _commit(work, "src/other.txt", "main side\n", "main side", t + 2050)
    _git_env(["merge", "-q", "--no-ff", "-m", "merge feature", "feature"], cwd=work,
             env={"GIT_AUTHOR_DATE": f"{t + 2200} +0000", "GIT_COMMITTER_DATE": f"{t + 2200} +0000"})
    # A gitlink (a submodule entry naming a commit of another repository).
    git("update-index", "--add", "--cacheinfo", "160000,1234567890123456789012345678901234567890,sub", cwd=work)
    _git_env(["commit", "-q", "-m", "add submodule"], cwd=work,
             env={"GIT_AUTHOR_DATE": f"{t + 2300} +0000", "GIT_COMMITTER_DATE": f"{t + 2300} +0000"})
    # Annotated tags: of a commit, of that tag, of a tree, of a blob.
    git("tag", "-a", "-m", "release 1", "v1", "HEAD~3", cwd=work)
    git("tag", "-a", "-m", "tag of a tag", "v1-signed", "v1", cwd=work)
    git("tag", "-a", "-m", "tag of a tree", "tree-tag", "HEAD^{tree}", cwd=work)
    blob = git("hash-object", "-w", "--stdin", cwd=work, input=b"a blob only a tag names\n").decode().strip()
    git("tag", "-a", "-m", "tag of a blob", "blob-tag", blob, cwd=work)
    bare = base / "repo.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    git("pack-refs", "--all", git_dir=bare)                       # tags and branches in packed-refs
    git("remote", "add", "origin", str(bare), cwd=work)
    # Many small pushes: some kept as packs, some exploded into loose objects.
    for i in range(8):
        _commit(work, f"push/{i}.txt", f"push {i}\n" * (5 + i), f"push {i}", t + 3000 + 60 * i)
        # receive-pack reads the receiving repository's config: keep the pack, or explode it.
        git("config", "receive.unpackLimit", "1" if i % 2 else "1000", git_dir=bare)
        git("push", "-q", "origin", "main", cwd=work)
    # A pack protected by .keep (a push still being handled, say).
    _commit(work, "push/kept.txt", "kept push\n" * 9, "kept push", t + 4000)
    before = set((bare / "objects" / "pack").glob("pack-*.pack"))
    git("config", "receive.unpackLimit", "1", git_dir=bare)
    git("push", "-q", "origin", "main", cwd=work)
    git("config", "--unset", "receive.unpackLimit", git_dir=bare)
    (keep_pack,) = set((bare / "objects" / "pack").glob("pack-*.pack")) - before
    keep_pack.with_suffix(".keep").write_text("held by a test\n")
    # A loose ref on top of packed-refs (the branch moved by the pushes is loose now), and one more.
    git("update-ref", "refs/heads/side", "HEAD~2", git_dir=bare)
    # A detached HEAD: a commit only HEAD reaches.
    git("checkout", "-q", "--detach", cwd=work)
    detached = _commit(work, "detached.txt", "only HEAD\n", "detached", t + 5000)
    git("push", "-q", "origin", f"{detached}:refs/tmp/detached", cwd=work)
    git("update-ref", "-d", "refs/tmp/detached", git_dir=bare)
    (bare / "HEAD").write_text(detached + "\n")
    shapes = Shapes(bare=bare, keep_pack=keep_pack, detached=detached)
    # Unreachable objects: loose young and old; packed old (a deleted branch's pack); a young commit on an old tree.
    for i in range(3):
        shapes.young.append(git("hash-object", "-w", "--stdin", git_dir=bare, input=b"young %d\n" % i).decode().strip())
        oid = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"old %d\n" % i).decode().strip()
        _age(_loose_path(bare, oid), OLD_AGE)
        shapes.old.append(oid)
    for p in shapes.young:
        _age(_loose_path(bare, p), YOUNG_AGE)
    old_blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"old blob under a young commit\n").decode().strip()
    old_tree = git("mktree", git_dir=bare, input=f"100644 blob {old_blob}\tkept.txt\n".encode()).decode().strip()
    young_commit = _git_env(["--git-dir", str(bare), "commit-tree", old_tree, "-m", "dangling"], cwd=base,
                            env={}).decode().strip()
    for oid in (old_blob, old_tree):
        _age(_loose_path(bare, oid), OLD_AGE)
    _age(_loose_path(bare, young_commit), YOUNG_AGE)
    shapes.young.append(young_commit)
    shapes.rescued += [old_tree, old_blob]
    # A deleted branch whose objects sit in an old pack.
    git("checkout", "-q", "-b", "doomed", "main", cwd=work)
    _commit(work, "doomed.txt", "doomed branch content\n" * 7, "doomed", t + 6000)
    doomed_objs = git("rev-list", "--objects", "main..doomed", cwd=work)
    ids = b"\n".join(line.split(b" ")[0] for line in doomed_objs.splitlines()) + b"\n"
    name = git("pack-objects", "-q", str(bare / "objects" / "pack" / "pack"), cwd=work, input=ids).decode().strip()
    for ext in ("pack", "idx"):
        _age(bare / "objects" / "pack" / f"pack-{name}.{ext}", OLD_AGE)
    shapes.old += [line.split(b" ")[0].decode() for line in doomed_objs.splitlines()]
    shutil.rmtree(work)
    return shapes


def copy(shapes: Shapes, dest: Path) -> Shapes:
    """An identical copy (mtimes kept: the ages matter)."""
    shutil.copytree(shapes.bare, dest, copy_function=shutil.copy2)
    return Shapes(bare=dest, keep_pack=dest / shapes.keep_pack.relative_to(shapes.bare), young=list(shapes.young),
                  old=list(shapes.old), rescued=list(shapes.rescued), detached=shapes.detached)


def reachable_listing(bare: Path) -> bytes:
    return git("rev-list", "--objects", "--all", git_dir=bare)


def has_object(bare: Path, oid: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(bare), "cat-file", "-e", oid], capture_output=True).returncode == 0


def check_with_git(bare: Path, listing: bytes, new_packs: list[str]) -> None:
    """git's verdict after a repack: fsck --full --strict, the same reachable objects, every new pack verifies."""
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert reachable_listing(bare) == listing, "git rev-list --objects --all changed"
    for name in new_packs:
        out = git("verify-pack", "-v", str(bare / "objects" / "pack" / f"{name}.idx")).decode()
        assert out.rstrip().endswith(": ok"), out[-300:]
