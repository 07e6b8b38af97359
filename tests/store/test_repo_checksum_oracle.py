"""The repository checksum (Gitaly's CalculateChecksum rule) against the same rule computed from git's own
``git show-ref --head`` output."""
from __future__ import annotations

import hashlib
from pathlib import Path

from backuputil import gitaly_checksum_by_git
from gitutil import git, make_worktree_repo
from packyard.store.backup.checksum import (
    ZERO_CHECKSUM,
    checksum_of_lines,
    differing_refs,
    repository_checksum,
    show_ref_lines,
)
from packyard.store.refs import RefStore


def _many_refs(tmp_path: Path) -> Path:
    bare = make_worktree_repo(tmp_path, commits=3)
    head = git("rev-parse", "HEAD", git_dir=bare).decode().strip()
    first = git("rev-parse", "HEAD~2", git_dir=bare).decode().strip()
    for name, oid in [("refs/heads/topic", first), ("refs/keep-around/" + first, first),
                      ("refs/merge-requests/1/head", head), ("refs/environments/prod/deploys/1", first),
                      ("refs/pull/7/head", first),              # not counted
                      ("refs/remotes/origin/main", first),      # not counted
                      ("refs/heads/side/HEADLESS", first)]:     # counted twice over (heads/ and HEAD)
        git("update-ref", name, oid, git_dir=bare)
    git("symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main", git_dir=bare)  # counted: "HEAD"
    git("notes", "--ref", "commits", "add", "-m", "a note", head, git_dir=bare)
    git("tag", "light", first, git_dir=bare)
    return bare


def test_checksum_matches_git_show_ref_rule(tmp_path: Path) -> None:
    bare = _many_refs(tmp_path)
    git("pack-refs", "--all", git_dir=bare)
    git("update-ref", "refs/heads/topic", git("rev-parse", "HEAD~1", git_dir=bare).decode().strip(),
        git_dir=bare)   # a loose ref over its packed value
    got = repository_checksum(bare)
    assert got.hex == gitaly_checksum_by_git(bare)
    assert got.hex != ZERO_CHECKSUM
    # the lines it hashed are git's show-ref lines, byte for byte
    store = RefStore(bare)
    assert show_ref_lines(store.as_dict(), store.resolve("HEAD")) == git("show-ref", "--head",
                                                                          git_dir=bare).splitlines()
    assert got.refs == len(git("show-ref", "--head", git_dir=bare).splitlines())
    assert got.counted == got.refs - 2   # refs/pull/7/head and refs/remotes/origin/main left out


def test_checksum_changes_with_a_counted_ref_only(tmp_path: Path) -> None:
    bare = _many_refs(tmp_path)
    before = repository_checksum(bare).hex
    first = git("rev-parse", "HEAD~2", git_dir=bare).decode().strip()
    git("update-ref", "refs/pull/8/head", first, git_dir=bare)
    assert repository_checksum(bare).hex == before == gitaly_checksum_by_git(bare)
    git("update-ref", "refs/tags/new", first, git_dir=bare)
    assert repository_checksum(bare).hex != before
    assert repository_checksum(bare).hex == gitaly_checksum_by_git(bare)


def test_detached_and_unborn_head(tmp_path: Path) -> None:
    bare = _many_refs(tmp_path)
    first = git("rev-parse", "HEAD~2", git_dir=bare).decode().strip()
    git("update-ref", "--no-deref", "HEAD", first, git_dir=bare)
    assert repository_checksum(bare).hex == gitaly_checksum_by_git(bare)
    git("symbolic-ref", "HEAD", "refs/heads/unborn", git_dir=bare)
    assert repository_checksum(bare).hex == gitaly_checksum_by_git(bare)


def test_empty_repository_is_zero(tmp_path: Path) -> None:
    git("init", "-q", "--bare", str(tmp_path / "e.git"))
    got = repository_checksum(tmp_path / "e.git")
    assert got.hex == ZERO_CHECKSUM == gitaly_checksum_by_git(tmp_path / "e.git")
    assert (got.counted, got.refs) == (0, 0)


def test_leading_zero_bytes_dropped_like_go_big_int() -> None:
    # the first of a bounded search whose SHA-1 starts with a zero byte: Go's big.Int.Bytes() drops it
    line = next(c for c in (b"%040x refs/heads/b%d" % (0, i) for i in range(100_000))
                if hashlib.sha1(c).digest()[0] == 0)
    got = checksum_of_lines([line])
    assert got.hex == hashlib.sha1(line).digest().lstrip(b"\0").hex()
    assert len(got.hex) < 40
    # a line XORed twice cancels out: the zero checksum, as Gitaly prints it
    assert checksum_of_lines([line, line]).hex == ZERO_CHECKSUM


def test_differing_refs_names_counted_refs() -> None:
    a = {"refs/heads/main": b"\1" * 20, "refs/pull/1/head": b"\2" * 20, "refs/tags/v1": b"\3" * 20}
    b = {"refs/heads/main": b"\4" * 20, "refs/pull/1/head": b"\5" * 20}
    assert differing_refs(a, b) == [("refs/heads/main", "01" * 20, "04" * 20), ("refs/tags/v1", "03" * 20, "-")]
