"""Pushes through the queue (PACKYARD_RECEIVE_MODE=queue, the default outside the test session): a real
``git push --receive-pack='packyard receive-pack'`` whose ingest and ref transaction run as a
``packyard.receive_pack`` job on the session's real Celery worker, against ``git receive-pack`` on an identical
repository (the same ``--porcelain`` output, exit status and refs), the job row, the spooled pack gone, the
keepalive packets a side-band client gets while it waits, and a job no worker takes in time."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gitutil import GIT_ENV, fsck, git

RECEIVE_PACK = "packyard receive-pack"


def _commit(work: Path, name: str, text: str) -> None:
    (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", f"{name}: {text[:20]}", cwd=work)


@pytest.fixture
def client(tmp_path: Path) -> Path:
    work = tmp_path / "client"
    git("init", "-q", "-b", "main", str(work))
    for i in range(3):
        _commit(work, f"f{i}.txt", "".join(f"line {j} of {i}\n" for j in range(200)))
    git("tag", "-a", "-m", "release", "v1", cwd=work)
    git("branch", "feature", "HEAD~1", cwd=work)
    return work


def _create_main(client: Path) -> tuple[str, bytes]:
    """(the client's HEAD, a raw push request creating refs/heads/main at it for a side-band-64k client: the
    command, a flush and the pack)."""
    tip = git("rev-parse", "HEAD", cwd=client).decode().strip()
    pack = git("pack-objects", "-q", "--stdout", "--revs", cwd=client, input=b"HEAD\n")
    line = f"{'0' * 40} {tip} refs/heads/main\0report-status side-band-64k\n".encode()
    return tip, b"%04x" % (len(line) + 4) + line + b"0000" + pack


def _env(pk, **extra: str) -> dict[str, str]:
    return {**pk.cli_env(PACKYARD_RECEIVE_MODE="queue", **extra), **GIT_ENV}


def _push(pk, client: Path, repo: Path, *args: str, ours: bool, **env: str) -> tuple[int, str]:
    cmd = ["git", "push", "--porcelain", *(["--receive-pack", RECEIVE_PACK] if ours else []), str(repo), *args]
    proc = subprocess.run(cmd, cwd=client, env=_env(pk, **env), capture_output=True, timeout=180)
    return proc.returncode, proc.stdout.decode()


def _refs(repo: Path) -> str:
    return git("for-each-ref", "--format=%(refname) %(objectname)", git_dir=repo).decode()


def test_queued_pushes_match_git(client: Path, store_root: Path, tmp_path: Path, pk, celery_worker) -> None:
    ours, theirs = store_root / "queued.git", tmp_path / "theirs.git"
    for repo in (ours, theirs):
        git("init", "-q", "--bare", str(repo))
    steps: list[tuple[str, ...]] = [
        ("main", "v1", "feature"),                                   # create, with a tag
        ("main",),                                                   # fast-forward (after a commit below)
        ("+main~1:refs/heads/feature",),                             # forced non-fast-forward
        (":refs/heads/feature",),                                    # delete
        ("--atomic", "main", "refs/heads/main:refs/heads/other"),    # atomic, both pass
    ]
    for i, refspecs in enumerate(steps):
        if i == 1:
            _commit(client, "next.txt", "next\n")
        got = {side: _push(pk, client, repo, *refspecs, ours=side == "ours")
               for side, repo in (("ours", ours), ("theirs", theirs))}
        assert got["ours"][0] == got["theirs"][0], (refspecs, got)
        assert got["ours"][1].replace(str(ours), "R") == got["theirs"][1].replace(str(theirs), "R"), (refspecs, got)
        assert _refs(ours) == _refs(theirs), refspecs
    fsck(ours)
    assert not list(pk.incoming_dir.glob("receive-*.pack"))             # the spooled packs are gone


def test_a_queued_push_is_a_job_the_worker_ran(client: Path, store_root: Path, pk, settings, celery_worker) -> None:
    from sqlalchemy import select

    from packyard.workers.records import Job, session_scope

    repo = store_root / "job.git"
    git("init", "-q", "--bare", str(repo))
    rc, out = _push(pk, client, repo, "-o", "queued.marker", "main", ours=True)
    assert rc == 0, out
    with session_scope(settings) as s:
        jobs = [j for j in s.scalars(select(Job).where(Job.kind == "packyard.receive_pack"))
                if j.params and j.params.get("push_options") == ["queued.marker"]]
    assert len(jobs) == 1
    job = jobs[0]
    assert job.state.value == "SUCCESS" and job.worker_hostname and job.worker_hostname.startswith("test-")
    assert job.params["pack"].startswith("receive-") and job.counters["refs_moved"] == 1


def test_a_bad_pack_through_the_queue_is_refused_as_git_refuses_it(store_root: Path, tmp_path: Path, pk,
                                                                   celery_worker) -> None:
    """A raw request whose pack stops mid-object: the same report bytes as git's, a FAILURE job row."""
    repo = store_root / "bad.git"
    git("init", "-q", "--bare", str(repo))
    blob = git("hash-object", "-w", "--stdin", git_dir=repo, input=b"x" * 5000).decode().strip()
    pack = git("pack-objects", "-q", "--stdout", git_dir=repo, input=blob.encode() + b"\n")
    for p in (repo / "objects").glob("??/*"):
        p.unlink()
    zero = "0" * 40
    line = f"{zero} {blob} refs/heads/blob\0report-status\n".encode()
    request = b"%04x" % (len(line) + 4) + line + b"0000" + pack[: len(pack) // 2]
    proc = subprocess.run(["packyard", "receive-pack", str(repo)], input=request, env=_env(pk),
                          capture_output=True, timeout=120)
    assert b"unpack index-pack abnormal exit" in proc.stdout and b"ng refs/heads/blob unpacker error" in proc.stdout
    assert git("for-each-ref", git_dir=repo) == b""
    assert not list(pk.incoming_dir.glob("receive-*.pack"))


def test_a_waiting_side_band_client_gets_keepalives(client: Path, store_root: Path, pk, settings,
                                                    celery_worker) -> None:
    """While the job waits (here: for the repository lease, which the test holds for a second), ``0005\\1``
    packets (git's keepalive) reach a side-band-64k client; then the report."""
    import time

    from packyard.workers.locks import redis_client, repo_lock

    repo = store_root / "keepalive.git"
    git("init", "-q", "--bare", str(repo))
    tip, request = _create_main(client)
    with repo_lock(redis_client(settings), str(repo.resolve()), ttl=30):
        proc = subprocess.Popen(["packyard", "receive-pack", str(repo)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_env(pk, PACKYARD_RECEIVE_KEEPALIVE="0.1"))
        assert proc.stdin is not None
        proc.stdin.write(request)
        proc.stdin.close()
        proc.stdin = None   # (communicate() below must not flush it)
        pk.wait_until(lambda: _started_push(settings, repo), 60, what="the push's job to start")
        time.sleep(0.5)   # the job waits for the lease held here; the client gets keepalives
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    after_advert = out[out.index(b"\n0000") + 5:]
    assert after_advert.startswith(b"0005\x01" * 3), after_advert[:40]   # keepalives first, then the report
    assert b"unpack ok" in after_advert and b"ok refs/heads/main" in after_advert
    assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == tip


def _started_push(settings, repo: Path) -> bool:
    from sqlalchemy import select

    from packyard.workers.records import Job, JobState, Repository, session_scope

    with session_scope(settings) as s:
        return s.scalar(select(Job.id).join(Repository, Job.repo_id == Repository.id).where(
            Repository.path == str(repo.resolve()), Job.kind == "packyard.receive_pack",
            Job.state == JobState.STARTED)) is not None


def test_a_push_no_worker_takes_in_time_is_refused(client: Path, store_root: Path, pk, celery_worker) -> None:
    """PACKYARD_RECEIVE_QUEUE_WAIT=0: the message expires before any worker may run it; the push is refused,
    bounded in time, and no ref moves (then or later)."""
    repo = store_root / "expired.git"
    git("init", "-q", "--bare", str(repo))
    rc, out = _push(pk, client, repo, "main", ours=True, PACKYARD_RECEIVE_QUEUE_WAIT="0")
    assert rc != 0 and "refs/heads/main" in out and "[remote rejected]" in out, out
    assert git("for-each-ref", git_dir=repo) == b""


def test_hooks_run_on_the_worker_as_git_runs_them(client: Path, store_root: Path, tmp_path: Path, pk, settings,
                                                  celery_worker) -> None:
    """A worker of its own (queue ``push-hooks``) whose settings name the hooks: the pushes queued there run
    git's pre-receive (quarantine), update and post-receive; the same porcelain output, refs and hook records
    as ``git receive-pack`` with the same scripts through ``core.hooksPath``, and the hooks' lines reach the
    client (as they come, before the report)."""
    import dataclasses
    import os

    from test_push_parity import RECORD_POST_RECEIVE, RECORD_PRE_RECEIVE, UPDATE_REFUSES_NEW

    where = tmp_path / "hooks"
    where.mkdir()
    scripts = {"pre-receive": RECORD_PRE_RECEIVE, "update": UPDATE_REFUSES_NEW, "post-receive": RECORD_POST_RECEIVE}
    for name, body in scripts.items():
        (where / name).write_text(body)
        (where / name).chmod(0o755)
    hooked = dataclasses.replace(settings, receive_pre_receive_hook=where / "pre-receive",
                                 receive_update_hook=where / "update", receive_post_receive_hook=where / "post-receive")
    worker = pk.WorkerProcess(hooked, f"hooks-{os.getpid()}@%h", tmp_path / "hooks-worker.log", queues=("push-hooks",))
    try:
        worker.wait_ready()
        ours, theirs = store_root / "hooked.git", tmp_path / "theirs.git"
        for repo in (ours, theirs):
            git("init", "-q", "--bare", str(repo))
            git("config", "receive.advertisePushOptions", "true", git_dir=repo)
        git("config", "core.hooksPath", str(where), git_dir=theirs)
        args = ("-o", "ci.skip", "main", "HEAD:refs/heads/new-branch", "v1")
        got = {}
        for side, repo in (("theirs", theirs), ("ours", ours)):
            cmd = ["git", "push", "--porcelain", *(["--receive-pack", RECEIVE_PACK] if side == "ours" else []),
                   str(repo), *args]
            proc = subprocess.run(cmd, cwd=client, env=_env(pk, PACKYARD_RECEIVE_QUEUE="push-hooks"),
                                  capture_output=True, timeout=180)
            got[side] = (proc.returncode, proc.stdout.decode().replace(str(repo), "R"), proc.stderr.decode())
        assert got["ours"][:2] == got["theirs"][:2], got
        assert _refs(ours) == _refs(theirs)
        logs = {side: {p.name: p.read_text() for p in sorted(repo.glob("hook-*.log"))}
                for side, repo in (("ours", ours), ("theirs", theirs))}
        assert logs["ours"] == logs["theirs"] and "hook-post-receive.log" in logs["ours"], logs
        said = {side: sorted(ln for ln in got[side][2].splitlines() if ln.startswith("remote: policy: "))
                for side in got}
        assert said["ours"] == said["theirs"] and said["ours"], got
        assert any(rec.get("task") == "packyard.receive_pack" for rec in worker.log_lines())   # it ran there
    finally:
        worker.stop()


def test_a_queued_push_over_http_streams_keepalives_then_the_report(client: Path, store_root: Path, tmp_path: Path,
                                                                    pk, settings, celery_worker) -> None:
    """``packyard http`` in queue mode: the response is streamed, so the keepalives written while the job waits
    (for a lease the test holds) reach the HTTP client before the report, as git http-backend streams
    receive-pack's output; then a real ``git push http://`` lands."""
    import http.client
    import time

    from httputil import PackyardHttp

    from packyard.workers.locks import redis_client, repo_lock

    repo = store_root / "http-keepalive.git"
    git("init", "-q", "--bare", str(repo))
    tip, body = _create_main(client)
    server = PackyardHttp(_env(pk, PACKYARD_RECEIVE_KEEPALIVE="0.1"), tmp_path / "http.log")
    try:
        host, port = server.url.removeprefix("http://").split(":")
        rel = repo.relative_to(pk.storage_root)
        with repo_lock(redis_client(settings), str(repo.resolve()), ttl=30):
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request("POST", f"/default/{rel}/git-receive-pack", body=body,
                         headers={"Content-Type": "application/x-git-receive-pack-request"})
            response = conn.getresponse()
            assert response.status == 200
            head = response.read1(64)                 # arrives while the job still waits for the lease
            pk.wait_until(lambda: _started_push(settings, repo), 60, what="the push's job to start")
            time.sleep(0.3)
        rest = response.read()
        conn.close()
        assert head.startswith(b"0005\x01"), head
        assert b"unpack ok" in rest and b"ok refs/heads/main" in rest, rest[-200:]
        assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == tip
        _commit(client, "over-http.txt", "pushed over http\n")
        proc = subprocess.run(["git", "push", "-q", f"{server.url}/default/{rel}", "main"], cwd=client,
                              env=_env(pk), capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert git("rev-parse", "refs/heads/main", git_dir=repo) == git("rev-parse", "HEAD", cwd=client)
    finally:
        server.close()


def test_a_queued_push_streams_the_hooks_output_as_it_comes(client: Path, store_root: Path, tmp_path: Path, pk,
                                                            settings, celery_worker) -> None:
    """The pre-receive on the worker says a line, then works for 2 s: the line reaches the side-band client
    while the hook still runs (before the hook's last step, before the ref moves), then the report; the line
    comes once."""
    import dataclasses
    import os
    import select
    import time

    hook = tmp_path / "pre-receive"
    hook.write_text('#!/bin/sh\necho "policy: checking your push"\nsleep 2\ntouch hook-done\n')
    hook.chmod(0o755)
    hooked = dataclasses.replace(settings, receive_pre_receive_hook=hook)
    worker = pk.WorkerProcess(hooked, f"stream-{os.getpid()}@%h", tmp_path / "stream-worker.log",
                              queues=("push-stream",))
    try:
        worker.wait_ready()
        repo = store_root / "streamed.git"
        git("init", "-q", "--bare", str(repo))
        tip, request = _create_main(client)
        proc = subprocess.Popen(["packyard", "receive-pack", str(repo)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_env(pk, PACKYARD_RECEIVE_QUEUE="push-stream"))
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(request)
        proc.stdin.close()
        proc.stdin = None
        out = b""
        deadline = time.monotonic() + 60
        while b"\x02policy: checking your push\n" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        assert b"\x02policy: checking your push\n" in out, out[-200:]
        assert not (repo / "hook-done").exists(), "the line came only after the hook was done"
        assert git("for-each-ref", git_dir=repo) == b""
        rest, err = proc.communicate(timeout=120)
        out += rest
        assert proc.returncode == 0, err
        assert out.count(b"policy: checking your push") == 1, out
        assert out.index(b"policy: checking") < out.index(b"unpack ok")
        assert (repo / "hook-done").exists()
        assert git("rev-parse", "refs/heads/main", git_dir=repo).decode().strip() == tip
    finally:
        worker.stop()


def test_hook_output_reaches_the_client_once_whatever_the_list_delivered(settings, redis_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """HookOutput with the session's real Redis: what the list delivered is not sent again; what it did not
    deliver (the list gone, Redis unreachable, a first attempt's output before a redelivered job's) comes from
    the job's result."""
    import uuid

    import redis

    from packyard.workers.receive.queued import HookOutput

    def pair(client=None):  # type: ignore[no-untyped-def]
        task = f"receive-{uuid.uuid4()}"
        worker, reader = HookOutput.open(settings, task), HookOutput.open(settings, task)
        if client is not None:
            worker.client = reader.client = client
        return worker, reader

    got: list[bytes] = []
    worker, reader = pair()
    worker.append(b"one\n")
    worker.append(b"two\n")
    reader.read_new(got.append)
    worker.append(b"three\n")
    assert got == [b"one\n", b"two\n"]
    assert reader.rest(b"one\ntwo\nthree\n") == b"three\n"          # the rest from the result, nothing twice
    assert reader.client.exists(reader.key) == 0                      # the list goes with the push
    worker, reader = pair()
    worker.append(b"first attempt\n")
    reader.read_new(got.append)
    assert reader.rest(b"second attempt\n") == b"second attempt\n"    # not its beginning: all of it
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    dead = redis.Redis(unix_socket_path=str(tmp_path / "nothing.sock"), socket_timeout=1, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))
    worker, reader = pair(dead)
    worker.append(b"lost\n")
    reader.read_new(got.append)
    assert worker.broken and reader.broken
    assert reader.rest(b"lost\n") == b"lost\n"                        # all of it from the result
