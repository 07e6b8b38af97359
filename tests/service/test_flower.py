"""Flower, started by `packyard flower` against the session broker, lists a finished verify_repo task behind
basic auth; `packyard flower` refuses to start open to others."""
from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from gitutil import make_worktree_repo

CREDENTIALS = "operator:a-long-test-password"


def _request(url: str, auth: str | None = CREDENTIALS) -> urllib.request.Request:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    return request


def _get(url: str, auth: str | None = CREDENTIALS):
    try:
        with urllib.request.urlopen(_request(url, auth), timeout=2) as r:
            body = r.read().decode()
            try:
                return r.status, json.loads(body or "null")
            except ValueError:
                return r.status, body   # /metrics: Prometheus text
    except urllib.error.HTTPError as err:
        return err.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None, None


@contextlib.contextmanager
def _running_flower(pk, tmp_path: Path, *args: str) -> Iterator[tuple[Any, str]]:
    """``packyard flower --port <free> args...`` with the credentials in FLOWER_BASIC_AUTH (not visible in ps, as
    docker-compose passes them), once its HTTP API answers: (the Child, its base URL); stopped on the way out."""
    from packyard.workers.cli.children import Child

    port = pk.free_port()
    log = open(tmp_path / "flower.log", "wb")
    flower = Child("flower", ["packyard", "flower", "--port", str(port), *args],
                   pk.cli_env(FLOWER_BASIC_AUTH=CREDENTIALS), stdout=log)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready():
            if flower.poll() is not None:
                raise AssertionError(f"flower exited: {(tmp_path / 'flower.log').read_text()[-2000:]}")
            return _get(f"{base}/api/tasks")[0] == 200
        pk.wait_until(ready, 60, interval=0.3, what="flower's HTTP API")
        yield flower, base
    finally:
        flower.stop(timeout=10)
        log.close()


def test_flower_lists_finished_verify_repo(tmp_path, store_root, celery_worker, celery_app, pk):
    with _running_flower(pk, tmp_path) as (flower, base):
        assert _get(f"{base}/api/tasks", auth=None)[0] == 401            # no credentials, no API
        assert _get(f"{base}/api/tasks", auth="operator:wrong-password-here")[0] == 401
        repo = make_worktree_repo(store_root)
        res = celery_app.send_task("packyard.verify_repo", kwargs={"repo": str(repo)})
        value = res.get(timeout=60)

        def listed():
            status, tasks = _get(f"{base}/api/tasks?limit=100")
            task = (tasks or {}).get(res.id)
            return task if task and task.get("state") == "SUCCESS" else None
        task = pk.wait_until(listed, 30, interval=0.3, what="the task in flower's /api/tasks")
        assert task["name"] == "packyard.verify_repo"
        assert task["worker"].startswith("test-")
        assert str(value["counters"]["objects"]) in task["result"]

        status, workers = _get(f"{base}/api/workers?refresh=1")
        assert status == 200 and any(name.startswith("test-") for name in workers)

        # Flower's own /metrics (what Prometheus scrapes) serves every flower_* metric the dashboard queries.
        from prometheus_client.parser import text_string_to_metric_families

        from promql import dashboard_metrics, served

        # Behind the dashboard's credentials (Flower itself serves it to anyone).
        assert _get(f"{base}/metrics", auth=None)[0] == 401
        assert _get(f"{base}/metrics", auth="operator:wrong-password-here")[0] == 401
        with urllib.request.urlopen(_request(f"{base}/metrics"), timeout=5) as r:
            families = {f.name: f.type for f in text_string_to_metric_families(r.read().decode())}
        wanted = dashboard_metrics("flower_")
        assert wanted and all(served(n, families) for n in wanted), (wanted, sorted(families))
    assert flower.poll() is not None
    out = subprocess.run(["pgrep", "-g", str(flower.pid)], capture_output=True, text=True)
    assert out.stdout.strip() == "", f"processes left in flower's group: {out.stdout}"


@pytest.mark.parametrize("argv, env, reason", [
    ([], {}, "no credentials"),
    (["--basic-auth", "admin:change-me"], {}, "well-known default"),
    ([], {"FLOWER_BASIC_AUTH": "admin:change-me"}, "well-known default"),
    ([], {"FLOWER_BASIC_AUTH": "admin:"}, "both parts non-empty"),
    ([], {"FLOWER_BASIC_AUTH": "ops:short"},
     "'ops' is 5 characters: use at least 16, or a passphrase of 4 or more words"),
    ([], {"FLOWER_BASIC_AUTH": "admin:password1234"},
     "'admin' is a well-known default with digits or punctuation appended"),
    ([], {"FLOWER_BASIC_AUTH": "ops:Xk7#pQ2!mZ9vRt4"}, "is 15 characters: use at least 16"),
    ([], {"FLOWER_BASIC_AUTH": f"{CREDENTIALS},metrics:abababababababababab"}, "fewer than 6 different characters"),
    (["--unauthenticated-api"], {"FLOWER_BASIC_AUTH": CREDENTIALS}, "needs --insecure-local"),
    (["--insecure-local", "--address", "0.0.0.0"], {}, "only listens on the loopback interface"),
])
def test_flower_refuses_to_start_open(pk, argv, env, reason):
    proc = subprocess.run(["packyard", "flower", "--port", str(pk.free_port()), *argv], capture_output=True,
                          text=True, timeout=60, env={**pk.cli_env(FLOWER_BASIC_AUTH=""), **env})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("packyard flower: refusing to start: ") and reason in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_flower_binds_loopback_by_default():
    from packyard.workers.cli import build_parser
    from packyard.workers.cli.flower import check_exposure

    args = build_parser(only="flower").parse_args(["flower"])
    assert args.address == "127.0.0.1"
    check_exposure("127.0.0.1", None, insecure_local=True, unauthenticated_api=True)   # a developer's machine
    check_exposure("0.0.0.0", CREDENTIALS, insecure_local=False, unauthenticated_api=False)


@pytest.mark.parametrize("password, ok", [
    ("a-long-test-password", True),          # 20 characters
    ("Xk7#pQ2!mZ9vRt4&", True),               # 16 characters
    ("cat dog fox owl", True),               # a passphrase of 4 words (15 characters)
    ("cat-dog-fox", False),                  # 3 words, 11 characters
    ("cat cat cat cat", False),              # 4 words, one of them different
    ("password1234", False), ("Change-Me!!", False), ("aaaaaaaaaaaaaaaaaaaa", False),
])
def test_password_strength_rule(password, ok):
    from packyard.workers.cli.flower import password_problem

    assert (password_problem(password) is None) == ok, password_problem(password)


def test_flower_metrics_public_serves_metrics_without_credentials(tmp_path, celery_worker, pk):
    with _running_flower(pk, tmp_path, "--metrics-public") as (_flower, base):
        status, body = _get(f"{base}/metrics", auth=None)
        assert status == 200 and "flower_" in body
        assert _get(f"{base}/api/tasks", auth=None)[0] == 401   # only /metrics is opened
