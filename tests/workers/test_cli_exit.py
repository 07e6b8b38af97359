"""The ``packyard`` program's exit (workers/cli/__init__.py ``entry``): a one-shot ingest command ends without
the interpreter's teardown, and with everything a normal exit does that a caller can see -- its output
flushed, its exit status, the atexit handlers run; a live thread, or a command that did not ask, gets the
normal exit. Observed from outside, in a child process: an object whose ``__del__`` writes a line shows
whether the teardown ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import GIT_ENV, _all_as_pack, fsck, git, make_worktree_repo

PROGRAM = """
import atexit, sys, threading, time
class Torn:
    def __del__(self):
        sys.stderr.write("teardown ran\\n")
kept = Torn()
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
if THREAD:
    threading.Thread(target=lambda: (time.sleep(0.5), sys.stderr.write("thread finished\\n"))).start()
from packyard.workers.cli import entry
sys.exit(entry())
"""


def _program(args: list[str], *, thread: bool = False) -> subprocess.CompletedProcess:
    code = PROGRAM.replace("THREAD", "True" if thread else "False")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env={**os.environ, **GIT_ENV},
                          timeout=120)


@pytest.fixture
def push(tmp_path: Path) -> tuple[Path, Path, dict[str, tuple[str, int]]]:
    """(an empty bare repository, a pack of another repository's objects, that repository)."""
    src = make_worktree_repo(tmp_path / "src", commits=2, files_per_commit=2)
    pack = tmp_path / "push.pack"
    pack.write_bytes(_all_as_pack(src))
    dest = tmp_path / "dest.git"
    git("init", "-q", "--bare", str(dest))
    return dest, pack, src


def test_index_pack_exits_at_once_with_its_output_and_status(push) -> None:
    dest, pack, src = push
    done = _program(["index-pack", "--repo", str(dest), "--strict", "--json", "--no-progress", str(pack)])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)          # the whole document: stdout was flushed before the exit
    assert result["counters"]["objects"] == len(git("rev-list", "--objects", "--all", git_dir=src).splitlines())
    assert b"atexit ran" in done.stderr       # the handlers ran ...
    assert b"teardown ran" not in done.stderr  # ... and the teardown did not
    git("update-ref", "refs/heads/main", git("rev-parse", "refs/heads/main", git_dir=src).decode().strip(),
        git_dir=dest)
    fsck(dest)


def test_a_failed_ingest_exits_at_once_with_its_message_and_status(push) -> None:
    dest, _pack, _src = push
    bad = dest.parent / "bad.pack"
    bad.write_bytes(b"PACK\0\0\0\2\0\0\0\1" + b"\0" * 30)
    done = _program(["index-pack", "--repo", str(dest), "--no-progress", str(bad)])
    assert done.returncode == 1
    assert b"packyard index-pack:" in done.stderr and b"bad.pack" in done.stderr
    assert b"atexit ran" in done.stderr and b"teardown ran" not in done.stderr
    assert not list((dest / "objects" / "pack").iterdir())


def test_a_live_thread_gets_the_normal_exit(push) -> None:
    """exit joins a thread that is not a daemon: exit_at_once must not cut it short."""
    dest, pack, _src = push
    done = _program(["index-pack", "--repo", str(dest), "--json", "--no-progress", str(pack)], thread=True)
    assert done.returncode == 0, done.stderr
    assert b"thread finished" in done.stderr and b"teardown ran" in done.stderr


def test_a_command_that_does_not_ask_gets_the_normal_exit(tmp_path: Path) -> None:
    """(the control: the observation works -- without exit_at_once the teardown's line is there)"""
    done = _program(["repack", "--repo", str(tmp_path / "nowhere.git"), "--json", "--no-progress"])
    assert done.returncode != 0
    assert b"atexit ran" in done.stderr and b"teardown ran" in done.stderr
