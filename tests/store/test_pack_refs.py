"""pack-refs against git: the same packed-refs bytes and loose files as ``git pack-refs --all``; a ref moved
meanwhile is never reverted, a ref deleted meanwhile never comes back, git's update-ref beside it loses
nothing; a SIGKILL at each step leaves every ref with its value."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import graphutil
from gitutil import ROOT, git
from gitutil import copy_repo as _copy
from packyard.store.packrefs import HEADER, loose_ref_count, pack_refs
from packyard.store.repo import Repository


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    bare = graphutil.build_history(tmp_path_factory.mktemp("packrefs"), big=False)
    head = git("rev-parse", "main", git_dir=bare).decode().strip()
    first = git("rev-list", "--max-parents=0", "main", git_dir=bare).decode().split()[0]
    # some refs already packed, one of them overridden by a newer loose value
    git("update-ref", "refs/heads/old-packed", first, git_dir=bare)
    git("update-ref", "refs/heads/overridden", first, git_dir=bare)
    git("pack-refs", "--all", git_dir=bare)
    git("update-ref", "refs/heads/overridden", head, git_dir=bare)
    # nested names, a symref under refs/, a per-worktree ref, a broken ref, notes
    git("update-ref", "refs/heads/feature/deep/x", head, git_dir=bare)
    git("symbolic-ref", "refs/remotes/origin/HEAD", "refs/heads/main", git_dir=bare)
    git("update-ref", "refs/bisect/bad", head, git_dir=bare)
    (bare / "refs" / "heads" / "broken").write_text("1" * 40 + "\n")
    git("notes", "--ref", "commits", "add", "-m", "a note", head, git_dir=bare)
    return bare


def _state(bare: Path) -> tuple[bytes, list[str], bytes]:
    packed = (bare / "packed-refs").read_bytes()
    loose = sorted(p.relative_to(bare).as_posix() for p in (bare / "refs").rglob("*") if p.is_file())
    refs = git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=bare)
    return packed, loose, refs


def test_packed_refs_bytes_and_loose_files_equal_gits(template, tmp_path):
    ours = _copy(template, tmp_path / "ours.git")
    theirs = _copy(template, tmp_path / "theirs.git")
    before = git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=ours)
    result = pack_refs(Repository.open(ours))
    git("pack-refs", "--all", git_dir=theirs)
    assert _state(ours) == _state(theirs)
    packed = (ours / "packed-refs").read_bytes()
    assert packed.startswith(HEADER)
    assert b"\n^" in packed                                  # annotated tags carry their peeled line
    assert git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=ours) == before
    assert "refs/remotes/origin/HEAD" in result.skipped and "refs/bisect/bad" in result.skipped
    assert "refs/heads/broken" in result.skipped
    assert result.pruned == result.packed >= 3
    assert (ours / "refs" / "heads" / "feature").exists() is (theirs / "refs" / "heads" / "feature").exists()
    assert loose_ref_count(ours) == loose_ref_count(theirs)


def test_packing_twice_changes_nothing(template, tmp_path):
    ours = _copy(template, tmp_path / "ours.git")
    pack_refs(Repository.open(ours))
    first = _state(ours)
    again = pack_refs(Repository.open(ours))
    assert again.pruned == 0 and _state(ours) == first


CHILD = """
import sys
from packyard.store.packrefs import pack_refs
from packyard.store.repo import Repository
r = pack_refs(Repository.open(sys.argv[1]))
print(r.pruned, r.kept_moved, r.kept_locked)
"""


def _child(bare: Path, fault: str, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "PACKYARD_FAULT": fault, "PACKYARD_FAULT_ONCE_DIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(bare)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_stopped(proc: subprocess.Popen, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError("pack-refs never reached its fault point")


def test_ref_moved_or_deleted_meanwhile_is_never_reverted_or_resurrected(template, tmp_path):
    """Between writing packed-refs and pruning (the window JGit bug #152 lost refs in), git moves one ref
    and deletes another: the moved one keeps its new value, the deleted one stays deleted."""
    bare = _copy(template, tmp_path / "repo.git")
    first = git("rev-list", "--max-parents=0", "main", git_dir=bare).decode().split()[0]
    head = git("rev-parse", "main", git_dir=bare).decode().strip()
    git("update-ref", "refs/heads/mv", head, git_dir=bare)
    git("update-ref", "refs/heads/del", head, git_dir=bare)
    proc = _child(bare, "packrefs.after_unlock:stop-once", tmp_path)
    _wait_stopped(proc)
    assert b"refs/heads/del" in (bare / "packed-refs").read_bytes()   # packed, not yet pruned
    git("update-ref", "refs/heads/mv", first, git_dir=bare)
    git("update-ref", "-d", "refs/heads/del", git_dir=bare)
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    pruned, kept_moved, _locked = map(int, out.split())
    assert kept_moved == 2      # mv moved, del deleted: the prune touches neither
    assert pruned >= 2
    assert git("rev-parse", "refs/heads/mv", git_dir=bare).decode().strip() == first
    assert git("rev-parse", "--verify", "-q", "refs/heads/del", git_dir=bare, check=False) == b""
    assert b"refs/heads/del" not in (bare / "packed-refs").read_bytes()
    pack_refs(Repository.open(bare))   # and the next run packs the moved value, not the old one
    assert git("rev-parse", "refs/heads/mv", git_dir=bare).decode().strip() == first


@pytest.mark.parametrize("point", ["packrefs.after_flush", "packrefs.after_rename", "packrefs.after_fsync",
                                   "packrefs.after_unlock", "packrefs.after_prune"])
def test_sigkill_at_each_step_keeps_every_ref(template, tmp_path, point):
    bare = _copy(template, tmp_path / "repo.git")
    (bare / "refs" / "heads" / "broken").unlink()   # git fsck judges the result below
    before = git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=bare)
    proc = _child(bare, f"{point}:kill", tmp_path)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=bare) == before
    git("fsck", "--no-dangling", git_dir=bare)
    pack_refs(Repository.open(bare))        # the rerun breaks the dead run's claim and completes
    assert git("for-each-ref", "--format=%(objectname) %(refname)", git_dir=bare) == before
    assert not (bare / "packed-refs.lock").exists()


GIT_LOOP = r"""
set -u
GD="$1"; N="$2"; A="$3"; B="$4"
for i in $(seq 1 "$N"); do
  r="refs/heads/loop-$((i % 7))"
  case $((i % 3)) in
    0) v="$A";;
    1) v="$B";;
    2) v="";;
  esac
  if [ -z "$v" ]; then
    if git --git-dir="$GD" update-ref -d "$r" 2>/dev/null; then echo "ok del $r"; else echo "fail del $r"; fi
  else
    if git --git-dir="$GD" update-ref "$r" "$v" 2>/dev/null; then echo "ok set $r $v"; else echo "fail set $r $v"; fi
  fi
