"""Queued jobs through a real prefork worker: confined to the storage roots and the incoming dir, bounded in time
and size, their arguments checked. Every refusal is a FAILURE row with an InvalidInputError (or LimitExceededError)
naming the path or argument, and nothing outside the roots is read into an error or written."""
from __future__ import annotations

import base64
import os
import socket
import subprocess
from pathlib import Path

import pytest

from gitutil import git, make_worktree_repo
from packyard.store.objects import ObjectType, hash_object
from procutil import run_task as queued


def outside_state(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``path``: bytes and mtime (ns), to prove nothing there was written."""
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file() and not p.is_symlink()}


def run_task(celery_app, pk, name: str, timeout: float = 120, **kwargs):
    return queued(celery_app, pk, name, timeout, **kwargs)[1:]


def refused(job, *fragments: str, error_type: str = "InvalidInputError") -> None:
    assert job.state.value == "FAILURE", (job.state, job.error)
    assert job.error_type == error_type, job.error
    for fragment in fragments:
        assert fragment in job.error, (fragment, job.error)


def commit_payload(repo: Path, blob: bytes) -> tuple[list[dict], str]:
    """write_objects payload: a blob, a tree holding it and a commit on top of main; returns (objects, commit)."""
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    tree = b"100644 new.txt\0" + hash_object(ObjectType.BLOB, blob)
    commit = (f"tree {hash_object(ObjectType.TREE, tree).hex()}\nparent {main}\n"
              "author W <w@x> 1700000000 +0000\ncommitter W <w@x> 1700000000 +0000\n\nweb edit\n").encode()
    objects = [{"type": t, "data": base64.b64encode(d).decode()} for t, d in
               (("blob", blob), ("tree", tree), ("commit", commit))]
    return objects, hash_object(ObjectType.COMMIT, commit).hex()


SECRET = b"SECRETTOKEN-7d2b: not for the job's eyes\n"


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory outside every root and the incoming dir, with a repository and a secret file in it."""
    make_worktree_repo(tmp_path / "o")
    (tmp_path / "o" / "shadow").write_bytes(SECRET * 8)
    return tmp_path / "o"


# -- repositories: only inside a storage root -----------------------------------------------------------------

def test_repository_outside_the_roots_is_refused_and_untouched(celery_worker, celery_app, pk, outside, store_root):
    repo = outside / "repo.git"
    before = outside_state(outside)
    objects, tip = commit_payload(repo, b"escape\n")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    updates = [{"ref": "refs/heads/main", "old": main, "new": tip}]
    link = store_root / "link.git"
    link.symlink_to(repo)                                   # inside a root by name, outside once resolved
    for spelling in (str(repo), str(link), f"{store_root}/../../../../{repo}",
                     f"default:{os.path.relpath(repo, pk.storage_root)}"):
        _, job = run_task(celery_app, pk, "packyard.write_objects", repo=spelling, objects=objects,
                          ref_updates=updates)
        refused(job, "is outside the storage roots", "PACKYARD_STORAGE_ROOTS")
    for name, _fragments in (("packyard.verify_repo", ()), ("packyard.import_tree", ())):
        kwargs = {"ref": "refs/heads/x", "source": "nothing"} if name == "packyard.import_tree" else {}
        _, job = run_task(celery_app, pk, name, repo=str(repo), **kwargs)
        refused(job, "is outside the storage roots")
    assert outside_state(outside) == before


@pytest.mark.parametrize("spelling, message", [
    ("relative/repo.git", "must be an absolute path or <storage>:<relative path>"),
    ("nosuch:repo.git", "names storage 'nosuch', which is not configured"),
    ("default:/etc", "must be relative to the storage"),
    ("default:", "must be relative to the storage"),
    ("", "must be a non-empty path"),
])
def test_repository_spellings_that_are_refused(celery_worker, celery_app, pk, spelling, message):
    _, job = run_task(celery_app, pk, "packyard.verify_repo", repo=spelling)
    refused(job, message)


def test_storage_addressing_resolves_to_one_spelling(celery_worker, celery_app, pk, store_root):
    from sqlalchemy import select

    from packyard.workers.records import LockEvent, Repository, session_scope

    repo = make_worktree_repo(store_root / "team")
    objects, tip = commit_payload(repo, b"addressed by storage name\n")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    address = f"default:{repo.relative_to(pk.storage_root)}"
    value, job = run_task(celery_app, pk, "packyard.write_objects", repo=address, objects=objects,
                          ref_updates=[{"ref": "refs/heads/main", "old": main, "new": tip}])
    assert job.state.value == "SUCCESS", job.error
    assert value["repo"] == str(repo) and git("rev-parse", "main", git_dir=repo).strip().decode() == tip
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        assert s.scalar(select(Repository.path).where(Repository.id == job.repo_id)) == str(repo)
        locks = s.scalars(select(LockEvent.lock_name).where(LockEvent.job_id == job.task_id)).all()
    assert locks and all(name.endswith(str(repo)) for name in locks)


def test_refs_heads_symlinked_outside_is_not_written_through(celery_worker, celery_app, pk, store_root, outside):
    repo = make_worktree_repo(store_root / "r")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    heads = outside / "heads"
    heads.mkdir()
    (heads / "main").write_text(main + "\n")
    (repo / "packed-refs").unlink()
    (repo / "refs" / "tags" / "v1").parent.mkdir(parents=True, exist_ok=True)
    os.rmdir(repo / "refs" / "heads")
    (repo / "refs" / "heads").symlink_to(heads)
    before = outside_state(outside)
    objects, tip = commit_payload(repo, b"through the symlink?\n")
    _, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo), objects=objects,
                      ref_updates=[{"ref": "refs/heads/main", "old": main, "new": tip}])
    refused(job, "leads outside the repository", str(repo / "refs" / "heads" / "main"))
    assert outside_state(outside) == before
    assert sorted(p.name for p in heads.iterdir()) == ["main"]


