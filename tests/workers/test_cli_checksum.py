"""`packyard status --repo` shows the repository checksum; `packyard verify --against OTHER` compares two copies
(a mirror made by git holds the same refs; a moved branch is named)."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from backuputil import gitaly_checksum_by_git
from gitutil import git, make_worktree_repo


@pytest.fixture
def fresh_env(pk):
    base = Path(tempfile.mkdtemp(prefix="pkc-", dir="/tmp")).resolve()
    env = pk.cli_env(PACKYARD_STATE_DIR=str(base / "state"), PACKYARD_STORAGE_ROOTS=f"default={base / 'root'}",
                     PACKYARD_INCOMING_DIR=str(base / "incoming"))
    for key in ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL"):
        env.pop(key, None)
    yield base, env
    shutil.rmtree(base, ignore_errors=True)


def _run(env, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["packyard", *argv], env=env, capture_output=True, text=True, timeout=120)


def test_status_shows_checksum_and_verify_against_compares(fresh_env):
    base, env = fresh_env
    repo = make_worktree_repo(base / "root" / "team")
    mirror = base / "root" / "mirror.git"
    git("clone", "-q", "--mirror", str(repo), str(mirror))
    want = gitaly_checksum_by_git(repo)

    out = _run(env, "status", "--repo", str(repo))
    assert out.returncode == 0, out.stderr
    assert f"\n  checksum: {want} (" in out.stdout

    out = _run(env, "verify", "--repo", str(repo), "--against", str(mirror))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ok checksum {want}:")

    old = git("rev-parse", "main~1", git_dir=mirror).decode().strip()
    git("update-ref", "refs/heads/main", old, git_dir=mirror)
    git("update-ref", "refs/pull/1/head", old, git_dir=mirror)   # not counted: not named
    out = _run(env, "verify", "--repo", str(repo), "--against", str(mirror), "--json")
    assert out.returncode == 1
    result = json.loads(out.stdout)
    assert result["match"] is False and result["other_checksum"] == gitaly_checksum_by_git(mirror)
    head = git("rev-parse", "main", git_dir=repo).decode().strip()
    assert result["differing"] == [{"ref": "HEAD", "ours": head, "theirs": old},
                                   {"ref": "refs/heads/main", "ours": head, "theirs": old}]

    out = _run(env, "verify", "--repo", str(repo), "--against", str(base / "nope.git"))
    assert out.returncode == 1 and "NotARepositoryError" in out.stderr
