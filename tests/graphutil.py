"""Repositories made with git for the commit-graph and pack-refs tests: merges, an octopus, paths with
bytes over 0x7f, a file that becomes a directory, a commit changing more than 512 paths, an empty commit,
dates over 2^32 and a commit dated 0 (generation overflow), annotated and nested tags."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from gitutil import CORPUS, GIT_ENV, git


def _git_dated(work: Path, date: int, *args: str) -> bytes:
    import subprocess

    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": f"{date} +0000", "GIT_COMMITTER_DATE": f"{date} +0000"}
    proc = subprocess.run(["git", *args], cwd=work, env=env, capture_output=True)
    if proc.returncode:
        raise AssertionError(proc.stderr.decode())
    return proc.stdout


def build_history(base: Path, *, big: bool = True) -> Path:
    """A bare repository (objects packed by git) with the shapes listed in the module docstring."""
    work = base / "work"
    work.mkdir(parents=True)
    git("init", "-q", "-b", "main", str(work))
    t = 1_600_000_000
    (work / "a.txt").write_text("a\n")
    (work / "dir").mkdir()
    (work / "dir" / "sub").mkdir()
    (work / "dir" / "sub" / "deep.c").write_text("int x;\n")
    (work / "caf\u00e9.txt").write_text("utf-8 name\n")
    (work / "\u00e4\u00f6\u00fc" ).mkdir()
    (work / "\u00e4\u00f6\u00fc" / "\u00df.txt").write_text("x\n")
    git("add", "-A", cwd=work)
    _git_dated(work, t, "commit", "-q", "-m", "root")
    for i in range(12):
        (work / "dir" / "sub" / "deep.c").write_text(f"int x = {i};\n")
        (work / f"f{i % 3}.txt").write_text(f"{i}\n")
        git("add", "-A", cwd=work)
        _git_dated(work, t + 100 * (i + 1), "commit", "-q", "-m", f"c{i}")
    # a file that becomes a directory, and a mode change
    (work / "a.txt").unlink()
    (work / "a.txt").mkdir()
    (work / "a.txt" / "inner").write_text("now a dir\n")
    (work / "f0.txt").chmod(0o755)
    git("add", "-A", cwd=work)
    _git_dated(work, t + 5000, "commit", "-q", "-m", "file to dir")
    _git_dated(work, t + 5100, "commit", "-q", "--allow-empty", "-m", "empty")
    # branches and merges, an octopus
    for b in ("x", "y", "z"):
        git("checkout", "-q", "-b", b, "main", cwd=work)
        (work / f"{b}.txt").write_text(b)
        git("add", "-A", cwd=work)
        _git_dated(work, t + 6000 + ord(b), "commit", "-q", "-m", f"on {b}")
    git("checkout", "-q", "main", cwd=work)
    _git_dated(work, t + 7000, "merge", "-q", "--no-ff", "-m", "octopus", "x", "y", "z")
    git("checkout", "-q", "-b", "side", "main~3", cwd=work)
    (work / "side.txt").write_text("side\n")
    git("add", "-A", cwd=work)
    _git_dated(work, t + 7100, "commit", "-q", "-m", "side")
    git("checkout", "-q", "main", cwd=work)
    _git_dated(work, t + 7200, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    if big:
        # more than 512 changed paths in one commit; exactly 512 in another (the limit is inclusive)
        many = work / "many"
        many.mkdir()
        for i in range(600):
            (many / f"m{i}").write_text(f"{i}\n")
        git("add", "-A", cwd=work)
        _git_dated(work, t + 8000, "commit", "-q", "-m", "600 files")
        for i in range(510):
            (many / f"m{i}").write_text(f"{i} again\n")
        git("add", "-A", cwd=work)
        _git_dated(work, t + 8100, "commit", "-q", "-m", "510 files (512 paths with many/ and .)")
    # dates: far future (over 2^32, the CDAT's 34-bit field) and a clock skew (generation offset)
    # dates git's date parser refuses, written as raw commits: far future (over 2^32, the CDAT's 34-bit
    # field), then a commit dated 1 on top (its generation offset overflows 31 bits: GDO2)
    for date, msg in ((5_000_000_000, "future"), (1, "clock skew: dated 1970 after 2128")):
        (work / f"{msg[:6]}.txt").write_text(msg)
        git("add", "-A", cwd=work)
        tree = git("write-tree", cwd=work).decode().strip()
        head = git("rev-parse", "HEAD", cwd=work).decode().strip()
        raw = (f"tree {tree}\nparent {head}\nauthor A <a@example.com> {date} +0000\n"
               f"committer C <c@example.com> {date} +0000\n\n{msg}\n").encode()
        oid = git("hash-object", "-t", "commit", "-w", "--stdin", cwd=work, input=raw).decode().strip()
        git("update-ref", "HEAD", oid, cwd=work)
    git("tag", "-a", "-m", "annotated", "v1", cwd=work)
    git("tag", "-a", "-m", "tag of a tag", "v1-nested", "v1", cwd=work)
    git("tag", "light", "main~2", cwd=work)
    tree = git("rev-parse", "main^{tree}", cwd=work).decode().strip()
    git("tag", "-a", "-m", "tag of a tree", "treetag", tree, cwd=work)
    bare = base / "repo.git"
    git("clone", "-q", "--bare", "--no-local", str(work), str(bare))
    for b in ("x", "y", "z", "side"):
        git("update-ref", f"refs/heads/{b}", git("rev-parse", b, cwd=work).decode().strip(), git_dir=bare)
    shutil.rmtree(work)
    return bare


def corpus_repo(base: Path, name: str = "git-v1.0.0") -> Path | None:
    """A bare repository holding a corpus pack and its refs (None without the corpus)."""
    pack = CORPUS / f"{name}.pack"
    refs = CORPUS / f"{name}.refs"
    if not pack.exists() or not refs.exists():
        return None
    bare = base / f"{name}.git"
    git("init", "-q", "--bare", str(bare))
    import subprocess

    with open(pack, "rb") as f:
        subprocess.run(["git", "--git-dir", str(bare), "index-pack", "--stdin"], stdin=f, check=True,
                       capture_output=True)
    lines = []
    for line in refs.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("refs/") and not parts[1].endswith("^{}"):
            lines.append(f"create {parts[1]} {parts[0]}\n")
    git("update-ref", "--stdin", git_dir=bare, input="".join(lines).encode())
    return bare


def add_commits(bare: Path, count: int, branch: str = "refs/heads/main", *, start: int = 1_700_000_000,
                tag: str = "grow") -> list[str]:
    """``count`` new commits on ``branch`` made with git plumbing, each changing one file and a file in a
    subdirectory; returns their ids."""
    import subprocess

    out = []
    parent = git("rev-parse", branch, git_dir=bare).decode().strip()
    for k in range(count):
        env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": f"{start + k} +0000",
               "GIT_COMMITTER_DATE": f"{start + k} +0000"}
        blob = git("hash-object", "-w", "--stdin", git_dir=bare, input=f"{tag} {k}\n".encode()).decode().strip()
        entries = [line for line in git("ls-tree", parent, git_dir=bare).decode().splitlines()
                   if not line.endswith(f"\t{tag}.txt") and not line.endswith(f"\t{tag}")]
        sub = git("mktree", git_dir=bare, input=f"100644 blob {blob}\tf{k % 3}\n".encode()).decode().strip()
        entries += [f"100644 blob {blob}\t{tag}.txt", f"040000 tree {sub}\t{tag}"]
        tree = git("mktree", git_dir=bare, input=("\n".join(entries) + "\n").encode()).decode().strip()
        proc = subprocess.run(["git", "--git-dir", str(bare), "commit-tree", tree, "-p", parent, "-m", f"{tag} {k}"],
                              env=env, capture_output=True, check=True)
        parent = proc.stdout.decode().strip()
        out.append(parent)
    git("update-ref", branch, parent, git_dir=bare)
    return out
