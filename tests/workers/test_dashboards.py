"""Every metric a Grafana panel queries is one the exporter serves: the dashboard's PromQL is parsed and
a real `packyard metrics` process is scraped (Flower's own metrics are checked in test_flower.py)."""
from __future__ import annotations

import urllib.request

from promql import dashboard_exprs, dashboard_metrics, metric_names, served


def test_promql_names_are_found():
    assert metric_names('histogram_quantile(0.95, sum by (le, kind) (rate(a_bucket{kind="x{y}"}[5m])))') == \
        {"a_bucket"}
    assert metric_names("sum by (k) (a_sum) / on (k) group_left sum without (le) (b_count) > bool 0") == \
        {"a_sum", "b_count"}
    assert metric_names("topk(10, c / 86400)") == {"c"}


def families_of(text: str) -> dict[str, str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_every_panel_metric_is_served_by_a_real_exporter(pk, migrated_db):
    from packyard.workers.cli.children import Child

    wanted = dashboard_metrics("packyard_")
    assert len(wanted) >= 12 and len(dashboard_exprs()) >= 15
    port = pk.free_port()
    log = open(pk.session_dir / f"metrics-{port}.log", "wb")
    exporter = Child("metrics", ["packyard", "metrics", "--port", str(port)], pk.cli_env(), stdout=log)

    def get():
        if exporter.poll() is not None:
            raise AssertionError((pk.session_dir / f"metrics-{port}.log").read_text())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()
        except OSError:
            return None
    try:
        text = pk.wait_until(get, 30, interval=0.2, what="packyard metrics to answer")
    finally:
        exporter.stop(timeout=10)
        log.close()
    families = families_of(text)
    missing = sorted(n for n in wanted if not served(n, families))
    assert not missing, f"panels query metrics the exporter does not serve: {missing}"
    assert families["packyard_job_duration_seconds"] == "histogram"
    assert families["packyard_lock_events"] == "counter" and families["packyard_records_up"] == "gauge"
    assert 'packyard_records_up 1.0' in text
    assert not served("packyard_no_such_metric", families)   # the check can fail
