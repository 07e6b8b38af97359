"""docker-compose.yml describes a deployment packyard can actually run, and does not run it open.

Where Debian's docker-compose is installed (.ci/run installs it) the file is
validated by it; in every case each service that runs the packyard image must
name a real ``packyard`` subcommand with arguments that subcommand accepts, the
secrets (PostgreSQL password, Flower credentials) must come from the environment
or .env with no default, Flower must be published on loopback only, and the image
must run as a non-root user.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gitutil import ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SECRETS = ("POSTGRES_PASSWORD", "FLOWER_BASIC_AUTH", "GRAFANA_ADMIN_PASSWORD")
REQUIRED = re.compile(r"\$\{(\w+):\?[^}]*\}")   # ${VAR:?message}: compose refuses to start when VAR is unset/empty


def load() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose_config(tmp_path: Path, **secrets: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env.update(secrets)
    empty = tmp_path / "empty.env"   # a developer's own .env must not decide the outcome
    empty.write_text("")
    return subprocess.run(["docker-compose", "-f", str(COMPOSE), "--env-file", str(empty), "config"],
                          capture_output=True, text=True, env=env)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates(tmp_path):
    proc = compose_config(tmp_path, POSTGRES_PASSWORD="pw-from-env", FLOWER_BASIC_AUTH="ops:a-long-password-from-env",
                          GRAFANA_ADMIN_PASSWORD="grafana-pw-from-env")
    assert proc.returncode == 0, proc.stderr
    assert "pw-from-env" in proc.stdout and "ops:a-long-password-from-env" in proc.stdout


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("missing", SECRETS)
def test_docker_compose_refuses_to_start_without_secrets(tmp_path, missing):
    given = {"POSTGRES_PASSWORD": "pw-from-env", "FLOWER_BASIC_AUTH": "ops:a-long-password-from-env",
             "GRAFANA_ADMIN_PASSWORD": "grafana-pw-from-env"}
    given[missing] = ""
    proc = compose_config(tmp_path, **given)
    assert proc.returncode != 0 and missing in proc.stderr, proc.stdout + proc.stderr


def test_secrets_come_from_the_environment_with_no_default():
    doc = load()
    text = COMPOSE.read_text()
    assert "change-me" not in text and ":-" not in text, "a default value for a variable"
    services = doc["services"]
    assert REQUIRED.fullmatch(services["postgres"]["environment"]["POSTGRES_PASSWORD"]).group(1) == "POSTGRES_PASSWORD"
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == \
        REQUIRED.search(services["flower"]["environment"]["FLOWER_BASIC_AUTH"]).group(0)
    assert REQUIRED.search(services["flower"]["environment"]["FLOWER_BASIC_AUTH"]).group(1) == "FLOWER_BASIC_AUTH"
    for name, svc in _packyard_services(doc):
        url = (svc.get("environment") or {})["PACKYARD_DATABASE_URL"]
        assert "${POSTGRES_PASSWORD:?" in url, (name, url)
        assert not any("--basic-auth" in str(a) for a in svc["command"]), "credentials in argv are visible in ps"
    example = (ROOT / ".env.example").read_text()
    for name in SECRETS:   # documented, and empty: copying the example unchanged does not start anything
        assert re.search(rf"(?m)^{name}=$", example), name


def test_dashboards_are_published_on_loopback_only():
    """Metrics, Prometheus and Grafana show repository paths and job details: loopback, like Flower."""
    for name, svc in load()["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} published beyond loopback: {port}"


def test_flower_is_locked_down():
    flower = load()["services"]["flower"]
    assert "--insecure-local" not in flower["command"] and "--unauthenticated-api" not in flower["command"]
    for port in flower.get("ports", []):
        assert str(port).startswith("127.0.0.1:"), f"flower published beyond loopback: {port}"


def test_image_runs_as_a_non_root_user():
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    users = [line.split(None, 1)[1] for line in lines if line.upper().startswith("USER ")]
    assert users, "no USER: the image runs as root"
    assert users[-1].split(":")[0] not in ("root", "0")
    last_user = max(i for i, line in enumerate(lines) if line.upper().startswith("USER "))
    assert not any(line.upper().startswith("RUN ") for line in lines[last_user:]), "RUN after USER runs as that user"


def test_jobs_are_confined_in_the_deployment():
    """Workers get a storage root and an incoming dir, each on a shared volume."""
    worker = load()["services"]["worker"]
    env = worker["environment"]
    root = env["PACKYARD_STORAGE_ROOTS"].split("=", 1)[1]
    volumes = {str(v).split(":")[1]: str(v).split(":")[0] for v in worker["volumes"]}
    assert volumes.get(root) == "repos" and volumes.get(env["PACKYARD_INCOMING_DIR"]) == "incoming"


def test_required_services_present():
    services = load()["services"]
    assert {"redis", "postgres", "migrate", "worker", "beat", "flower", "metrics", "prometheus",
            "grafana"} <= set(services)
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
        argv = [str(a) for a in svc["command"]]
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
            if key.startswith("FLOWER_"):   # Flower's own variables (read by packyard flower and by Flower)
                continue
            assert key in text, f"service {name} sets {key}, which workers/settings.py does not read"
        assert "PACKYARD_REDIS_URL" in env and "PACKYARD_DATABASE_URL" in env


def test_prometheus_scrapes_the_exporter_and_flower_and_grafana_gets_the_dashboard():
    services = load()["services"]
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    metrics_port = services["metrics"]["command"][services["metrics"]["command"].index("--port") + 1]
    flower_port = services["flower"]["command"][services["flower"]["command"].index("--port") + 1]
    assert targets == {f"metrics:{metrics_port}", f"flower:{flower_port}"}
    # Every file a container mounts exists in the checkout, except secrets the operator creates
    # (kept out of version control by .gitignore and documented in .env.example).
    ignored = set((ROOT / ".gitignore").read_text().split())
    example = (ROOT / ".env.example").read_text()
    for name in ("prometheus", "grafana"):
        for vol in services[name]["volumes"]:
            src = vol.split(":")[0]
            if src.startswith("./") and src[2:] in ignored:
                assert src[2:] in example, f"{name} mounts the secret {src}: .env.example must say how to make it"
            elif src.startswith("./"):
                assert (ROOT / src).exists(), f"{name} mounts {src}, which does not exist"
    flower_job = next(job for job in prom["scrape_configs"] if job["job_name"] == "flower")
    assert flower_job["basic_auth"]["password_file"], "Flower refuses anonymous scrapes"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/packyard.yml").read_text())
    mounted = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
