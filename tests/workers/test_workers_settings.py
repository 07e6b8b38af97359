"""Settings from the environment, the embedded Redis server's life cycle, and the log format choice."""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from packyard.workers.settings import Settings


def test_defaults_are_embedded_under_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert s.state_dir == tmp_path / ".state"
    assert s.embedded_redis
    assert s.redis_py_url == f"unix://{tmp_path / '.state' / 'redis.sock'}"
    assert s.broker_url == f"redis+socket://{tmp_path / '.state' / 'redis.sock'}"
    assert s.database_url == f"sqlite:///{tmp_path / '.state' / 'packyard.db'}"
    assert (s.worker_concurrency, s.log_format, s.lock_ttl) == (2, "auto", 60.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lock_ttl = 1  # type: ignore[misc]


def test_explicit_environment(tmp_path):
    env = {"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_REDIS_URL": "redis://cache:6379/2",
           "PACKYARD_DATABASE_URL": "postgresql+psycopg://u@db/packyard", "PACKYARD_WORKER_CONCURRENCY": "8",
           "PACKYARD_LOG_FORMAT": "JSON", "PACKYARD_MAX_PACK_BYTES": "1048576", "PACKYARD_LOCK_TTL": "2.5",
           "PACKYARD_NIGHTLY_REPOS": os.pathsep.join([str(tmp_path / "a.git"), "", str(tmp_path / "b.git")])}
    s = Settings.from_env(env)
    assert not s.embedded_redis and s.broker_url == s.redis_py_url == "redis://cache:6379/2"
    assert s.database_url == "postgresql+psycopg://u@db/packyard"
    assert (s.worker_concurrency, s.log_format, s.max_pack_bytes, s.lock_ttl) == (8, "json", 1048576, 2.5)
    assert s.nightly_repos == (str(tmp_path / "a.git"), str(tmp_path / "b.git"))
    # A child process given as_env() reads the same settings back.
    assert Settings.from_env(s.as_env()) == s


def test_embedded_socket_url_round_trips_to_children(tmp_path):
    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path)})
    child = Settings.from_env(s.as_env())
    assert child.broker_url == s.broker_url and child.database_url == s.database_url
    assert not child.embedded_redis  # the child uses the server; it does not start its own


@pytest.mark.parametrize("name,value", [("PACKYARD_WORKER_CONCURRENCY", "two"), ("PACKYARD_LOG_FORMAT", "xml"),
                                        ("PACKYARD_LOCK_TTL", "soon")])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        Settings.from_env({name: value})


