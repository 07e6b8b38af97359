"""CLI odds and ends as a user meets them: progress bars on a real pty, `packyard gc` quarantines,
`packyard status` for every job kind (rows written by a real worker process)."""
from __future__ import annotations

import base64
import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest

from gitutil import batch_check_all, git, make_worktree_repo, snapshot_tree


def run(pk, *args, input=None, timeout=120, **env):
    return subprocess.run(["packyard", *args], env=pk.cli_env(**env), capture_output=True, text=True,
                          input=input, timeout=timeout, cwd=pk.session_dir)


def whole_pack(bare: Path) -> bytes:
    return git("pack-objects", "--revs", "--all", "-q", "--stdout", git_dir=bare, input=b"")


def run_on_pty(pk, argv: list[str], stdin_data: bytes | None = None, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``packyard argv`` with stderr on a fresh pty (which reports 0 rows x 0 columns, as a
    terminal whose size was never set does); return (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    assert os.get_terminal_size(slave) == os.terminal_size((0, 0))
    proc = subprocess.Popen(["packyard", *argv], env=pk.cli_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=slave, cwd=pk.session_dir)
    os.close(slave)
    if stdin_data is not None:
        proc.stdin.write(stdin_data)
    proc.stdin.close()
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the pty
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout), out.decode(errors="replace")


def bars(screen: str) -> list[str]:
    """Completed progress bars on the terminal: '<label>: 100% (n/n) ████ [...]'."""
    return [seg.strip() for line in screen.split("\n") for seg in line.split("\r")
            if "100% (" in seg and "█" in seg]


# -- progress bars: one adapter, visible on a terminal reporting 0 rows -------------------------------

def test_progress_bars_show_on_a_zero_size_terminal_for_every_command(pk, tmp_path):
    src = make_worktree_repo(tmp_path / "src")
    objects = len(batch_check_all(src))
    pack = whole_pack(src)
    (tmp_path / "p.pack").write_bytes(pack)

    code, screen = run_on_pty(pk, ["verify", "--repo", str(src)])
    assert code == 0, screen
    assert any(b.startswith("checking") for b in bars(screen)), screen

    dest = tmp_path / "ingested.git"
    git("init", "-q", "--bare", str(dest))
    code, screen = run_on_pty(pk, ["index-pack", "--repo", str(dest), str(tmp_path / "p.pack")])
    assert code == 0, screen
    labels = [b.split(":")[0] for b in bars(screen)]
    assert "Receiving objects" in labels and f"({objects}/{objects})" in screen, screen

    dest = tmp_path / "unpacked.git"
    git("init", "-q", "--bare", str(dest))
    code, screen = run_on_pty(pk, ["unpack-objects", "--repo", str(dest)], stdin_data=pack)
    assert code == 0, screen
    assert bars(screen), screen

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for n in range(20):
        (tree / "sub" / f"f{n}.txt").write_text(f"file {n}\n")
    code, screen = run_on_pty(pk, ["import", "--repo", str(dest), "--ref", "refs/heads/imported", str(tree)])
    assert code == 0, screen
    assert bars(screen), screen

    doc = json.dumps([{"type": "blob", "data": base64.b64encode(f"blob {n}\n".encode()).decode()}
                      for n in range(10)]).encode()
    code, screen = run_on_pty(pk, ["write-objects", "--repo", str(dest), "-"], stdin_data=doc)
    assert code == 0, screen
    assert bars(screen), screen
    git("fsck", "--full", git_dir=dest)

    code, screen = run_on_pty(pk, ["verify", "--repo", str(src), "--no-progress"])
    assert code == 0 and not bars(screen) and "%" not in screen, screen


def test_no_progress_bars_when_stderr_is_not_a_terminal(pk, tmp_path):
    src = make_worktree_repo(tmp_path)
    out = run(pk, "verify", "--repo", str(src))
    assert out.returncode == 0 and out.stderr == "", out.stderr


# -- gc: abandoned index-pack quarantines ---------------------------------------------------------------

def crashed_ingest(pk, repo: Path, pack: Path) -> Path:
    """SIGKILL a real `packyard index-pack` after it wrote its quarantine; return that quarantine."""
    before = set((repo / "objects").glob("incoming-*"))
    out = run(pk, "index-pack", "--repo", str(repo), str(pack), PACKYARD_FAULT="index_pack.after_writeout")
    assert out.returncode == -9, out.stderr
    (quarantine,) = set((repo / "objects").glob("incoming-*")) - before
    assert any(quarantine.iterdir())
    return quarantine


def age(path: Path, seconds: float) -> None:
    """Make ``path`` and everything in it look untouched for ``seconds``."""
    then = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (then, then), follow_symlinks=False)


