"""The bulk-write tasks on a real prefork worker (job rows + counters) and their CLI commands; git fsck after each."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from gitutil import ROOT, batch_check_all, edit_commit, fsck, git, make_worktree_repo, snapshot_tree, write_source
from packyard.store.objects import ObjectType, hash_object
from procutil import run_task

BATCH_COUNTERS = ("objects_written", "objects_skipped", "bytes_in", "bytes_written", "writeouts", "flushes",
                  "renames", "dir_fsyncs", "elapsed_us_barrier_flush", "elapsed_us_publish_renames",
                  "elapsed_us_collect", "elapsed_us_update_refs")


def make_source(base: Path, n: int = 40) -> Path:
    return write_source(base, n, 4, lambda i: f"content {i}\n" * (i + 1), dir_name="dir{}", file_name="file{}.txt")


def test_import_tree_task(store_root, incoming, celery_worker, celery_app, pk):
    repo = make_worktree_repo(store_root / "r")
    src = make_source(incoming)
    old = git("rev-parse", "main", git_dir=repo).strip().decode()
    res, value, job = run_task(celery_app, pk, "packyard.import_tree", repo=str(repo), ref="refs/heads/main",
                               source=str(src), message="imported by a worker")
    assert job.state.value == "SUCCESS", job.error
    assert job.counters == value["counters"]
    for key in BATCH_COUNTERS:
        assert key in job.counters, key
    assert job.counters["files"] == 40 and job.counters["objects_written"] == 40 + 5 + 1
    # objects + the ref + packyard/fence (the lease's token, recorded by the first fenced ref update here)
    assert job.counters["renames"] == 46 + 1 + 1
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == value["commit"]
    assert int((repo / "packyard" / "fence").read_text()) >= 1
    assert git("rev-parse", "main^", git_dir=repo).strip().decode() == old
    fsck(repo)


def test_import_tree_task_bad_input_fails_and_changes_nothing(store_root, incoming, celery_worker, celery_app, pk):
    repo = make_worktree_repo(store_root / "r")
    src = make_source(incoming, 5)
    (src / "escape").symlink_to("../../etc")
    before = snapshot_tree(repo)
    res, value, job = run_task(celery_app, pk, "packyard.import_tree", repo=str(repo), ref="refs/heads/main",
                               source=str(src))
    assert job.state.value == "FAILURE"
    assert job.error_type == "InvalidInputError" and "outside the import root" in job.error
    assert str(src / "escape") in job.error
    assert snapshot_tree(repo) == before
    fsck(repo)


def test_unpack_objects_task(tmp_path, store_root, incoming, celery_worker, celery_app, pk):
    donor = make_worktree_repo(tmp_path / "donor")
    tip = git("rev-parse", "main", git_dir=donor).strip().decode()
    pack = incoming / "in.pack"
    pack.write_bytes(git("pack-objects", "-q", "--revs", "--stdout", git_dir=donor, input=b"main\n"))
    target = store_root / "t.git"
    git("init", "-q", "--bare", str(target))
    res, value, job = run_task(celery_app, pk, "packyard.unpack_objects", repo=str(target), pack_path=str(pack),
                               ref_updates=[{"ref": "refs/heads/main", "old": None, "new": tip}])
    assert job.state.value == "SUCCESS", job.error
    assert job.counters["objects"] == len(batch_check_all(donor)) - 1  # the annotated tag is not on main
    assert job.counters["objects_written"] == job.counters["objects"]
    assert git("rev-parse", "main", git_dir=target).strip().decode() == tip
    fsck(target)


def test_write_objects_task_base64(store_root, celery_worker, celery_app, pk):
    repo = make_worktree_repo(store_root / "r")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    blob = b"edited in the web UI\n"
    tree, commit, raw_id = edit_commit(main, "edit.txt", blob, "W <w@x>", "web edit")
    commit_id = raw_id.hex()
    objects = [{"type": t, "data": base64.b64encode(d).decode()} for t, d in
               (("blob", blob), ("tree", tree), ("commit", commit), ("blob", blob))]
    res, value, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo), objects=objects,
                               ref_updates=[{"ref": "refs/heads/main", "old": main, "new": commit_id}])
    assert job.state.value == "SUCCESS", job.error
    assert value["results"] == ["queued", "queued", "queued", "duplicate_in_batch"]
    assert job.counters["objects_written"] == 3 and job.counters["duplicates"] == 1
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == commit_id
    fsck(repo)
    # CAS failure: the ref moved (old value is stale): job fails, ref untouched
    res, value, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo), objects=objects[:1],
                               ref_updates=[{"ref": "refs/heads/main", "old": main, "new": main}])
    assert job.state.value == "FAILURE" and job.error_type == "RefUpdateError"
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == commit_id
    fsck(repo)


PACKYARD = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))"]


def packyard(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PACKYARD, *args], cwd=ROOT, capture_output=True,
                          text=True, input=input, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_import_unpack_write_gc(tmp_path):
    bare = tmp_path / "c.git"
    git("init", "-q", "--bare", str(bare))
    src = make_source(tmp_path, 12)
    proc = packyard("import", "--repo", str(bare), "--ref", "refs/heads/main", "-m", "cli import", "--json",
                    str(src))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert git("rev-parse", "main", git_dir=bare).strip().decode() == out["commit"]
    fsck(bare)
    # the same PATH onto a ref that moved meanwhile is a CAS failure only inside the batch; here: bad ref name
    proc = packyard("import", "--repo", str(bare), "--ref", "main", str(src))
    assert proc.returncode == 1 and "InvalidInputError" in proc.stderr
    # unpack-objects from stdin, like git
    pack = git("pack-objects", "-q", "--revs", "--stdout", git_dir=bare, input=b"main\n")
    other = tmp_path / "o.git"
    git("init", "-q", "--bare", str(other))
    proc = subprocess.run([*PACKYARD, "unpack-objects", "--repo", str(other), "--json",
                           "--ref-update", f"refs/heads/main::{out['commit']}"], cwd=ROOT, capture_output=True,
                          input=pack, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["counters"]["objects_written"] == len(batch_check_all(bare))
    fsck(other)
    # write-objects
    proc = packyard("write-objects", "--repo", str(other), "-",
                    input=json.dumps([{"type": "blob", "data": base64.b64encode(b"hi\n").decode()}]))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["oids"] == [hash_object(ObjectType.BLOB, b"hi\n").hex()]
    # gc: a dead writer's tmp file (pid that cannot exist) of this host goes; git's own stays until expiry
    from packyard.store.batch import loose as bulk
    fan = other / "objects" / "ab"
    fan.mkdir(exist_ok=True)
    ours = fan / f"tmp_obj_4194304999_{bulk._HOST_TAG}-00c0ffee_1"
    gits = fan / "tmp_obj_Xy12Zq"
    ours.write_bytes(b"partial")
    gits.write_bytes(b"partial")
    proc = packyard("gc", "--repo", str(other), "--stale-after", "0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stale_tmp_removed"] == 1
    assert not ours.exists() and gits.exists()
    fsck(other)
