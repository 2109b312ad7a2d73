"""docker-compose.yml and deploy/prometheus agree with each other and with the metrics.

Docker may be absent where the tests run, so the compose file is checked by reading it:
Prometheus scrapes services that exist, on the ports they serve metrics on, and every
alert names series that ``app.core.metrics`` defines. ``promtool check rules/config``
runs too when promtool is installed (CI installs Debian's prometheus package).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import app.core.metrics  # noqa: F401 - registers every Treadle metric

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PROM_DIR = ROOT / "deploy" / "prometheus"
PROM: dict[str, Any] = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())


def _series_names() -> set[str]:
    names: set[str] = set()
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            names.add(sample.name)
        names.add(metric.name)
        if metric.type == "histogram":
            names.update(f"{metric.name}_{s}" for s in ("bucket", "sum", "count"))
        if metric.type == "counter":
            names.add(f"{metric.name}_total")
    return names


def test_prometheus_scrapes_every_api_and_worker_service() -> None:
    services = COMPOSE["services"]
    targets = {
        target
        for job in PROM["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    api_port = "8000"
    assert f"api:{api_port}" in targets
    workers = [name for name, svc in services.items() if "worker" in svc.get("command", [])]
    assert len(workers) >= 2
    for name in workers:
        command = services[name]["command"]
        port = command[command.index("--metrics-port") + 1]
        assert f"{name}:{port}" in targets, f"{name} is not scraped"
        # The metrics server binds TREADLE_HOST: it must listen beyond the container.
        assert services[name]["environment"]["TREADLE_HOST"] == "0.0.0.0"
    assert {t.split(":")[0] for t in targets} <= set(services), "a target is not a service"


def test_compose_mounts_the_prometheus_files() -> None:
    prom = COMPOSE["services"]["prometheus"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in prom["volumes"] if v.startswith("./")}
    assert mounts["./deploy/prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./deploy/prometheus/alerts.yml"] in PROM["rule_files"]
    for local in mounts:
        assert (ROOT / local).is_file(), local


def test_alerts_use_only_series_treadle_exports() -> None:
    rules = yaml.safe_load((PROM_DIR / "alerts.yml").read_text())
    exported = _series_names()
    used: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            used.update(re.findall(r"\btreadle_[a-z_]+", rule["expr"]))
    assert used, "no treadle series in the alerts"
    assert used <= exported, f"alerts use series nobody exports: {sorted(used - exported)}"
    documented = (ROOT / "docs" / "operations.md").read_text()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert f"`{rule['alert']}`" in documented, f"{rule['alert']} is not documented"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules_and_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    rules = subprocess.run(
        [promtool, "check", "rules", str(PROM_DIR / "alerts.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    # The config names the rules file by its path inside the container.
    config = tmp_path / "prometheus.yml"
    config.write_text(
        (PROM_DIR / "prometheus.yml")
        .read_text()
        .replace("/etc/prometheus/alerts.yml", str(PROM_DIR / "alerts.yml"))
    )
    checked = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
