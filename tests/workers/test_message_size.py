"""Issue 16: a job message over PACKYARD_MAX_MESSAGE_BYTES is refused by the embedded Redis before it is
stored (not in a queue, not in the append-only file), and by `packyard submit` before it is published."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gitutil import ROOT, make_worktree_repo


@pytest.fixture
def small_state():
    state = Path(tempfile.mkdtemp(prefix="pkm-", dir="/tmp"))   # a short unix socket path
    yield state
    shutil.rmtree(state, ignore_errors=True)


def _write_objects_kwargs(content_bytes: int) -> dict:
    data = base64.b64encode(os.urandom(content_bytes)).decode()
    return {"repo": "/nowhere/r.git", "objects": [{"type": "blob", "data": data}]}


def test_embedded_redis_refuses_an_oversized_message_before_storing_it(small_state):
    import kombu.exceptions
    import redis
    from celery import Celery

    from packyard.workers.embedded import EmbeddedRedis

    limit = 2 << 20
    server = EmbeddedRedis(small_state, max_message_bytes=limit).start()
    try:
        aof = small_state / "redis" / "appendonly.aof"
        app = Celery("sizecheck", broker=server.celery_url)
        app.conf.broker_connection_retry_on_startup = False
        with server.client() as c:
            assert c.config_get("proto-max-bulk-len") == {"proto-max-bulk-len": str(limit)}
            assert c.config_get("client-query-buffer-limit") == {"client-query-buffer-limit": str(2 * limit)}

            # Under the limit (content 0.5 MiB: ~0.9 MiB once kombu base64-encodes the body): stored.
            app.send_task("packyard.write_objects", kwargs=_write_objects_kwargs(512 << 10))
            assert c.llen("celery") == 1
            before = aof.stat().st_size

            # Over it (content 3 MiB, 5.3 MiB on the wire): the connection is refused mid-request.
            with pytest.raises((kombu.exceptions.OperationalError, redis.ConnectionError)):
                app.send_task("packyard.write_objects", kwargs=_write_objects_kwargs(3 << 20))
            assert c.llen("celery") == 1, "the oversized message was queued"
            grown = aof.stat().st_size - before
            assert grown < 64 << 10, f"the append-only file grew by {grown} bytes"
            assert c.ping()   # the server itself is fine
        app.close()
    finally:
        server.stop()


def test_embedded_redis_takes_its_limit_from_the_settings(small_state):
    from packyard.workers.embedded import EmbeddedRedis
    from packyard.workers.settings import Settings

    s = Settings.from_env({"PACKYARD_STATE_DIR": str(small_state), "PACKYARD_MAX_MESSAGE_BYTES": str(5 << 20)})
    server = EmbeddedRedis.for_settings(s).start()
    try:
        with server.client() as c:
            assert c.config_get("proto-max-bulk-len")["proto-max-bulk-len"] == str(5 << 20)
    finally:
        server.stop()
    # Default: 16 MiB, or more when a write_objects message may carry more (base64 twice + headers).
    assert Settings.from_env({"PACKYARD_STATE_DIR": str(small_state)}).message_limit == 16 << 20
    big = Settings.from_env({"PACKYARD_STATE_DIR": str(small_state), "PACKYARD_WRITE_OBJECTS_MAX_BYTES": str(10 << 20)})
    assert big.message_limit == (21 << 20)


def test_a_reused_server_gets_the_limits_too(small_state):
    """A server left running by an older packyard (Redis's own defaults: 512 MB) gets the limits when
    a packyard process reuses it."""
    from packyard.workers.embedded import EmbeddedRedis

    first = EmbeddedRedis(small_state, max_message_bytes=512 << 20).start()
    try:
        reused = EmbeddedRedis(small_state, max_message_bytes=4 << 20).start()
        assert reused.reused and reused.process is None
        with first.client() as c:
            assert c.config_get("proto-max-bulk-len")["proto-max-bulk-len"] == str(4 << 20)
            assert c.config_get("client-query-buffer-limit")["client-query-buffer-limit"] == str(8 << 20)
    finally:
        first.stop()


def test_settings_refuse_a_limit_a_full_write_objects_message_would_not_fit(small_state):
    from packyard.workers.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=r"PACKYARD_MAX_MESSAGE_BYTES \(2097152\) must be at least 3145728"):
        Settings.from_env({"PACKYARD_STATE_DIR": str(small_state), "PACKYARD_MAX_MESSAGE_BYTES": str(2 << 20)})


def test_submit_refuses_an_oversized_message_before_publishing(pk, store_root, redis_client):
    """The argv goes in on stdin: a message this big does not fit in one argument of a real exec."""
    repo = make_worktree_repo(store_root)
    objects = '[{"type": "blob", "data": "%s"}]' % base64.b64encode(os.urandom(2 << 20)).decode()
    queued = sum(redis_client.llen(k) for k in redis_client.scan_iter(_type="list"))
    for extra in ([], ["--no-check"]):   # the broker's limit is not one of the skippable argument checks
        argv = ["submit", "write_objects", "--repo", str(repo), *extra, "-p", f"objects={objects}"]
        out = subprocess.run([sys.executable, "-c", "import json, sys; from packyard.workers.cli import main; "
                              "sys.exit(main(json.load(sys.stdin)))"], input=json.dumps(argv),
                             env=pk.cli_env(PACKYARD_MAX_MESSAGE_BYTES=str(3 << 20)), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr[-2000:]
        assert out.stderr.startswith("packyard submit: LimitExceededError: packyard.write_objects message of "), \
            out.stderr
        assert "over the 3145728-byte limit of the broker (PACKYARD_MAX_MESSAGE_BYTES); not sent" in out.stderr
        assert "objects_file=" in out.stderr and "queued" not in out.stdout and "Traceback" not in out.stderr
    assert sum(redis_client.llen(k) for k in redis_client.scan_iter(_type="list")) == queued


def test_compose_redis_has_the_size_directives_of_the_default_settings(small_state):
    import yaml

    from packyard.workers.embedded import size_directives
    from packyard.workers.settings import Settings

    command = yaml.safe_load((ROOT / "docker-compose.yml").read_text())[
        "services"]["redis"]["command"]
    limit = Settings.from_env({"PACKYARD_STATE_DIR": str(small_state)}).message_limit
    for directive in size_directives(limit):
        name, value = directive.split()
        assert command[command.index(f"--{name}") + 1] == value, command
