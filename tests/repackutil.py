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
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gitutil import ROOT, fsck_strict, git

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
    old_blob = git("hash-object", "-w", "--stdin", git_dir=bare,
                   input=b"old blob under a young commit\n").decode().strip()
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
    fsck_strict(bare)
    assert reachable_listing(bare) == listing, "git rev-list --objects --all changed"
    for name in new_packs:
        out = git("verify-pack", "-v", str(bare / "objects" / "pack" / f"{name}.idx")).decode()
        assert out.rstrip().endswith(": ok"), out[-300:]


# -- a history whose unreachable objects are young and old, young ones reaching old ones (test_repack_cruft) --

MISSING = "1" * 40


def _pack_range(dest: Path, src: Path, spec: str, age: float = 0.0) -> None:
    name = git("pack-objects", "-q", "--revs", str(dest / "objects" / "pack" / "pack"), git_dir=src,
               input=spec.encode()).decode().strip()
    if age:
        t = time.time() - age
        for suffix in (".pack", ".idx"):
            os.utime(dest / "objects" / "pack" / f"pack-{name}{suffix}", (t, t))


def _copy_loose(dest: Path, src: Path, oid: str) -> None:
    """Copy one object of ``src`` into ``dest`` as a young loose object."""
    typ = git("cat-file", "-t", oid, git_dir=src).decode().strip()
    data = git("cat-file", typ, oid, git_dir=src)
    assert git("hash-object", "-w", "-t", typ, "--stdin", git_dir=dest, input=data).decode().strip() == oid


def build_cruft(base: Path) -> dict:
    """A bare repository whose ``main`` reaches c1..c4 and whose unreachable objects are:
    c5..c8 in a pack dated 30 days back (old), c9..c10 in a young pack (their parents are old: rescued),
    c11..c12 in a second old pack that only a young loose tag of c12 reaches, a young loose side commit on c6
    whose tree is new, a young loose commit whose parent is missing and an old loose blob (expired)."""
    work = base / "work"
    git("init", "-q", "-b", "main", str(work))
    commits = []
    for k in range(1, 13):
        (work / f"f{k % 4}.txt").write_text(f"version {k}\n" * (20 + k))
        (work / "dir").mkdir(exist_ok=True)
        (work / "dir" / f"g{k}.txt").write_text(f"file {k}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"c{k}", cwd=work)
        commits.append(git("rev-parse", "HEAD", cwd=work).decode().strip())
    git("tag", "-a", "-m", "a tag of c12", "t12", commits[11], cwd=work)
    tag = git("rev-parse", "t12", cwd=work).decode().strip()
    git("checkout", "-q", "-b", "side", commits[5], cwd=work)
    (work / "side.txt").write_text("side\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "side", cwd=work)
    side = git("rev-parse", "HEAD", cwd=work).decode().strip()
    src = work / ".git"

    bare = base / "repo.git"
    git("init", "-q", "--bare", str(bare))
    c = commits
    _pack_range(bare, src, f"{c[3]}\n")
    _pack_range(bare, src, f"{c[7]}\n^{c[3]}\n", age=30 * DAY)
    _pack_range(bare, src, f"{c[9]}\n^{c[7]}\n")
    _pack_range(bare, src, f"{c[11]}\n^{c[9]}\n", age=30 * DAY)
    for oid in [tag, side, git("rev-parse", f"{side}^{{tree}}", git_dir=src).decode().strip(),
                git("rev-parse", f"{side}:side.txt", git_dir=src).decode().strip()]:
        _copy_loose(bare, src, oid)
    tree4 = git("rev-parse", f"{c[3]}^{{tree}}", git_dir=src).decode().strip()
    broken = git("hash-object", "-w", "-t", "commit", "--literally", "--stdin", git_dir=bare,
                 input=f"tree {tree4}\nparent {MISSING}\nauthor A <a@x> 1 +0000\ncommitter A <a@x> 1 +0000\n\nb\n"
                 .encode()).decode().strip()
    lone = git("hash-object", "-w", "--stdin", git_dir=bare, input=b"an old blob nothing names\n").decode().strip()
    t = time.time() - 30 * DAY
    os.utime(bare / "objects" / lone[:2] / lone[2:], (t, t))
    git("update-ref", "refs/heads/main", c[3], git_dir=bare)
    return {"bare": bare, "commits": c, "tag": tag, "side": side, "broken": broken, "lone": lone}




_REPACK_CHILD = """
import sys
from packyard.store.maintenance.repack.options import RepackMode, RepackOptions
from packyard.store.maintenance.repack.run import repack
from packyard.store.repo import Repository
repack(Repository.open(sys.argv[1]), RepackOptions(mode=RepackMode(sys.argv[2])))
"""


def repack_in_child(bare: Path, mode: str, fault: str | None) -> subprocess.CompletedProcess:
    """``repack`` of ``bare`` in ``mode`` in a child process, killed at ``fault`` (``point`` or ``point@N``: its
    Nth hit; None: runs to the end)."""
    env = {k: v for k, v in os.environ.items() if k != "PACKYARD_FAULT"}
    if fault:
        name, _, at = fault.partition("@")
        env["PACKYARD_FAULT"] = f"{name}:kill@{at}" if at else name
    return subprocess.run([sys.executable, "-c", _REPACK_CHILD, str(bare), mode], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