done
"""


def test_git_update_ref_running_beside_pack_refs_loses_nothing(template, tmp_path):
    bare = _copy(template, tmp_path / "repo.git")
    a = git("rev-parse", "main", git_dir=bare).decode().strip()
    b = git("rev-parse", "main~1", git_dir=bare).decode().strip()
    loop = subprocess.Popen(["bash", "-c", GIT_LOOP, "loop", str(bare), "300", a, b],
                            stdout=subprocess.PIPE, text=True)
    rounds = 0
    repo = Repository.open(bare)
    while loop.poll() is None and rounds < 200:
        pack_refs(repo)
        rounds += 1
    out, _ = loop.communicate(timeout=120)
    pack_refs(repo)
    expected: dict[str, str | None] = {}
    for line in out.splitlines():
        words = line.split()
        if words[0] != "ok":
            continue   # a failed git command changed nothing (it says so); it is not a loss
        expected[words[2]] = words[3] if words[1] == "set" else None
    assert rounds >= 2 and len(expected) == 7
    for name, value in expected.items():
        got = git("rev-parse", "--verify", "-q", name, git_dir=bare, check=False).decode().strip() or None
        assert got == value, (name, got, value)


PY_LOOP = """
import sys
from packyard.store.errors import StoreError
from packyard.store.refs import RefUpdate
from packyard.store.repo import Repository
repo = Repository.open(sys.argv[1])
a, b = bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
for i in range(int(sys.argv[4])):
    name = f"refs/heads/py-{i % 5}"
    old = repo.refs.read(name)
    new = a if old != a else b
    try:
        repo.refs.update([RefUpdate(name, old, new)])
        print("ok", name, new.hex(), flush=True)
    except StoreError as err:
        print("fail", name, type(err).__name__, flush=True)
"""


def test_packyards_own_ref_updates_beside_pack_refs_lose_nothing(template, tmp_path):
    """packyard's RefStore.update (compare-and-swap under <ref>.lock) in another process while pack-refs
    runs in a loop: every update that succeeded is the ref's value at the end; none is reverted."""
    bare = _copy(template, tmp_path / "repo.git")
    a = git("rev-parse", "main", git_dir=bare).decode().strip()
    b = git("rev-parse", "main~1", git_dir=bare).decode().strip()
    loop = subprocess.Popen([sys.executable, "-c", PY_LOOP, str(bare), a, b, "200"], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    repo = Repository.open(bare)
    rounds = 0
    while loop.poll() is None and rounds < 200:
        pack_refs(repo)
        rounds += 1
    out, _ = loop.communicate(timeout=120)
    assert loop.returncode == 0
    last: dict[str, str] = {}
    for line in out.splitlines():
        words = line.split()
        if words[0] == "ok":
            last[words[1]] = words[2]
    assert rounds >= 2 and len(last) == 5
    for name, value in last.items():
        assert git("rev-parse", name, git_dir=bare).decode().strip() == value, name
