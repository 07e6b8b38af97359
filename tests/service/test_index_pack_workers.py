"""index-pack through the workers: the command with a real Redis lease, the task on a real prefork worker,
the CLI (file and stdin) and `packyard submit index-pack`; git is the oracle for every result."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gitutil import CORPUS, ROOT, batch_check_all, corpus_tip, git, needs_corpus, snapshot_tree
from packyard.store.errors import LockLostError
from packyard.store.owner import split_owner
from packyard.workers.commands.index_pack import index_pack
from procutil import run_task as queued

V1 = CORPUS / "git-v1.0.0.pack"

PACKYARD = [sys.executable, "-c", "import sys; from packyard.workers.cli import main; sys.exit(main(sys.argv[1:]))"]
COUNTERS = ("objects", "deltas", "bytes", "thin_bases_added", "peak_rss", "elapsed_us_receive",
            "elapsed_us_resolve", "elapsed_us_index", "elapsed_us_install", "flushes", "renames", "dir_fsyncs")


def bare(path: Path) -> Path:
    git("init", "-q", "--bare", str(path))
    return path


def quarantines(repo: Path) -> list[Path]:
    return [p for p in (repo / "objects").iterdir() if p.name.startswith("incoming-")]


def git_checksum(pack: Path, tmp: Path) -> str:
    out = git("index-pack", "--stdin", git_dir=bare(tmp / "oracle.git"), input=pack.read_bytes()).decode()
    return out.split()[-1]


@needs_corpus('git-v1.0.0')
def test_command_holds_lease_only_to_publish(tmp_path, redis_client):
    from packyard.workers.locks import repo_lock

    repo = bare(tmp_path / "r.git")
    events = []

    def lock():
        events.append("lock")
        return repo_lock(redis_client, repo, ttl=30)

    result = index_pack(repo, V1, lock=lock,
                        ref_updates=[{"ref": "refs/heads/main", "old": None, "new": corpus_tip()}])
    assert events == ["lock"]
    for key in COUNTERS:
        assert key in result["counters"], key
    assert result["counters"]["objects"] == 12233 and result["outcome"] == "installed"
    assert result["checksum"] == git_checksum(V1, tmp_path)
    git("fsck", "--full", "--no-dangling", git_dir=repo)
    assert git("rev-parse", "main", git_dir=repo).decode().strip() == corpus_tip()


@needs_corpus('git-v1.0.0')
def test_command_lease_lost_before_publish_installs_nothing(tmp_path, redis_client):
    from packyard.workers.locks import KEY_PREFIX, lock_name_for, repo_lock

    repo = bare(tmp_path / "r.git")
    before = snapshot_tree(repo)

    def stolen_lock():
        cm = repo_lock(redis_client, repo, ttl=30)
        # The lease expires (or is taken over) after acquisition: publishing must be refused.
        class Steal:
            def __enter__(self):
                lease = cm.__enter__()
                redis_client.delete(KEY_PREFIX + lock_name_for(repo))
                return lease

            def __exit__(self, *exc):
                return cm.__exit__(*exc)
        return Steal()

    with pytest.raises(LockLostError):
        index_pack(repo, V1, lock=stolen_lock)
    assert snapshot_tree(repo) == before and quarantines(repo) == []


def run_task(celery_app, pk, **kwargs):
    return queued(celery_app, pk, "packyard.index_pack", 180, **kwargs)[1:]


def pushed(incoming_dir: Path, pack: Path = V1) -> Path:
    """The pack as a frontend hands it over: a file in the incoming directory."""
    dest = incoming_dir / pack.name
    shutil.copyfile(pack, dest)
    return dest


@needs_corpus('git-v1.0.0')
def test_index_pack_task_on_worker(store_root, incoming, celery_worker, celery_app, pk):
    repo = bare(store_root / "r.git")
    value, job = run_task(celery_app, pk, repo=str(repo), pack=str(pushed(incoming)), strict=True,
                          keep="pushed by a test",
                          ref_updates=[{"ref": "refs/heads/main", "old": None, "new": corpus_tip()}])
    assert job.state.value == "SUCCESS", job.error
    assert job.counters == value["counters"]
    for key in COUNTERS:
        assert key in job.counters, key
    assert job.counters["objects"] == 12233 and job.counters["workers"] == 2
    keep = Path(value["keep"])
    owner, message = split_owner(keep.read_bytes())
    assert owner is not None and owner.job == job.task_id and message == b"pushed by a test\n"
    keep.unlink()
    git("fsck", "--full", "--no-dangling", git_dir=repo)
    assert len(batch_check_all(repo)) == 12233


@needs_corpus('git-v1.0.0')
def test_index_pack_task_bad_pack_fails_and_changes_nothing(store_root, incoming, celery_worker, celery_app, pk):
    repo = bare(store_root / "r.git")
    broken = incoming / "broken.pack"
    broken.write_bytes(V1.read_bytes()[:100_000])
    before = snapshot_tree(repo)
    value, job = run_task(celery_app, pk, repo=str(repo), pack=str(broken))
    assert job.state.value == "FAILURE"
    assert job.error_type == "PackFormatError" and "truncated" in job.error and "offset" in job.error
    assert snapshot_tree(repo) == before and quarantines(repo) == []


def packyard(*args: str, stdin=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*PACKYARD, *args], cwd=ROOT, capture_output=True, stdin=stdin,
                          env=env or {**os.environ, "PYTHONPATH": str(ROOT)})


@needs_corpus('git-v1.0.0')
def test_cli_index_pack_file_and_stdin(tmp_path):
    expected = git_checksum(V1, tmp_path)
    a = bare(tmp_path / "a.git")
    proc = packyard("index-pack", "--repo", str(a), str(V1))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == f"pack\t{expected}\n"
    b = bare(tmp_path / "b.git")
    with open(V1, "rb") as fin:
        proc = packyard("index-pack", "--repo", str(b), "--keep", "cli", "--json",
                        "--ref-update", f"refs/heads/main::{corpus_tip()}", "-", stdin=fin)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["checksum"] == expected and result["keep"].endswith(".keep")
    git("fsck", "--full", "--no-dangling", git_dir=b)
    # Bad input: exit status 1, a typed reason naming the offset, nothing left behind.
    c = bare(tmp_path / "c.git")
    before = snapshot_tree(c)
    broken = tmp_path / "broken.pack"
    data = bytearray(V1.read_bytes())
    data[-1] ^= 0xFF
    broken.write_bytes(bytes(data))
    proc = packyard("index-pack", "--repo", str(c), str(broken))
    assert proc.returncode == 1
    assert b"PackFormatError" in proc.stderr and b"checksum" in proc.stderr and b"offset" in proc.stderr
    assert snapshot_tree(c) == before


@needs_corpus('git-v1.0.0')
def test_submit_index_pack(store_root, incoming, celery_worker, pk):
    repo = bare(store_root / "r.git")
    pack = pushed(incoming)
    proc = packyard("submit", "index-pack", "--repo", str(repo), "-p", f"pack={pack.relative_to(pk.incoming_dir)}",
                    "--wait", env=pk.cli_env())
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = proc.stdout.decode()
    body = json.loads(out[out.index("{"):])
    assert body["state"] == "SUCCESS" and body["result"]["counters"]["objects"] == 12233
    git("fsck", "--full", "--no-dangling", git_dir=repo)
