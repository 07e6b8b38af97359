"""docker-compose.yml describes a deployment packyard can actually run.

Where Debian's docker-compose is installed (.ci/run installs it) the file is
validated by it; in every case each service that runs the packyard image must
name a real ``packyard`` subcommand with arguments that subcommand accepts.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates():
    proc = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_required_services_present():
    services = load()["services"]
    assert {"redis", "postgres", "migrate", "worker", "beat", "flower", "metrics", "prometheus", "grafana"} <= set(services)
    assert services["worker"]["deploy"]["replicas"] >= 2
    # Every worker replica sees the same repositories volume (shared storage).
    assert any(str(v).startswith("repos:") for v in services["worker"]["volumes"])


def _packyard_services(doc: dict):
    for name, svc in doc["services"].items():
        if svc.get("build") or str(svc.get("image", "")).startswith("packyard"):
            yield name, svc


def test_every_command_is_a_real_packyard_subcommand():
    doc = load()
    services = dict(_packyard_services(doc))
    assert set(services) == {"migrate", "worker", "beat", "flower", "metrics"}
    for name, svc in services.items():
        argv = [str(a).replace("${FLOWER_BASIC_AUTH:-admin:change-me}", "admin:x") for a in svc["command"]]
        # argparse validates the subcommand and every option before acting on --help.
        proc = subprocess.run([str(Path(sys.executable).parent / "packyard"), *argv, "--help"],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, f"service {name}: packyard {' '.join(argv)} rejected: {proc.stderr}"
        assert proc.stdout.startswith(f"usage: packyard {argv[0]}"), proc.stdout


def test_environment_names_match_settings():
    from packyard.workers import settings

    text = Path(settings.__file__).read_text()
    for name, svc in _packyard_services(load()):
        env = svc.get("environment") or {}
        for key in env:
            assert key in text, f"service {name} sets {key}, which workers/settings.py does not read"
        assert "PACKYARD_REDIS_URL" in env and "PACKYARD_DATABASE_URL" in env


def test_prometheus_scrapes_the_exporter_and_flower_and_grafana_gets_the_dashboard():
    services = load()["services"]
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    metrics_port = services["metrics"]["command"][services["metrics"]["command"].index("--port") + 1]
    flower_port = services["flower"]["command"][services["flower"]["command"].index("--port") + 1]
    assert targets == {f"metrics:{metrics_port}", f"flower:{flower_port}"}
    # Every file a container mounts exists in the checkout.
    for name in ("prometheus", "grafana"):
        for vol in services[name]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (ROOT / src).exists(), f"{name} mounts {src}, which does not exist"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/packyard.yml").read_text())
    mounted = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
