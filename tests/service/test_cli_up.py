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

from gitutil import CORPUS, git, make_worktree_repo

CORPUS_REFS = CORPUS / "git-v1.0.0.refs"

# The session's services and confinement dirs: `packyard up`/`demo` must bring up their own.
EMBEDDED_UNSET = ("PACKYARD_REDIS_URL", "PACKYARD_DATABASE_URL", "PACKYARD_STORAGE_ROOTS", "PACKYARD_INCOMING_DIR")


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


@pytest.mark.slow
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

        # The embedded default storage root: <state dir>/repositories.
        repo = make_worktree_repo(state / "repositories")
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


KINDS = ("index_pack", "unpack_objects", "import_tree", "write_objects", "verify_repo")


def run_demo(env: dict[str, str], cwd: Path) -> str:
    out = subprocess.run(["packyard", "demo"], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("(as expected)") == 7 and "NOT as expected" not in out.stdout
    assert "write_objects ids match the ids git computed" in out.stdout
    table = out.stdout[out.stdout.index("job  task id"):out.stdout.index("[demo]   refs/heads/")]
    rows = [line for line in table.splitlines()[2:] if line.strip()]
    assert len(rows) == 7 and sum("SUCCESS" in r for r in rows) == 6 and sum("FAILURE" in r for r in rows) == 1
    assert all(any(f" {k} " in r for r in rows) for k in KINDS)
    thin = [r for r in rows if " index_pack " in r and "thin_bases_added=0" not in r]
    assert len(thin) == 1, table  # the thin push had its bases appended
    assert "git fsck --full hosted.git: passed" in out.stdout
    assert "7/7 jobs as expected, all checks passed" in out.stdout
    # The nightly maintenance step: plans with their reasons for repositories in different states.
    assert "[demo] nightly maintenance: the plan each registered repository would get now, and why" in out.stdout
    assert "[demo]   busy-loose.git: LOOSE" in out.stdout and "[demo]   many-pushes.git: FULL" in out.stdout
    assert "because ~" in out.stdout and "no full repack on record (at most every 5.0 days)" in out.stdout
    # The short race: its counts, no lost read.
    assert "[demo] race: readers against repacks and pushes" in out.stdout
    race = out.stdout[out.stdout.index("[demo]   packyard race "):]
    assert re.search(r"lookups\s+[\d,]+ \(reads", race) and re.search(r"lost\s+0 ", race), race
    assert "verdict   PASS: no lost reads" in race, race
    return out.stdout


@pytest.mark.slow
def test_demo_runs_the_main_job(embedded_env, pk):
    """Twice on one state dir: first without the corpus (git makes the history), then with it."""
    state, env = embedded_env
    first = run_demo({**env, "PACKYARD_CORPUS": str(state / "no-corpus-here")}, state)
    assert "no corpus found" in first
    assert not (state / "redis.sock").exists()  # Redis stopped again
    hosted = state / "demo" / "repositories" / "hosted.git"   # inside the storage root the demo registers
    git("fsck", "--full", git_dir=hosted)  # the oracle, not only the demo's word

    second = run_demo(env, state)  # state dir reused: Redis, database, logs, demo/ from the first run
    assert not (state / "redis.sock").exists()
    git("fsck", "--full", git_dir=hosted)
    if CORPUS_REFS.exists():
        assert "from corpus" in second
        # main = the corpus tip + 3 thin-push commits + 2 small-push commits
        assert git("rev-parse", "main~5", git_dir=hosted).decode().strip() == CORPUS_REFS.read_text().split()[0]

    status = subprocess.run(["packyard", "status", "--json", "--limit", "200"], env=env, cwd=state,
                            capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in status.stdout.splitlines()]
    # The short race's own jobs (pushes and repacks of race.git, and the run itself), all successful.
    race = [r for r in rows if (r["repo"] or "").endswith("/race.git")]
    assert sum(r["kind"] == "packyard.race" for r in race) == 2 and all(r["state"] == "SUCCESS" for r in race), race
    rows = [r for r in rows if r not in race]
    maintenance = {"packyard.plan_maintenance", "packyard.repack", "packyard.gc"}
    jobs = [r for r in rows if r["kind"] not in maintenance]
    assert len(jobs) == 14 and sorted(r["state"] for r in jobs).count("FAILURE") == 2   # 7 jobs per demo run
    assert {r["kind"] for r in rows} >= maintenance - {"packyard.gc"}, "the demo's maintenance window ran"
    assert all(r["state"] == "SUCCESS" for r in rows if r["kind"] in maintenance), rows
    assert all(r["worker"] and r["pid"] for r in rows)  # run by the worker processes
    for failed in (r for r in rows if r["state"] == "FAILURE"):
        assert "corrupted.git" in failed["error"] and failed["kind"] == "packyard.verify_repo"


@pytest.mark.slow
def test_down_stops_the_embedded_redis_only_when_nothing_uses_it(embedded_env, tmp_path, pk):
    """`packyard submit` leaves an embedded Redis running (with the job queued in it); `packyard down`
    refuses while a job is queued or a client is connected, --force stops it, and a second down is a no-op."""
    import redis as redis_py

    state, env = embedded_env
    repo = make_worktree_repo(state / "repositories" / "r")
    sub = subprocess.run(["packyard", "submit", "verify_repo", "--repo", str(repo)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0, sub.stderr
    pid = int((state / "redis" / "redis.pid").read_text())
    sock = state / "redis.sock"
    refused = subprocess.run(["packyard", "down"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    assert "1 queued job message(s)" in refused.stderr, refused.stderr
    client = redis_py.Redis(unix_socket_path=str(sock))
    assert client.ping(), "a refused down leaves the server running"
    client.delete(*[k for k in client.scan_iter() if client.type(k) == b"list"])   # drain the queue
    refused = subprocess.run(["packyard", "down"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "1 other client(s) connected" in refused.stderr, refused.stderr
    client.close()
    out = subprocess.run(["packyard", "down"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"stopped the embedded Redis (pid {pid})" in out.stdout
    pk.wait_until(lambda: not group_alive(pid) and not os.path.exists(f"/proc/{pid}"), 10, what="redis to exit")
    assert not sock.exists()
    again = subprocess.run(["packyard", "down"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no embedded Redis running" in again.stdout
    # --force: a server with a queued job is stopped anyway, and says what it keeps for the next start.
    sub = subprocess.run(["packyard", "submit", "verify_repo", "--repo", str(repo)], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0, sub.stderr
    forced = subprocess.run(["packyard", "down", "--force"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert "still there for the next start: 1 queued job message(s)" in forced.stdout, forced.stdout
    assert not sock.exists()
    # The append-only file kept it: the next server starts with the job still queued.
    from packyard.workers.embedded import EmbeddedRedis

    server = EmbeddedRedis(state).start()
    try:
        with server.client() as c:
            assert sum(c.llen(k) for k in c.scan_iter(_type="list")) == 1
    finally:
        server.stop()


@pytest.mark.slow
def test_up_creates_its_dirs_and_starts_a_dead_redis_again(embedded_env, tmp_path, pk):
    """The first `submit index_pack` finds the incoming dir and the storage root `up` created; an embedded
    Redis killed under `up` is started again on the same socket and AOF, and jobs run again."""
    import threading

    from gitutil import _all_as_pack

    state, env = embedded_env
    repos, incoming = state / "repositories", state / "incoming"
    assert not repos.exists() and not incoming.exists()
    up = subprocess.Popen(["packyard", "up", "--no-beat"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(up.stdout.readline, "")), daemon=True)
    reader.start()

    def submit(*argv: str) -> dict:
        out = subprocess.run(["packyard", "submit", *argv, "--wait", "--timeout", "90"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout[out.stdout.index("{"):])

    try:
        pk.wait_until(lambda: any("created" in line for line in lines), 60, what="up's banner")
        assert f"packyard up: created {repos}, {incoming}\n" in lines, lines
        assert repos.is_dir() and incoming.is_dir()
        (incoming / "push.pack").write_bytes(_all_as_pack(make_worktree_repo(tmp_path / "src")))
        init = subprocess.run(["packyard", "init", "--repo", str(repos / "new.git")], env=env,
                              capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        assert submit("index_pack", "--repo", str(repos / "new.git"), "-p", "pack=push.pack")["state"] == "SUCCESS"

        old = int((state / "redis" / "redis.pid").read_text())
        os.kill(old, signal.SIGKILL)
        restarted = pk.wait_until(lambda: next((line for line in lines if "started it again" in line), None), 60,
                                  what="up to start Redis again")
        new = int(re.search(r"\(pid (\d+)\)", restarted).group(1))
        assert new != old and int((state / "redis" / "redis.pid").read_text()) == new
        assert f"on {state / 'redis.sock'} with its data in {state / 'redis'}" in restarted
        # The worker reconnects by itself; a job queued now runs.
        assert submit("verify_repo", "--repo", str(repos / "new.git"))["state"] == "SUCCESS"
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, lines
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
    reader.join(10)
    assert "packyard up: stopped\n" in lines
    assert not (state / "redis.sock").exists()
    pk.wait_until(lambda: not os.path.exists(f"/proc/{new}"), 10, what="the restarted Redis to exit with up")
