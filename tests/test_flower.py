"""Flower, started by `packyard flower` against the session broker, lists a finished verify_repo task."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

from gitutil import make_worktree_repo


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None, None


def test_flower_lists_finished_verify_repo(tmp_path, celery_worker, celery_app, pk):
    from packyard.workers.cli.common import Child

    port = pk.free_port()
    log = open(tmp_path / "flower.log", "wb")
    flower = Child("flower", ["packyard", "flower", "--port", str(port), "--unauthenticated-api"], pk.cli_env(),
                   stdout=log)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready():
            if flower.poll() is not None:
                raise AssertionError(f"flower exited: {(tmp_path / 'flower.log').read_text()[-2000:]}")
            return _get(f"{base}/api/tasks")[0] == 200
        pk.wait_until(ready, 60, interval=0.3, what="flower's HTTP API")

        repo = make_worktree_repo(tmp_path)
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

        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            families = {f.name: f.type for f in text_string_to_metric_families(r.read().decode())}
        wanted = dashboard_metrics("flower_")
        assert wanted and all(served(n, families) for n in wanted), (wanted, sorted(families))
    finally:
        flower.stop(timeout=10)
        log.close()
    assert flower.poll() is not None
    out = subprocess.run(["pgrep", "-g", str(flower.pid)], capture_output=True, text=True)
    assert out.stdout.strip() == "", f"processes left in flower's group: {out.stdout}"
