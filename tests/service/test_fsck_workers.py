"""Receive checks through real workers: PACKYARD_RECEIVE_FSCK (default on) makes every queued index_pack
and unpack_objects strict although the message does not ask; a refused push leaves nothing behind (no
quarantine, no loose object, no ref) and the job row (and ``packyard status``) names the msg id, the
object and the path. Also the CLI's --strict / --fsck / --fsck-skiplist."""
from __future__ import annotations

import json
import subprocess

from fsckcases import CASES, Source, git_verdict
from gitutil import batch_check_all, git, snapshot_tree
from procutil import run_task


def _bad_push(tmp_path, incoming, name: str):
    src = Source(tmp_path / "src.git")
    case = CASES[name](src)
    commit = src.commit(case.push[-1])       # a commit over the bad tree: what a real push carries
    pack = incoming / f"{name}.pack"
    pack.write_bytes(src.pack(case.push + [commit]))
    return src, case, commit, pack


def _status(pk, repo):
    return subprocess.run(["packyard", "status", "--repo", str(repo), "--limit", "5"], env=pk.cli_env(),
                          capture_output=True, text=True, timeout=120, cwd=pk.session_dir)


def test_queued_jobs_are_strict_by_default_and_refusals_leave_nothing(tmp_path, store_root, incoming,
                                                                    celery_worker, celery_app, pk):
    for task, pack_arg, name, msg_id, path, bad_at in (
            ("packyard.index_pack", "pack", "hasDotgit-ntfs-short", "hasDotgit", "git~1", -1),      # the tree
            ("packyard.unpack_objects", "pack_path", "gitmodulesName", "gitmodulesName", ".gitmodules", 0)):  # blob
        src, case, commit, pack = _bad_push(tmp_path / task, incoming, name)
        tool = "index-pack" if task.endswith("index_pack") else "unpack-objects"
        (tmp_path / task / "oracle").mkdir()
        assert not git_verdict(src, case, tool, tmp_path / task / "oracle").accepted   # git refuses it too
        repo = store_root / f"{name}.git"
        git("init", "-q", "--bare", str(repo))
        before = snapshot_tree(repo)
        # the message does not ask for --strict: the server decides
        _res, _value, job = run_task(celery_app, pk, task, repo=str(repo), **{pack_arg: str(pack)},
                                     ref_updates=[{"ref": "refs/heads/main", "old": None, "new": commit}])
        assert job.state.value == "FAILURE"
        bad = case.push[bad_at]
        assert job.error_type == "FsckError", job.error
        assert f"{bad}: {msg_id}: " in job.error and f"[path {path}]" in job.error, job.error
        assert snapshot_tree(repo) == before, "the refused push left files behind"
        assert not [p for p in (repo / "objects").iterdir() if p.name.startswith("incoming-")]
        assert git("for-each-ref", git_dir=repo) == b""
        out = _status(pk, repo)
        assert out.returncode == 0 and "FAILURE" in out.stdout and msg_id in out.stdout, out.stdout


def test_queued_unpack_of_a_good_push_succeeds(tmp_path, store_root, incoming, celery_worker, celery_app, pk):
    src = Source(tmp_path / "src.git")
    case = CASES["ok-history"](src)
    pack = incoming / "good.pack"
    pack.write_bytes(src.pack(case.push))
    repo = store_root / "good.git"
    git("init", "-q", "--bare", str(repo))
    _res, value, job = run_task(celery_app, pk, "packyard.unpack_objects", repo=str(repo), pack_path=str(pack),
                                ref_updates=[{"ref": "refs/tags/v1.0", "old": None, "new": case.push[-1]}])
    assert job.state.value == "SUCCESS", job.error
    assert len(batch_check_all(repo)) == len(case.push)
    git("fsck", "--full", "--strict", "--no-dangling", git_dir=repo)


def _cli(pk, *args):
    return subprocess.run(["packyard", *args], env=pk.cli_env(), capture_output=True, text=True, timeout=120,
                          cwd=pk.session_dir)


def test_cli_strict_and_severities(tmp_path, pk):
    src = Source(tmp_path / "src.git")
    case = CASES["zeroPaddedFilemode"](src)
    pack = tmp_path / "z.pack"
    pack.write_bytes(src.pack(case.push))
    for cmd in ("index-pack", "unpack-objects"):
        repo = tmp_path / f"{cmd}.git"
        git("init", "-q", "--bare", str(repo))
        out = _cli(pk, cmd, "--repo", str(repo), "--strict", str(pack))
        assert out.returncode == 1 and "FsckError" in out.stderr and "zeroPaddedFilemode" in out.stderr, out.stderr
        out = _cli(pk, cmd, "--repo", str(repo), "--strict", "--fsck", "zeroPaddedFilemode=ignore", "--json",
                   str(pack))
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["repo"] == str(repo.resolve())
        assert len(batch_check_all(repo)) == len(case.push)
    # a skip list names the bad tree: accepted, as git's fsck.skipList
    repo = tmp_path / "skip.git"
    git("init", "-q", "--bare", str(repo))
    skip = tmp_path / "skiplist"
    skip.write_text(case.push[-1] + "\n")
    out = _cli(pk, "unpack-objects", "--repo", str(repo), "--strict", "--fsck-skiplist", str(skip), str(pack))
    assert out.returncode == 0, out.stderr
    out = _cli(pk, "index-pack", "--repo", str(repo), "--fsck", "noSuchId=error", str(pack))
    assert out.returncode == 1 and "unhandled message id: nosuchid" in out.stderr.lower()
