"""Fork networks made with git for the pool tests: a source repository and forks with commits of their own, and
what git says about them (rev-list --objects, count-objects, for-each-ref, pack bytes)."""
from __future__ import annotations

from pathlib import Path

from gitutil import git


def commit(work: Path, name: str, text: str, message: str) -> str:
    (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work).decode().strip()


def make_source(tmp: Path, commits: int = 4) -> tuple[Path, Path]:
    """(bare source repository, its work tree) made with git, packed as git packs it."""
    work = tmp / "src-work"
    git("init", "-q", "-b", "main", str(work))
    for i in range(commits):
        commit(work, "big.txt", "".join(f"shared line {k}\n" for k in range(300)) + f"version {i}\n", f"c{i}")
        commit(work, f"f{i}.txt", f"file {i}\n" * 20, f"f{i}")
    git("tag", "-a", "-m", "a tag", "v1", cwd=work)
    bare = tmp / "src.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    git("repack", "-adq", git_dir=bare)
    git("remote", "add", "origin", str(bare), cwd=work)
    return bare, work


def make_fork(tmp: Path, source: Path, name: str, own_commits: int = 2) -> Path:
    """A full copy of ``source`` (git clone --bare) with commits of its own pushed by git."""
    fork = tmp / f"{name}.git"
    git("clone", "-q", "--bare", "--no-local", str(source), str(fork))
    work = tmp / f"{name}-work"
    git("clone", "-q", "--no-local", str(fork), str(work))
    for i in range(own_commits):
        commit(work, f"{name}-{i}.txt", f"{name} {i}\n" * 30, f"{name} {i}")
    git("push", "-q", "origin", "main", cwd=work)
    return fork


def objects(repo: Path) -> list[str]:
    return sorted(git("rev-list", "--objects", "--all", git_dir=repo).decode().splitlines())


def count_objects(repo: Path) -> dict[str, int]:
    """git count-objects -v: loose ``count`` and ``in-pack`` objects of the repository itself."""
    return {k: int(v) for k, v in (line.split(": ") for line in
                                   git("count-objects", "-v", git_dir=repo).decode().splitlines()) if v.isdigit()}


def pack_bytes(repo: Path) -> int:
    """Bytes of the repository's installed packs (preserved/ not counted: it expires)."""
    return sum(f.stat().st_size for f in (repo / "objects" / "pack").glob("*.pack"))


def refs(repo: Path) -> dict[str, str]:
    out = git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=repo).decode().splitlines()
    pairs = [line.split(" ", 1) for line in out]
    return {pair[0]: pair[1] for pair in pairs}


def pack_offsets(repo: Path) -> dict[str, int]:
    """object -> its offset in the repository's one pack (git verify-pack -v)."""
    (idx,) = (repo / "objects" / "pack").glob("*.idx")
    out = {}
    for line in git("verify-pack", "-v", str(idx)).decode().splitlines():
        f = line.split()
        if len(f) >= 5 and len(f[0]) == 40 and f[1] in ("commit", "tree", "blob", "tag"):
            out[f[0]] = int(f[4])
    return out


def written_first(repo: Path, ids: set[str]) -> bool:
    """Whether every object of ``ids`` comes before every other object in the repository's one pack (git's
    layer 0 under pack.islandCore); both parts must be there."""
    offsets = pack_offsets(repo)
    inside = [o for oid, o in offsets.items() if oid in ids]
    outside = [o for oid, o in offsets.items() if oid not in ids]
    assert inside and outside
    return max(inside) < min(outside)
