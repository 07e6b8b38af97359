"""The nightly window end to end: a real `celery beat` opens it, real workers plan and repack a dozen
repositories built with git, never more than N maintenance jobs at once, each job carrying its reasons;
then a real `packyard metrics` scrape shows the jobs' counts and durations.

The fleet runs against its own Redis server and SQLite database (not the session's), so the session
worker — which has default settings — cannot take any of its jobs. Until the repack engine's task is
merged, ``packyard.repack`` is the git-backed stand-in in workers_testtasks.py (the real task replaces
it without a change here).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from gitutil import commit_blobs, git

N = 2            # PACKYARD_MAINTENANCE_CONCURRENCY for the fleet
HOLD = 1.5       # seconds the repack stand-in holds its slot (the real repack takes what it takes)
EXPECTED = {     # repository -> (task, mode) the window must queue; every other repository: no job
    "loose-a": ("packyard.repack", "loose"),
    "loose-b": ("packyard.repack", "loose"),
    "geometric": ("packyard.repack", "geometric"),
    "full": ("packyard.repack", "full"),
    "leftovers": ("packyard.gc", None),
}


class Fleet:
    def __init__(self, pk: Any, base: Path) -> None:
        from packyard.workers.embedded import EmbeddedRedis
        from packyard.workers.records import upgrade_database
        from packyard.workers.settings import Settings

        self.pk = pk
        self.state = Path(tempfile.mkdtemp(prefix="pkn-", dir="/tmp"))
        self.redis = EmbeddedRedis(self.state).start()
        now = time.gmtime()
        self.env = {
            "PACKYARD_STATE_DIR": str(self.state), "PACKYARD_REDIS_URL": f"unix://{self.state / 'redis.sock'}",
            "PACKYARD_DATABASE_URL": f"sqlite:///{self.state / 'packyard.db'}", "PACKYARD_LOG_FORMAT": "json",
            # the window opened this minute: a beat started now opens it at once (and not again today)
            "PACKYARD_MAINTENANCE_CRON": f"{now.tm_min} {now.tm_hour} * * *",
            "PACKYARD_MAINTENANCE_WINDOW": "3600", "PACKYARD_MAINTENANCE_CONCURRENCY": str(N),
            "PACKYARD_MAINTENANCE_TICK": "1", "PACKYARD_MAINTENANCE_JITTER": "0.3",
            "PACKYARD_PLAN_AFTER_INGESTS": "3", "PACKYARD_NIGHTLY_REPOS": "",
            # the fleet's repositories live under ``base``: its only storage root
            "PACKYARD_STORAGE_ROOTS": f"fleet={base}", "PACKYARD_INCOMING_DIR": str(self.state / "incoming"),
            # the pack rules only: the commit-graph and pack-refs reasons (issue 19, tests/workers/test_serving.py)
            # would plan a loose repack for every repository git built without a graph
            "PACKYARD_MAINTENANCE_SKIP_COMMIT_GRAPH": "1", "PACKYARD_MAINTENANCE_SKIP_PACK_REFS": "1",
        }
        self.settings = Settings.from_env(self.env)
        self.url = self.settings.database_url
        upgrade_database(self.settings)
        self.base = base
        self.children: list[Any] = []
        self.workers_started = False

    def start_workers(self, count: int = 2) -> None:
        saved = os.environ.get("PACKYARD_TEST_REPACK_HOLD")
        os.environ["PACKYARD_TEST_REPACK_HOLD"] = str(HOLD)
        try:
            workers = [self.pk.WorkerProcess(self.settings, f"fleet{i}-{os.getpid()}@%h", self.state / f"w{i}.log")
                       for i in range(count)]
        finally:
            os.environ.pop("PACKYARD_TEST_REPACK_HOLD") if saved is None else os.environ.update(
                PACKYARD_TEST_REPACK_HOLD=saved)
        self.children += workers
        self.workers_started = True
        # ping through the fleet's broker, not the session's
        from celery import Celery

        probe = Celery(broker=self.settings.broker_url)
        try:
            host = __import__("socket").gethostname()
            want = {w.name.replace("%h", host) for w in workers}
            self.pk.wait_until(lambda: want <= {n for r in (probe.control.ping(timeout=0.5) or []) for n in r}, 90,
                               what="the fleet's workers to answer a ping")
        finally:
            probe.close()

    def start_beat(self) -> Any:
        from packyard.workers.cli.children import Child, beat_argv, child_env

        log = open(self.state / "beat.log", "ab")
        beat = Child("beat", beat_argv(self.settings), child_env(self.settings), stdout=log)
        beat.log = log
        self.children.append(beat)
        return beat

    def cli(self, *args: str, timeout: float = 120) -> Any:
        import subprocess

        return subprocess.run(["packyard", *args], env=self.pk.cli_env(**self.env), capture_output=True, text=True,
                              timeout=timeout)

    def jobs(self, *kinds: str) -> list[Any]:
        from packyard.workers.records import Job, Repository, session_scope

        with session_scope(self.url) as s:
            q = select(Job, Repository.path).outerjoin(Repository, Job.repo_id == Repository.id).order_by(Job.id)
            if kinds:
                q = q.where(Job.kind.in_(kinds))
            return [(job, path) for job, path in s.execute(q)]

    def stop(self) -> None:
        for child in reversed(self.children):
            if hasattr(child, "child"):
                child.stop()
            else:
                child.stop(timeout=10)
                child.log.close()
        self.redis.stop()
        shutil.rmtree(self.state, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(pk, tmp_path_factory):
    f = Fleet(pk, tmp_path_factory.mktemp("fleet"))
    try:
        yield f
    finally:
        f.stop()


def bare(base: Path, name: str) -> Path:
    path = base / f"{name}.git"
    git("init", "-q", "--bare", str(path))
    return path


def small_pushes(repo: Path, scratch: Path, count: int, tip: str) -> str:
    """``count`` pushes of one commit each, every one its own pack (git repack without -a)."""
    for _ in range(count):
        tip = commit_blobs(repo, scratch, "main", 1, parent=tip)
        git("repack", "-q", "-d", git_dir=repo)
    return tip


def build_repositories(base: Path) -> dict[str, Path]:
    """A dozen repositories in different states, built with git."""
    scratch = base / "scratch"
    repos = {}
    for name, files in (("loose-a", 1600), ("loose-b", 1300), ("disabled", 1600), ("unregistered", 1600)):
        repos[name] = r = bare(base, name)
        commit_blobs(r, scratch, "main", files)                # every object loose, all reachable
    for name in ("geometric", "full"):
        repos[name] = r = bare(base, name)
        tip = commit_blobs(r, scratch, "main", 200)
        git("repack", "-q", "-a", "-d", git_dir=r)             # one big pack ...
        small_pushes(r, scratch, 4, tip)                       # ... and four small pushes after it
    for name in ("fresh-a", "fresh-b", "leftovers"):
        repos[name] = r = bare(base, name)
        tip = commit_blobs(r, scratch, "main", 20)
        git("repack", "-q", "-a", "-d", git_dir=r)
    repos["keep"] = r = bare(base, "keep")
    tip = commit_blobs(r, scratch, "main", 200)
    git("repack", "-q", "-a", "-d", git_dir=r)
    (idx,) = (r / "objects" / "pack").glob("*.idx")
    idx.with_suffix(".keep").write_text("pinned by the test\n")
    small_pushes(r, scratch, 1, tip)                           # a .keep pack and one small pack
    # An ingest that died two hours ago left its quarantine behind.
    q = repos["leftovers"] / "objects" / "incoming-deadbeef"
    q.mkdir()
    (q / "tmp_pack_x").write_bytes(b"partial")
    then = time.time() - 7200
    for p in (q / "tmp_pack_x", q):
        os.utime(p, (then, then))
    repos["empty"] = bare(base, "empty")
    repos["missing"] = base / "missing.git"                    # registered, then deleted from disk
    return repos


class InFlight(threading.Thread):
    """Samples, every 20 ms, the fleet's taken slots (Redis) and its STARTED maintenance jobs (records)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.stopped = threading.Event()
        self.max_slots = self.max_started = self.samples = 0

    def run(self) -> None:
        from sqlalchemy import func

        from packyard.workers.records import Job, JobState, session_scope
        from packyard.workers.slots import fleet_slots

        slots = fleet_slots(self.fleet.settings)
        while not self.stopped.wait(0.02):
            taken = slots.in_flight()
            with session_scope(self.fleet.url) as s:
                started = s.scalar(select(func.count()).select_from(Job)
                                   .where(Job.kind.in_(["packyard.repack", "packyard.gc"]))
                                   .where(Job.state == JobState.STARTED))
            self.max_slots, self.max_started = max(self.max_slots, taken), max(self.max_started, started)
            self.samples += 1


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    depth = best = 0
    for _, step in events:
        depth += step
        best = max(best, depth)
    return best


