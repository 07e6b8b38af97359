"""Real git as the oracle: helpers to build repositories with git and read them back with git."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable


def _checkout_root() -> Path:
    """The checkout these tests belong to: the nearest folder above this file with pyproject.toml and store/
    (so a test locates it the same from tests/, tests/store/ or any deeper folder, in any checkout path)."""
    here = Path(__file__).resolve().parent
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "store").is_dir():
            return folder
    raise RuntimeError(f"no checkout (pyproject.toml + store/) above {here}")


ROOT = _checkout_root()
# The demo's rule too (workers/cli/demo.py): PACKYARD_CORPUS, else ../shared/corpus beside the checkout.
CORPUS = Path(os.environ.get("PACKYARD_CORPUS", ROOT.parent / "shared" / "corpus"))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_AUTHOR_DATE": "1700000000 +0000", "GIT_COMMITTER_DATE": "1700000000 +0000",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
}


def git(*args: str, cwd: str | Path | None = None, input: bytes | None = None,
        git_dir: str | Path | None = None, check: bool = True) -> bytes:
    env = {**os.environ, **GIT_ENV}
    cmd = ["git"]
    if git_dir is not None:
        cmd += ["--git-dir", str(git_dir)]
    proc = subprocess.run(cmd + list(args), cwd=cwd, input=input, env=env, capture_output=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}")
    return proc.stdout


def make_worktree_repo(base: Path, commits: int = 3, files_per_commit: int = 5) -> Path:
    """A bare repository with a few commits of text files, all objects loose."""
    work = base / "work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(work))
    for c in range(commits):
        sub = work / f"dir{c % 2}"
        sub.mkdir(exist_ok=True)
        for f in range(files_per_commit):
            (sub / f"file{f}.txt").write_text(f"commit {c} file {f}\n" * (f + 1))
        (work / "README").write_text(f"revision {c}\n")
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"commit {c}", cwd=work)
    git("tag", "-a", "-m", "a tag", "v1", cwd=work)
    bare = base / "repo.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    # Explode the clone's pack into loose objects: unpack-objects skips objects
    # the repository already has, so move the pack out of the way first.
    pack_data = _all_as_pack(bare)
    for p in (bare / "objects" / "pack").glob("pack-*"):
        p.unlink()
    git("unpack-objects", "-q", cwd=bare, input=pack_data)
    shutil.rmtree(work)
    return bare


def _all_as_pack(bare: Path) -> bytes:
    revs = git("rev-list", "--objects", "--all", git_dir=bare)
    ids = b"\n".join(line.split(b" ")[0] for line in revs.splitlines()) + b"\n"
    return git("pack-objects", "-q", "--stdout", git_dir=bare, input=ids)


def corpus_available(name: str = "git-v1.0.0") -> bool:
    return (CORPUS / f"{name}.pack").is_file() and (CORPUS / f"{name}.refs").is_file()


def needs_corpus(*names: str):
    """Skip (never error) a test whose corpus packs are absent: tests run with or without ../shared."""
    import pytest

    names = names or ("git-v1.0.0",)
    missing = [n for n in names if not corpus_available(n)]
    return pytest.mark.skipif(bool(missing), reason=f"corpus {CORPUS} has no {', '.join(missing)}")


def corpus_tip(name: str = "git-v1.0.0") -> str:
    """The hex tip commit of a corpus pack (read when a test runs, never at import)."""
    return (CORPUS / f"{name}.refs").read_text().split()[0]


def repo_from_corpus(base: Path, name: str = "git-v1.0.0") -> Path:
    """A bare repository holding one corpus pack (indexed by git) and its ref (skips if absent)."""
    if not corpus_available(name):
        import pytest

        pytest.skip(f"corpus {CORPUS} has no {name}")
    bare = base / f"{name}.git"
    git("init", "-q", "--bare", str(bare))
    # Named by its checksum as git names packs: the process-wide delta-base cache keys entries by pack
    # name, so two different packs must never share one within a test session.
    with open(CORPUS / f"{name}.pack", "rb") as f:
        f.seek(-20, os.SEEK_END)
        checksum = f.read(20).hex()
    dest = bare / "objects" / "pack" / f"pack-{checksum}.pack"
    shutil.copyfile(CORPUS / f"{name}.pack", dest)
    git("index-pack", str(dest))
    git("update-ref", "refs/heads/main", corpus_tip(name), git_dir=bare)
    git("symbolic-ref", "HEAD", "refs/heads/main", git_dir=bare)
    return bare


def git_tree_of(src: Path, tmp: Path) -> str:
    """The tree git itself builds for ``src`` (a copy in ``tmp/gitwork``, ``git add -A``, ``git write-tree``)."""
    work = tmp / "gitwork"
    subprocess.run(["cp", "-a", str(src), str(work)], check=True)
    git("init", "-q", str(work))
    git("add", "-A", cwd=work)
    return git("write-tree", cwd=work).strip().decode()


def edit_commit(parent: str, name: str, blob: bytes, who: str, message: str) -> tuple[bytes, bytes, bytes]:
    """A commit made outside git (a web UI's edit), raw: the tree whose one file ``name`` holds ``blob`` and the
    commit of it on ``parent`` (hex) by ``who`` (``Name <email>``) at 1700000000: (tree, commit, commit id)."""
    def oid(kind: str, data: bytes) -> bytes:
        return hashlib.sha1(f"{kind} {len(data)}".encode() + b"\0" + data).digest()

    tree = f"100644 {name}".encode() + b"\0" + oid("blob", blob)
    commit = (f"tree {oid('tree', tree).hex()}\nparent {parent}\nauthor {who} 1700000000 +0000\n"
              f"committer {who} 1700000000 +0000\n\n{message}\n").encode()
    return tree, commit, oid("commit", commit)


def batch_check_all(bare: Path) -> dict[str, tuple[str, int]]:
    """{hex oid: (type, size)} for every object in the repository, per git."""
    out = git("cat-file", "--batch-check", "--batch-all-objects", git_dir=bare)
    result: dict[str, tuple[str, int]] = {}
    for line in out.decode().splitlines():
        oid, typ, size = line.split()
        result[oid] = (typ, int(size))
    return result


def snapshot_tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes: compare before/after to prove nothing changed."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def write_blobs(bare: Path, scratch: Path, count: int, tag: str) -> list[str]:
    """``count`` new loose blobs written by git (``hash-object -w --stdin-paths``); their ids."""
    src = scratch / f"blobs-{tag}"
    src.mkdir(parents=True)
    paths = []
    for i in range(count):
        p = src / str(i)
        p.write_text(f"{tag} blob {i}\n")
        paths.append(str(p))
    out = git("hash-object", "-w", "--stdin-paths", git_dir=bare, input="\n".join(paths).encode() + b"\n")
    shutil.rmtree(src)
    return out.decode().split()


def commit_blobs(bare: Path, scratch: Path, branch: str, files: int, parent: str | None = None) -> str:
    """A commit of ``files`` new blobs (written loose by git) on refs/heads/<branch>; its id."""
    ids = write_blobs(bare, scratch, files, f"{branch}-{parent or 'root'}")
    entries = "".join(f"100644 blob {oid}\tf{i}.txt\n" for i, oid in enumerate(ids))
    tree = git("mktree", git_dir=bare, input=entries.encode()).decode().strip()
    commit = git("commit-tree", tree, "-m", branch, *(["-p", parent] if parent else []), git_dir=bare).decode().strip()
    git("update-ref", f"refs/heads/{branch}", commit, git_dir=bare)
    return commit


def commit_objects(base: Path, text: str, parent: str | None = None) -> tuple[list[dict[str, str]], str]:
    """A commit of one file made by git in a scratch repository under ``base``, as a ``write_objects``
    payload ([{"type", "data" (base64)}], blob, tree, commit) and the commit's id (hex)."""
    import base64

    scratch = base / "scratch.git"
    if not scratch.exists():
        git("init", "-q", "--bare", str(scratch))
    blob = git("hash-object", "-w", "--stdin", git_dir=scratch, input=text.encode()).decode().strip()
    tree = git("mktree", git_dir=scratch, input=f"100644 blob {blob}\tfile.txt\n".encode()).decode().strip()
    extra = ["-p", parent] if parent else []
    commit = git("commit-tree", tree, *extra, "-m", text[:40], git_dir=scratch).decode().strip()
    objects = [{"type": kind, "data": base64.b64encode(git("cat-file", kind, oid, git_dir=scratch)).decode()}
               for kind, oid in (("blob", blob), ("tree", tree), ("commit", commit))]
    return objects, commit


def fsck(bare: Path) -> None:
    """git's verdict on a whole repository: ``git fsck --full --no-dangling`` must pass."""
    git("fsck", "--full", "--no-dangling", git_dir=bare)


def fsck_strict(bare: Path) -> None:
    """The same with ``--strict`` (git's receive-side rules: modes, names, .gitmodules...)."""
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def write_source(base: Path, n: int, dirs: int, content: Callable[[int], str], dir_name: str = "d{}",
                 file_name: str = "f{}.txt") -> Path:
    """A source tree to import: ``base/src/<dir_name % i mod dirs>/<file_name % i>`` holding ``content(i)``
    for each of ``n`` files."""
    src = base / "src"
    for i in range(n):
        d = src / dir_name.format(i % dirs)
        d.mkdir(parents=True, exist_ok=True)
        (d / file_name.format(i)).write_text(content(i))
    return src


def copy_repo(src: Path, dst: Path) -> Path:
    """A private copy of a template repository (symlinks kept as links)."""
    shutil.copytree(src, dst, symlinks=True)
    return dst