def test_a_regular_file_as_repository_is_not_a_directory(celery_worker, celery_app, pk, store_root):
    f = store_root / "file.git"
    f.write_text("not a repository\n")
    f.chmod(0o600)
    _, job = run_task(celery_app, pk, "packyard.verify_repo", repo=str(f))
    refused(job, "repository path is not a directory", error_type="NotARepositoryError")
    assert "permission" not in job.error


# -- input files: only regular files inside the incoming dir ---------------------------------------------------

def test_input_files_outside_incoming_are_refused_without_reading_them(celery_worker, celery_app, pk, store_root,
                                                                       incoming, outside):
    repo = make_worktree_repo(store_root / "r")
    secret = outside / "shadow"
    (incoming / "escape").symlink_to(outside)                    # a directory link inside incoming
    (incoming / "shadow.pack").symlink_to(secret)                # a file link inside incoming
    cases = [
        ("packyard.index_pack", {"pack": str(secret)}, "is outside the incoming directory"),
        ("packyard.index_pack", {"pack": f"{incoming}/../../../{secret}"}, "is outside the incoming directory"),
        ("packyard.index_pack", {"pack": str(incoming / "escape" / "shadow")}, "is outside the incoming directory"),
        ("packyard.index_pack", {"pack": str(incoming / "shadow.pack")}, "is a symlink, not a regular file"),
        ("packyard.unpack_objects", {"pack_path": str(secret)}, "is outside the incoming directory"),
        ("packyard.unpack_objects", {"pack_path": str(incoming / "shadow.pack")}, "is a symlink"),
        ("packyard.write_objects", {"objects_file": str(secret)}, "is outside the incoming directory"),
        ("packyard.import_tree", {"ref": "refs/heads/x", "source": str(outside)}, "is outside the incoming"),
        ("packyard.import_tree", {"ref": "refs/heads/x", "source": str(incoming / "escape")}, "is a symlink"),
        ("packyard.import_tree", {"ref": "refs/heads/x", "source": "/etc"}, "is outside the incoming directory"),
        ("packyard.index_pack", {"pack": str(incoming / "absent.pack")}, "pack does not exist"),
        ("packyard.index_pack", {"pack": "-"}, "pack does not exist"),
    ]
    before_refs = git("for-each-ref", git_dir=repo)
    for name, kwargs, message in cases:
        _, job = run_task(celery_app, pk, name, repo=str(repo), **kwargs)
        refused(job, message)
        assert "SECRETTOKEN" not in job.error
    assert git("for-each-ref", git_dir=repo) == before_refs
    git("fsck", "--full", "--no-dangling", git_dir=repo)