def scrape(port: int) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.slow
def test_window_plans_and_repacks_a_fleet_within_the_cap(fleet, pk):
    from packyard.workers.records import Repository, session_scope
    from packyard.workers.records.registry import from_epoch

    repos = build_repositories(fleet.base)
    registered = {k: v for k, v in repos.items() if k != "unregistered"}
    for name, path in registered.items():
        if name != "missing":
            out = fleet.cli("repos", "add", "--repo", str(path))
            assert out.returncode == 0 and "registered" in out.stdout, out.stderr
    out = fleet.cli("repos", "add", "--repo", str(repos["missing"]))
    assert out.returncode == 1 and "NotARepositoryError" in out.stderr       # add checks the path ...
    from packyard.workers.records import registry
    registry.register(fleet.url, repos["missing"])                           # ... a repository deleted later
    assert fleet.cli("repos", "disable", "--repo", str(repos["disabled"])).returncode == 0
    # What the records say of earlier maintenance: fully repacked yesterday / an hour ago.
    now = time.time()
    history = {"geometric": now - 86400, "fresh-a": now - 3600, "fresh-b": now - 3600, "keep": now - 3600,
               "leftovers": now - 3600}
    with session_scope(fleet.url) as s:
        for name, at in history.items():
            s.execute(update(Repository).where(Repository.path == str(repos[name].resolve()))
                      .values(last_full_repack_at=from_epoch(at), last_repack_at=from_epoch(at)))

    fleet.start_workers(2)
    sampler = InFlight(fleet)
    sampler.start()
    t0 = time.time()
    beat = fleet.start_beat()

    def done():
        if beat.poll() is not None:
            raise AssertionError(f"beat exited: {(fleet.state / 'beat.log').read_text()[-2000:]}")
        maint = fleet.jobs("packyard.repack", "packyard.gc")
        rounds = fleet.jobs("packyard.plan_maintenance")
        return (len(maint) >= len(EXPECTED) and all(j.state.finished for j, _ in maint) and rounds
                and all(j.state.finished for j, _ in rounds) and (rounds[-1][0].counters or {}).get("waiting") == 0)
    try:
        pk.wait_until(done, 240, interval=0.25, what="the window to plan and finish every maintenance job")
        time.sleep(1.0)  # nothing more arrives: no late round, no extra job
        sampler.stopped.set()
        sampler.join()
    finally:
        sampler.stopped.set()
    maint = fleet.jobs("packyard.repack", "packyard.gc")
    rounds = [j for j, _ in fleet.jobs("packyard.plan_maintenance")]

    # Exactly the expected jobs, all successful, each with its plan, statistics and reasons.
    by_repo = {Path(path).name.removesuffix(".git"): job for job, path in maint}
    assert len(maint) == len(EXPECTED) and set(by_repo) == set(EXPECTED), [(j.kind, p) for j, p in maint]
    for name, (kind, mode) in EXPECTED.items():
        job = by_repo[name]
        assert job.kind == kind and job.state.value == "SUCCESS", (name, job.error)
        plan = job.params["plan"]
        assert plan["trigger"] == "window" and plan["outcome"] == "queued" and plan["job"] == job.task_id
        assert plan["reasons"] and plan["stats"]["packs"] is not None
        assert 1 <= plan["in_flight"] <= N
        if mode:
            assert job.params["mode"] == mode == plan["action"]
    assert "loose objects" in by_repo["loose-a"].params["plan"]["reasons"][0]
    assert "outside the geometric progression" in by_repo["geometric"].params["plan"]["reasons"][0]
    assert any("no full repack on record" in r for r in by_repo["full"].params["plan"]["reasons"])
    assert "abandoned incoming-* quarantine" in by_repo["leftovers"].params["plan"]["reasons"][0]
    assert by_repo["full"].params["expire"] == 14 * 86400 and by_repo["geometric"].params["factor"] == 2

    # Never more than N in flight: slots and running jobs sampled throughout, and the rows' own times.
    assert sampler.samples > 50
    assert sampler.max_slots <= N and sampler.max_started <= N, (sampler.max_slots, sampler.max_started)
    assert max(j.params["plan"]["in_flight"] for j, _ in maint) == N     # the cap was reached, not just respected
    intervals = [(j.started_at.timestamp(), j.finished_at.timestamp()) for j, _ in maint]
    assert max_overlap(intervals) <= N
    assert len(rounds) >= 2 and sum(r.counters["queued"] for r in rounds) == len(EXPECTED)  # waited for slots
    assert all(r.params.get("trigger") == "window" for r in rounds) and rounds[0].queued_at.timestamp() - t0 < 60

    # Every other registered repository has its plan recorded, "nothing" included; none is left unplanned.
    rows = {Path(r["path"]).name.removesuffix(".git"): r for r in registry.list_repositories(fleet.url)}
    assert "unregistered" not in rows
    for name in ("fresh-a", "fresh-b", "keep", "empty"):
        plan = rows[name]["last_plan"]
        assert plan["outcome"] == "nothing" and plan["action"] == "nothing" and plan["reasons"], (name, plan)
    assert rows["keep"]["last_plan"]["stats"]["keep_packs"] == 1
    assert rows["missing"]["last_plan"]["outcome"] == "unreadable"
    assert "NotARepositoryError" in rows["missing"]["last_plan"]["error"]
    assert rows["disabled"]["last_plan"] is None and rows["disabled"]["last_planned_at"] is None
    assert all(rows[n]["last_planned_at"] is not None for n in registered if n != "disabled")

    # The registry moved as the repacks landed.
    for name in ("loose-a", "loose-b", "geometric", "full"):
        assert rows[name]["last_repack_at"] is not None and rows[name]["ingests_since_repack"] == 0
    assert rows["full"]["last_full_repack_at"] is not None and rows["loose-a"]["last_full_repack_at"] is None

    # git is the oracle: every repository is intact, and the jobs did what their plans said.
    for name, path in repos.items():
        if name != "missing":
            git("fsck", "--full", "--no-dangling", git_dir=path)
    from packyard.store.maintenance.planning.stats import gather_stats
    for name in ("loose-a", "loose-b"):
        assert gather_stats(repos[name]).loose_estimate < 1024
    assert len(gather_stats(repos["full"]).packs) == 1
    assert len(gather_stats(repos["geometric"]).packs) < 5
    assert not (repos["leftovers"] / "objects" / "incoming-deadbeef").exists()
    assert gather_stats(repos["disabled"]).loose_estimate >= 1024   # left alone
    assert gather_stats(repos["unregistered"]).loose_estimate >= 1024

    # A scrape of the metrics endpoint shows the jobs' counts and durations.
    from packyard.workers.cli.children import Child

    port = pk.free_port()
    log = open(fleet.state / "metrics.log", "wb")
    exporter = Child("metrics", ["packyard", "metrics", "--port", str(port)], pk.cli_env(**fleet.env), stdout=log)
    try:
        samples = pk.wait_until(lambda: _try_scrape(port, exporter), 30, interval=0.2, what="the metrics endpoint")
    finally:
        exporter.stop(timeout=10)
        log.close()
    assert samples[("packyard_jobs", (("kind", "packyard.repack"), ("state", "SUCCESS")))] == 4
    assert samples[("packyard_jobs", (("kind", "packyard.gc"), ("state", "SUCCESS")))] == 1
    # The histogram is the rows' durations, whatever the repack implementation took.
    durations = [j.duration_ms for j, _ in maint if j.kind == "packyard.repack"]
    count = samples[("packyard_job_duration_seconds_count", (("kind", "packyard.repack"),))]
    total = samples[("packyard_job_duration_seconds_sum", (("kind", "packyard.repack"),))]
    assert count == 4 and total == pytest.approx(sum(durations) / 1000) and total > 0
    for le in ("1.0", "2.5", "5.0"):
        want = sum(1 for d in durations if d <= float(le) * 1000)
        assert samples[("packyard_job_duration_seconds_bucket", (("kind", "packyard.repack"), ("le", le)))] == want
    assert samples[("packyard_job_duration_seconds_bucket", (("kind", "packyard.repack"), ("le", "+Inf")))] == 4
    acquired = samples[("packyard_lock_events_total", (("event", "acquired"), ("lease", "maintenance")))]
    assert acquired == len(EXPECTED)
    assert samples[("packyard_maintenance_jobs_in_flight", ())] == 0
    full = str(repos["full"].resolve())
    assert samples[("packyard_repository_packs", (("repo", full),))] == 1
    assert samples[("packyard_repository_last_full_repack_age_seconds", (("repo", full),))] < 300
    # Every plan that called for a job has had it land: none is still due.
    assert not any(v for (name, _), v in samples.items() if name == "packyard_repositories_maintenance_due")
    disabled = str(repos["disabled"].resolve())
    assert ("packyard_repository_packs", (("repo", disabled),)) not in samples   # disabled: not exported
    assert samples[("packyard_repositories", (("enabled", "false"),))] == 1


