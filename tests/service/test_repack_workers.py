"""repack through the workers and the CLI: a real prefork worker holding the maintenance lease, the
job row with counters and the fencing token, the store's maintenance fence refusing a stale token,
`packyard submit repack` and `packyard repack` in-process."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import repackutil as ru
from gitutil import git, snapshot_tree
from packyard.store.errors import LockLostError
from packyard.store.fence import FenceKind, recorded_token
from packyard.workers.commands.repack import parse_expire, repack

PACKYARD = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))"]


def test_parse_expire_reads_gits_spellings():
    assert parse_expire("2.weeks.ago") == 14 * 86400
    assert parse_expire("1.hour.ago") == 3600 and parse_expire("3.days.ago") == 3 * 86400
    assert parse_expire("now") == 0 and parse_expire("never") == float("inf")
    assert parse_expire("90") == 90 and parse_expire(None) == 14 * 86400
    with pytest.raises(Exception, match="expiry"):
        parse_expire("yesterday-ish")


def test_repack_task_on_a_worker_records_counters_and_the_fencing_token(shapes, celery_worker, celery_app, pk,
                                                                         settings):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    res = celery_app.send_task("packyard.repack", kwargs={"repo": str(bare), "mode": "full"})
    value = res.get(timeout=180, propagate=False)
    job = pk.wait_job(res.id)
    assert job.state.value == "SUCCESS", job.error
    counters = job.counters
    assert counters == value["counters"]
    assert counters["deltas_reused"] > 0 and counters["packs_merged"] > 5
    assert counters["cruft_kept"] == len(shapes.young) + len(shapes.rescued)
    token = counters["fence_token"]
    assert token >= 1 and recorded_token(bare, FenceKind.MAINTENANCE) == token
    assert "elapsed_us_plan" in counters and "elapsed_us_write" in counters
    ru.check_with_git(bare, listing, value["packs_written"] + [value["cruft_pack"]])
    # The maintenance lease (its own key and token sequence) was taken and released.
    from sqlalchemy import select

    from packyard.workers.records import LockEvent, session_scope
    from packyard.workers.records.models import LockEventKind

    with session_scope(settings) as s:
        events = [(e.lock_name, e.event, e.fencing_token) for e in s.scalars(
            select(LockEvent).where(LockEvent.job_id == res.id).order_by(LockEvent.id))]
    assert events[0][1] is LockEventKind.ACQUIRED and events[-1][1] is LockEventKind.RELEASED
    assert all("maint:" in name and tok == token for name, _e, tok in events)


def test_submit_repack_geometric_from_the_cli(shapes, celery_worker, pk):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    proc = subprocess.run([*PACKYARD, "submit", "repack", "--repo", str(bare), "-p", "mode=geometric", "--wait",
                           "--timeout", "180"], capture_output=True, text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["state"] == "SUCCESS" and out["result"]["mode"] == "geometric"
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)
    assert ru.reachable_listing(bare) == listing


def test_a_stale_maintenance_token_deletes_nothing(shapes, redis_client):
    """A holder whose lease was taken over (a later token already deleted here) is refused by the store."""
    from packyard.store.fence import fenced

    bare = shapes.bare
    with fenced(bare, 7, "a later holder's deletion", kind=FenceKind.MAINTENANCE):
        pass
    before = snapshot_tree(bare)

    class StaleLease:
        token = 6

        def check(self):   # its own check still passes (it stalled after checking)
            pass

    with pytest.raises(LockLostError, match="stale fencing token 6"):
        repack(bare, mode="full", lease=StaleLease())
    after = snapshot_tree(bare)
    gone = [k for k in before if k not in after]
    assert gone == [], "nothing deleted"
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=bare)


def test_lost_lease_before_deleting_deletes_nothing(shapes):
    bare = shapes.bare
    before = snapshot_tree(bare)

    class LostLease:
        token = 3

        def check(self):
            raise LockLostError("maintenance lease expired while checking (test)")

    with pytest.raises(LockLostError):
        repack(bare, mode="full", lease=LostLease())
    assert [k for k in before if k not in snapshot_tree(bare)] == []


def test_repack_cli_in_process(shapes, pk):
    bare = shapes.bare
    listing = ru.reachable_listing(bare)
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--mode", "full", "--expire", "2.weeks.ago",
                           "--json"], capture_output=True, text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    c = result["counters"]
    assert c["cruft_kept"] == len(shapes.young) + len(shapes.rescued) and c["cruft_expired"] == len(shapes.old)
    ru.check_with_git(bare, listing, result["packs_written"] + [result["cruft_pack"]])
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--mode", "loose"], capture_output=True,
                          text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0 and proc.stdout.strip() == "Nothing new to pack.", proc.stdout + proc.stderr
    proc = subprocess.run([*PACKYARD, "gc", "--repo", str(bare), "--preserve-for", "0"], capture_output=True,
                          text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.loads(proc.stdout)["preserved_packs_expired"]) == sorted(result["packs_deleted"])


def test_repack_cli_bad_input_prints_one_line(shapes, pk):
    bare = shapes.bare
    (bare / "refs" / "heads" / "ghost").write_text("2" * 40 + "\n")
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare)], capture_output=True, text=True,
                          env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packyard repack: ObjectMissingError:"), proc.stderr
    assert "2" * 40 in lines[0] and "refs/heads/ghost" in lines[0]


def test_repack_cli_with_lock_fences_its_deletions(shapes, pk, redis_server):
    bare = shapes.bare
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--mode", "geometric", "--lock", "--json"],
                          capture_output=True, text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr
    token = json.loads(proc.stdout)["counters"]["fence_token"]
    assert token >= 1 and recorded_token(bare, FenceKind.MAINTENANCE) == token


def test_repack_cli_gives_up_after_its_wait_when_another_maintenance_job_holds_the_lease(shapes, pk, redis_client):
    from packyard.workers.locks import LeaseKind, acquire

    bare = shapes.bare
    before = snapshot_tree(bare)
    holder = acquire(redis_client, bare, ttl=60, job_id="nightly-job", kind=LeaseKind.MAINTENANCE)
    try:
        proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--lock", "--wait", "1"],
                              capture_output=True, text=True, env=pk.cli_env(), cwd=pk.root, timeout=60)
    finally:
        holder.release()
    assert proc.returncode == 75, proc.stderr
    assert "maintenance lease busy" in proc.stderr and "by job nightly-job" in proc.stderr, proc.stderr
    assert snapshot_tree(bare) == before


def test_repack_cli_writes_a_bitmap_unless_no_bitmap(shapes, pk):
    bare = shapes.bare
    pack_dir = bare / "objects" / "pack"
    # A .keep pack holds reachable objects: the new pack lacks closure, so no bitmap (git: "disabling bitmap
    # writing, as some objects are not being packed").
    first = repack(bare, mode="full")
    assert first["counters"]["bitmap_skipped"] == 1 and list(pack_dir.glob("pack-*.bitmap")) == []
    shapes.keep_pack.with_suffix(".keep").unlink()
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--json"], capture_output=True, text=True,
                          env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    [main] = result["packs_written"]
    assert [p.stem for p in pack_dir.glob("pack-*.bitmap")] == [main]
    assert result["counters"]["bitmap_commits"] > 0
    out = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--test-bitmap", "HEAD"], capture_output=True)
    assert out.returncode == 0 and out.stderr.rstrip().endswith(b"OK!"), out.stderr[-300:]
    # The queued command's flag (the task passes it through): the next pack has none.
    git("update-ref", "refs/heads/extra", git("commit-tree", "-m", "x", "HEAD^{tree}", git_dir=bare).decode().strip(),
        git_dir=bare)
    again = repack(bare, mode="full", no_bitmap=True)
    assert again["packs_written"] != [main] and again["counters"]["bitmap_commits"] == 0
    assert not (pack_dir / f"{again['packs_written'][0]}.bitmap").exists()
    proc = subprocess.run([*PACKYARD, "repack", "--repo", str(bare), "--no-bitmap", "--json"], capture_output=True,
                          text=True, env=pk.cli_env(), cwd=pk.root)
    assert proc.returncode == 0, proc.stderr
    assert list(pack_dir.glob("pack-*.bitmap")) == []