def test_non_regular_inputs_are_refused(celery_worker, celery_app, pk, store_root, incoming):
    """/dev/zero (outside, and linked in), a FIFO and a socket in the incoming dir: refused, nothing blocks."""
    repo = make_worktree_repo(store_root / "r")
    fifo = incoming / "push.fifo"
    os.mkfifo(fifo)
    sock_path = incoming / "push.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    (incoming / "zero.pack").symlink_to("/dev/zero")
    try:
        cases = [
            ("packyard.index_pack", {"pack": "/dev/zero"}, "is outside the incoming directory"),
            ("packyard.import_tree", {"ref": "refs/heads/z", "source": "/dev/zero"}, "is outside the incoming"),
            ("packyard.index_pack", {"pack": str(incoming / "zero.pack")}, "is a symlink"),
            ("packyard.index_pack", {"pack": str(fifo)}, "is a FIFO, not a regular file"),
            ("packyard.unpack_objects", {"pack_path": str(fifo)}, "is a FIFO"),
            ("packyard.import_tree", {"ref": "refs/heads/z", "source": str(fifo)},
             "is a FIFO, not a regular file or a directory"),
            ("packyard.write_objects", {"objects_file": str(sock_path)}, "is a socket"),
        ]
        for name, kwargs, message in cases:
            _, job = run_task(celery_app, pk, name, timeout=60, repo=str(repo), **kwargs)
            refused(job, message)
            assert job.duration_ms is not None and job.duration_ms < 10_000, job.duration_ms
    finally:
        sock.close()


def test_a_non_pack_in_incoming_is_named_not_echoed(celery_worker, celery_app, pk, store_root, incoming):
    repo = make_worktree_repo(store_root / "r")
    (incoming / "secret.pack").write_bytes(SECRET * 4)
    for name, key in (("packyard.index_pack", "pack"), ("packyard.unpack_objects", "pack_path")):
        _, job = run_task(celery_app, pk, name, repo=str(repo), **{key: "/".join(
            (incoming / "secret.pack").relative_to(pk.incoming_dir).parts)})
        refused(job, "not a pack file (bad signature)", str(incoming / "secret.pack"), error_type="PackFormatError")
        assert "SECRETTOKEN" not in job.error and "eyes" not in job.error


# -- time limits ----------------------------------------------------------------------------------------------

def test_soft_time_limit_fails_the_job_naming_it_and_frees_the_repository(celery_worker, celery_app, pk,
                                                                           store_root):
    from sqlalchemy import select

    from packyard.workers.records import LockEvent, LockEventKind, session_scope

    repo = store_root / "slow.git"
    _, job = run_task(celery_app, pk, "packyard.test_stuck", timeout=60, repo=str(repo), seconds=50)
    refused(job, "packyard.test_stuck ran past its soft time limit of 2 s", "PACKYARD_TIME_LIMITS",
            error_type="LimitExceededError")
    assert job.duration_ms < 20_000
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        events = s.scalars(select(LockEvent.event).where(LockEvent.job_id == job.task_id)
                           .order_by(LockEvent.id)).all()
    assert events == [LockEventKind.ACQUIRED, LockEventKind.RELEASED]
    # The repository is free at once: a job on it takes the lease without waiting for a TTL.
    value, nxt = run_task(celery_app, pk, "packyard.test_locked", timeout=30, repo=str(repo))
    assert nxt.state.value == "SUCCESS" and nxt.retries == 0, nxt.error


