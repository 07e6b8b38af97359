"""Object pools as a hosting service runs them: the queued pool jobs on a real Celery worker (job rows, leases,
confinement), the `packyard pool` CLI, membership in the records (`pool list`, `status --repo`), and git as the
oracle after every step (fsck --full in the pool and each member, rev-list --objects, clone of each fork)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gitutil import fsck, git
from poolutil import make_fork, make_source, objects


def run(pk, *args, timeout=180):
    return subprocess.run(["packyard", *args], env=pk.cli_env(), capture_output=True, text=True, timeout=timeout,
                          cwd=pk.session_dir)


def _network(root: Path, forks: int = 2) -> tuple[Path, list[Path]]:
    source, _work = make_source(root)
    return source, [make_fork(root, source, f"fork{i}") for i in range(forks)]


def _clone_ok(repo: Path, into: Path) -> None:
    git("clone", "-q", "--no-local", "--bare", str(repo), str(into))
    fsck(into)


def _job(pk, celery_app, name: str, **kwargs):
    res = celery_app.send_task(name, kwargs=kwargs)
    return pk.wait_job(res.id, timeout=180)


def test_pool_jobs_on_a_worker_from_create_to_delete(store_root, celery_worker, celery_app, pk, settings) -> None:
    from packyard.workers.records import pools

    source, forks = _network(store_root)
    before = {r: objects(r) for r in (source, *forks)}
    pool = store_root / "pool.git"

    created = _job(pk, celery_app, "packyard.pool_create", repo=str(pool), source=str(source))
    assert created.state.value == "SUCCESS", created.error
    assert created.counters["objects_copied"] == len(before[source])
    fsck(pool)

    for fork in forks:
        job = _job(pk, celery_app, "packyard.pool_link", repo=str(fork), pool=str(pool))
        assert job.state.value == "SUCCESS", job.error
        assert job.counters["repack_borrowed"] > 0          # the shared history stays in the pool
        assert (fork / "objects" / "info" / "alternates").read_text().strip() == "../../pool.git/objects"
        fsck(fork)
        assert objects(fork) == before[fork]
    assert pools.members_of(settings, pool) == tuple(sorted(str(f.resolve()) for f in forks))
    assert pools.pool_of(settings, forks[0]) == str(pool.resolve())

    # A fork's nightly repack works now, and packs only its own objects.
    repacked = _job(pk, celery_app, "packyard.repack", repo=str(forks[0]))
    assert repacked.state.value == "SUCCESS", repacked.error
    fsck(forks[0])
    # The pool's repack keeps everything its members reach.
    pool_repack = _job(pk, celery_app, "packyard.repack", repo=str(pool))
    assert pool_repack.state.value == "SUCCESS", pool_repack.error
    for r in (pool, *forks):
        fsck(r)

    refused = _job(pk, celery_app, "packyard.pool_delete", repo=str(pool))
    assert refused.state.value == "FAILURE" and "member" in refused.error and pool.is_dir()

    for i, fork in enumerate(forks):
        job = _job(pk, celery_app, "packyard.pool_disconnect", repo=str(fork))
        assert job.state.value == "SUCCESS", job.error
        assert not (fork / "objects" / "info" / "alternates").exists()
        fsck(fork)
        assert objects(fork) == before[fork]
        _clone_ok(fork, store_root / f"clone{i}.git")
    assert pools.members_of(settings, pool) == ()

    deleted = _job(pk, celery_app, "packyard.pool_delete", repo=str(pool))
    assert deleted.state.value == "SUCCESS", deleted.error
    assert not pool.exists() and pools.get_pool(settings, pool) is None


def test_pool_jobs_are_confined_to_the_storage_roots(store_root, tmp_path, celery_worker, celery_app, pk,
                                                     settings) -> None:
    """A message naming a pool or a source outside the roots is refused at the boundary, nothing written; a
    fork whose alternates lead outside the roots is refused by every job that opens it, naming the file."""
    source, forks = _network(store_root, forks=1)
    outside_pool = tmp_path / "pool.git"
    job = _job(pk, celery_app, "packyard.pool_create", repo=str(store_root / "p.git"), source=str(tmp_path))
    assert job.state.value == "FAILURE" and "outside the storage roots" in job.error
    assert not (store_root / "p.git").exists()
    job = _job(pk, celery_app, "packyard.pool_link", repo=str(forks[0]), pool=str(outside_pool))
    assert job.state.value == "FAILURE" and "outside the storage roots" in job.error
    assert not (forks[0] / "objects" / "info" / "alternates").exists()

    # By hand, as `git clone --shared` from outside would write it: every job refuses the repository.
    other = tmp_path / "elsewhere.git"
    git("clone", "-q", "--bare", "--no-local", str(source), str(other))
    (forks[0] / "objects" / "info" / "alternates").write_text(f"{other / 'objects'}\n")
    for name in ("packyard.verify_repo", "packyard.repack"):
        job = _job(pk, celery_app, name, repo=str(forks[0]))
        assert job.state.value == "FAILURE", name
        assert job.error_type == "AlternatesRefused" and "alternates" in job.error and str(other) in job.error


def test_pool_cli_life_and_records(store_root, pk) -> None:
    source, forks = _network(store_root)
    pool = store_root / "pool.git"
    out = run(pk, "pool", "create", "--pool", str(pool), "--source", str(source), "--lock", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outcome"] == "done"
    for fork in forks:
        out = run(pk, "pool", "link", "--pool", str(pool), "--repo", str(fork), "--lock")
        assert out.returncode == 0, out.stderr
        assert "pool link: done" in out.stdout
        fsck(fork)
    again = run(pk, "pool", "link", "--pool", str(pool), "--repo", str(forks[0]))
    assert again.returncode == 0 and "pool link: already" in again.stdout, again.stdout + again.stderr

    listed = run(pk, "pool", "list", "--json", "--check")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    (row,) = [json.loads(line) for line in listed.stdout.splitlines() if json.loads(line)["pool"] == str(pool)]
    assert row["member_count"] == 2 and row["source"] == str(source.resolve()) and row["fetches"] == 1
    assert sorted(row["disk"]["members"]) == sorted(row["members"])

    status = run(pk, "status", "--repo", str(forks[1]), "--no-reconcile")
    assert status.returncode == 0, status.stderr
    assert f"pool: member of {pool}" in status.stdout
    status = run(pk, "status", "--repo", str(pool), "--no-reconcile")
    assert "pool: an object pool with 2 member(s)" in status.stdout

    out = run(pk, "pool", "fetch", "--pool", str(pool))
    assert out.returncode == 0 and "pool fetch: already" in out.stdout, out.stdout + out.stderr
    refused = run(pk, "pool", "delete", "--pool", str(pool))
    assert refused.returncode == 1 and "disconnect them first" in refused.stderr
    for fork in forks:
        out = run(pk, "pool", "disconnect", "--repo", str(fork), "--lock")
        assert out.returncode == 0, out.stderr
        fsck(fork)
    out = run(pk, "pool", "delete", "--pool", str(pool), "--lock")
    assert out.returncode == 0, out.stderr
    assert not pool.exists()
    listed = run(pk, "pool", "list", "--json")
    assert str(pool) not in listed.stdout


def test_delete_is_refused_while_the_records_name_a_member(store_root, pk, settings) -> None:
    """The members file on disk lost a member (restored from an old backup, edited by hand): the records still
    name it, and the pool is not deleted under it."""
    from packyard.workers.commands import pool as command
    from packyard.workers.records import upgrade_database

    upgrade_database(settings)
    source, forks = _network(store_root, forks=1)
    pool = store_root / "pool.git"
    command.prepare_pool_dir(pool)
    command.create(pool, source)
    command.link(forks[0], pool)
    (pool / "packyard" / "members").write_text("")
    out = run(pk, "pool", "delete", "--pool", str(pool))
    assert out.returncode == 1 and str(forks[0].resolve()) in out.stderr, out.stderr
    assert pool.is_dir()
    fsck(forks[0])
