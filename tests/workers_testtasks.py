"""Test-only tasks, loaded into the test worker with `celery worker --include workers_testtasks`.

They follow the contract of workers/tasks/__init__.py exactly (command function + ~5-line task),
and exercise what verify_repo cannot: retries on a lost lease, PROGRESS states, lease events.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from packyard.store.errors import CorruptObjectError, LockLostError
from packyard.store.progress import Progress
from packyard.workers.app import app
from packyard.workers.settings import get_settings
from packyard.workers.tasks.base import PackyardTask


def flaky_command(repo: str, key: str, failures: int, *, progress: Progress | None = None) -> dict[str, Any]:
    """Raises LockLostError for the first ``failures`` attempts (counted in Redis), then succeeds."""
    from packyard.workers.locks import redis_client

    attempts = int(redis_client(get_settings()).incr(key))
    if attempts <= failures:
        raise LockLostError(f"lease lost on attempt {attempts}", path=repo)
    return {"counters": {"attempts": attempts}}


def corrupt_command(repo: str, *, progress: Progress | None = None) -> dict[str, Any]:
    raise CorruptObjectError("bad object for the test", path=repo, oid="ab" * 20)


def slow_command(repo: str, steps: int, key: str | None = None, *, progress: Progress | None = None) -> dict[str, Any]:
    if key is not None:   # count the runs (a duplicate delivery must not run the command again)
        from packyard.workers.locks import redis_client

        redis_client(get_settings()).incr(key)
    for i in range(steps):
        if progress:
            progress("stepping", i, steps)
        time.sleep(0.1)
    if progress:
        progress("stepping", steps, steps)
    return {"counters": {"steps": steps}}


@app.task(name="packyard.test_flaky", bind=True, base=PackyardTask, retry_backoff_base=0.05)
def test_flaky(self: PackyardTask, repo: str, key: str, failures: int) -> dict[str, Any]:
    return self.call(flaky_command, repo, key, failures)


@app.task(name="packyard.test_corrupt", bind=True, base=PackyardTask, retry_backoff_base=0.05)
def test_corrupt(self: PackyardTask, repo: str) -> dict[str, Any]:
    return self.call(corrupt_command, repo)


def slow_ref_command(repo: str, ref: str, new: str, steps: int, *, lease: Any,
                     progress: Progress | None = None) -> dict[str, Any]:
    """``steps`` tenths of a second of work, then move ``ref`` to ``new`` under the lease's fencing token."""
    from packyard.store import RefUpdate, Repository

    for i in range(steps):
        if progress:
            progress("stepping", i, steps)
        time.sleep(0.1)
    r = Repository.open(repo)
    lease.check()
    r.refs.update([RefUpdate(ref, r.refs.read(ref), bytes.fromhex(new))], fence_token=lease.token)
    return {"counters": {"steps": steps, "token": lease.token}}


@app.task(name="packyard.test_slow", bind=True, base=PackyardTask, progress_interval=0.05)
def test_slow(self: PackyardTask, repo: str, steps: int, key: str | None = None) -> dict[str, Any]:
    with self.repo_lock(repo) as lease:
        self.bind_log(step_count=steps)
        result = self.call(slow_command, repo, steps, key)
        lease.check()
        return result


@app.task(name="packyard.test_slow_ref", bind=True, base=PackyardTask, progress_interval=0.05,
          retry_backoff_base=0.5)
def test_slow_ref(self: PackyardTask, repo: str, ref: str, new: str, steps: int) -> dict[str, Any]:
    with self.repo_lock(repo) as lease:
        return self.call(slow_ref_command, repo, ref, new, steps, lease=lease)


@app.task(name="packyard.test_locked", bind=True, base=PackyardTask, retry_backoff_base=0.2)
def test_locked(self: PackyardTask, repo: str) -> dict[str, Any]:
    with self.repo_lock(repo, wait=0.2) as lease:
        lease.check()
        return {"counters": {"token": lease.token}}


@app.task(name="packyard.test_race", bind=True, base=PackyardTask)
def test_race(self: PackyardTask, repo: str) -> dict[str, Any]:
    self.record_race("pack_vanished", repo, pack="pack-1234.pack", retried=True)
    return {"counters": {"races": 1}}


def stuck_command(repo: str, seconds: float, *, progress: Progress | None = None) -> dict[str, Any]:
    """Works (sleeps) for ``seconds``: longer than its kind's soft limit (PACKYARD_TIME_LIMITS in conftest)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return {"counters": {"finished": 1}}


def unstoppable_command(repo: str, seconds: float, *, progress: Progress | None = None) -> dict[str, Any]:
    """Like stuck_command, but swallows the soft limit (as a C loop would not see it): only the hard limit stops it."""
    from celery.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            continue
    return {"counters": {"finished": 1}}


@app.task(name="packyard.test_stuck", bind=True, base=PackyardTask)
def test_stuck(self: PackyardTask, repo: str, seconds: float) -> dict[str, Any]:
    with self.repo_lock(repo):
        return self.call(stuck_command, repo, seconds)


@app.task(name="packyard.test_unstoppable", bind=True, base=PackyardTask)
def test_unstoppable(self: PackyardTask, repo: str, seconds: float) -> dict[str, Any]:
    with self.repo_lock(repo):
        return self.call(unstoppable_command, repo, seconds)


# -- a stand-in for packyard.repack until the repack engine's task is merged -----------------------
# The maintenance planner queues "packyard.repack" by name. Where the real task exists (the module
# packyard.workers.tasks.repack), it is what runs and this stand-in is not registered; until then the
# stand-in does the repack with git (the oracle) under the maintenance lease, so the nightly-window
# test runs end to end. PACKYARD_TEST_REPACK_HOLD keeps it busy a little longer, so that the fleet's
# concurrency cap (not the speed of git on tiny repositories) is what the test observes.
import importlib.util  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402

REAL_REPACK = importlib.util.find_spec("packyard.workers.tasks.repack") is not None


def git_repack_command(repo: str, mode: str, factor: int, fence: Callable[[], None], *,
                       progress: Progress | None = None) -> dict[str, Any]:
    def packs() -> int:
        return len([n for n in os.listdir(os.path.join(repo, "objects", "pack")) if n.endswith(".idx")])

    argv = {"full": ["repack", "-a", "-d", "-q"], "geometric": ["repack", f"--geometric={factor}", "-d", "-q"],
            "loose": ["repack", "-d", "-q"]}[mode]
    before = packs()
    time.sleep(float(os.environ.get("PACKYARD_TEST_REPACK_HOLD", "0")))
    fence()
    subprocess.run(["git", "--git-dir", repo, *argv], check=True, capture_output=True)
    return {"counters": {"packs_before": before, "packs_after": packs()}}


if not REAL_REPACK:
    from packyard.workers.locks import LeaseKind

    @app.task(name="packyard.repack", bind=True, base=PackyardTask)
    def repack_standin(self: PackyardTask, repo: str, mode: str = "full", factor: int = 2,
                       expire: float | None = None, preserve_for: float | None = None) -> dict[str, Any]:
        with self.repo_lock(repo, kind=LeaseKind.MAINTENANCE) as lease:
            return self.call(git_repack_command, repo, mode, factor, lease.check)