def test_hard_time_limit_kills_records_and_releases(celery_worker, celery_app, pk, store_root, redis_client):
    from packyard.workers.locks import KEY_PREFIX, lock_name_for

    repo = store_root / "endless.git"
    res = celery_app.send_task("packyard.test_unstoppable", kwargs={"repo": str(repo), "seconds": 50})
    job = pk.wait_job(res.id, timeout=40)
    refused(job, "packyard.test_unstoppable ran past its hard time limit of 3 s", "worker process was killed",
            error_type="LimitExceededError")
    # Released by the worker's main process, not by the lease's 60 s TTL running out.
    pk.wait_until(lambda: redis_client.get(KEY_PREFIX + lock_name_for(repo)) is None, 10,
                  what="the killed job's lease to be released")
    value, nxt = run_task(celery_app, pk, "packyard.test_locked", timeout=30, repo=str(repo))
    assert nxt.state.value == "SUCCESS", nxt.error
    # Failed for good, not redelivered (it would only be killed again).
    assert pk.job_row(res.id).state.value == "FAILURE"
    started = [line for line in celery_worker.log_lines()
               if line.get("job_id") == res.id and line.get("event") == "job.started"]
    assert len(started) == 1, started


def test_a_message_cannot_raise_its_time_limit(celery_worker, celery_app, pk, store_root):
    repo = store_root / "greedy.git"
    res = celery_app.send_task("packyard.test_stuck", kwargs={"repo": str(repo), "seconds": 50},
                               soft_time_limit=3600, time_limit=7200)
    job = pk.wait_job(res.id, timeout=40)
    refused(job, "soft time limit of 2 s", error_type="LimitExceededError")


# -- sizes ------------------------------------------------------------------------------------------------------

def test_big_write_objects_payload_refused_then_accepted_as_a_file(celery_worker, celery_app, pk, store_root,
                                                                   incoming):
    import kombu.exceptions

    repo = make_worktree_repo(store_root / "r")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    blob = os.urandom(40 << 20)
    objects, tip = commit_payload(repo, blob)
    updates = [{"ref": "refs/heads/main", "old": main, "new": tip}]
    # 40 MiB in a message: over the broker's PACKYARD_MAX_MESSAGE_BYTES (16 MiB), so Redis refuses it while it
    # arrives (issue 16; tests/workers/test_message_size.py) and no job exists.
    with pytest.raises(kombu.exceptions.OperationalError):
        celery_app.send_task("packyard.write_objects", kwargs={"repo": str(repo), "objects": objects,
                                                               "ref_updates": updates})
    # 2 MiB: the broker takes it, the worker refuses it (over PACKYARD_WRITE_OBJECTS_MAX_BYTES) and says how.
    medium, medium_tip = commit_payload(repo, os.urandom(2 << 20))
    _, job = run_task(celery_app, pk, "packyard.write_objects", timeout=300, repo=str(repo), objects=medium,
                      ref_updates=[{"ref": "refs/heads/main", "old": main, "new": medium_tip}])
    refused(job, "over the 1048576-byte limit per message (PACKYARD_WRITE_OBJECTS_MAX_BYTES)",
            "in the incoming directory", "git cat-file --batch", "objects_file=", error_type="LimitExceededError")
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == main
    # The same objects as a file in the incoming directory, in the format git cat-file --batch prints.
    batch = incoming / "edit.batch"
    with open(batch, "wb") as f:
        for item in objects:
            data = base64.b64decode(item["data"])
            oid = hash_object(ObjectType.from_label(item["type"]), data).hex()
            f.write(f"{oid} {item['type']} {len(data)}\n".encode() + data + b"\n")
    value, job = run_task(celery_app, pk, "packyard.write_objects", timeout=300, repo=str(repo),
                          objects_file=str(batch.relative_to(pk.incoming_dir)), ref_updates=updates)
    assert job.state.value == "SUCCESS", job.error
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == tip
    assert git("cat-file", "blob", "main:new.txt", git_dir=repo) == blob
    git("fsck", "--full", "--no-dangling", git_dir=repo)


def test_objects_file_written_by_git_cat_file(celery_worker, celery_app, pk, store_root, incoming, tmp_path):
    donor = make_worktree_repo(tmp_path / "donor")
    ids = git("rev-list", "--objects", "--all", git_dir=donor).decode().split()
    ids = [i for i in ids if len(i) == 40]
    batch = incoming / "donor.batch"
    batch.write_bytes(git("cat-file", "--batch", git_dir=donor, input="\n".join(ids).encode() + b"\n"))
    target = store_root / "t.git"
    git("init", "-q", "--bare", str(target))
    value, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(target), objects_file=str(batch))
    assert job.state.value == "SUCCESS", job.error
    assert sorted(value["oids"]) == sorted(ids)
    # A tampered file: the header's id no longer matches the content; the offset is named, not the bytes.
    data = bytearray(batch.read_bytes())
    first_nl = data.index(b"\n")
    data[first_nl + 1] ^= 0x01
    batch.write_bytes(bytes(data))
    _, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(target), objects_file=str(batch))
    refused(job, "does not hash to the id its header names", "offset 0", str(batch))