def _try_scrape(port: int, exporter: Any) -> dict[str, Any] | None:
    if exporter.poll() is not None:
        raise AssertionError("packyard metrics exited")
    try:
        return scrape(port)
    except OSError:
        return None


def test_every_third_ingest_plans_the_repository(fleet, pk):
    """PACKYARD_PLAN_AFTER_INGESTS=3: the third ingest since the last repack queues the planner for that repo."""
    import base64

    repo = bare(fleet.base, "pushed")
    if not fleet.workers_started:
        fleet.start_workers(1)
    for n in range(4):  # four web edits (write_objects), each an ingest
        objects = [{"type": "blob", "data": base64.b64encode(f"edit {n}\n".encode()).decode()}]
        out = fleet.cli("submit", "write_objects", "--repo", str(repo), "-p", f"objects={json.dumps(objects)}",
                        "--wait", "--timeout", "90")
        assert out.returncode == 0, out.stdout + out.stderr
    resolved = str(repo.resolve())

    def plans():
        found = [j for j, p in fleet.jobs("packyard.plan_maintenance") if p == resolved]
        return found if found and all(j.state.finished for j in found) else None
    found = pk.wait_until(plans, 60, what="the ingest-triggered plan")
    time.sleep(1.0)  # a (wrong) second plan would have been queued by now
    found = plans()
    assert len(found) == 1, "one plan at the third ingest, none at the fourth"
    (plan,) = found
    assert plan.params == {"trigger": "ingests"} and plan.state.value == "SUCCESS"
    assert plan.counters["action"] == "nothing" and plan.counters["outcome"] == "nothing"
    from packyard.workers.records import registry
    row = registry.get(fleet.url, repo)
    assert row["ingests_since_repack"] == 4 and row["last_plan"]["trigger"] == "ingests"
    assert row["last_plan"]["stats"]["ingests_since_repack"] in (3, 4)  # the fourth may land before the plan runs
    git("fsck", "--full", git_dir=repo)
