"""`packyard up` and `packyard demo` on embedded defaults: real Redis, real workers, clean shutdown."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from gitutil import make_worktree_repo

EMBEDDED_UNSET = ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL")


@pytest.fixture
def embedded_env(pk):
    """Environment with only a state dir: packyard must bring up Redis and SQLite itself."""
    state = Path(tempfile.mkdtemp(prefix="pku-", dir="/tmp"))
    env = pk.cli_env(PACKYARD_STATE_DIR=str(state))
    for key in EMBEDDED_UNSET:
        env.pop(key, None)
    yield state, env
    shutil.rmtree(state, ignore_errors=True)


def group_alive(pgid: int) -> str:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.strip()


def test_up_runs_jobs_and_stops_cleanly_on_ctrl_c(embedded_env, tmp_path, pk):
    state, env = embedded_env
    up = subprocess.Popen(["packyard", "up"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        banner = up.stdout.readline()
        assert banner.startswith("packyard up:"), banner
        pids = [int(p) for p in re.findall(r"pid (\d+)", banner)]
        assert len(pids) == 2  # worker, beat
        assert (state / "redis.sock").exists() and (state / "packyard.db").exists()

        repo = make_worktree_repo(tmp_path)
        out = subprocess.run(["packyard", "submit", "verify_repo", "--repo", str(repo), "--wait", "--timeout", "90"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout[out.stdout.index("{"):])["state"] == "SUCCESS"
        status = subprocess.run(["packyard", "status"], env=env, capture_output=True, text=True, timeout=60)
        assert "SUCCESS" in status.stdout and "verify_repo" in status.stdout

        up.send_signal(signal.SIGINT)  # what Ctrl-C does
        rest, _ = up.communicate(timeout=60)
        assert up.returncode == 0, rest
        assert "packyard up: stopped" in rest
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    for pid in pids:
        assert group_alive(pid) == "", f"process group {pid} outlived `packyard up`"
    assert not (state / "redis.sock").exists()


def test_demo_runs_the_main_job(embedded_env, pk):
    state, env = embedded_env
    out = subprocess.run(["packyard", "demo"], env=env, cwd=state, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("(as expected)") == 3
    table = out.stdout[out.stdout.index("job  task id"):]
    assert table.count("SUCCESS") == 2 and table.count("FAILURE") == 1
    assert not (state / "redis.sock").exists()  # Redis stopped again

    status = subprocess.run(["packyard", "status", "--json"], env=env, cwd=state, capture_output=True, text=True,
                            timeout=60)
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    assert sorted(r["state"] for r in rows) == ["FAILURE", "SUCCESS", "SUCCESS"]
    assert all(r["worker"] and r["pid"] for r in rows)  # run by the worker processes
    failed = next(r for r in rows if r["state"] == "FAILURE")
    assert "corrupted.git" in failed["error"]