def test_import_tree_bounded_by_files_and_bytes(celery_worker, celery_app, pk, store_root, incoming, monkeypatch):
    """The limits come from the worker's settings: a second worker with small ones, on its own queue."""
    import dataclasses

    from packyard.workers.settings import Settings

    repo = make_worktree_repo(store_root / "r")
    many = incoming / "many"
    many.mkdir()
    for i in range(30):
        (many / f"f{i}.txt").write_text("x" * 100)
    big = incoming / "big"
    big.mkdir()
    (big / "large.bin").write_bytes(b"y" * 20_000)
    settings = dataclasses.replace(Settings.from_env(), import_max_files=20, import_max_bytes=10_000)
    queue = f"limits-{os.getpid()}"
    worker = pk.WorkerProcess(settings, f"limits-{os.getpid()}@%h", incoming / "limits-worker.log", queues=(queue,))
    try:
        worker.wait_ready()
        before = git("for-each-ref", git_dir=repo)
        for source, message in ((many, "more than 20 entries"), (big, "more than 10000 bytes")):
            res = celery_app.send_task("packyard.import_tree", queue=queue,
                                       kwargs={"repo": str(repo), "ref": "refs/heads/imp", "source": str(source)})
            res.get(timeout=60, propagate=False)
            refused(pk.job_row(res.id), message, error_type="LimitExceededError")
        assert git("for-each-ref", git_dir=repo) == before
    finally:
        worker.stop()


# -- arguments --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kwargs, message", [
    ("packyard.index_pack", {"pack": "p.pack", "max_pack_bytes": "big"},
     "argument 'max_pack_bytes' must be an integer or null, got str 'big'"),
    ("packyard.index_pack", {"pack": 7}, "argument 'pack' must be a string, got int 7"),
    ("packyard.index_pack", {"pack": "p.pack", "fix_thin": "yes"}, "argument 'fix_thin' must be true or false"),
    ("packyard.write_objects", {"objects": "blob"}, "argument 'objects' must be a list of objects or null"),
    ("packyard.write_objects", {"objects": [], "ref_updates": [["refs/heads/x"]]},
     "argument 'ref_updates' must be a list of objects or null"),
    ("packyard.import_tree", {"ref": "refs/heads/x"}, "missing a required argument: 'source'"),
    ("packyard.verify_repo", {"deep": True}, "unexpected keyword argument 'deep'"),
])
def test_wrong_arguments_name_the_argument(celery_worker, celery_app, pk, store_root, name, kwargs, message):
    _, job = run_task(celery_app, pk, name, repo=str(store_root / "r.git"), **kwargs)
    refused(job, message)
    assert "not supported between" not in job.error and job.retries == 0


@pytest.mark.parametrize("update, message", [
    ({"ref": "refs/heads/x", "old": None, "new": 5}, "ref update #0: 'new' must be a 40-hex object id"),
    ({"ref": 1, "old": None, "new": "ab" * 20}, "ref update #0: 'ref' must be a string"),
])
def test_wrong_ref_update_fields_are_named(celery_worker, celery_app, pk, store_root, update, message):
    repo = make_worktree_repo(store_root / "r")
    _, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo), objects=[], ref_updates=[update])
    refused(job, message)


def test_a_branch_cannot_name_a_blob_through_the_queue(celery_worker, celery_app, pk, store_root):
    repo = make_worktree_repo(store_root / "r")
    main = git("rev-parse", "main", git_dir=repo).strip().decode()
    blob = b"a blob is not a branch\n"
    _, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo),
                      objects=[{"type": "blob", "data": base64.b64encode(blob).decode()}],
                      ref_updates=[{"ref": "refs/heads/main", "old": main,
                                    "new": hash_object(ObjectType.BLOB, blob).hex()}])
    refused(job, "non-commit object (blob) to branch refs/heads/main")
    assert git("rev-parse", "main", git_dir=repo).strip().decode() == main
    value, job = run_task(celery_app, pk, "packyard.write_objects", repo=str(repo),
                          objects=[{"type": "blob", "data": base64.b64encode(blob).decode()}],
                          ref_updates=[{"ref": "refs/tags/a-blob", "old": None,
                                        "new": hash_object(ObjectType.BLOB, blob).hex()}])
    assert job.state.value == "SUCCESS", job.error
    git("fsck", "--full", "--no-dangling", git_dir=repo)