def test_embedded_redis_start_reuse_stop():
    from packyard.workers.embedded import EmbeddedRedis

    state = Path(tempfile.mkdtemp(prefix="pke-", dir="/tmp"))
    try:
        servers = [EmbeddedRedis(state) for _ in range(3)]
        threads = [threading.Thread(target=srv.start) for srv in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        owners = [srv for srv in servers if not srv.reused]
        assert len(owners) == 1, "exactly one server started; the others reused it"
        reusers = [srv for srv in servers if srv.reused]
        client = reusers[0].client()
        client.set("k", "v")
        assert reusers[1].client().get("k") == b"v"
        assert client.config_get("port")["port"] == "0"  # no TCP listener
        client.close()
        reusers[0].stop()                  # a reusing handle does not stop the owner's server
        assert owners[0].ping()
        owners[0].stop()
        assert not owners[0].ping() and not (state / "redis.sock").exists()
        assert owners[0].process is None
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(state, ignore_errors=True)


def test_socket_path_too_long_is_refused(tmp_path):
    from packyard.workers.embedded import EmbeddedRedis, EmbeddedRedisError

    with pytest.raises(EmbeddedRedisError, match="too long"):
        EmbeddedRedis(tmp_path / ("x" * 120)).start()


def _log_through(stream, fmt):
    from packyard.workers import logs as plog

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        plog.configure(fmt, "INFO", stream=stream, force=True)
        plog.bind_job(job_id="j-1", task="packyard.verify_repo", repo="/r.git")
        plog.get_logger("packyard.test").info("job.finished", counters={"objects": 3})
        logging.getLogger("celery.test").info("a stdlib line")
        plog.clear_job()
    finally:
        root.handlers, _ = saved
        root.setLevel(saved[1])
        plog._configured = None


def test_json_lines_when_not_a_terminal():
    out = io.StringIO()
    _log_through(out, "auto")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["event"] == "job.finished" and lines[0]["counters"] == {"objects": 3}
    for line in lines:  # job context on every line, stdlib (Celery) lines included
        assert (line["job_id"], line["task"], line["repo"]) == ("j-1", "packyard.verify_repo", "/r.git")
        assert line["timestamp"].endswith("Z")


def test_console_renderer_on_a_terminal():
    master, slave = os.openpty()
    stream = os.fdopen(slave, "w", buffering=1)
    try:
        _log_through(stream, "auto")
        stream.flush()
        text = os.read(master, 65536).decode(errors="replace")
    finally:
        stream.close()
        os.close(master)
    assert "job.finished" in text and "job_id" in text and "j-1" in text
    assert not text.lstrip().startswith("{")


def test_maintenance_settings_and_policy(tmp_path):
    env = {"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_REDIS_URL": "redis://r:6379/0",
           "PACKYARD_MAINTENANCE_CRON": " 15  3 * *  0 ",
           "PACKYARD_MAINTENANCE_WINDOW": "7200", "PACKYARD_MAINTENANCE_CONCURRENCY": "4",
           "PACKYARD_PLAN_AFTER_INGESTS": "25", "PACKYARD_MAINTENANCE_LOOSE_LIMIT": "6700",
           "PACKYARD_MAINTENANCE_FULL_INTERVAL": "86400", "PACKYARD_MAINTENANCE_CRUFT_EXPIRE": "3600"}
    s = Settings.from_env(env)
    assert s.maintenance_cron == "15 3 * * 0"
    assert (s.maintenance_window, s.maintenance_concurrency, s.plan_after_ingests) == (7200.0, 4, 25)
    policy = s.maintenance_policy
    assert (policy.loose_objects_limit, policy.full_repack_interval, policy.cruft_expire) == (6700, 86400.0, 3600.0)
    assert policy.pack_limit == 50 and policy.geometric_factor == 2  # defaults: git's and Gitaly's
    assert Settings.from_env(s.as_env()) == s
    defaults = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path)})
    assert (defaults.maintenance_cron, defaults.maintenance_window, defaults.maintenance_concurrency) == \
        ("0 2 * * *", 14400.0, 2)
    with pytest.raises(ValueError, match="PACKYARD_MAINTENANCE_CRON"):
        Settings.from_env({"PACKYARD_MAINTENANCE_CRON": "0 2 * *"})


def test_storage_roots_incoming_and_limits_defaults(tmp_path):
    s = Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path)})
    assert s.storage_roots == (("default", tmp_path.resolve() / "repositories"),)
    assert s.incoming_dir == tmp_path.resolve() / "incoming"
    assert s.time_limit_for("packyard.index_pack") == (3600.0, 3900.0)
    assert s.time_limit_for("packyard.some_future_task") == s.time_limit_for("default")
    assert max(hard for _k, _s, hard in s.time_limits) < s.visibility_timeout
    assert (s.write_objects_max_bytes, s.import_max_files) == (1 << 20, 1_000_000)


def test_storage_roots_incoming_and_limits_round_trip(tmp_path):
    env = {"PACKYARD_STATE_DIR": str(tmp_path), "PACKYARD_REDIS_URL": "redis://cache:6379/2",
           "PACKYARD_STORAGE_ROOTS": f" main={tmp_path / 'a'} , archive={tmp_path / 'b'}/ ",
           "PACKYARD_INCOMING_DIR": str(tmp_path / "in"),
           "PACKYARD_TIME_LIMITS": "index_pack=10:20,packyard.verify_repo=1.5:2.5",
           "PACKYARD_IMPORT_MAX_BYTES": "1000", "PACKYARD_IMPORT_MAX_FILES": "10",
           "PACKYARD_WRITE_OBJECTS_MAX_BYTES": "2048", "PACKYARD_OBJECTS_FILE_MAX_BYTES": "4096"}
    s = Settings.from_env(env)
    assert s.storage_roots == (("main", tmp_path / "a"), ("archive", tmp_path / "b"))
    assert s.incoming_dir == tmp_path / "in"
    assert s.time_limit_for("index_pack") == (10.0, 20.0) and s.time_limit_for("verify_repo") == (1.5, 2.5)
    assert s.time_limit_for("write_objects") == (600.0, 660.0)   # kinds not named keep their defaults
    assert (s.import_max_bytes, s.import_max_files, s.write_objects_max_bytes, s.objects_file_max_bytes) == \
        (1000, 10, 2048, 4096)
    assert Settings.from_env(s.as_env()) == s


