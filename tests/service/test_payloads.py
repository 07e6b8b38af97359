"""Payloads are stored once, as a summary, readable by the service user only.

A write_objects job with a large blob used to leave the whole payload in the result backend
(``result_extended``: args kept for a week) and in ``jobs.params``, in files every local user
could read.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from gitutil import git


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_job_params_and_result_backend_keep_no_object_content(celery_worker, celery_app, pk, tmp_path, store_root,
                                                             redis_client):
    repo = store_root / "r.git"
    git("init", "-q", "--bare", str(repo))
    content = os.urandom(300 * 1024)
    objects = [{"type": "blob", "data": base64.b64encode(content).decode()}]
    res = celery_app.send_task("packyard.write_objects", kwargs={"repo": str(repo), "objects": objects})
    value = res.get(timeout=120)
    oid = value["oids"][0]
    assert git("cat-file", "blob", oid, git_dir=repo) == content

    job = pk.job_row(res.id)
    payload = json.dumps(objects, sort_keys=True, separators=(",", ":")).encode()
    assert job.params == {"objects": {"count": 1, "bytes": len(content),
                                      "sha256": hashlib.sha256(payload).hexdigest()}}
    stored = redis_client.get(f"celery-task-meta-{res.id}")
    meta = json.loads(stored)
    assert meta["status"] == "SUCCESS" and meta["result"]["oids"] == [oid]
    assert "args" not in meta and "kwargs" not in meta and len(stored) < 4096, "results only, no arguments"
    assert objects[0]["data"][:64].encode() not in stored


def test_message_argument_reprs_are_summaries(celery_app, redis_client, migrated_db, tmp_path):
    """Events (and Flower, which builds its task list from them) show argsrepr/kwargsrepr from the
    message headers: the summary, not the first KiB of the objects."""
    import uuid

    queue = f"nobody-{uuid.uuid4().hex[:6]}"
    data = base64.b64encode(b"secret content " * 100).decode()
    res = celery_app.send_task("packyard.write_objects", queue=queue,
                               kwargs={"repo": str(tmp_path), "objects": [{"type": "blob", "data": data}]})
    try:
        (raw,) = redis_client.lrange(queue, 0, -1)
        headers = json.loads(raw)["headers"]
        assert headers["id"] == res.id
        assert "'count': 1" in headers["kwargsrepr"] and "'sha256':" in headers["kwargsrepr"]
        assert data[:32] not in headers["kwargsrepr"] and str(tmp_path) in headers["kwargsrepr"]
    finally:
        redis_client.delete(queue)


def test_state_dir_database_and_redis_files_are_private(pk):
    from packyard.workers.embedded import EmbeddedRedis

    state = Path(tempfile.mkdtemp(prefix="pkp-", dir="/tmp")) / "state"
    old_umask = os.umask(0o022)
    try:
        env = pk.cli_env(PACKYARD_STATE_DIR=str(state))
        env.pop("PACKYARD_DATABASE_URL")
        out = subprocess.run(["packyard", "migrate"], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert mode(state) == 0o700
        assert mode(state / "packyard.db") == 0o600
        assert all(mode(p) == 0o600 for p in state.glob("packyard.db*")), {p.name: oct(mode(p))
                                                                         for p in state.glob("packyard.db*")}
        server = EmbeddedRedis(state).start()
        try:
            with server.client() as c:
                c.set("k", "v")
            assert mode(state / "redis") == 0o700
            aof = state / "redis" / "appendonly.aof"
            assert aof.exists() and mode(aof) == 0o600
            assert {p.name: mode(p) for p in (state / "redis").iterdir()} == {
                p.name: 0o600 for p in (state / "redis").iterdir()}
        finally:
            server.stop()
        # A redis dir loosened by hand is made private again at the next start.
        os.chmod(state / "redis", 0o755)
        server = EmbeddedRedis(state).start()
        server.stop()
        assert mode(state / "redis") == 0o700
    finally:
        os.umask(old_umask)
        shutil.rmtree(state.parent, ignore_errors=True)
