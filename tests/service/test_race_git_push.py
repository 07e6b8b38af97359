"""The race harness's real-client pusher (workers/race/gitpush.py): a real ``git push`` through
``packyard receive-pack`` with the run's settings; the ref moves, the push is a job row, and a push git
rejects is a failed push of the run, never a landed one. (The whole race with it: tests/service/test_race.py.)"""
from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from gitutil import git
from packyard.workers.race.gitpush import GitPushFailed, GitPushRun
from packyard.workers.race.pushes import Frontend


def _frontend(store_root: Path, tmp_path: Path) -> Frontend:
    fe = Frontend(store_root / "served.git", tmp_path / "work.git", tmp_path / "incoming", seed=5, files=3,
                  commits=5, topics=1)
    fe.incoming.mkdir()
    fe.build()
    return fe


def _run(fe: Frontend, push, tmp_path: Path, settings, pk) -> GitPushRun:  # type: ignore[no-untyped-def]
    run = GitPushRun(push, fe.work, fe.served, tmp_path / "scratch", settings.as_env())
    pk.wait_until(run.ready, 120, what="git push to finish")
    return run


def test_a_git_push_lands_as_a_receive_pack_job(redis_server, migrated_db, store_root, tmp_path, settings, pk):  # type: ignore[no-untyped-def]
    from packyard.workers.records import Job, session_scope

    fe = _frontend(store_root, tmp_path)
    push = fe.next_push("git_push")
    assert push.kwargs == {} and push.task == "packyard.receive_pack"
    run = _run(fe, push, tmp_path, settings, pk)
    assert run.successful() and run.result is None
    fe.landed(push)
    assert git("rev-parse", "refs/heads/main", git_dir=fe.served).decode().strip() == push.new
    have = git("cat-file", "--batch-check", git_dir=fe.served,
               input="".join(f"{o}\n" for o in push.objects).encode()).decode()
    assert "missing" not in have and len(push.objects) >= 3
    git("fsck", "--full", "--strict", git_dir=fe.served)
    with session_scope(settings) as s:
        rows = [r for r in s.execute(select(Job).where(Job.kind == "packyard.receive_pack")).scalars()
                if push.new in json.dumps(r.params)]   # (the session's database: this push's row by its command)
        assert [r.state.value for r in rows] == ["SUCCESS"]
        assert rows[0].params and str(fe.served.resolve()) in json.dumps(rows[0].params)
    assert not list((tmp_path / "scratch").iterdir())   # its output files are gone


def test_a_rejected_push_is_a_failure_not_a_landing(redis_server, migrated_db, store_root, tmp_path, settings,  # type: ignore[no-untyped-def]
                                                     pk):
    fe = _frontend(store_root, tmp_path)
    first, second = fe.next_push("git_push"), fe.next_push("git_push")   # siblings on the same main
    assert _run(fe, first, tmp_path, settings, pk).successful()
    fe.landed(first)
    run = _run(fe, second, tmp_path, settings, pk)
    assert not run.successful()
    assert isinstance(run.result, GitPushFailed) and "rejected" in str(run.result), run.result
    assert git("rev-parse", "refs/heads/main", git_dir=fe.served).decode().strip() == first.new