def test_gc_removes_abandoned_quarantines_and_keeps_fresh_ones(pk, tmp_path):
    src = make_worktree_repo(tmp_path / "src")
    pack = tmp_path / "push.pack"
    pack.write_bytes(whole_pack(src))
    repo = tmp_path / "r.git"
    git("init", "-q", "--bare", str(repo))
    old = crashed_ingest(pk, repo, pack)
    fresh = crashed_ingest(pk, repo, pack)
    age(old, 3601)
    age(fresh, 3000)   # younger than the default limit: could still be a live (slow) ingest
    others = {k: v for k, v in snapshot_tree(repo).items() if "incoming-" not in k}

    out = run(pk, "gc", "--repo", str(repo))
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    assert report["stale_quarantines_removed"] == [f"objects/{old.name}"]
    assert not old.exists() and fresh.is_dir() and any(fresh.iterdir())
    assert {k: v for k, v in snapshot_tree(repo).items() if "incoming-" not in k} == others

    out = run(pk, "gc", "--repo", str(repo), "--quarantine-after", "1800")
    assert json.loads(out.stdout)["stale_quarantines_removed"] == [f"objects/{fresh.name}"]
    assert not list((repo / "objects").glob("incoming-*"))
    git("fsck", "--full", git_dir=repo)

    # The repository still takes the push after gc (nothing it needs was removed).
    out = run(pk, "index-pack", "--repo", str(repo), str(pack))
    assert out.returncode == 0, out.stderr
    assert set(batch_check_all(repo)) == set(batch_check_all(src))
    git("fsck", "--full", git_dir=repo)


def test_gc_on_a_missing_repository_is_an_error(pk, tmp_path):
    out = run(pk, "gc", "--repo", str(tmp_path / "absent.git"))
    assert out.returncode == 1 and "NotARepositoryError" in out.stdout


# -- status: one readable row per job, whatever its kind ------------------------------------------------

def submit(pk, task: str, repo: Path, **params) -> str:
    argv = ["submit", task, "--repo", str(repo), "--wait", "--timeout", "90"]
    for key, value in params.items():
        argv += ["-p", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    out = run(pk, *argv)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split()[2]


@pytest.mark.usefixtures("celery_worker")
@pytest.mark.slow
def test_status_table_shows_key_counters_for_every_job_kind(pk, tmp_path, store_root, incoming):
    src = make_worktree_repo(tmp_path / "src")
    tip = git("rev-parse", "main", git_dir=src).decode().strip()
    pack = incoming / "push.pack"
    pack.write_bytes(whole_pack(src))
    repo = store_root / "hosted.git"
    git("init", "-q", "--bare", str(repo))
    tree = incoming / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("a\n")

    ids = {
        "index_pack": submit(pk, "index_pack", repo, pack=str(pack),
                             ref_updates=[{"ref": "refs/heads/main", "old": None, "new": tip}]),
        "unpack_objects": submit(pk, "unpack_objects", repo, pack_path=str(pack)),
        "import_tree": submit(pk, "import_tree", repo, ref="refs/heads/docs", source=str(tree)),
        "write_objects": submit(pk, "write_objects", repo,
                                objects=[{"type": "blob", "data": base64.b64encode(b"x\n").decode()}]),
        "verify_repo": submit(pk, "verify_repo", repo),
    }
    git("fsck", "--full", git_dir=repo)

    out = run(pk, "status", "--repo", str(repo), "--limit", "10")
    assert out.returncode == 0, out.stderr
    header, rule, *rows = out.stdout.split("\n\n", 1)[1].splitlines()
    assert header.startswith("job  task id") and len(rows) == 5
    counters_at = header.index("counters")
    want = {
        "index_pack": [f"objects={len(batch_check_all(src))}", "deltas=", "thin_bases_added=0", "bytes=",
                       "peak_rss="],
        "unpack_objects": ["objects=", "objects_written=0", f"objects_skipped={len(batch_check_all(src))}"],
        "import_tree": ["files=1", "objects_written=3", "flushes="],
        "write_objects": ["objects_written=1", "objects_skipped=0", "renames="],
        "verify_repo": ["objects=", "commits=", "refs="],
    }
    for kind, task_id in ids.items():
        (row,) = [r for r in rows if task_id[:8] in r]
        assert f" {kind} " in row and "SUCCESS" in row
        counters = row[counters_at:].strip()
        for piece in want[kind]:
            assert piece in counters, (kind, counters)
        # a glance, not a dump: no JSON, no per-phase timings, at most six counters
        assert "{" not in counters and "elapsed" not in counters, counters
        assert len(counters.split()) <= 6 and len(counters) <= 80, counters
