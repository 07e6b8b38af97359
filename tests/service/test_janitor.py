"""packyard janitor: leftovers judged by the job that owns them, on real workers, Redis and git.

* the judgement itself, table-tested with real owner records and real job rows (dead process,
  finished job while its process lives on, pending job, unknown job young and old, no record);
* leftovers of an ingest, a bulk write and a repack whose worker processes were SIGKILLed are
  removed by owner (each with its reason, on a ``packyard.janitor`` job row), while the same three
  jobs paused (SIGSTOP) in another worker keep every file; resumed, they finish, git fsck passes;
* the beat task runs the same on the session worker.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import pytest

from gitutil import commit_objects, git, make_worktree_repo
from packyard.store import owner as store_owner
from packyard.store.leftovers import Kind, Leftover, Verdict
from packyard.workers.commands.janitor import Decision, JobOracle, judge
from procutil import stopped


def dead_owner(job: str | None) -> store_owner.Owner:
    """The owner record of a process that has exited (a real pid, now gone)."""
    code = ("import sys; from packyard.store import owner; "
            "sys.stdout.write(owner.current_owner().encode().decode())")
    env = {**os.environ}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    rec = store_owner.Owner.decode(out.encode())
    assert rec is not None
    return replace(rec, job=job)


def test_judgement_by_owner_process_and_job(sqlite_url, redis_client):
    from packyard.workers.records import JobState, upgrade_database
    from packyard.workers.records.recorder import record_finished, record_queued, record_started
    from packyard.workers.settings import Settings

    upgrade_database(sqlite_url)
    settings = Settings.from_env({**os.environ, "PACKYARD_DATABASE_URL": sqlite_url})
    for tid, state in (("done", JobState.SUCCESS), ("broke", JobState.FAILURE)):
        record_started(sqlite_url, task_id=tid, kind="packyard.index_pack", repo=None, params=None, hostname="w",
                       pid=1)
        record_finished(sqlite_url, task_id=tid, kind="packyard.index_pack", repo=None, state=state, counters=None,
                        error=None, error_type=None)
    record_queued(sqlite_url, task_id="running", kind="packyard.write_objects", repo=None)
    record_started(sqlite_url, task_id="running", kind="packyard.write_objects", repo=None, params=None,
                   hostname="w", pid=1)
    meta = f"only-in-redis-{uuid.uuid4().hex[:6]}"
    redis_client.set(f"celery-task-meta-{meta}", json.dumps({"status": "SUCCESS"}), ex=60)
    oracle = JobOracle(settings, redis_client)
    me = store_owner.current_owner()
    elsewhere = replace(me, host="another-host.example", pid=4242)

    def decide(owner, age=5.0):
        alive = store_owner.liveness(owner) if owner is not None else None
        item = Leftover(Path("x.lock"), Kind.REF_CLAIM, owner, age, Verdict.KEEP_YOUNG, alive=alive)
        return judge(item, oracle, safety_age=3600)

    assert decide(dead_owner("running"))[0] is Decision.REMOVE            # its process is dead: a retry has its own
    assert "owner process dead" in decide(dead_owner("running"))[1]
    assert decide(replace(me, job="done")) == (Decision.REMOVE, f"job done finished "
                                                                f"({replace(me, job='done').describe()})")
    assert decide(replace(elsewhere, job="broke"))[0] is Decision.REMOVE
    assert decide(replace(me, job="running"))[0] is Decision.KEEP          # a live (or paused) job: never
    assert decide(replace(elsewhere, job="running"), age=10 ** 7)[0] is Decision.KEEP
    assert decide(replace(elsewhere, job=meta))[0] is Decision.REMOVE       # Redis's result says it finished
    assert decide(replace(elsewhere, job="nobody-knows"))[0] is Decision.KEEP
    assert decide(replace(elsewhere, job="nobody-knows"), age=7200)[0] is Decision.REMOVE
    assert decide(replace(me, job=None))[0] is Decision.KEEP
    assert decide(replace(elsewhere, job=None))[0] is Decision.AGE_RULES
    assert decide(None)[0] is Decision.AGE_RULES


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _jobs(celery_app, queue: str, repos: dict[str, Path], incoming: Path, tmp: Path) -> dict[str, object]:
    """One ingest (index_pack with a .keep), one bulk write and one full repack, each on its own repository."""
    objects, commit = commit_objects(tmp, f"janitor {queue}\n")
    pack = incoming / f"{queue}.pack"
    pack.write_bytes(git("pack-objects", "--revs", "--stdout", "-q", git_dir=tmp / "scratch.git",
                         input=f"{commit}\n".encode()))
    objects2, commit2 = commit_objects(tmp, f"bulk {queue}\n")
    return {
        "ingest": celery_app.send_task("packyard.index_pack", queue=queue, kwargs={
            "repo": str(repos["ingest"]), "pack": str(pack), "keep": "receive in progress"}),
        "bulk": celery_app.send_task("packyard.write_objects", queue=queue, kwargs={
            "repo": str(repos["bulk"]), "objects": objects2,
            "ref_updates": [{"ref": "refs/heads/bulk", "old": None, "new": commit2}]}),
        "repack": celery_app.send_task("packyard.repack", queue=queue, kwargs={
            "repo": str(repos["repack"]), "mode": "full"}),
    }


def leftovers(repo: Path) -> dict[str, list[str]]:
    objects = repo / "objects"
    return {
        "quarantines": sorted(p.name for p in objects.glob("incoming-*")),
        "keeps": sorted(p.name for p in (objects / "pack").glob("*.keep")),
        "tmp_objects": sorted(p.name for p in objects.glob("??/tmp_obj_*")),
        "markers": sorted(p.name for p in (repo / "packyard" / "batches").glob("*")),
        "pack_temps": sorted(p.name for p in (objects / "pack").glob("tmp_*")),
    }


FAULTS = ("index_pack.after_keep", "bulk.after_writeout", "repack.after_write")


@pytest.mark.slow
def test_leftovers_of_killed_jobs_go_by_owner_and_paused_jobs_keep_theirs(
        celery_app, pk, settings, migrated_db, store_root, incoming, tmp_path, monkeypatch):
    dead = {k: make_worktree_repo(store_root / f"dead-{k}") for k in ("ingest", "bulk", "repack")}
    live = {k: make_worktree_repo(store_root / f"live-{k}") for k in ("ingest", "bulk", "repack")}

    once = tmp_path / "once"
    once.mkdir()
    # 1. Three jobs caught at their fault point (SIGSTOP), then their whole worker -- main process and
    #    pool -- SIGKILLed at once, as a host crash does: nothing is redelivered to clean up after them.
    monkeypatch.setenv("PACKYARD_FAULT", ",".join(f"{f}:stop-once" for f in FAULTS))
    (tmp_path / "once-dead").mkdir()
    monkeypatch.setenv("PACKYARD_FAULT_ONCE_DIR", str(tmp_path / "once-dead"))
    q_dead = f"jan-dead-{uuid.uuid4().hex[:6]}"
    killer = pk.WorkerProcess(settings, f"{q_dead}-{os.getpid()}@%h", tmp_path / "dead.log", queues=(q_dead,),
                              concurrency=3)
    try:
        killer.wait_ready()
        dead_jobs = _jobs(celery_app, q_dead, dead, incoming, tmp_path / "d")
        pk.wait_until(lambda: all((tmp_path / "once-dead" / f).exists() for f in FAULTS), 90,
                      what="the three jobs to reach their fault points")
        caught = [pk.job_row(r.id).worker_pid for r in dead_jobs.values()]
        pk.wait_until(lambda: all(stopped(p) for p in caught), 30, what="the three processes to stop")
        os.killpg(killer.child.pid, signal.SIGKILL)
        pk.wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and not _zombie(p) for p in caught), 30,
                      what="the killed processes to be gone")
    finally:
        killer.stop()
    # 2. The same three jobs paused (SIGSTOP) at the same points in another worker: alive, pending.
    monkeypatch.setenv("PACKYARD_FAULT_ONCE_DIR", str(once))
    q_live = f"jan-live-{uuid.uuid4().hex[:6]}"
    pauser = pk.WorkerProcess(settings, f"{q_live}-{os.getpid()}@%h", tmp_path / "live.log", queues=(q_live,),
                              concurrency=3)
    paused: list[int] = []
    try:
        pauser.wait_ready()
        live_jobs = _jobs(celery_app, q_live, live, incoming, tmp_path / "l")
        pk.wait_until(lambda: all((once / f).exists() for f in FAULTS), 90, what="the three jobs to pause")
        paused = [pk.job_row(r.id).worker_pid for r in live_jobs.values()]
        pk.wait_until(lambda: all(stopped(p) for p in paused), 30, what="the paused processes to stop")
        before_live = {k: leftovers(r) for k, r in live.items()}
        before_dead = {k: leftovers(r) for k, r in dead.items()}

        out = subprocess.run(["packyard", "janitor", "--json", *sum((["--repo", str(r)] for r in
                                                                     (*dead.values(), *live.values())), [])],
                             env=pk.cli_env(), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)

        # The dead jobs' leftovers are gone, each removal with its owner's job and why.
        for kind, repo in dead.items():
            assert {k: v for k, v in leftovers(repo).items() if v} == {}, (kind, leftovers(repo))
        removed = {(r["what"], Path(r["repo"]).parent.name) for r in result["removed"]}
        assert {("quarantine", "dead-ingest"), ("keep", "dead-ingest"), ("batch", "dead-bulk"),
                ("pack_temps", "dead-repack")} <= removed, result["removed"]
        by_job = {r["job"] for r in result["removed"]}
        assert {dead_jobs["ingest"].id, dead_jobs["bulk"].id, dead_jobs["repack"].id} <= by_job
        assert all("owner process dead" in r["why"] for r in result["removed"]), result["removed"]
        assert all(v for v in (before_dead["ingest"]["quarantines"], before_dead["ingest"]["keeps"],
                               before_dead["bulk"]["tmp_objects"], before_dead["bulk"]["markers"],
                               before_dead["repack"]["pack_temps"])), before_dead
        # The paused jobs' files are all still there: their jobs are pending and their processes alive.
        assert {k: leftovers(r) for k, r in live.items()} == before_live
        assert all(v for v in (before_live["ingest"]["quarantines"], before_live["ingest"]["keeps"],
                               before_live["bulk"]["tmp_objects"], before_live["repack"]["pack_temps"]))
        kept = {(k["what"], Path(k["repo"]).parent.name) for k in result["kept"]}
        assert {("quarantine", "live-ingest"), ("batch", "live-bulk"), ("pack_temps", "live-repack")} <= kept
        assert all("still pending" in k["why"] for k in result["kept"] if "live-" in k["repo"])
        # The run is a job row listing what it removed and why.
        job = pk.job_row(result["job"])
        assert job.kind == "packyard.janitor" and job.state.value == "SUCCESS"
        assert job.counters["removed"] == len(result["removed"]) and job.counters["removed_items"]
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    # Resumed, the paused jobs finish and clean up after themselves.
    try:
        for name, res in live_jobs.items():
            res.get(timeout=120)
            assert pk.job_row(res.id).state.value == "SUCCESS", name
    finally:
        pauser.stop()
    assert not leftovers(live["bulk"])["tmp_objects"] and not leftovers(live["repack"])["pack_temps"]
    assert not leftovers(live["ingest"])["quarantines"]
    for repo in (*dead.values(), *live.values()):
        git("fsck", "--full", git_dir=repo)


def test_the_beat_task_runs_the_janitor_on_a_worker(celery_worker, celery_app, pk, settings, store_root, tmp_path):
    repo = make_worktree_repo(store_root / "beat")
    # A claim of a job the records know finished (its process -- this test -- lives on): the job decides.
    from packyard.workers.records.models import JobState
    from packyard.workers.records.recorder import record_run

    job_id = f"finished-{uuid.uuid4().hex[:8]}"
    from datetime import datetime

    record_run(settings, task_id=job_id, kind="packyard.write_objects", repo=str(repo),
               params=None, started=datetime.now(UTC), state=JobState.SUCCESS, counters=None)
    lock = repo / "refs" / "heads" / "main.lock"
    with store_owner.bind_job(job_id):
        lock.write_bytes(store_owner.current_owner().encode())
    outside = tmp_path / "elsewhere.git"
    git("init", "-q", "--bare", str(outside))
    refused = celery_app.send_task("packyard.janitor", kwargs={"repos": [str(outside)]})
    with pytest.raises(Exception, match="storage root"):
        refused.get(timeout=60)
    res = celery_app.send_task("packyard.janitor", kwargs={"repos": [str(repo)]})
    value = res.get(timeout=60)
    assert not lock.exists()
    (item,) = [r for r in value["removed"] if r["what"] == "claim"]
    assert item["path"] == "refs/heads/main.lock" and item["why"].startswith(f"job {job_id} finished")
    row = pk.job_row(res.id)
    assert row.kind == "packyard.janitor" and row.state.value == "SUCCESS" and row.counters["removed_claim"] == 1