# -- the CLI: submit checks before queueing, errors are one line ---------------------------------------------------

def cli(pk, *args, **env):
    return subprocess.run(["packyard", *args], env=pk.cli_env(**env), capture_output=True, text=True, timeout=120,
                          cwd=pk.session_dir)


def test_submit_fails_fast_on_what_the_worker_would_refuse(pk, outside, store_root, incoming):
    from sqlalchemy import func, select

    from packyard.workers.records import Job, session_scope

    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        jobs_before = s.scalar(select(func.count()).select_from(Job))
    repo = store_root / "r.git"
    for argv, message in (
        (["verify_repo", "--repo", str(outside / "repo.git")], "is outside the storage roots"),
        (["index_pack", "--repo", str(repo), "-p", f"pack={outside / 'shadow'}"], "is outside the incoming"),
        (["index_pack", "--repo", str(repo), "-p", "pack=/dev/zero"], "is outside the incoming directory"),
        (["index_pack", "--repo", str(repo), "-p", "pack=x.pack", "-p", "max_pack_bytes=big"],
         "argument 'max_pack_bytes' must be an integer or null"),
    ):
        out = cli(pk, "submit", *argv)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.startswith("packyard submit: InvalidInputError: ") and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    with session_scope(os.environ["PACKYARD_DATABASE_URL"]) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == jobs_before   # nothing was queued


def test_cli_in_process_commands_keep_working_anywhere(pk, tmp_path):
    """The user's own commands are not confined: a repository and inputs outside every root."""
    repo = tmp_path / "mine.git"
    git("init", "-q", "--bare", str(repo))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("mine\n")
    out = cli(pk, "import", "--repo", str(repo), "--ref", "refs/heads/main", "--no-progress", str(src))
    assert out.returncode == 0, out.stderr
    out = cli(pk, "verify", "--repo", str(repo))
    assert out.returncode == 0, out.stderr


def test_cli_os_errors_are_one_line(pk, tmp_path):
    repo = tmp_path / "r.git"
    git("init", "-q", "--bare", str(repo))
    for argv, fragment in (
        (["write-objects", "--repo", str(repo), str(tmp_path / "absent.json")],
         f"{tmp_path / 'absent.json'}: No such file or directory"),
        (["write-objects", "--repo", str(repo), str(tmp_path)], f"{tmp_path}: Is a directory"),
    ):
        out = cli(pk, *argv)
        assert out.returncode == 1, out.stdout + out.stderr
        assert out.stderr.strip().splitlines() == [f"packyard write-objects: {fragment}"], out.stderr


def test_cli_write_objects_from_an_objects_file(pk, tmp_path):
    donor = make_worktree_repo(tmp_path / "donor")
    ids = [i for i in git("rev-list", "--objects", "--all", git_dir=donor).decode().split() if len(i) == 40]
    batch = tmp_path / "all.batch"
    batch.write_bytes(git("cat-file", "--batch", git_dir=donor, input="\n".join(ids).encode() + b"\n"))
    target = tmp_path / "t.git"
    git("init", "-q", "--bare", str(target))
    tip = git("rev-parse", "main", git_dir=donor).strip().decode()
    doc = tmp_path / "refs.json"
    doc.write_text('{"objects": [], "ref_updates": [{"ref": "refs/heads/main", "old": null, "new": "%s"}]}' % tip)
    out = cli(pk, "write-objects", "--repo", str(target), "--no-progress", "--objects-file", str(batch), str(doc))
    assert out.returncode == 0, out.stderr
    assert git("rev-parse", "main", git_dir=target).strip().decode() == tip
    git("fsck", "--full", "--no-dangling", git_dir=target)