@pytest.mark.parametrize("env, message", [
    ({"PACKYARD_STORAGE_ROOTS": "main=relative/path"},
     "PACKYARD_STORAGE_ROOTS: the path of storage 'main' must be absolute"),
    ({"PACKYARD_STORAGE_ROOTS": "/just/a/path"}, "PACKYARD_STORAGE_ROOTS: bad entry"),
    ({"PACKYARD_STORAGE_ROOTS": "a=/x,a=/y"}, "storage 'a' is named twice"),
    ({"PACKYARD_INCOMING_DIR": "incoming"}, "PACKYARD_INCOMING_DIR must be an absolute path"),
    ({"PACKYARD_STORAGE_ROOTS": "a=/srv/x", "PACKYARD_INCOMING_DIR": "/srv/x/in"}, "overlap"),
    ({"PACKYARD_STORAGE_ROOTS": "a=/srv/x/repos", "PACKYARD_INCOMING_DIR": "/srv/x"}, "overlap"),
    ({"PACKYARD_TIME_LIMITS": "index_pack=20:10"}, "0 < SOFT < HARD"),
    ({"PACKYARD_TIME_LIMITS": "index_pack=soon"}, "PACKYARD_TIME_LIMITS: bad entry 'index_pack=soon'"),
    ({"PACKYARD_VISIBILITY_TIMEOUT": "3600"},
     r"PACKYARD_VISIBILITY_TIMEOUT \(3600 s\) must be greater than the largest hard time limit \(verify_repo"),
    ({"PACKYARD_TIME_LIMITS": "import_tree=100:20000"}, r"largest hard time limit \(import_tree: 20000 s"),
    ({"PACKYARD_WRITE_OBJECTS_MAX_BYTES": "0"}, "PACKYARD_WRITE_OBJECTS_MAX_BYTES must be positive"),
])
def test_unsafe_settings_are_refused_at_load(tmp_path, env, message):
    from packyard.workers.settings import SettingsError

    with pytest.raises(SettingsError, match=message):
        Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), **env})
    with pytest.raises(ValueError):   # SettingsError is a ValueError: older callers still catch it
        Settings.from_env({"PACKYARD_STATE_DIR": str(tmp_path), **env})


def test_worker_refuses_to_start_with_a_visibility_timeout_below_a_hard_limit(tmp_path, pk):
    import subprocess

    proc = subprocess.run(["packyard", "worker"], capture_output=True, text=True, timeout=60,
                          env=pk.cli_env(PACKYARD_VISIBILITY_TIMEOUT="60", PACKYARD_STATE_DIR=str(tmp_path)))
    assert proc.returncode != 0
    assert "PACKYARD_VISIBILITY_TIMEOUT (60 s) must be greater than the largest hard time limit" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_get_settings_follows_every_change_of_what_it_reads(tmp_path, monkeypatch):
    """get_settings reuses its last result only while the cwd and every PACKYARD_* variable are the same."""
    from packyard.workers.settings import get_settings

    monkeypatch.delenv("PACKYARD_STATE_DIR", raising=False)
    monkeypatch.setenv("PACKYARD_MAX_PACK_BYTES", "1000")
    first = get_settings()
    assert get_settings() is first and first.max_pack_bytes == 1000
    monkeypatch.setenv("PACKYARD_MAX_PACK_BYTES", "2000")
    assert get_settings().max_pack_bytes == 2000
    monkeypatch.setenv("PACKYARD_RECEIVE_MODE", "queue")
    monkeypatch.setenv("PACKYARD_RECEIVE_MODE", "process")          # set again to a different value
    assert get_settings().receive_mode == "process"
    for where in (tmp_path / "a", tmp_path / "b"):                  # the default state dir is the cwd's
        where.mkdir()
        monkeypatch.chdir(where)
        assert get_settings().state_dir == where.resolve() / ".state"
    before = get_settings()
    monkeypatch.setenv("PACKYARD_NEW_ONE", "x")                     # a variable that was not there before
    assert get_settings() is not before                             # is read again
